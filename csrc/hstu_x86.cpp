// The HSTU attention engines of x86 CPUs with AVX-512: fp32 with register-tiled FMA micro-kernels,
// and bf16 operands with fp32 accumulation on AMX-BF16 tiles (TDPBF16PS) or, without AMX, on
// AVX512-BF16 register tiles (VDPBF16PS).  The two bf16 engines share the operand layouts: A
// row-major, B packed in VNNI pairs (B(k, n) at [k / 2][n][k % 2]).  The elementwise work (bias,
// SiLU and its derivative, masks, the bias tables' gradients) is AVX-512 code shared by all three;
// the bf16 engines compute it to bf16 accuracy (their P and dS are rounded to bf16 anyway), the
// fp32 engine to fp32 accuracy.
//
// The whole unit is compiled for AVX-512 + AMX (#pragma GCC target below); csrc/hstu.cpp calls it
// only where hstu::engine_usable says the CPU (and, for AMX, the OS) has those.  Everything that
// follows the pragma has internal linkage except the entry points of hstu_kernel.h.
#include "hstu_kernel.h"  // TRASC_HSTU_X86_ENGINES

#if defined(TRASC_HSTU_X86_ENGINES)

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "amx_tiles.h"

#include "hstu_kernel.h"
#include "hstu_layer_kernels.h"

namespace torchrec_ascend {
namespace hstu {
namespace detail {

// the OS's permission for the AMX tile state, asked once (amx_tiles.h)
bool amx_permitted() {
  static const bool ok = amx::request_tile_state();
  return ok;
}

}  // namespace detail
}  // namespace hstu
}  // namespace torchrec_ascend

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512cd,avx512bf16,fma,f16c,bmi,bmi2,lzcnt,amx-tile,amx-bf16")

#include "hstu_driver.h"

namespace torchrec_ascend {
namespace hstu {
namespace {

// ============================================================================ vector math

inline __m512 bf16x16_to_f32(__m256i x) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}
// 32 bf16 (round to nearest even) from two 16-float vectors: lo -> elements 0..15, hi -> 16..31
inline __m512i f32x32_to_bf16(__m512 lo, __m512 hi) { return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); }

// exp(-z) and sigmoid(z) = 1 / (1 + exp(-z)).  kFast: bf16 accuracy (degree-3 2^f, |rel err| <
// 4e-4, and RCP14); else fp32 accuracy (Cephes' exp on a clamped, two-constant range reduction,
// RCP14 refined by one Newton step).
template <bool kFast>
inline __m512 sigmoid(__m512 z) {
  if constexpr (kFast) {
    const __m512 t = _mm512_mul_ps(z, _mm512_set1_ps(-1.44269504088896341f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.052867315f), f, _mm512_set1_ps(0.24215215f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.69358683f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.99996275f));
    const __m512 e = _mm512_scalef_ps(p, n);
    return _mm512_rcp14_ps(_mm512_add_ps(e, _mm512_set1_ps(1.0f)));
  } else {
    __m512 x = _mm512_sub_ps(_mm512_setzero_ps(), z);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512 d = _mm512_add_ps(_mm512_scalef_ps(p, n), _mm512_set1_ps(1.0f));
    const __m512 y = _mm512_rcp14_ps(d);
    return _mm512_mul_ps(y, _mm512_fnmadd_ps(d, y, _mm512_set1_ps(2.0f)));
  }
}

// d silu(z) / dz = sg (1 + z (1 - sg)), from z and sg = sigmoid(z)
inline __m512 silu_grad(__m512 z, __m512 sg) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_mul_ps(sg, _mm512_fmadd_ps(z, _mm512_sub_ps(one, sg), one));
}

// bucket(a - b) for 16 lanes (b[c], c < 16, where `live`): floor(ln|a - b| / 0.301) clamped to
// [0, nb], exactly the float64 formula.  Computed in fp32 (ln by exponent + degree-6 polynomial,
// |err| < 2e-5 in ln / 0.301); a lane within 2e-4 of a bucket boundary is redone by the exact
// scalar bucketer.
inline __m512i buckets16(int64_t a, const int64_t* b, __mmask16 live, const Bucketer& bk) {
  const __m512i av = _mm512_set1_epi64(a);
  const __m512i b0 = _mm512_maskz_loadu_epi64(static_cast<__mmask8>(live), b);
  const __m512i b1 = _mm512_maskz_loadu_epi64(static_cast<__mmask8>(live >> 8), b + 8);
  const __m512i d0 = _mm512_abs_epi64(_mm512_sub_epi64(av, b0));
  const __m512i d1 = _mm512_abs_epi64(_mm512_sub_epi64(av, b1));
  __m512 x = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtepi64_ps(d0)), _mm512_cvtepi64_ps(d1), 1);
  x = _mm512_max_ps(x, _mm512_set1_ps(1.0f));
  __m512 m = _mm512_getmant_ps(x, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_src);
  __m512 e = _mm512_getexp_ps(x);
  const __mmask16 big = _mm512_cmp_ps_mask(m, _mm512_set1_ps(1.5f), _CMP_GE_OQ);
  m = _mm512_mask_mul_ps(m, big, m, _mm512_set1_ps(0.5f));
  e = _mm512_mask_add_ps(e, big, e, _mm512_set1_ps(1.0f));
  const __m512 u = _mm512_sub_ps(m, _mm512_set1_ps(1.0f));
  // ln(1 + u) / 0.301 on u in [-0.25, 0.5): least-max-error degree-6 fit
  constexpr float s = 1.0f / 0.301f;
  __m512 p = _mm512_set1_ps(-0.08602808934650259f * s);
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(0.19183904968760576f * s));
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(-0.2566647946571549f * s));
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(0.3347100522376192f * s));
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(-0.4998802993125037f * s));
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(0.9999747850381968f * s));
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(-3.2790324319710597e-07f * s));
  const __m512 y = _mm512_fmadd_ps(e, _mm512_set1_ps(0.69314718055994531f * s), p);
  const __m512 fl = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 fr = _mm512_sub_ps(y, fl);
  const __mmask16 near = (_mm512_cmp_ps_mask(fr, _mm512_set1_ps(2e-4f), _CMP_LT_OQ) |
                          _mm512_cmp_ps_mask(fr, _mm512_set1_ps(1.0f - 2e-4f), _CMP_GT_OQ)) & live;
  __m512i bi = _mm512_cvttps_epi32(fl);
  bi = _mm512_min_epi32(_mm512_max_epi32(bi, _mm512_setzero_si512()), _mm512_set1_epi32(static_cast<int>(bk.nb)));
  bi = _mm512_maskz_mov_epi32(live, bi);
  if (near) {
    alignas(64) int32_t tmp[16];
    _mm512_store_si512(tmp, bi);
    for (int l = 0; l < 16; ++l)
      if (near >> l & 1) tmp[l] = static_cast<int32_t>(bk(a - b[l]));
    bi = _mm512_load_si512(tmp);
  }
  return bi;
}

inline __mmask16 first_lanes(int64_t k) {
  return k >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (k < 0 ? 0 : k)) - 1u);
}

// ---------------------------------------------------------------------------- time bias of a tile
//
// With sorted timestamps (the usual case: a user's events in time order) a - b_c is monotone in
// both the row (a non-decreasing) and the column (b non-decreasing), so over a group of 16
// columns and all rows of a tile |a - b| is extreme at the group's corners when it keeps one
// sign there.  Each group is then one of: constant (one bucket at all four corners: most groups
// away from the diagonal), narrow (its buckets span at most kNarrow + 1 values: a lane's bucket is
// the count of thresholds it passes, a few compares), or general (the vector bucketer and a
// gather; also every group of unsorted timestamps).

constexpr int kNarrow = 3;
constexpr int64_t kRowSub = 16;  // rows of a classified group

inline bool non_decreasing(const int64_t* x, int64_t n) {
  for (int64_t i = 1; i < n; ++i)
    if (x[i] < x[i - 1]) return false;
  return true;
}

// |a - b[c]| for 16 lanes as two 8-lane int64 halves
inline void abs_dt16(int64_t a, const int64_t* b, __mmask16 live, __m512i& d0, __m512i& d1) {
  const __m512i av = _mm512_set1_epi64(a);
  d0 = _mm512_abs_epi64(_mm512_sub_epi64(av, _mm512_maskz_loadu_epi64(static_cast<__mmask8>(live), b)));
  d1 = _mm512_abs_epi64(_mm512_sub_epi64(av, _mm512_maskz_loadu_epi64(static_cast<__mmask8>(live >> 8), b + 8)));
}
// lanes with |a - b| >= t
inline __mmask16 at_least(const __m512i& d0, const __m512i& d1, int64_t t) {
  const __m512i tv = _mm512_set1_epi64(t);
  return static_cast<__mmask16>(_mm512_cmpge_epi64_mask(d0, tv) | (static_cast<unsigned>(_mm512_cmpge_epi64_mask(d1, tv)) << 8));
}

