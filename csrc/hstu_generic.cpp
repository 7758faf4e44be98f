// The HSTU attention engines every CPU runs: BLAS GEMMs (the sgemm_ / dgemm_ that libtorch_cpu
// exports: MKL on x86 wheels) with plain loops for the elementwise work (GCC vectorises them for
// the AVX2 clone picked at load time), fp64 everywhere and fp32 anywhere; and on x86 CPUs with
// AVX2 + FMA the avx2_fp32 engine (F32Avx2: those loops with FMA register tiles, SiLU and
// transposes of its own, under per-function target attributes).
// Also: the time bucketer, and the dispatch of forward / backward to the engines.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "hstu_driver.h"
#include "hstu_math.h"
#include "isa.h"

namespace torchrec_ascend {
namespace hstu {

// ---------------------------------------------------------------------------------- Bucketer

int64_t Bucketer::formula(int64_t x) {
  return static_cast<int64_t>(std::floor(std::log(static_cast<double>(x)) / kLogBase));
}

Bucketer::Bucketer(int64_t last_bucket) : nb(last_bucket), th(last_bucket + 2) {
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  th[0] = 1;
  for (int64_t k = 1; k <= nb + 1; ++k) {
    const double guess = std::exp(kLogBase * static_cast<double>(k));
    if (guess > 4.0e18) {
      th[k] = kMax;
      continue;
    }
    int64_t x = std::max<int64_t>(1, static_cast<int64_t>(guess));
    while (x > 1 && formula(x - 1) >= k) --x;
    while (formula(x) < k) ++x;
    th[k] = x;
  }
  for (int e = 0; e < 64; ++e) {
    const uint64_t x = uint64_t(1) << e;
    int64_t b = 0;
    while (b < nb && x >= static_cast<uint64_t>(th[b + 1])) ++b;
    lo[e] = b;
  }
}

const char* engine_name(Engine e) {
  switch (e) {
    case Engine::kBlas: return "blas";
    case Engine::kAvx512F32: return "avx512_fp32";
    case Engine::kAvx512Bf16: return "avx512_bf16";
    case Engine::kAmxBf16: return "amx_bf16";
    case Engine::kAvx2F32: return "avx2_fp32";
  }
  return "?";
}

bool engine_usable(Engine e) {
#if defined(TRASC_HSTU_X86_ENGINES)
  const bool avx512 = isa() == Isa::kAvx512 && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  switch (e) {
    case Engine::kBlas: return true;
    case Engine::kAvx512F32: return avx512;
    case Engine::kAvx2F32: return isa() >= Isa::kAvx2;
    case Engine::kAvx512Bf16: return avx512 && __builtin_cpu_supports("avx512bf16");
    case Engine::kAmxBf16:
      return avx512 && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("amx-bf16") &&
             __builtin_cpu_supports("amx-tile") && detail::amx_permitted();
  }
  return false;
#else
  return e == Engine::kBlas;
#endif
}

namespace {

// ---------------------------------------------------------------------------------- BLAS engine

extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
            const int*, const float*, const int*, const float*, float*, const int*) __attribute__((weak));
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*, const double*,
            const int*, const double*, const int*, const double*, double*, const int*) __attribute__((weak));
}

template <typename T>
inline T exp_of(T x) {
  if constexpr (std::is_same_v<T, float>) return exp_f32(x); else return std::exp(x);
}

// The loops below are branch-free where they are hot: a masked element gets scale 0 and every
// factor next to it is finite, so it comes out 0 without a select.  "avx2" is the clone picked
// on AVX2 machines; no-trapping-math lets GCC if-convert the exp clamp.
#define TRA_HSTU_VECTOR __attribute__((target_clones("avx2", "default"), optimize("no-trapping-math")))

TRA_HSTU_VECTOR void silu_row_f32(const float* __restrict s, const float* __restrict bias, float alpha,
                                  int64_t w, float* __restrict p) {
  for (int64_t c = 0; c < w; ++c) {
    const float z = alpha * s[c] + (bias ? bias[c] : 0.0f);
    p[c] = z / (1.0f + exp_f32(-z));
  }
}

// key row r of the backward: p, ds (= dP silu'(z)) for queries c < w, masked by `ok`
TRA_HSTU_VECTOR void silu_bwd_row_f32(const float* __restrict s, const float* __restrict dp,
                                      const float* __restrict bias, const float* __restrict ok, float alpha,
                                      int64_t w, float* __restrict p, float* __restrict ds) {
  for (int64_t c = 0; c < w; ++c) {
    const float z = alpha * s[c] + (bias ? bias[c] : 0.0f);
    const float sig = 1.0f / (1.0f + exp_f32(-z));
    p[c] = z * sig * ok[c];
    ds[c] = dp[c] * ok[c] * sig * (1.0f + z * (1.0f - sig));
  }
}
#undef TRA_HSTU_VECTOR

