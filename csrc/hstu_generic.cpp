// The HSTU attention engines every CPU runs: BLAS GEMMs (the sgemm_ / dgemm_ that libtorch_cpu
// exports: MKL on x86 wheels) with plain loops for the elementwise work (GCC vectorises them for
// the AVX2 clone picked at load time).  fp32 on CPUs without AVX-512, and fp64 everywhere.
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

  static void bias_rows(int64_t m, int64_t w, const int64_t* lim, const T* pos, int64_t p0, const T* ts_w,
                        const Bucketer* bk, const int64_t* a, const int64_t* bv, T* out, int64_t ld,
                        BucketRuns* /*runs*/) {
    for (int64_t r = 0; r < m; ++r) {
      T* o = out + r * ld;
      const int64_t e = lim ? std::min(lim[r], w) : w;
      if (pos) std::memcpy(o, pos + (p0 - r), e * sizeof(T)); else std::fill(o, o + e, T(0));
      if (ts_w)
        for (int64_t c = 0; c < e; ++c) o[c] += ts_w[(*bk)(a[r] - bv[c])];
    }
  }

  static void table_grads(int64_t m, int64_t w, const T* G, int64_t ld, double* dpos, int64_t p0, double* dts,
                          const Bucketer* bk, const int64_t* a, const int64_t* bv, const BucketRuns* /*runs*/,
                          double scale) {
    for (int64_t r = 0; r < m; ++r) {
      const T* g = G + r * ld;
      for (int64_t c = 0; c < w; ++c) {
        if (g[c] == T(0)) continue;
        const double x = static_cast<double>(g[c]) * scale;
        if (dpos) dpos[p0 + r - c] += x;
        if (dts) dts[(*bk)(a[r] - bv[c])] += x;
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