// The classification of the 16-column groups of a tile, kept for the tables' gradients
struct GroupKinds {
  static constexpr int8_t kConst = 0, kNarrowKind = 1, kGeneral = 2;
};

// out(r, c) = pos[p0 - r + c] + ts_w[bucket(a[r] - b[c])] for c < lim[r] (lim null: w); with
// `runs`, each group's kind and buckets are kept (and the ids of general groups)
// bucket(x) when it is likely `hint` (two compares), else the bucketer
inline int64_t bucket_hinted(const Bucketer& bk, int64_t x, int64_t hint) {
  const int64_t ax = x < 0 ? -x : x;
  if (hint >= 0 && hint <= bk.nb && ax >= bk.th[hint] && (hint == bk.nb || ax < bk.th[hint + 1])) return hint;
  return bk(x);
}

// Classifies the groups (16 rows x 16 columns) of rows [r0, r0 + mr) x columns [0, w): kind and
// bucket range per group into kind[g], kmin[g], kmax[g]
void classify_groups(int64_t mr, int64_t w, const Bucketer& bk, const int64_t* a, const int64_t* b, bool sorted,
                     int64_t groups, int8_t* kind, int32_t* kmin, int32_t* kmax) {
  int64_t hlo = -1, hhi = -1;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t c0 = 16 * g, c1 = imin(c0 + 16, w);
    kind[g] = GroupKinds::kGeneral;
    kmin[g] = kmax[g] = 0;
    if (!sorted) continue;
    // a - b rises with the row and falls with the column: its extremes over the group are at
    // (first row, last column) and (last row, first column)
    const int64_t lo = a[0] - b[c1 - 1], hi = a[mr - 1] - b[c0];
    if (lo < 0 && hi > 0) continue;  // changes sign inside
    const int64_t k1 = bucket_hinted(bk, lo, hlo), k2 = bucket_hinted(bk, hi, hhi);
    hlo = k1;
    hhi = k2;
    kmin[g] = static_cast<int32_t>(imin(k1, k2));
    kmax[g] = static_cast<int32_t>(imax(k1, k2));
    kind[g] = k1 == k2 ? GroupKinds::kConst : (kmax[g] - kmin[g] <= kNarrow ? GroupKinds::kNarrowKind : GroupKinds::kGeneral);
  }
}

void bias_rows_avx512(int64_t m, int64_t w, const int64_t* lim, const float* pos, int64_t p0, const float* ts_w,
                      const Bucketer* bk, const int64_t* a, const int64_t* b, float* out, int64_t ld,
                      BucketRuns* runs) {
  const bool sorted = ts_w && m > 0 && non_decreasing(a, m) && non_decreasing(b, w);
  const int64_t gmax = (w + 15) / 16;
  static thread_local Scratch<int32_t> own;
  if (!runs) own.get(3 * gmax + 1);
  for (int64_t r0 = 0; r0 < m; r0 += kRowSub) {
    const int64_t mr = imin(kRowSub, m - r0);
    int64_t lmax = 0;
    for (int64_t r = r0; r < r0 + mr; ++r) lmax = imax(lmax, lim ? imin(lim[r], w) : w);
    const int64_t groups = (lmax + 15) / 16;
    int8_t* kind = runs ? runs->kind + (r0 / kRowSub) * runs->gld : reinterpret_cast<int8_t*>(own.p);
    int32_t* kmin = runs ? runs->kmin + (r0 / kRowSub) * runs->gld : own.p + gmax;
    int32_t* kmax = runs ? runs->kmax + (r0 / kRowSub) * runs->gld : own.p + 2 * gmax;
    if (ts_w) classify_groups(mr, w, *bk, a + r0, b, sorted, groups, kind, kmin, kmax);
    for (int64_t r = r0; r < r0 + mr; ++r) {
      const int64_t e = lim ? imin(lim[r], w) : w;
      const float* pr = pos ? pos + (p0 - r) : nullptr;
      float* o = out + r * ld;
      for (int64_t g = 0, c0 = 0; c0 < e; ++g, c0 += 16) {
        const __mmask16 live = first_lanes(e - c0);
        __m512 x = pr ? _mm512_maskz_loadu_ps(live, pr + c0) : _mm512_setzero_ps();
        if (ts_w) {
          const int8_t kd = kind[g];
          if (kd == GroupKinds::kConst) {
            x = _mm512_add_ps(x, _mm512_set1_ps(ts_w[kmin[g]]));
          } else if (kd == GroupKinds::kNarrowKind) {
            __m512i d0, d1;
            abs_dt16(a[r], b + c0, live, d0, d1);
            __m512 tv = _mm512_set1_ps(ts_w[kmin[g]]);
            for (int64_t k = kmin[g] + 1; k <= kmax[g]; ++k)
              tv = _mm512_mask_mov_ps(tv, at_least(d0, d1, bk->th[k]), _mm512_set1_ps(ts_w[k]));
            x = _mm512_add_ps(x, tv);
          } else {
            const __m512i bi = buckets16(a[r], b + c0, live, *bk);
            x = _mm512_add_ps(x, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, bi, ts_w, 4));
            if (runs) _mm512_mask_storeu_epi32(runs->ids + r * runs->ld + c0, live, bi);
          }
        }
        _mm512_mask_storeu_ps(o + c0, live, x);
      }
    }
  }
}

// dpos[p0 + r - c] += scale G(r, c) and dts[bucket(r, c)] += scale G(r, c) over rows r < m and
// columns c < w (G is 0 where masked; the buckets as bias_rows classified them).  The diagonals
// are summed in fp32 first, in four copies taken by row in turn (consecutive rows' windows
// overlap: one copy would make each row wait on the previous row's stores); the buckets per group:
// one sum for a constant group, a masked sum per bucket for a narrow one, a histogram (four
// copies) for a general one.
void table_grads_avx512(int64_t m, int64_t w, const float* G, int64_t ld, double* dpos, int64_t p0, double* dts,
                        const Bucketer* bk, const int64_t* a, const int64_t* b, const BucketRuns* runs,
                        double scale) {
  if (dpos) {
    const int64_t span = m + w + 32;
    static thread_local Scratch<float> buf;
    float* diag = buf.zeroed(4 * span);
    const __m512i rev = _mm512_set_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    // element (r, c) -> diag[16 + (w - 1) + r - c]; 16 columns c0.. map to the reversed window
    // starting at 16 + (w - 1) + r - (c0 + 15)
    for (int64_t r = 0; r < m; ++r) {
      float* d = diag + (r & 3) * span;
      const float* g = G + r * ld;
      for (int64_t c0 = 0; c0 < w; c0 += 16) {
        const __mmask16 live = first_lanes(w - c0);
        const __m512 gv = _mm512_permutexvar_ps(rev, _mm512_maskz_loadu_ps(live, g + c0));
        float* dst = d + (w - 1) + r - c0 - 15 + 16;
        _mm512_storeu_ps(dst, _mm512_add_ps(_mm512_loadu_ps(dst), gv));
      }
    }
    for (int64_t x = 0; x < m + w - 1; ++x) {
      const float s = diag[x + 16] + diag[span + x + 16] + diag[2 * span + x + 16] + diag[3 * span + x + 16];
      if (s != 0.0f) dpos[p0 + x - (w - 1)] += static_cast<double>(s) * scale;
    }
  }
  if (dts) {
    const int64_t nts = bk->nb + 1, stride = round_up(nts, 16);
    static thread_local Scratch<float> hbuf;
    float* hp = hbuf.zeroed(4 * stride);
    for (int64_t r0 = 0; r0 < m; r0 += kRowSub) {
      const int64_t mr = imin(kRowSub, m - r0);
      const int8_t* kinds = runs->kind + (r0 / kRowSub) * runs->gld;
      const int32_t* kmins = runs->kmin + (r0 / kRowSub) * runs->gld;
      const int32_t* kmaxs = runs->kmax + (r0 / kRowSub) * runs->gld;
      for (int64_t c0 = 0, g = 0; c0 < w; c0 += 16, ++g) {
        const __mmask16 live = first_lanes(w - c0);
        const int8_t kind = kinds[g];
        const int64_t kmin = kmins[g], kmax = kmaxs[g];
        if (kind == GroupKinds::kConst) {
          __m512 acc = _mm512_setzero_ps();
          for (int64_t r = r0; r < r0 + mr; ++r) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(live, G + r * ld + c0));
          hp[kmin] += _mm512_reduce_add_ps(acc);
        } else if (kind == GroupKinds::kNarrowKind) {
          __m512 acc[kNarrow + 1];
          for (int k = 0; k <= kNarrow; ++k) acc[k] = _mm512_setzero_ps();
          for (int64_t r = r0; r < r0 + mr; ++r) {
            const __m512 gv = _mm512_maskz_loadu_ps(live, G + r * ld + c0);
            __m512i d0, d1;
            abs_dt16(a[r], b + c0, live, d0, d1);
            // acc_k: the lanes at bucket >= kmin + k; bucket kmin + k gets acc_k - acc_{k+1}
            acc[0] = _mm512_add_ps(acc[0], gv);
            for (int64_t k = kmin + 1; k <= kmax; ++k)
              acc[k - kmin] = _mm512_mask_add_ps(acc[k - kmin], at_least(d0, d1, bk->th[k]), acc[k - kmin], gv);
          }
          float prev = 0.0f;
          for (int64_t k = kmax; k >= kmin; --k) {
            const float sk = _mm512_reduce_add_ps(acc[k - kmin]);
            hp[k] += sk - prev;
            prev = sk;
          }
        } else {
          for (int64_t r = r0; r < r0 + mr; ++r) {
            const float* gr = G + r * ld;
            const int32_t* id = runs->ids + r * runs->ld;
            for (int64_t c = c0; c < imin(c0 + 16, w); ++c) hp[((c & 3) * stride) + id[c]] += gr[c];
          }
        }
      }
    }
    for (int64_t x = 0; x < nts; ++x) {
      const float s = hp[x] + hp[stride + x] + hp[2 * stride + x] + hp[3 * stride + x];
      if (s != 0.0f) dts[x] += static_cast<double>(s) * scale;
    }
  }
}