template <typename T>
struct BlasEngine {
  using in_t = T;
  using acc_t = T;
  static constexpr int64_t kRowPad = 1, kKPad = 1, kNPad = 1;
  static constexpr bool kBSeparate = false;  // dS^T's B layout is its A layout
  static constexpr bool kGroupHeads = false;  // one head per backward task (as the fp32 AVX-512 engine)
  static constexpr double kPartsPerThread = 4.0;
  struct Thread {};

  static int64_t b_ld(int64_t /*K*/, int64_t N) { return N; }
  static int64_t b_size(int64_t K, int64_t N) { return K * N; }
  static const T* b_block(const T* B, int64_t ld, int64_t k0, int64_t n0) { return B + k0 * ld + n0; }
  static T* b_block(T* B, int64_t ld, int64_t k0, int64_t n0) { return B + k0 * ld + n0; }

  // B(k, n) = src[k lds + n] for k < K (rows [K, Kp) zero), n < N
  static void pack_b(const T* src, int64_t lds, int64_t K, int64_t Kp, int64_t N, T* dst, int64_t ld) {
    for (int64_t x = 0; x < K; ++x) std::memcpy(dst + x * ld, src + x * lds, N * sizeof(T));
    if (Kp > K) std::memset(dst + K * ld, 0, (Kp - K) * ld * sizeof(T));
  }
  // B(k, n) = src[n lds + k] for k < K, n < N (columns [N, Np) zero)
  static void pack_bt(const T* src, int64_t lds, int64_t K, int64_t N, int64_t Np, T* dst, int64_t ld) {
    for (int64_t x = 0; x < K; ++x) {
      T* row = dst + x * ld;
      for (int64_t y = 0; y < N; ++y) row[y] = src[y * lds + x];
      for (int64_t y = N; y < Np; ++y) row[y] = T(0);
    }
  }
  static void transpose_rows(const T* src, int64_t lds, int64_t rows, int64_t cols, T* dst, int64_t ldd) {
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < rows; ++r) dst[c * ldd + r] = src[r * lds + c];
  }

  // row-major C[M, N] (+)= A[M, K] B[K, N]
  static void gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb_,
                   T* C, int64_t ldc, bool accumulate) {
    if (M <= 0 || N <= 0) return;
    const T beta = accumulate ? T(1) : T(0), one = T(1);
    constexpr bool is_f = std::is_same_v<T, float>;
    const bool blas = (is_f ? sgemm_ != nullptr : dgemm_ != nullptr) && K > 0 &&
                      std::max({M, N, K, lda, ldb_, ldc}) < (int64_t(1) << 31);
    if (blas) {  // column-major view: C^T = B^T A^T
      const char no = 'N';
      const int m_ = static_cast<int>(N), n_ = static_cast<int>(M), k_ = static_cast<int>(K);
      const int la = static_cast<int>(lda), lb = static_cast<int>(ldb_), lc = static_cast<int>(ldc);
      if constexpr (is_f) sgemm_(&no, &no, &m_, &n_, &k_, &one, B, &lb, A, &la, &beta, C, &lc);
      else dgemm_(&no, &no, &m_, &n_, &k_, &one, B, &lb, A, &la, &beta, C, &lc);
      return;
    }
    for (int64_t i = 0; i < M; ++i) {
      T* c = C + i * ldc;
      if (!accumulate) std::fill(c, c + N, T(0));
      for (int64_t x = 0; x < K; ++x) {
        const T a = A[i * lda + x];
        const T* b = B + x * ldb_;
        for (int64_t j = 0; j < N; ++j) c[j] += a * b[j];
      }
    }
  }

  static void store_rows(int64_t m, int64_t cols, const T* C, int64_t ldc, T scale, T* dst, int64_t ldd) {
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < cols; ++c) dst[r * ldd + c] = C[r * ldc + c] * scale;
  }
  static void store_transposed(int64_t rows, int64_t n, const T* C, int64_t ldc, T scale, T* dst, int64_t ldd) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < rows; ++c) dst[i * ldd + c] = C[c * ldc + i] * scale;
  }

  // runs (the backward's strips): each element's time bucket kept in runs->ids for table_grads
  static void bias_rows(int64_t m, int64_t w, const int64_t* lim, const T* pos, int64_t p0, const T* ts_w,
                        const Bucketer* bk, const int64_t* a, const int64_t* bv, T* out, int64_t ld,
                        BucketRuns* runs) {
    for (int64_t r = 0; r < m; ++r) {
      T* o = out + r * ld;
      const int64_t e = lim ? std::min(lim[r], w) : w;
      if (pos) std::memcpy(o, pos + (p0 - r), e * sizeof(T)); else std::fill(o, o + e, T(0));
      if (ts_w) add_time_bias(o, runs ? runs->ids + r * runs->ld : nullptr, a[r], bv, 0, e, ts_w, *bk);
    }
  }
  // o[c] += ts_w[bucket(a - b[c])] for c in [c0, e), the buckets also into ids (when given)
  static void add_time_bias(T* o, int32_t* ids, int64_t a, const int64_t* b, int64_t c0, int64_t e, const T* ts_w,
                            const Bucketer& bk) {
    for (int64_t c = c0; c < e; ++c) {
      const int64_t id = bk(a - b[c]);
      if (ids) ids[c] = static_cast<int32_t>(id);
      o[c] += ts_w[id];
    }
  }

  // dts's buckets from runs->ids where bias_rows kept them
  static void table_grads(int64_t m, int64_t w, const T* G, int64_t ld, double* dpos, int64_t p0, double* dts,
                          const Bucketer* bk, const int64_t* a, const int64_t* bv, const BucketRuns* runs,
                          double scale) {
    for (int64_t r = 0; r < m; ++r) {
      const T* g = G + r * ld;
      const int32_t* ids = runs ? runs->ids + r * runs->ld : nullptr;
      for (int64_t c = 0; c < w; ++c) {
        if (g[c] == T(0)) continue;
        const double x = static_cast<double>(g[c]) * scale;
        if (dpos) dpos[p0 + r - c] += x;
        if (dts) dts[ids ? ids[c] : (*bk)(a[r] - bv[c])] += x;
      }
    }
  }

  // P = valid * silu(alpha S + bias) for rows r < m, columns c < w (c < full[r] or c == self[r];
  // full == null: all valid); columns [w, wp) zero
  static void silu_fwd(int64_t m, int64_t w, int64_t wp, const T* S, int64_t lds, const T* bias, int64_t ldb_,
                       const int64_t* full, const int64_t* self, T alpha, T* Pm, int64_t ldp) {
    for (int64_t r = 0; r < m; ++r) {
      const T* s = S + r * lds;
      const T* bi = bias ? bias + r * ldb_ : nullptr;
      T* p = Pm + r * ldp;
      if constexpr (std::is_same_v<T, float>) {
        silu_row_f32(s, bi, alpha, w, p);
      } else {
        for (int64_t c = 0; c < w; ++c) {
          const T z = alpha * s[c] + (bi ? bi[c] : T(0));
          p[c] = z / (T(1) + std::exp(-z));
        }
      }
      if (full) {
        for (int64_t c = full[r]; c < w; ++c)
          if (c != self[r]) p[c] = T(0);
      }
      for (int64_t c = w; c < wp; ++c) p[c] = T(0);
    }
  }

  // key rows r < m (key j0 + r), query columns c < w (query i0 + c): valid when j < e[c] or i == j.
  // PA = valid * silu(z), dSA = valid * dP silu'(z) (also into G when given); rows [m, mk) and
  // columns [w, wp) zero.
  static void silu_bwd(int64_t m, int64_t mk, int64_t w, int64_t wp, const T* S, const T* dP, int64_t ld,
                       const T* bias, int64_t ldbias, int64_t j0, int64_t i0, const int64_t* e, T alpha, T* PA,
                       T* dSA, int64_t lda, T* /*dSB: = dSA*/, int64_t /*ldb*/, T* G, int64_t ldg,
                       bool /*g_add: never set without kGroupHeads*/) {
    T ok[kBwdRows];
    for (int64_t r = 0; r < m; ++r) {
      const int64_t j = j0 + r;
      for (int64_t c = 0; c < w; ++c) ok[c] = (j < e[c] || i0 + c == j) ? T(1) : T(0);
      const T* s = S + r * ld;
      const T* dp = dP + r * ld;
      const T* bi = bias ? bias + r * ldbias : nullptr;
      T* p = PA + r * lda;
      T* ds = dSA + r * lda;
      if constexpr (std::is_same_v<T, float>) {
        silu_bwd_row_f32(s, dp, bi, ok, alpha, w, p, ds);
      } else {
        for (int64_t c = 0; c < w; ++c) {
          const T z = alpha * s[c] + (bi ? bi[c] : T(0));
          const T sig = T(1) / (T(1) + std::exp(-z));
          p[c] = z * sig * ok[c];
          ds[c] = dp[c] * ok[c] * sig * (T(1) + z * (T(1) - sig));
        }
      }
      for (int64_t c = w; c < wp; ++c) p[c] = ds[c] = T(0);
      if (G) std::memcpy(G + r * ldg, ds, w * sizeof(T));
    }
    for (int64_t r = m; r < mk; ++r) {
      std::memset(PA + r * lda, 0, wp * sizeof(T));
      std::memset(dSA + r * lda, 0, wp * sizeof(T));
    }
  }
};