// ============================================================================ transposes

// 16 x 16 transpose of 32-bit words in registers
inline void transpose16x16_epi32(__m512i* r) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
  }
}

inline __mmask32 first_halves(int64_t k) {
  return k >= 32 ? 0xFFFFFFFFu : (k <= 0 ? 0u : (1u << k) - 1u);
}

// Loads rows [0, rows) of a block (row stride lds bytes; the first `halves` 16-bit elements of
// each, the rest and the rows beyond read as 0) and transposes it as 16 x 16 32-bit words.
inline void load_transposed(const char* src, int64_t lds, int64_t rows, int64_t halves, __m512i* r) {
  const __mmask32 k = first_halves(halves);
  for (int i = 0; i < 16; ++i)
    r[i] = i < rows ? _mm512_maskz_loadu_epi16(k, src + i * lds) : _mm512_setzero_si512();
  transpose16x16_epi32(r);
}

// dst word block (16 columns x out_rows rows, row stride ldd bytes) = transpose of a src block
inline void transpose_words(const char* src, int64_t lds, int64_t rows, int64_t halves, char* dst, int64_t ldd,
                            int64_t out_rows) {
  __m512i r[16];
  load_transposed(src, lds, rows, halves, r);
  for (int i = 0; i < out_rows; ++i) _mm512_storeu_si512(dst + i * ldd, r[i]);
}

// ============================================================================ elementwise

// 16 lanes of row r, columns c0..c0+15 of the forward: P = silu(alpha s + bias), lanes not in
// `ok` are 0
template <bool kFast>
inline __m512 silu16(const float* s, const float* bias, __m512 alpha, __mmask16 ok) {
  const __m512 sv = _mm512_maskz_loadu_ps(ok, s);
  const __m512 z = bias ? _mm512_fmadd_ps(sv, alpha, _mm512_maskz_loadu_ps(ok, bias)) : _mm512_mul_ps(sv, alpha);
  return _mm512_maskz_mul_ps(ok, z, sigmoid<kFast>(z));
}

// the forward's valid lanes of row r at columns c0.. (full == null: all of [0, w))
inline __mmask16 fwd_mask(int64_t r, int64_t c0, int64_t w, const int64_t* full, const int64_t* self) {
  __mmask16 ok = first_lanes(w - c0);
  if (full) {
    __mmask16 k = first_lanes(full[r] - c0);
    const int64_t sc = self[r] - c0;
    if (self[r] >= 0 && sc >= 0 && sc < 16) k |= static_cast<__mmask16>(1u << sc);
    ok &= k;
  }
  return ok;
}

// The backward's valid lanes of a block (keys j0 .. j0 + m - 1, queries i0 .. i0 + w - 1): key j
// is seen by query i0 + c where j < e[c] or j == i0 + c.  A full block (every query sees every
// key: e[c] past the last key) needs no per-lane test; the others compare the key with the
// queries' prefix ends as 32-bit lanes (wp, the block's padded width, is at most kBwdRows).
struct BwdMasks {
  bool full = true;
  int64_t i0;
  alignas(64) int32_t e32[kBwdRows];
  BwdMasks(int64_t m, int64_t w, int64_t wp, int64_t j0, int64_t i0_, const int64_t* e) : i0(i0_) {
    for (int64_t c = 0; c < w && full; ++c) full = e[c] > j0 + m - 1;
    if (!full)
      for (int64_t c = 0; c < wp; ++c) e32[c] = c < w ? static_cast<int32_t>(imin(e[c], INT32_MAX)) : 0;
  }
  // key j's lanes at queries i0 + c .. i0 + c + 15, within `live`
  template <bool kFull>
  __mmask16 at(int64_t j, int64_t c, __mmask16 live) const {
    if (kFull) return live;
    __mmask16 k = _mm512_cmpgt_epi32_mask(_mm512_load_si512(e32 + c), _mm512_set1_epi32(static_cast<int32_t>(j)));
    const int64_t d = j - (i0 + c);
    if (d >= 0 && d < 16) k |= static_cast<__mmask16>(1u << d);
    return static_cast<__mmask16>(k & live);
  }
};

// backward lanes: p = silu(z), ds = dP silu'(z), both 0 outside ok
template <bool kFast>
inline void silu_bwd16(const float* s, const float* dp, const float* bias, __m512 alpha, __mmask16 ok, __m512& p,
                       __m512& ds) {
  const __m512 sv = _mm512_maskz_loadu_ps(ok, s);
  const __m512 z = bias ? _mm512_fmadd_ps(sv, alpha, _mm512_maskz_loadu_ps(ok, bias)) : _mm512_mul_ps(sv, alpha);
  const __m512 sig = sigmoid<kFast>(z);
  p = _mm512_maskz_mul_ps(ok, z, sig);
  ds = _mm512_maskz_mul_ps(ok, _mm512_maskz_loadu_ps(ok, dp), silu_grad(z, sig));
}

// The relative-bias rows and their table gradients, the same AVX-512 work in every engine here
struct Avx512Tables {
  static void bias_rows(int64_t m, int64_t w, const int64_t* lim, const float* pos, int64_t p0, const float* ts_w,
                        const Bucketer* bk, const int64_t* a, const int64_t* b, float* out, int64_t ld,
                        BucketRuns* runs) {
    bias_rows_avx512(m, w, lim, pos, p0, ts_w, bk, a, b, out, ld, runs);
  }
  static void table_grads(int64_t m, int64_t w, const float* G, int64_t ld, double* dpos, int64_t p0, double* dts,
                          const Bucketer* bk, const int64_t* a, const int64_t* b, const BucketRuns* runs,
                          double scale) {
    table_grads_avx512(m, w, G, ld, dpos, p0, dts, bk, a, b, runs, scale);
  }
};

// ============================================================================ fp32 engine

struct F32Avx512 : Avx512Tables {
  using in_t = float;
  using acc_t = float;
  static constexpr int64_t kRowPad = 1, kKPad = 1, kNPad = 16;
  static constexpr bool kBSeparate = false;
  // backward tasks take one head each: the bias work is a small share of the fp32 backward, and
  // a group's fp32 operand packs (twice bf16's) outgrow the caches (max_len 4096: 330 -> 420 ms)
  static constexpr bool kGroupHeads = false;
  static constexpr double kPartsPerThread = 4.0;
  struct Thread {};

  static int64_t b_ld(int64_t /*K*/, int64_t N) { return padded_f32_b_ld(N); }
  static int64_t b_size(int64_t K, int64_t N) { return K * b_ld(K, N); }
  static const float* b_block(const float* B, int64_t ld, int64_t k0, int64_t n0) { return B + k0 * ld + n0; }

  static void pack_b(const float* src, int64_t lds, int64_t K, int64_t Kp, int64_t N, float* dst, int64_t ld) {
    pack_f32_b_padded(src, lds, K, Kp, N, dst, ld);
  }
  // dst[k ld + n] = src[n lds + k] by 16 x 16 blocks; columns [round_up(N, 16), ld) zero
  static void pack_bt(const float* src, int64_t lds, int64_t K, int64_t N, int64_t /*Np*/, float* dst, int64_t ld) {
    transpose_rows(src, lds, N, K, dst, ld);
    const int64_t n16 = round_up(N, 16);
    for (int64_t x = 0; x < K; ++x) std::memset(dst + x * ld + n16, 0, (ld - n16) * sizeof(float));
  }
  // dst[c ldd + r] = src[r lds + c], r < rows, c < cols (columns of dst up to round_up(rows, 16))
  static void transpose_rows(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst, int64_t ldd) {
    for (int64_t r0 = 0; r0 < rows; r0 += 16)
      for (int64_t c0 = 0; c0 < cols; c0 += 16)
        transpose_words(reinterpret_cast<const char*>(src + r0 * lds + c0), lds * 4, imin(16, rows - r0),
                        2 * imin(16, cols - c0), reinterpret_cast<char*>(dst + c0 * ldd + r0), ldd * 4,
                        imin(16, cols - c0));
  }

  // C[MR rows, 16 NV columns] (+)= A B over K
  template <int MR, int NV>
  static void tile(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb_, float* C, int64_t ldc,
                   bool accumulate) {
    __m512 acc[MR][NV];
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v)
        acc[r][v] = accumulate ? _mm512_loadu_ps(C + r * ldc + 16 * v) : _mm512_setzero_ps();
    for (int64_t x = 0; x < K; ++x) {
      __m512 bv[NV];
      for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_ps(B + x * ldb_ + 16 * v);
      for (int r = 0; r < MR; ++r) {
        const __m512 a = _mm512_set1_ps(A[r * lda + x]);
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(a, bv[v], acc[r][v]);
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(C + r * ldc + 16 * v, acc[r][v]);
  }
  template <int NV>
  static void rows_tail(int64_t mr, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb_, float* C,
                        int64_t ldc, bool acc) {
    switch (mr) {
      case 1: tile<1, NV>(K, A, lda, B, ldb_, C, ldc, acc); break;
      case 2: tile<2, NV>(K, A, lda, B, ldb_, C, ldc, acc); break;
      case 3: tile<3, NV>(K, A, lda, B, ldb_, C, ldc, acc); break;
      case 4: tile<4, NV>(K, A, lda, B, ldb_, C, ldc, acc); break;
      case 5: tile<5, NV>(K, A, lda, B, ldb_, C, ldc, acc); break;
      case 6: tile<6, NV>(K, A, lda, B, ldb_, C, ldc, acc); break;
      case 7: tile<7, NV>(K, A, lda, B, ldb_, C, ldc, acc); break;
      default: break;
    }
  }
  static void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb_,
                   float* C, int64_t ldc, bool accumulate) {
    constexpr int kMR = 8;
    for (int64_t n0 = 0; n0 < N; n0 += 32) {
      const bool two = N - n0 >= 32;
      int64_t m0 = 0;
      for (; m0 + kMR <= M; m0 += kMR) {
        if (two) tile<kMR, 2>(K, A + m0 * lda, lda, B + n0, ldb_, C + m0 * ldc + n0, ldc, accumulate);
        else tile<kMR, 1>(K, A + m0 * lda, lda, B + n0, ldb_, C + m0 * ldc + n0, ldc, accumulate);
      }
      if (m0 < M) {
        if (two) rows_tail<2>(M - m0, K, A + m0 * lda, lda, B + n0, ldb_, C + m0 * ldc + n0, ldc, accumulate);
        else rows_tail<1>(M - m0, K, A + m0 * lda, lda, B + n0, ldb_, C + m0 * ldc + n0, ldc, accumulate);
      }
    }
  }

  static void store_rows(int64_t m, int64_t cols, const float* C, int64_t ldc, float scale, float* dst,
                         int64_t ldd) {
    const __m512 sv = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < cols; c += 16) {
        const __mmask16 k = first_lanes(cols - c);
        _mm512_mask_storeu_ps(dst + r * ldd + c, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, C + r * ldc + c), sv));
      }
  }
  // dst[i ldd + c] = scale C[c ldc + i], i < n, c < rows
  static void store_transposed(int64_t rows, int64_t n, const float* C, int64_t ldc, float scale, float* dst,
                               int64_t ldd) {
    const __m512 sv = _mm512_set1_ps(scale);
    for (int64_t c0 = 0; c0 < rows; c0 += 16)
      for (int64_t i0 = 0; i0 < n; i0 += 16) {
        __m512i r[16];
        load_transposed(reinterpret_cast<const char*>(C + c0 * ldc + i0), ldc * 4, imin(16, rows - c0),
                        2 * imin(16, n - i0), r);
        const __mmask16 k = first_lanes(rows - c0);
        for (int64_t t = 0; t < imin(16, n - i0); ++t)
          _mm512_mask_storeu_ps(dst + (i0 + t) * ldd + c0, k, _mm512_mul_ps(_mm512_castsi512_ps(r[t]), sv));
      }
  }

  static void silu_fwd(int64_t m, int64_t w, int64_t wp, const float* S, int64_t lds, const float* bias,
                       int64_t ldbias, const int64_t* full, const int64_t* self, float alpha, float* Pm, int64_t ldp) {
    const __m512 av = _mm512_set1_ps(alpha);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < wp; c += 16) {
        const __mmask16 ok = fwd_mask(r, c, w, full, self);
        _mm512_storeu_ps(Pm + r * ldp + c,
                         silu16<false>(S + r * lds + c, bias ? bias + r * ldbias + c : nullptr, av, ok));
      }
  }

  static void silu_bwd(int64_t m, int64_t mk, int64_t w, int64_t wp, const float* S, const float* dP, int64_t ld,
                       const float* bias, int64_t ldbias, int64_t j0, int64_t i0, const int64_t* e, float alpha,
                       float* PA, float* dSA, int64_t lda, float* /*dSB*/, int64_t /*ldb*/, float* G, int64_t ldg,
                       bool /*g_add: never set without kGroupHeads*/) {
    const BwdMasks masks(m, w, wp, j0, i0, e);
    if (masks.full) silu_bwd_rows<true>(m, mk, w, wp, S, dP, ld, bias, ldbias, j0, masks, alpha, PA, dSA, lda, G, ldg);
    else silu_bwd_rows<false>(m, mk, w, wp, S, dP, ld, bias, ldbias, j0, masks, alpha, PA, dSA, lda, G, ldg);
  }

 private:
  template <bool kFull>
  static void silu_bwd_rows(int64_t m, int64_t mk, int64_t w, int64_t wp, const float* S, const float* dP,
                            int64_t ld, const float* bias, int64_t ldbias, int64_t j0, const BwdMasks& masks,
                            float alpha, float* PA, float* dSA, int64_t lda, float* G, int64_t ldg) {
    const __m512 av = _mm512_set1_ps(alpha);
    for (int64_t r = 0; r < mk; ++r)
      for (int64_t c = 0; c < wp; c += 16) {
        const __mmask16 ok = r < m ? masks.at<kFull>(j0 + r, c, first_lanes(w - c)) : 0;
        __m512 p, ds;
        silu_bwd16<false>(S + r * ld + c, dP + r * ld + c, bias && r < m ? bias + r * ldbias + c : nullptr, av, ok,
                          p, ds);
        _mm512_storeu_ps(PA + r * lda + c, p);
        _mm512_storeu_ps(dSA + r * lda + c, ds);
        if (G && r < m) _mm512_mask_storeu_ps(G + r * ldg + c, first_lanes(w - c), ds);
      }
  }
};

// ============================================================================ bf16 engines

// B in VNNI pairs, by blocks of 16 columns: B(k, n) at B[(n / 16) ld + (k / 2) 32 + 2 (n % 16) + k % 2]
// with ld = 16 round_up(K, 32) (a block: K / 2 rows of 64 bytes, what one tile row-set reads)
struct Bf16Common : Avx512Tables {
  using in_t = bf16_t;
  using acc_t = float;
  static constexpr int64_t kRowPad = 16, kKPad = 32, kNPad = 16;
  static constexpr bool kBSeparate = true;
  // backward tasks take a group of heads (the bias strips were ~40% of the bf16 backward)
  static constexpr bool kGroupHeads = true;
  static constexpr double kPartsPerThread = 4.0;

  // 16 lanes of the tables' gradient strip: dS written (the first head of a task) or added (the others)
  static void store_g(float* g, __mmask16 live, __m512 ds, bool add) {
    _mm512_mask_storeu_ps(g, live, add ? _mm512_add_ps(_mm512_maskz_loadu_ps(live, g), ds) : ds);
  }