#if defined(TRASC_HSTU_X86_ENGINES)
// ---------------------------------------------------------------------------------- AVX2 engine

// fp32 on CPUs with AVX2 + FMA (and without AVX-512, where it is the fast one): the BLAS engine's
// elementwise loops with a register-tiled FMA micro-kernel of its own for the GEMMs.  The
// attention's GEMMs are small (32-64 rows, 32-128 columns and inner dimension): sgemm_ spends
// much of each call packing and dispatching.  B is packed as the AVX-512 fp32 engine packs it
// (rows a multiple of 16 floats, columns zero padded), so every tile reads and writes whole
// 16-column blocks.
#define TRA_HSTU_AVX2 __attribute__((target("avx2,fma")))

struct F32Avx2 : BlasEngine<float> {
  static constexpr int64_t kNPad = 16;
  static constexpr bool kGroupHeads = true;
  // one part of the work per thread: the fewest key ranges (each packs the queries it sees and
  // sums a dQ partial), the sequences left whole even the threads out (eight heads, two threads,
  // backward, benchmark inputs, alternating: 1 / 2 / 4 parts per thread 55.2 / 56.5 / 57.0 ms at
  // max_len 1024, 664.5 / 660.7 / 685.3 ms at 4096, 22.4 / 22.8 / 23.3 ms at 256)
  static constexpr double kPartsPerThread = 1.0;

  // a mask bound as a 32-bit lane value (column and key indices are below 2^31)
  static int32_t lane_bound(int64_t x) {
    return static_cast<int32_t>(x > INT32_MAX ? INT32_MAX : (x < INT32_MIN ? INT32_MIN : x));
  }
  // lanes [0, n) set (n clamped to [0, 8])
  TRA_HSTU_AVX2 static __m256 ok_columns(int64_t n) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(lane_bound(n < 8 ? n : 8)), lane));
  }
  // alpha s + bias for 8 columns; a partial chunk (not `whole`) reads only the lanes of `ok`
  TRA_HSTU_AVX2 static __m256 scores8(const float* s, const float* bias, __m256 alpha, bool whole, __m256i ok) {
    const __m256 sv = whole ? _mm256_loadu_ps(s) : _mm256_maskload_ps(s, ok);
    if (!bias) return _mm256_mul_ps(sv, alpha);
    return _mm256_fmadd_ps(sv, alpha, whole ? _mm256_loadu_ps(bias) : _mm256_maskload_ps(bias, ok));
  }
  // sigmoid(z) = 1 / (1 + exp(-z)) to fp32 accuracy: exp_f32's reduction and polynomial
  // (hstu_math.h), RCP refined by one Newton step
  TRA_HSTU_AVX2 static __m256 sigmoid8(__m256 z) {
    __m256 x = _mm256_sub_ps(_mm256_setzero_ps(), z);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kExpLn2Hi), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kExpLn2Lo), r);
    __m256 p = _mm256_set1_ps(kExpPoly[0]);