  static int64_t b_rows(int64_t K) { return round_up(K, 32) / 2; }
  static int64_t b_ld(int64_t K, int64_t /*N*/) { return 32 * b_rows(K); }
  static int64_t b_size(int64_t K, int64_t N) { return round_up(N, 16) / 16 * b_ld(K, N); }
  static const bf16_t* b_block(const bf16_t* B, int64_t ld, int64_t k0, int64_t n0) {
    return B + (n0 / 16) * ld + (k0 / 2) * 32;
  }

  // B(k, n) = src[k lds + n] (k < K, n < N), zero elsewhere (rows up to Kp, columns up to
  // round_up(N, 16))
  static void pack_b(const bf16_t* src, int64_t lds, int64_t K, int64_t Kp, int64_t N, bf16_t* dst, int64_t ld) {
    const int64_t pairs = b_rows(Kp), n16 = round_up(N, 16);
    const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                            37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi_idx = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55, 23,
                                            54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
    for (int64_t pr = 0; pr < pairs; ++pr) {
      const int64_t k = 2 * pr;
      const bf16_t* r0 = k < K ? src + k * lds : nullptr;
      const bf16_t* r1 = k + 1 < K ? src + (k + 1) * lds : nullptr;
      for (int64_t n = 0; n < n16; n += 32) {
        const __mmask32 live = first_halves(N - n);
        const __m512i a = r0 ? _mm512_maskz_loadu_epi16(live, r0 + n) : _mm512_setzero_si512();
        const __m512i b = r1 ? _mm512_maskz_loadu_epi16(live, r1 + n) : _mm512_setzero_si512();
        _mm512_storeu_si512(dst + (n / 16) * ld + pr * 32, _mm512_permutex2var_epi16(a, lo_idx, b));
        if (n + 16 < n16) _mm512_storeu_si512(dst + (n / 16 + 1) * ld + pr * 32, _mm512_permutex2var_epi16(a, hi_idx, b));
      }
    }
  }
  // B(k, n) = src[n lds + k] (k < K, n < N), zero elsewhere: a transpose of 32-bit pairs, by
  // 16 x 16 blocks
  static void pack_bt(const bf16_t* src, int64_t lds, int64_t K, int64_t N, int64_t Np, bf16_t* dst, int64_t ld) {
    const int64_t pairs = b_rows(K), n16 = round_up(N, 16);
    for (int64_t n0 = 0; n0 < N; n0 += 16)
      for (int64_t p0 = 0; p0 < pairs; p0 += 16)
        transpose_words(reinterpret_cast<const char*>(src + n0 * lds + 2 * p0), lds * 2, imin(16, N - n0),
                        K - 2 * p0, reinterpret_cast<char*>(dst + (n0 / 16) * ld + p0 * 32), 64, imin(16, pairs - p0));
    if (round_up(Np, 16) > n16) std::memset(dst + (n16 / 16) * ld, 0, (round_up(Np, 16) - n16) / 16 * ld * sizeof(bf16_t));
  }
  // dst[c ldd + r] = src[r lds + c] for r < rows (a multiple of 16), c < cols: 32-bit pair
  // transposes, then each pair row split into its even and odd elements
  static void transpose_rows(const bf16_t* src, int64_t lds, int64_t rows, int64_t cols, bf16_t* dst, int64_t ldd) {
    const __m512i split = _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1, 30, 28, 26, 24,
                                           22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const int64_t pairs = (cols + 1) / 2;
    for (int64_t r0 = 0; r0 < rows; r0 += 16)
      for (int64_t p0 = 0; p0 < pairs; p0 += 16) {
        __m512i r[16];
        load_transposed(reinterpret_cast<const char*>(src + r0 * lds + 2 * p0), lds * 2, imin(16, rows - r0),
                        cols - 2 * p0, r);
        for (int64_t t = 0; t < imin(16, pairs - p0); ++t) {
          const __m512i x = _mm512_permutexvar_epi16(split, r[t]);
          const int64_t c = 2 * (p0 + t);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c * ldd + r0), _mm512_castsi512_si256(x));
          if (c + 1 < cols)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (c + 1) * ldd + r0), _mm512_extracti64x4_epi64(x, 1));
        }
      }
  }

  static void store_rows(int64_t m, int64_t cols, const float* C, int64_t ldc, float scale, bf16_t* dst,
                         int64_t ldd) {
    const __m512 sv = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < cols; c += 16) {
        const __mmask16 k = first_lanes(cols - c);
        const __m256i b = (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, C + r * ldc + c), sv));
        _mm256_mask_storeu_epi16(dst + r * ldd + c, k, b);
      }
  }
  // dst[i ldd + c] = bf16(scale C[c ldc + i]), i < n, c < rows
  static void store_transposed(int64_t rows, int64_t n, const float* C, int64_t ldc, float scale, bf16_t* dst,
                               int64_t ldd) {
    const __m512 sv = _mm512_set1_ps(scale);
    for (int64_t c0 = 0; c0 < rows; c0 += 16)
      for (int64_t i0 = 0; i0 < n; i0 += 16) {
        __m512i r[16];
        load_transposed(reinterpret_cast<const char*>(C + c0 * ldc + i0), ldc * 4, imin(16, rows - c0),
                        2 * imin(16, n - i0), r);
        const __mmask16 k = first_lanes(rows - c0);
        for (int64_t t = 0; t < imin(16, n - i0); ++t) {
          const __m256i b = (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_castsi512_ps(r[t]), sv));
          _mm256_mask_storeu_epi16(dst + (i0 + t) * ldd + c0, k, b);
        }
      }
  }

  // P rows (bf16, A layout), 32 columns at a time (wp is a multiple of 32)
  static void silu_fwd(int64_t m, int64_t w, int64_t wp, const float* S, int64_t lds, const float* bias,
                       int64_t ldbias, const int64_t* full, const int64_t* self, float alpha, bf16_t* Pm,
                       int64_t ldp) {
    const __m512 av = _mm512_set1_ps(alpha);
    for (int64_t r = 0; r < m; ++r) {
      const float* s = S + r * lds;
      const float* bi = bias ? bias + r * ldbias : nullptr;
      for (int64_t c = 0; c < wp; c += 32) {
        const __m512 lo = silu16<true>(s + c, bi ? bi + c : nullptr, av, fwd_mask(r, c, w, full, self));
        const __m512 hi = silu16<true>(s + c + 16, bi ? bi + c + 16 : nullptr, av, fwd_mask(r, c + 16, w, full, self));
        _mm512_storeu_si512(Pm + r * ldp + c, f32x32_to_bf16(lo, hi));
      }
    }
  }

  // key rows in pairs (the VNNI copy of dS^T interleaves them), 32 query columns at a time
  static void silu_bwd(int64_t m, int64_t mk, int64_t w, int64_t wp, const float* S, const float* dP, int64_t ld,
                       const float* bias, int64_t ldbias, int64_t j0, int64_t i0, const int64_t* e, float alpha,
                       bf16_t* PA, bf16_t* dSA, int64_t lda, bf16_t* dSB, int64_t ldb_, float* G, int64_t ldg,
                       bool g_add) {
    const BwdMasks masks(m, w, wp, j0, i0, e);
    const SiluBwdArgs a{m, mk, w, wp, S, dP, ld, bias, ldbias, j0, masks, alpha, PA, dSA, lda, dSB, ldb_, G, ldg};
    const bool full = masks.full;
    if (bias == nullptr) {
      if (full) silu_bwd_rows<false, false, true>(a);
      else silu_bwd_rows<false, false, false>(a);
    } else if (g_add) {
      if (full) silu_bwd_rows<true, true, true>(a);
      else silu_bwd_rows<true, true, false>(a);
    } else {
      if (full) silu_bwd_rows<true, false, true>(a);
      else silu_bwd_rows<true, false, false>(a);
    }
  }

 private:
  struct SiluBwdArgs {
    int64_t m, mk, w, wp;
    const float *S, *dP;
    int64_t ld;
    const float* bias;  // and G, the tables' gradient strip: both or neither
    int64_t ldbias, j0;
    const BwdMasks& masks;
    float alpha;
    bf16_t *PA, *dSA;
    int64_t lda;
    bf16_t* dSB;
    int64_t ldb;
    float* G;
    int64_t ldg;
  };
  // silu_bwd's rows: the call's choices (bias and G; G written or added to; lane masks or none)
  // as template arguments, a row pair's four vectors in registers (a loop over the pair, with
  // arrays, kept them on the stack: ~70 instructions per vector)
  template <bool kBias, bool kAdd, bool kFull>
  static void silu_bwd_rows(const SiluBwdArgs& a) {
    const __m512 av = _mm512_set1_ps(a.alpha);
    const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38,
                                            6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi_idx = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55, 23,
                                            54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
    // rows r, r + 1 at columns c .. c + 31 out: P and dS (A layout), dS's VNNI pair row r / 2
    // (two blocks of 16 columns, rows r and r + 1 interleaved)
    auto store_pair = [&](int64_t r, int64_t c, __m512i p0, __m512i p1, __m512i ds0, __m512i ds1) {
      _mm512_storeu_si512(a.PA + r * a.lda + c, p0);
      _mm512_storeu_si512(a.PA + (r + 1) * a.lda + c, p1);
      _mm512_storeu_si512(a.dSA + r * a.lda + c, ds0);
      _mm512_storeu_si512(a.dSA + (r + 1) * a.lda + c, ds1);
      _mm512_storeu_si512(a.dSB + (c / 16) * a.ldb + (r / 2) * 32, _mm512_permutex2var_epi16(ds0, lo_idx, ds1));
      _mm512_storeu_si512(a.dSB + (c / 16 + 1) * a.ldb + (r / 2) * 32, _mm512_permutex2var_epi16(ds0, hi_idx, ds1));
    };
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t r = 0; r < a.mk; r += 2) {
      if (r >= a.m) {  // both rows past the keys (padding of the last block): zeros, nothing to compute
        for (int64_t c = 0; c < a.wp; c += 32) store_pair(r, c, zero, zero, zero, zero);
        continue;
      }
      const bool v1 = r + 1 < a.m;  // row r is a key row; row r + 1 may be padding
      const float* s0 = a.S + r * a.ld;
      const float* dp0 = a.dP + r * a.ld;
      // a padding row has every lane masked off (nothing loaded): row r's pointer does for it
      const float* b0 = kBias ? a.bias + r * a.ldbias : nullptr;
      const float* b1 = kBias ? (v1 ? b0 + a.ldbias : b0) : nullptr;
      float* g0 = kBias ? a.G + r * a.ldg : nullptr;
      for (int64_t c = 0; c < a.wp; c += 32) {
        const __mmask16 l0 = first_lanes(a.w - c), l1 = first_lanes(a.w - c - 16);
        const int64_t j = a.j0 + r;  // row r / r + 1, columns c / c + 16
        const __mmask16 k00 = a.masks.at<kFull>(j, c, l0), k01 = a.masks.at<kFull>(j, c + 16, l1);
        const __mmask16 k10 = v1 ? a.masks.at<kFull>(j + 1, c, l0) : 0;
        const __mmask16 k11 = v1 ? a.masks.at<kFull>(j + 1, c + 16, l1) : 0;
        __m512 p00, p01, p10, p11, d00, d01, d10, d11;
        silu_bwd16<true>(s0 + c, dp0 + c, kBias ? b0 + c : nullptr, av, k00, p00, d00);
        silu_bwd16<true>(s0 + c + 16, dp0 + c + 16, kBias ? b0 + c + 16 : nullptr, av, k01, p01, d01);
        silu_bwd16<true>(s0 + a.ld + c, dp0 + a.ld + c, kBias ? b1 + c : nullptr, av, k10, p10, d10);
        silu_bwd16<true>(s0 + a.ld + c + 16, dp0 + a.ld + c + 16, kBias ? b1 + c + 16 : nullptr, av, k11, p11, d11);
        if (kBias) {
          store_g(g0 + c, l0, d00, kAdd);
          store_g(g0 + c + 16, l1, d01, kAdd);
          if (v1) {
            store_g(g0 + a.ldg + c, l0, d10, kAdd);
            store_g(g0 + a.ldg + c + 16, l1, d11, kAdd);
          }
        }
        store_pair(r, c, f32x32_to_bf16(p00, p01), f32x32_to_bf16(p10, p11), f32x32_to_bf16(d00, d01),
                   f32x32_to_bf16(d10, d11));
      }
    }
  }
};

// AVX512-BF16 register tiles: C[MR rows, 16 NV columns] (+)= A B, K in pairs (VDPBF16PS)
struct Bf16Avx512 : Bf16Common {
  struct Thread {};
  template <int MR, int NV>
  static void tile(int64_t K, const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb_, float* C, int64_t ldc,
                   bool accumulate) {
    __m512 acc[MR][NV];
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v)
        acc[r][v] = accumulate ? _mm512_loadu_ps(C + r * ldc + 16 * v) : _mm512_setzero_ps();
    for (int64_t kk = 0; kk < K / 2; ++kk) {
      __m512bh bv[NV];
      for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(B + v * ldb_ + kk * 32);
      for (int r = 0; r < MR; ++r) {
        uint32_t pair;
        std::memcpy(&pair, A + r * lda + 2 * kk, 4);
        const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, bv[v]);
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(C + r * ldc + 16 * v, acc[r][v]);
  }
  static void gemm(int64_t M, int64_t N, int64_t K, const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb_,
                   float* C, int64_t ldc, bool accumulate) {
    constexpr int kMR = 8;  // M is a multiple of 16
    for (int64_t n0 = 0; n0 < N; n0 += 32) {
      const bool two = N - n0 >= 32;
      for (int64_t m0 = 0; m0 < M; m0 += kMR) {
        const bf16_t* b = B + (n0 / 16) * ldb_;
        if (two) tile<kMR, 2>(K, A + m0 * lda, lda, b, ldb_, C + m0 * ldc + n0, ldc, accumulate);
        else tile<kMR, 1>(K, A + m0 * lda, lda, b, ldb_, C + m0 * ldc + n0, ldc, accumulate);
      }
    }
  }
};

// AMX tiles: every tile 16 rows x 64 bytes (amx_tiles.h)
struct Bf16Amx : Bf16Common {
  struct Thread {
    Thread() { amx::configure_tiles_16x64(); }
    ~Thread() { _tile_release(); }
  };

  // C[32 rows (two tiles when R2), 32 columns (two tiles when C2)] (+)= A B over K (multiple of 32)
  template <bool R2, bool C2>
  static void block(int64_t K, const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb_, float* C, int64_t ldc,
                    bool accumulate) {
    const int64_t sa = lda * 2, sc = ldc * 4;
    if (accumulate) {
      _tile_loadd(0, C, sc);
      if (C2) _tile_loadd(1, C + 16, sc);
      if (R2) _tile_loadd(2, C + 16 * ldc, sc);
      if (R2 && C2) _tile_loadd(3, C + 16 * ldc + 16, sc);
    } else {
      _tile_zero(0);
      if (C2) _tile_zero(1);
      if (R2) _tile_zero(2);
      if (R2 && C2) _tile_zero(3);
    }
    for (int64_t k = 0; k < K; k += 32) {
      _tile_loadd(4, A + k, sa);
      _tile_loadd(6, B + k * 16, 64);
      if (C2) _tile_loadd(7, B + ldb_ + k * 16, 64);
      _tile_dpbf16ps(0, 4, 6);
      if (C2) _tile_dpbf16ps(1, 4, 7);
      if (R2) {
        _tile_loadd(5, A + 16 * lda + k, sa);
        _tile_dpbf16ps(2, 5, 6);
        if (C2) _tile_dpbf16ps(3, 5, 7);
      }
    }
    _tile_stored(0, C, sc);
    if (C2) _tile_stored(1, C + 16, sc);
    if (R2) _tile_stored(2, C + 16 * ldc, sc);
    if (R2 && C2) _tile_stored(3, C + 16 * ldc + 16, sc);
  }
  static void gemm(int64_t M, int64_t N, int64_t K, const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb_,
                   float* C, int64_t ldc, bool accumulate) {
    for (int64_t m0 = 0; m0 < M; m0 += 32) {
      const bool r2 = M - m0 >= 32;
      for (int64_t n0 = 0; n0 < N; n0 += 32) {
        const bool c2 = N - n0 >= 32;
        const bf16_t* a = A + m0 * lda;
        const bf16_t* b = B + (n0 / 16) * ldb_;
        float* c = C + m0 * ldc + n0;
        if (r2 && c2) block<true, true>(K, a, lda, b, ldb_, c, ldc, accumulate);
        else if (r2) block<true, false>(K, a, lda, b, ldb_, c, ldc, accumulate);
        else if (c2) block<false, true>(K, a, lda, b, ldb_, c, ldc, accumulate);
        else block<false, false>(K, a, lda, b, ldb_, c, ldc, accumulate);
      }
    }
  }
};

}  // namespace