#pragma GCC unroll 6
    for (int k = 1; k < 6; ++k) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[k]));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256 scale = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
    const __m256 d = _mm256_fmadd_ps(p, scale, _mm256_set1_ps(1.0f));
    const __m256 y = _mm256_rcp_ps(d);
    return _mm256_mul_ps(y, _mm256_fnmadd_ps(d, y, _mm256_set1_ps(2.0f)));
  }

  // the time buckets of a - b[c .. c + 7] (Bucketer's exact float64 formula, floor(ln|a - b| /
  // 0.301) clamped to [0, nb]): ln in fp32 (|a - b| converted exactly below 2^52, exponent +
  // atanh series, |err| < 1e-6 in ln / 0.301); a lane within 2e-4 of a bucket boundary, or at
  // 2^52 and above, is redone by the scalar bucketer
  TRA_HSTU_AVX2 static __m256i buckets8(int64_t a, const int64_t* b, const Bucketer& bk) {
    const __m256i av = _mm256_set1_epi64x(a), zero = _mm256_setzero_si256(), one = _mm256_set1_epi64x(1);
    const __m256i limit = _mm256_set1_epi64x((int64_t(1) << 52) - 1);
    const __m256i magic = _mm256_set1_epi64x(0x4330000000000000LL);  // 2^52 as a double's bits
    const __m256d two52 = _mm256_set1_pd(4503599627370496.0);
    __m128 half[2];
    int far = 0;  // lanes at 2^52 and above (or |INT64_MIN|): scalar
    for (int hh = 0; hh < 2; ++hh) {
      const __m256i d = _mm256_sub_epi64(av, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 4 * hh)));
      const __m256i ad = _mm256_blendv_epi8(d, _mm256_sub_epi64(zero, d), _mm256_cmpgt_epi64(zero, d));
      const __m256i x = _mm256_blendv_epi8(ad, one, _mm256_cmpgt_epi64(one, ad));  // max(|d|, 1)
      // |d| >= 2^52, or d = INT64_MIN (whose negation stays negative)
      const __m256i big = _mm256_or_si256(_mm256_cmpgt_epi64(x, limit), _mm256_cmpgt_epi64(zero, ad));
      far |= _mm256_movemask_pd(_mm256_castsi256_pd(big)) << (4 * hh);
      const __m256d xd = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(_mm256_and_si256(x, limit), magic)), two52);
      half[hh] = _mm256_cvtpd_ps(xd);
    }
    const __m256 x = _mm256_set_m128(half[1], half[0]);
    // x = 2^e m, m in [sqrt(1/2), sqrt(2)); ln m = 2 atanh(u), u = (m - 1) / (m + 1), |u| < 0.172
    const __m256i xi = _mm256_castps_si256(x);
    __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(xi, 23), _mm256_set1_epi32(127));
    __m256 m = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(xi, _mm256_set1_epi32(0x007FFFFF)),
                                                   _mm256_set1_epi32(0x3F800000)));
    const __m256 hi = _mm256_cmp_ps(m, _mm256_set1_ps(1.41421356f), _CMP_GT_OQ);
    m = _mm256_blendv_ps(m, _mm256_mul_ps(m, _mm256_set1_ps(0.5f)), hi);
    e = _mm256_sub_epi32(e, _mm256_castps_si256(hi));  // hi lanes are -1: e + 1
    const __m256 one_f = _mm256_set1_ps(1.0f);
    const __m256 u = _mm256_div_ps(_mm256_sub_ps(m, one_f), _mm256_add_ps(m, one_f));
    const __m256 u2 = _mm256_mul_ps(u, u);
    __m256 p = _mm256_fmadd_ps(u2, _mm256_set1_ps(2.0f / 9.0f), _mm256_set1_ps(2.0f / 7.0f));
    p = _mm256_fmadd_ps(p, u2, _mm256_set1_ps(2.0f / 5.0f));
    p = _mm256_fmadd_ps(p, u2, _mm256_set1_ps(2.0f / 3.0f));
    p = _mm256_fmadd_ps(p, u2, _mm256_set1_ps(2.0f));
    const __m256 ln = _mm256_fmadd_ps(_mm256_cvtepi32_ps(e), _mm256_set1_ps(0.693147180559945f), _mm256_mul_ps(p, u));
    const __m256 q = _mm256_mul_ps(ln, _mm256_set1_ps(static_cast<float>(1.0 / Bucketer::kLogBase)));
    const __m256 fl = _mm256_floor_ps(q);
    const __m256 frac = _mm256_sub_ps(q, fl);
    const __m256 near = _mm256_or_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(2e-4f), _CMP_LT_OQ),
                                     _mm256_cmp_ps(frac, _mm256_set1_ps(1.0f - 2e-4f), _CMP_GT_OQ));
    __m256i id = _mm256_cvttps_epi32(fl);
    id = _mm256_min_epi32(_mm256_max_epi32(id, _mm256_setzero_si256()), _mm256_set1_epi32(static_cast<int32_t>(bk.nb)));
    const int redo = _mm256_movemask_ps(near) | far;
    if (redo) {
      alignas(32) int32_t ids[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(ids), id);
      for (int l = 0; l < 8; ++l)
        if (redo >> l & 1) ids[l] = static_cast<int32_t>(bk(a - b[l]));
      id = _mm256_load_si256(reinterpret_cast<const __m256i*>(ids));
    }
    return id;
  }

  // out(r, c) = pos[p0 - r + c] + ts_w[bucket(a[r] - b[c])] for c < lim[r] (BlasEngine::bias_rows,
  // the buckets 8 at a time; runs: the buckets kept for table_grads)
  TRA_HSTU_AVX2 static void bias_rows(int64_t m, int64_t w, const int64_t* lim, const float* pos, int64_t p0,
                                      const float* ts_w, const Bucketer* bk, const int64_t* a, const int64_t* bv,
                                      float* out, int64_t ld, BucketRuns* runs) {
    for (int64_t r = 0; r < m; ++r) {
      float* o = out + r * ld;
      const int64_t e = lim ? std::min(lim[r], w) : w;
      if (pos) std::memcpy(o, pos + (p0 - r), e * sizeof(float)); else std::fill(o, o + e, 0.0f);
      if (!ts_w) continue;
      int32_t* ids = runs ? runs->ids + r * runs->ld : nullptr;
      int64_t c = 0;
      for (; c + 8 <= e; c += 8) {
        const __m256i id = buckets8(a[r], bv + c, *bk);
        if (ids) _mm256_storeu_si256(reinterpret_cast<__m256i*>(ids + c), id);
        _mm256_storeu_ps(o + c, _mm256_add_ps(_mm256_loadu_ps(o + c), _mm256_i32gather_ps(ts_w, id, 4)));
      }
      add_time_bias(o, ids, a[r], bv, c, e, ts_w, *bk);
    }
  }

  static int64_t b_ld(int64_t /*K*/, int64_t N) { return padded_f32_b_ld(N); }
  static int64_t b_size(int64_t K, int64_t N) { return K * b_ld(K, N); }

  static void pack_b(const float* src, int64_t lds, int64_t K, int64_t Kp, int64_t N, float* dst, int64_t ld) {
    pack_f32_b_padded(src, lds, K, Kp, N, dst, ld);
  }
  // B(k, n) = src[n lds + k] for k < K, n < N; columns [N, ld) zero
  static void pack_bt(const float* src, int64_t lds, int64_t K, int64_t N, int64_t /*Np*/, float* dst, int64_t ld) {
    transpose_rows(src, lds, N, K, dst, ld);
    for (int64_t x = 0; x < K; ++x) std::memset(dst + x * ld + N, 0, (ld - N) * sizeof(float));
  }
  // dst[c ldd + r] = src[r lds + c], r < rows, c < cols: 8 x 8 blocks in registers (the strided
  // scalar copy was a tenth of the backward), the edges element by element
  TRA_HSTU_AVX2 static void transpose_rows(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                                           int64_t ldd) {
    const int64_t r8 = rows / 8 * 8, c8 = cols / 8 * 8;
    for (int64_t r0 = 0; r0 < r8; r0 += 8)
      for (int64_t c0 = 0; c0 < c8; c0 += 8) transpose8x8(src + r0 * lds + c0, lds, dst + c0 * ldd + r0, ldd);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t c_from = r < r8 ? c8 : 0;
      for (int64_t c = c_from; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
    }
  }
  TRA_HSTU_AVX2 static void transpose8x8(const float* src, int64_t lds, float* dst, int64_t ldd) {
    __m256 r[8], t[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
#pragma GCC unroll 4
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 8; i += 4) {
      r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
      r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
      r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
      r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
      _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
  }

  // C[MR rows, 8 NV columns] (+)= A B over K: MR x NV accumulators, NV loads of B and MR
  // broadcasts of A per step of K
  template <int MR, int NV>
  TRA_HSTU_AVX2 static void tile(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb_, float* C,
                                 int64_t ldc, bool accumulate) {
    __m256 acc[MR][NV];  // from zero, C added at the end: a conditional start keeps GCC from holding
                         // the accumulators in registers only (it stored them every step)
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
    for (int64_t x = 0; x < K; ++x) {
      __m256 bv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) bv[v] = _mm256_loadu_ps(B + x * ldb_ + 8 * v);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256 a = _mm256_broadcast_ss(A + r * lda + x);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(a, bv[v], acc[r][v]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        float* c = C + r * ldc + 8 * v;
        _mm256_storeu_ps(c, accumulate ? _mm256_add_ps(_mm256_loadu_ps(c), acc[r][v]) : acc[r][v]);
      }
  }

  // P = valid * silu(alpha S + bias), 8 columns at a time (the loops of BlasEngine::silu_fwd)
  TRA_HSTU_AVX2 static void silu_fwd(int64_t m, int64_t w, int64_t wp, const float* S, int64_t lds,
                                     const float* bias, int64_t ldbias, const int64_t* full, const int64_t* self,
                                     float alpha, float* Pm, int64_t ldp) {
    const __m256 av = _mm256_set1_ps(alpha);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t r = 0; r < m; ++r) {
      const float* s = S + r * lds;
      const float* bi = bias ? bias + r * ldbias : nullptr;
      const __m256i fullv = _mm256_set1_epi32(full ? lane_bound(full[r]) : 0);
      const __m256i selfv = _mm256_set1_epi32(full ? lane_bound(self[r]) : 0);
      for (int64_t c = 0; c < wp; c += 8) {
        const __m256i col = _mm256_add_epi32(lane, _mm256_set1_epi32(static_cast<int32_t>(c)));
        __m256i ok = _mm256_castps_si256(ok_columns(w - c));
        if (full)
          ok = _mm256_and_si256(ok, _mm256_or_si256(_mm256_cmpgt_epi32(fullv, col), _mm256_cmpeq_epi32(selfv, col)));
        const __m256 z = scores8(s + c, bi ? bi + c : nullptr, av, c + 8 <= w, ok);
        _mm256_storeu_ps(Pm + r * ldp + c, _mm256_and_ps(_mm256_castsi256_ps(ok), _mm256_mul_ps(z, sigmoid8(z))));
      }
    }
  }

  // key rows r < m (key j0 + r), query columns c < w (query i0 + c), valid when j < e[c] or
  // i == j: PA = valid * silu(z), dSA = valid * dP silu'(z) (also into G when given); rows [m, mk)
  // and columns [w, wp) zero (the loops of BlasEngine::silu_bwd)
  TRA_HSTU_AVX2 static void silu_bwd(int64_t m, int64_t mk, int64_t w, int64_t wp, const float* S, const float* dP,
                                     int64_t ld, const float* bias, int64_t ldbias, int64_t j0, int64_t i0,
                                     const int64_t* e, float alpha, float* PA, float* dSA, int64_t lda,
                                     float* /*dSB: = dSA*/, int64_t /*ldb*/, float* G, int64_t ldg, bool g_add) {
    alignas(32) int32_t e32[kBwdRows];
    for (int64_t c = 0; c < wp; ++c) e32[c] = c < w ? lane_bound(e[c]) : INT32_MIN;
    const __m256 av = _mm256_set1_ps(alpha), one = _mm256_set1_ps(1.0f);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t r = 0; r < m; ++r) {
      const __m256i jv = _mm256_set1_epi32(lane_bound(j0 + r));
      const float* bi = bias ? bias + r * ldbias : nullptr;
      for (int64_t c = 0; c < wp; c += 8) {
        const __m256i col = _mm256_add_epi32(lane, _mm256_set1_epi32(static_cast<int32_t>(i0 + c)));
        const __m256i ends = _mm256_load_si256(reinterpret_cast<const __m256i*>(e32 + c));
        const __m256i seen = _mm256_or_si256(_mm256_cmpgt_epi32(ends, jv), _mm256_cmpeq_epi32(col, jv));
        const __m256 live = ok_columns(w - c);
        const __m256 ok = _mm256_and_ps(_mm256_castsi256_ps(seen), live);
        const bool whole = c + 8 <= w;
        const __m256 z = scores8(S + r * ld + c, bi ? bi + c : nullptr, av, whole, _mm256_castps_si256(ok));
        const __m256 sg = sigmoid8(z);
        const __m256 dp = _mm256_loadu_ps(dP + r * ld + c);
        const __m256 p = _mm256_and_ps(ok, _mm256_mul_ps(z, sg));
        const __m256 ds = _mm256_and_ps(ok, _mm256_mul_ps(_mm256_mul_ps(dp, sg),
                                                          _mm256_fmadd_ps(z, _mm256_sub_ps(one, sg), one)));
        _mm256_storeu_ps(PA + r * lda + c, p);
        _mm256_storeu_ps(dSA + r * lda + c, ds);
        if (G) {
          float* g = G + r * ldg + c;
          const __m256i cols = _mm256_castps_si256(live);
          const __m256 gs = g_add ? _mm256_add_ps(whole ? _mm256_loadu_ps(g) : _mm256_maskload_ps(g, cols), ds) : ds;
          if (whole) _mm256_storeu_ps(g, gs);
          else _mm256_maskstore_ps(g, cols, gs);
        }
      }
    }
    for (int64_t r = m; r < mk; ++r) {
      std::memset(PA + r * lda, 0, wp * sizeof(float));
      std::memset(dSA + r * lda, 0, wp * sizeof(float));
    }
  }

  // row-major C[M, N] (+)= A[M, K] B[K, N], N padded to 16 (whole 16-column blocks written)
  TRA_HSTU_AVX2 static void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                                 int64_t ldb_, float* C, int64_t ldc, bool accumulate) {
    // rows in tiles of 6 and 5 (12 and 10 accumulators: enough independent FMAs to cover their
    // latency) wherever M allows, the 32 / 64 rows of the driver's blocks included; a smaller
    // remainder tile would wait on its few accumulators
    int64_t fives = (6 - M % 6) % 6;
    if (5 * fives > M) fives = 0;
    const int64_t m6 = M - 5 * fives;
    for (int64_t n0 = 0; n0 < N; n0 += 16) {
      const float* Bn = B + n0;
      int64_t m0 = 0;
      for (; m0 + 6 <= m6; m0 += 6) tile<6, 2>(K, A + m0 * lda, lda, Bn, ldb_, C + m0 * ldc + n0, ldc, accumulate);
      for (int64_t f = 0; f < fives; ++f, m0 += 5)  // m6 is a multiple of 6: these end at M
        tile<5, 2>(K, A + m0 * lda, lda, Bn, ldb_, C + m0 * ldc + n0, ldc, accumulate);
      const float* At = A + m0 * lda;
      float* Ct = C + m0 * ldc + n0;
      switch (M - m0) {
        case 1: tile<1, 2>(K, At, lda, Bn, ldb_, Ct, ldc, accumulate); break;
        case 2: tile<2, 2>(K, At, lda, Bn, ldb_, Ct, ldc, accumulate); break;
        case 3: tile<3, 2>(K, At, lda, Bn, ldb_, Ct, ldc, accumulate); break;
        case 4: tile<4, 2>(K, At, lda, Bn, ldb_, Ct, ldc, accumulate); break;
        default: break;  // 0 (a remainder of 5 is one of the fives: M % 6 == 5 gives fives == 1)
      }
    }
  }
};
#undef TRA_HSTU_AVX2
#endif  // TRASC_HSTU_X86_ENGINES

}  // namespace

namespace detail {
void forward_blas(const Problem<float>& P, const float* q, const float* k, const float* v, float* out) {
  forward_driver<BlasEngine<float>>(P, q, k, v, out);
}
void forward_blas(const Problem<double>& P, const double* q, const double* k, const double* v, double* out) {
  forward_driver<BlasEngine<double>>(P, q, k, v, out);
}
void backward_blas(const Problem<float>& P, const float* go, const float* q, const float* k, const float* v,
                   float* dq, float* dk, float* dv, double* dpos, double* dts) {
  backward_driver<BlasEngine<float>>(P, go, q, k, v, dq, dk, dv, dpos, dts);
}
#if defined(TRASC_HSTU_X86_ENGINES)
void forward_avx2_f32(const Problem<float>& P, const float* q, const float* k, const float* v, float* out) {
  forward_driver<F32Avx2>(P, q, k, v, out);
}
void backward_avx2_f32(const Problem<float>& P, const float* go, const float* q, const float* k, const float* v,
                       float* dq, float* dk, float* dv, double* dpos, double* dts) {
  backward_driver<F32Avx2>(P, go, q, k, v, dq, dk, dv, dpos, dts);
}
#endif
void backward_blas(const Problem<double>& P, const double* go, const double* q, const double* k,
                   const double* v, double* dq, double* dk, double* dv, double* dpos, double* dts) {
  backward_driver<BlasEngine<double>>(P, go, q, k, v, dq, dk, dv, dpos, dts);
}
}  // namespace detail