// ============================================================================ layer elementwise
// (csrc/hstu_layer_kernels.h): fp32 arithmetic, fp32 or bf16 storage, 16 lanes at a time

namespace {

inline __m512 load16(bool bf, const void* p, int64_t i, __mmask16 k) {
  if (bf) return bf16x16_to_f32(_mm256_maskz_loadu_epi16(k, static_cast<const bf16_t*>(p) + i));
  return _mm512_maskz_loadu_ps(k, static_cast<const float*>(p) + i);
}
inline void store16(bool bf, void* p, int64_t i, __mmask16 k, __m512 x) {
  if (bf) _mm256_mask_storeu_epi16(static_cast<bf16_t*>(p) + i, k, (__m256i)_mm512_cvtneps_pbh(x));
  else _mm512_mask_storeu_ps(static_cast<float*>(p) + i, k, x);
}

// lane * 0x9E3779B1 (mod 2^32), layer_mask_hash's first multiplier times a lane number
constexpr int lane_c1(uint32_t lane) { return static_cast<int>(lane * 0x9E3779B1u); }

// the dropout factor (0 or scale) of elements idx0 .. idx0 + 15: layer_mask_hash in 16 lanes
inline __m512 dropout16(const LayerDropout& d, uint64_t idx0) {
  if (!d.on) return _mm512_set1_ps(1.0f);
  // layer_mask_hash's index products without a vector multiply: (lo0 + lane) * C1 = lo0 * C1 +
  // lane * C1 (mod 2^32, wrapped or not), and the high word is hi0, plus 1 in the lanes whose low
  // word wrapped, so its product is hi0 * C2, plus C2 there -- the same bits as multiplying
  const uint32_t lo0 = static_cast<uint32_t>(idx0), hi0 = static_cast<uint32_t>(idx0 >> 32);
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i lanes_c1 =
      _mm512_set_epi32(lane_c1(15), lane_c1(14), lane_c1(13), lane_c1(12), lane_c1(11), lane_c1(10), lane_c1(9),
                       lane_c1(8), lane_c1(7), lane_c1(6), lane_c1(5), lane_c1(4), lane_c1(3), lane_c1(2), lane_c1(1),
                       lane_c1(0));
  const __m512i lo_b = _mm512_set1_epi32(static_cast<int>(lo0));
  const __mmask16 carry = _mm512_cmplt_epu32_mask(_mm512_add_epi32(lo_b, lane), lo_b);  // crossed 2^32
  __m512i hi_c2 = _mm512_set1_epi32(static_cast<int>(hi0 * 0x85EBCA77u));
  hi_c2 = _mm512_mask_add_epi32(hi_c2, carry, hi_c2, _mm512_set1_epi32(static_cast<int>(0x85EBCA77u)));
  __m512i x = _mm512_xor_si512(_mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(lo0 * 0x9E3779B1u)), lanes_c1),
                               hi_c2);
  x = _mm512_add_epi32(x, _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(d.seed))));
  x = _mm512_xor_si512(x, _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(d.seed >> 32) * 0xC2B2AE3Du)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x85EBCA6Bu)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 13));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0xC2B2AE35u)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  const __mmask16 keep = _mm512_cmpge_epu32_mask(x, _mm512_set1_epi32(static_cast<int>(d.threshold)));
  return _mm512_maskz_mov_ps(keep, _mm512_set1_ps(d.scale));
}

}  // namespace

namespace detail {

// f(r, part, c, col, k): every 16-column block of rows [r0, r1) of the four parts (widths w4, side by
// side in rows of `width`): c within the part, col within the row, k its live lanes
namespace {
template <typename F>
inline void for_each_split_block(int64_t r0, int64_t r1, const int64_t* w4, F f) {
  for (int64_t r = r0; r < r1; ++r) {
    int64_t c0 = 0;
    for (int part = 0; part < 4; ++part) {
      for (int64_t c = 0; c < w4[part]; c += 16) f(r, part, c, c0 + c, first_lanes(w4[part] - c));
      c0 += w4[part];
    }
  }
}
}  // namespace

// bf16 in and out: the bf16-accuracy sigmoid (|rel err| < 4e-4, under the output's rounding
// of 2^-9), fp32: the fp32-accuracy one
namespace {
template <bool kBf16>
void silu_split_rows(const void* h, int64_t r0, int64_t r1, int64_t width, const int64_t* w4, void* const* outs) {
  for_each_split_block(r0, r1, w4, [&](int64_t r, int part, int64_t c, int64_t col, __mmask16 k) {
    const __m512 z = load16(kBf16, h, r * width + col, k);
    store16(kBf16, outs[part], r * w4[part] + c, k, _mm512_mul_ps(z, sigmoid<kBf16>(z)));
  });
}
template <bool kBf16>
void silu_split_bwd_rows(const void* h, int64_t r0, int64_t r1, int64_t width, const int64_t* w4,
                         const void* const* grads, void* dh) {
  for_each_split_block(r0, r1, w4, [&](int64_t r, int part, int64_t c, int64_t col, __mmask16 k) {
    const __m512 z = load16(kBf16, h, r * width + col, k);
    const __m512 d = silu_grad(z, sigmoid<kBf16>(z));
    store16(kBf16, dh, r * width + col, k, _mm512_mul_ps(load16(kBf16, grads[part], r * w4[part] + c, k), d));
  });
}
}  // namespace

void avx512_silu_split(bool bf, const void* h, int64_t r0, int64_t r1, int64_t width, const int64_t* w4,
                       void* const* outs) {
  if (bf) silu_split_rows<true>(h, r0, r1, width, w4, outs);
  else silu_split_rows<false>(h, r0, r1, width, w4, outs);
}

void avx512_silu_split_bwd(bool bf, const void* h, int64_t r0, int64_t r1, int64_t width, const int64_t* w4,
                           const void* const* grads, void* dh) {
  if (bf) silu_split_bwd_rows<true>(h, r0, r1, width, w4, grads, dh);
  else silu_split_bwd_rows<false>(h, r0, r1, width, w4, grads, dh);
}

namespace {
// LayerNorm (no affine, eps 1e-6) of one row of D values, 16 lanes at a time (load(c, k): columns
// c .. c + 15, lanes outside k zero): the row's mean and 1 / sqrt(var + eps), two passes
template <class Load>
inline void row_moments(int64_t D, Load load, float& mean, float& rstd) {
  __m512 s = _mm512_setzero_ps();
  for (int64_t c = 0; c < D; c += 16) s = _mm512_add_ps(s, load(c, first_lanes(D - c)));
  mean = _mm512_reduce_add_ps(s) / static_cast<float>(D);
  const __m512 mv = _mm512_set1_ps(mean);
  __m512 ss = _mm512_setzero_ps();
  for (int64_t c = 0; c < D; c += 16) {
    const __mmask16 k = first_lanes(D - c);
    const __m512 x = _mm512_maskz_sub_ps(k, load(c, k), mv);
    ss = _mm512_fmadd_ps(x, x, ss);
  }
  rstd = 1.0f / std::sqrt(_mm512_reduce_add_ps(ss) / static_cast<float>(D) + 1e-6f);
}

// LayerNorm's backward of one row: dx = rstd (g - mean(g) - xh mean(g xh)) from xh(c, k) (the
// normalised values, zero outside k) and g, the gradient w.r.t. them: first(c, k, xh) in the pass
// that sums (it may store other outputs), again(c, k) in the pass that writes out(c, k, dx)
template <class XH, class First, class Again, class Out>
inline void layer_norm_bwd_row(int64_t D, __m512 rv, XH xh_of, First first, Again again, Out out) {
  __m512 sd = _mm512_setzero_ps(), sdx = _mm512_setzero_ps();
  for (int64_t c = 0; c < D; c += 16) {
    const __mmask16 k = first_lanes(D - c);
    const __m512 xh = xh_of(c, k);
    const __m512 g = first(c, k, xh);
    sd = _mm512_add_ps(sd, g);
    sdx = _mm512_fmadd_ps(g, xh, sdx);
  }
  const __m512 md = _mm512_set1_ps(_mm512_reduce_add_ps(sd) / static_cast<float>(D));
  const __m512 mdx = _mm512_set1_ps(_mm512_reduce_add_ps(sdx) / static_cast<float>(D));
  for (int64_t c = 0; c < D; c += 16) {
    const __mmask16 k = first_lanes(D - c);
    out(c, k, _mm512_mul_ps(rv, _mm512_sub_ps(_mm512_sub_ps(again(c, k), md), _mm512_mul_ps(xh_of(c, k), mdx))));
  }
}
}  // namespace

void avx512_norm_gate(bool bf, const void* attn, const void* u, int64_t r0, int64_t r1, int64_t D,
                      const LayerDropout& drop, void* y, float* mean, float* rstd) {
  for (int64_t r = r0; r < r1; ++r) {
    row_moments(D, [&](int64_t c, __mmask16 k) { return load16(bf, attn, r * D + c, k); }, mean[r], rstd[r]);
    const __m512 mv = _mm512_set1_ps(mean[r]), rv = _mm512_set1_ps(rstd[r]);
    const uint64_t base = static_cast<uint64_t>(r) * static_cast<uint64_t>(D);
    for (int64_t c = 0; c < D; c += 16) {
      const __mmask16 k = first_lanes(D - c);
      const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(load16(bf, attn, r * D + c, k), mv), rv);
      const __m512 v = _mm512_mul_ps(_mm512_mul_ps(load16(bf, u, r * D + c, k), xh), dropout16(drop, base + c));
      store16(bf, y, r * D + c, k, v);
    }
  }
}