// ---------------------------------------------------------------------------------- dispatch

void forward(Engine e, const Problem<float>& P, const void* q, const void* k, const void* v, void* out) {
  switch (e) {
    case Engine::kBlas:
      detail::forward_blas(P, static_cast<const float*>(q), static_cast<const float*>(k),
                           static_cast<const float*>(v), static_cast<float*>(out));
      return;
#if defined(TRASC_HSTU_X86_ENGINES)
    case Engine::kAvx512F32:
      detail::forward_avx512_f32(P, static_cast<const float*>(q), static_cast<const float*>(k),
                                 static_cast<const float*>(v), static_cast<float*>(out));
      return;
    case Engine::kAvx2F32:
      detail::forward_avx2_f32(P, static_cast<const float*>(q), static_cast<const float*>(k),
                               static_cast<const float*>(v), static_cast<float*>(out));
      return;
    case Engine::kAvx512Bf16:
    case Engine::kAmxBf16:
      detail::forward_bf16(e == Engine::kAmxBf16, P, static_cast<const bf16_t*>(q), static_cast<const bf16_t*>(k),
                           static_cast<const bf16_t*>(v), static_cast<bf16_t*>(out));
      return;
#endif
    default: break;
  }
  throw std::invalid_argument(std::string("hstu: engine ") + engine_name(e) + " is not built here");
}

void forward(Engine e, const Problem<double>& P, const double* q, const double* k, const double* v, double* out) {
  if (e != Engine::kBlas) throw std::invalid_argument("hstu: float64 runs on the blas engine only");
  detail::forward_blas(P, q, k, v, out);
}

void backward(Engine e, const Problem<float>& P, const void* go, const void* q, const void* k, const void* v,
              void* dq, void* dk, void* dv, double* dpos, double* dts) {
  switch (e) {
    case Engine::kBlas:
      detail::backward_blas(P, static_cast<const float*>(go), static_cast<const float*>(q),
                            static_cast<const float*>(k), static_cast<const float*>(v), static_cast<float*>(dq),
                            static_cast<float*>(dk), static_cast<float*>(dv), dpos, dts);
      return;
#if defined(TRASC_HSTU_X86_ENGINES)
    case Engine::kAvx512F32:
      detail::backward_avx512_f32(P, static_cast<const float*>(go), static_cast<const float*>(q),
                                  static_cast<const float*>(k), static_cast<const float*>(v),
                                  static_cast<float*>(dq), static_cast<float*>(dk), static_cast<float*>(dv), dpos,
                                  dts);
      return;
    case Engine::kAvx2F32:
      detail::backward_avx2_f32(P, static_cast<const float*>(go), static_cast<const float*>(q),
                                static_cast<const float*>(k), static_cast<const float*>(v), static_cast<float*>(dq),
                                static_cast<float*>(dk), static_cast<float*>(dv), dpos, dts);
      return;
    case Engine::kAvx512Bf16:
    case Engine::kAmxBf16:
      detail::backward_bf16(e == Engine::kAmxBf16, P, static_cast<const bf16_t*>(go), static_cast<const bf16_t*>(q),
                            static_cast<const bf16_t*>(k), static_cast<const bf16_t*>(v), static_cast<bf16_t*>(dq),
                            static_cast<bf16_t*>(dk), static_cast<bf16_t*>(dv), dpos, dts);
      return;
#endif
    default: break;
  }
  throw std::invalid_argument(std::string("hstu: engine ") + engine_name(e) + " is not built here");
}

void backward(Engine e, const Problem<double>& P, const double* go, const double* q, const double* k,
              const double* v, double* dq, double* dk, double* dv, double* dpos, double* dts) {
  if (e != Engine::kBlas) throw std::invalid_argument("hstu: float64 runs on the blas engine only");
  detail::backward_blas(P, go, q, k, v, dq, dk, dv, dpos, dts);
}

}  // namespace hstu
}  // namespace torchrec_ascend