void avx512_norm_gate_bwd(bool bf, const void* dy, const void* attn, const void* u, const float* mean,
                          const float* rstd, int64_t r0, int64_t r1, int64_t D, const LayerDropout& drop, void* dattn,
                          void* du) {
  for (int64_t r = r0; r < r1; ++r) {
    const __m512 mv = _mm512_set1_ps(mean[r]), rv = _mm512_set1_ps(rstd[r]);
    const uint64_t base = static_cast<uint64_t>(r) * static_cast<uint64_t>(D);
    // g' = dy * mask / (1 - p); du = g' * xh; the gradient w.r.t. xh: g' * u
    auto gm = [&](int64_t c, __mmask16 k) { return _mm512_mul_ps(load16(bf, dy, r * D + c, k), dropout16(drop, base + c)); };
    layer_norm_bwd_row(
        D, rv, [&](int64_t c, __mmask16 k) { return _mm512_maskz_mul_ps(k, _mm512_sub_ps(load16(bf, attn, r * D + c, k), mv), rv); },
        [&](int64_t c, __mmask16 k, __m512 xh) {
          const __m512 g = gm(c, k);
          store16(bf, du, r * D + c, k, _mm512_mul_ps(g, xh));
          return _mm512_mul_ps(g, load16(bf, u, r * D + c, k));
        },
        [&](int64_t c, __mmask16 k) { return _mm512_mul_ps(gm(c, k), load16(bf, u, r * D + c, k)); },
        [&](int64_t c, __mmask16 k, __m512 v) { store16(bf, dattn, r * D + c, k, v); });
  }
}

void avx512_dropout(bool bf, const void* x, int64_t r0, int64_t r1, int64_t D, const LayerDropout& drop, void* y) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint64_t base = static_cast<uint64_t>(r) * static_cast<uint64_t>(D);
    for (int64_t c = 0; c < D; c += 16) {
      const __mmask16 k = first_lanes(D - c);
      store16(bf, y, r * D + c, k, _mm512_mul_ps(load16(bf, x, r * D + c, k), dropout16(drop, base + c)));
    }
  }
}

// 32 source rows x 16 columns per step: row pairs interleaved into 32-bit words (word c of pair p
// = (x[2p, c], x[2p + 1, c])), the 16 x 16 words transposed: row c of the result is then the 32
// destination elements dst[c, rb .. rb + 32) in order
void avx512_transpose16(const uint16_t* src, int64_t R, int64_t C, int64_t r0, int64_t r1, uint16_t* dst) {
  for (int64_t rb = r0; rb < r1; rb += 32) {
    const int64_t rows = std::min<int64_t>(32, r1 - rb);
    const __mmask32 out_k = first_halves(rows);
    for (int64_t cb = 0; cb < C; cb += 16) {
      const __mmask16 in_k = first_lanes(C - cb);
      __m512i w[16];
      for (int p = 0; p < 16; ++p) {
        const int64_t ra = rb + 2 * p, rc = ra + 1;
        const __m256i a = ra < rb + rows ? _mm256_maskz_loadu_epi16(in_k, src + ra * C + cb) : _mm256_setzero_si256();
        const __m256i b = rc < rb + rows ? _mm256_maskz_loadu_epi16(in_k, src + rc * C + cb) : _mm256_setzero_si256();
        w[p] = _mm512_or_si512(_mm512_cvtepu16_epi32(a), _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
      }
      transpose16x16_epi32(w);
      const int64_t cols = std::min<int64_t>(16, C - cb);
      for (int64_t c = 0; c < cols; ++c) _mm512_mask_storeu_epi16(dst + (cb + c) * R + rb, out_k, w[c]);
    }
  }
}

void avx512_ln_cast(bool bf, const float* x, int64_t r0, int64_t r1, int64_t D, void* y, float* mean, float* rstd) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * D;
    row_moments(D, [&](int64_t c, __mmask16 k) { return _mm512_maskz_loadu_ps(k, xr + c); }, mean[r], rstd[r]);
    const __m512 mv = _mm512_set1_ps(mean[r]), rv = _mm512_set1_ps(rstd[r]);
    for (int64_t c = 0; c < D; c += 16) {
      const __mmask16 k = first_lanes(D - c);
      store16(bf, y, r * D + c, k, _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, xr + c), mv), rv));
    }
  }
}

void avx512_ln_cast_bwd(bool bf, const void* dy, const float* x, const float* mean, const float* rstd,
                        const float* add, int64_t r0, int64_t r1, int64_t D, float* dx) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * D;
    const __m512 mv = _mm512_set1_ps(mean[r]), rv = _mm512_set1_ps(rstd[r]);
    auto g = [&](int64_t c, __mmask16 k) { return load16(bf, dy, r * D + c, k); };
    auto xh = [&](int64_t c, __mmask16 k) {
      return _mm512_maskz_mul_ps(k, _mm512_sub_ps(_mm512_maskz_loadu_ps(k, xr + c), mv), rv);
    };
    auto first = [&](int64_t c, __mmask16 k, __m512) { return g(c, k); };
    if (add) {
      const float* ar = add + r * D;
      layer_norm_bwd_row(D, rv, xh, first, g, [&](int64_t c, __mmask16 k, __m512 v) {
        _mm512_mask_storeu_ps(dx + r * D + c, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, ar + c), v));
      });
    } else {
      layer_norm_bwd_row(D, rv, xh, first, g,
                         [&](int64_t c, __mmask16 k, __m512 v) { _mm512_mask_storeu_ps(dx + r * D + c, k, v); });
    }
  }
}

void avx512_cast_colsum(bool bf, const float* dy, int64_t r0, int64_t r1, int64_t D, void* out, float* part) {
  for (int64_t c = 0; c < D; c += 16) _mm512_mask_storeu_ps(part + c, first_lanes(D - c), _mm512_setzero_ps());
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = 0; c < D; c += 16) {
      const __mmask16 k = first_lanes(D - c);
      const __m512 v = _mm512_maskz_loadu_ps(k, dy + r * D + c);
      _mm512_mask_storeu_ps(part + c, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, part + c), v));
      store16(bf, out, r * D + c, k, v);
    }
  }
}

}  // namespace detail

namespace detail {
void forward_avx512_f32(const Problem<float>& P, const float* q, const float* k, const float* v, float* out) {
  forward_driver<F32Avx512>(P, q, k, v, out);
}
void backward_avx512_f32(const Problem<float>& P, const float* go, const float* q, const float* k, const float* v,
                         float* dq, float* dk, float* dv, double* dpos, double* dts) {
  backward_driver<F32Avx512>(P, go, q, k, v, dq, dk, dv, dpos, dts);
}
void forward_bf16(bool amx, const Problem<float>& P, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                  bf16_t* out) {
  if (amx && !amx_permitted()) throw std::runtime_error("hstu: the OS refused the AMX tile state");
  if (amx) forward_driver<Bf16Amx>(P, q, k, v, out);
  else forward_driver<Bf16Avx512>(P, q, k, v, out);
}
void backward_bf16(bool amx, const Problem<float>& P, const bf16_t* go, const bf16_t* q, const bf16_t* k,
                   const bf16_t* v, bf16_t* dq, bf16_t* dk, bf16_t* dv, double* dpos, double* dts) {
  if (amx && !amx_permitted()) throw std::runtime_error("hstu: the OS refused the AMX tile state");
  if (amx) backward_driver<Bf16Amx>(P, go, q, k, v, dq, dk, dv, dpos, dts);
  else backward_driver<Bf16Avx512>(P, go, q, k, v, dq, dk, dv, dpos, dts);
}
}  // namespace detail

}  // namespace hstu
}  // namespace torchrec_ascend

#pragma GCC pop_options

#endif  // TRASC_HSTU_X86_ENGINES
