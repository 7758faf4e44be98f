// Fused jagged HSTU attention on CPU (torchrec_ascend::hstu_mha forward and backward).
//
// No padded tensor: each sequence is processed in place inside the jagged [T, H, d] inputs.
// Forward: OpenMP over (sequence, query tile); per task the relative bias and the mask of the
// tile are computed once and shared by all heads, then per head S = Q K^T (tile rows x visible
// keys only: causal tile skipping), P = silu(alpha S + bias) / N * valid, O = P V.
// Backward: OpenMP over sequences (dq, dk, dv of a sequence are written by one thread only), key
// tiles inside, rows restricted to the ones that can see the tile; the bias tables' gradients go
// to per-thread buffers that are reduced at the end.
// Matrix products go through at::mm_out / addmm_ on strided views (MKL / the torch BLAS, single
// threaded inside the OpenMP region); elementwise work is plain loops.
// Work and memory follow sum_b n_b^2 (plus one diagonal tile per row tile), never B * N_max^2.
#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <limits>
#include <numeric>
#include <tuple>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "torchrec_ascend.h"

namespace torchrec_ascend {

namespace {

constexpr int64_t kTile = 64;           // query rows per forward task, keys per backward tile
constexpr double kLogBase = 0.301;      // bucket = floor(ln(max(|dt|, 1)) / 0.301)

// Exact time bucketing without a log per pair: thresholds th[k] = smallest x >= 1 with
// floor(ln(x) / 0.301) >= k (computed with the float64 formula itself), lo[e] = bucket(2^e).
struct Bucketer {
  int64_t nb = 0;
  std::vector<int64_t> th;
  int64_t lo[64];

  static int64_t formula(int64_t x) {
    return static_cast<int64_t>(std::floor(std::log(static_cast<double>(x)) / kLogBase));
  }

  explicit Bucketer(int64_t num_buckets) : nb(num_buckets), th(num_buckets + 2) {
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

  inline int64_t operator()(int64_t dt) const {
    uint64_t x = dt < 0 ? uint64_t(0) - static_cast<uint64_t>(dt) : static_cast<uint64_t>(dt);
    if (x < 1) x = 1;
    int64_t b = lo[63 - __builtin_clzll(x)];
    while (b < nb && x >= static_cast<uint64_t>(th[b + 1])) ++b;
    return b;
  }
};

// ---------------------------------------------------------------------------------------------
// Small GEMMs straight into BLAS.  The forward/backward tiles are small (<= 64 x n x d), where
// at::mm_out's dispatcher, checks and tensor creation cost as much as the product itself; the
// Fortran BLAS that libtorch_cpu exports (MKL on x86 wheels) is called directly.  The symbols are
// weak: where a torch build does not export them the tensor path below runs instead.
extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
            const int*, const float*, const int*, const float*, float*, const int*) __attribute__((weak));
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*, const double*,
            const int*, const double*, const int*, const double*, double*, const int*) __attribute__((weak));
}

// Row-major C[m, n] (row stride ldc) = alpha * op(A) op(B) + beta * C, op(X) = X or X^T (ta, tb);
// A is stored [m, k] (or [k, m] when ta), B [k, n] (or [n, k] when tb), rows ld* apart.
// beta == 0 ignores C's old values (NaN included).
template <typename scalar_t>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, scalar_t alpha, const scalar_t* A,
          int64_t lda, const scalar_t* B, int64_t ldb, scalar_t beta, scalar_t* C, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  constexpr bool is_f = std::is_same_v<scalar_t, float>;
  const bool blas = (is_f ? sgemm_ != nullptr : dgemm_ != nullptr) && k > 0 && lda > 0 && ldb > 0 &&
                    std::max({m, n, k, lda, ldb, ldc}) < (int64_t(1) << 31);
  if (blas) {
    // column-major view: C^T = op(B)^T op(A)^T, every row-major operand is its own transpose
    const char cb = tb ? 'T' : 'N', ca = ta ? 'T' : 'N';
    const int M = static_cast<int>(n), N = static_cast<int>(m), K = static_cast<int>(k);
    const int la = static_cast<int>(lda), lb = static_cast<int>(ldb), lc = static_cast<int>(ldc);
    if constexpr (is_f) {
      sgemm_(&cb, &ca, &M, &N, &K, &alpha, B, &lb, A, &la, &beta, C, &lc);
    } else {
      dgemm_(&cb, &ca, &M, &N, &K, &alpha, B, &lb, A, &la, &beta, C, &lc);
    }
    return;
  }
  const auto opt = at::TensorOptions().dtype(c10::CppTypeToScalarType<scalar_t>::value);
  auto mat = [&](const scalar_t* p, int64_t r, int64_t c, int64_t ld, bool t) {
    at::Tensor x = at::from_blob(const_cast<scalar_t*>(p), {t ? c : r, t ? r : c}, {ld, 1}, opt);
    return t ? x.t() : x;
  };
  at::Tensor Cv = at::from_blob(C, {m, n}, {ldc, 1}, opt);
  if (k == 0) {
    if (beta == scalar_t(0)) Cv.zero_(); else Cv.mul_(beta);
    return;
  }
  Cv.addmm_(mat(A, m, k, lda, ta), mat(B, k, n, ldb, tb), beta, alpha);
}

// ---------------------------------------------------------------------------------------------
// Elementwise SiLU steps, vectorised for fp32: exp(x) by range reduction (x = n ln2 + r, |r| <=
// ln2 / 2) and a degree-6 polynomial (~1 ulp, Cephes' expf coefficients), plain loops that GCC
// vectorises (8-wide in the AVX2 clone picked at load time; the extension is built for the
// baseline ISA).  fp64 keeps std::exp.
__attribute__((always_inline)) inline float exp_f32(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);  // no std::min/max: they would not inline into the clone
  // round to nearest by the 1.5 * 2^23 trick (|x log2 e| < 2^22; vectorises, unlike nearbyintf)
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// The loops are branch-free: a masked element has scale 0, and every factor next to it is finite
// (1 + exp(-z) lies in [1, 1 + e^87]), so it comes out as 0 without a select.  no-trapping-math
// lets GCC if-convert exp_f32's clamp; "avx2" is the clone picked on AVX2 machines.
#define TRA_SILU_VECTOR __attribute__((target_clones("avx2", "default"), optimize("no-trapping-math")))

// forward: s <- silu(alpha s + bias) * scale   (scale = valid / N)
TRA_SILU_VECTOR
void silu_fwd_f32(float* __restrict s, const float* __restrict bias, const float* __restrict scale,
                  float alpha, int64_t e) {
  for (int64_t x = 0; x < e; ++x) {
    const float z = alpha * s[x] + bias[x];
    s[x] = z * scale[x] / (1.0f + exp_f32(-z));
  }
}

// backward: p <- silu(z) * scale, d <- dP silu'(z) * scale, gsum += d   (z = alpha s + bias)
TRA_SILU_VECTOR
void silu_bwd_f32(const float* __restrict s, const float* __restrict bias, const float* __restrict scale,
                  float alpha, int64_t e, float* __restrict p, float* __restrict d, float* __restrict gsum) {
  for (int64_t x = 0; x < e; ++x) {
    const float z = alpha * s[x] + bias[x];
    const float sig = 1.0f / (1.0f + exp_f32(-z));
    p[x] = z * sig * scale[x];
    const float dv = d[x] * scale[x] * sig * (1.0f + z * (1.0f - sig));
    d[x] = dv;
    gsum[x] += dv;
  }
}
#undef TRA_SILU_VECTOR

template <typename scalar_t>
void silu_fwd(scalar_t* s, const scalar_t* bias, const scalar_t* scale, scalar_t alpha, int64_t e) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    silu_fwd_f32(s, bias, scale, alpha, e);
  } else {
    for (int64_t x = 0; x < e; ++x) {
      const scalar_t z = alpha * s[x] + bias[x];
      s[x] = scale[x] == scalar_t(0) ? scalar_t(0) : z / (scalar_t(1) + std::exp(-z)) * scale[x];
    }
  }
}

template <typename scalar_t>
void silu_bwd(const scalar_t* s, const scalar_t* bias, const scalar_t* scale, scalar_t alpha, int64_t e,
              scalar_t* p, scalar_t* d, scalar_t* gsum) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    silu_bwd_f32(s, bias, scale, alpha, e, p, d, gsum);
  } else {
    for (int64_t x = 0; x < e; ++x) {
      if (scale[x] == scalar_t(0)) {
        p[x] = 0;
        d[x] = 0;
        continue;
      }
      const scalar_t z = alpha * s[x] + bias[x];
      const scalar_t sig = scalar_t(1) / (scalar_t(1) + std::exp(-z));
      p[x] = z * sig * scale[x];
      d[x] = d[x] * scale[x] * sig * (scalar_t(1) + z * (scalar_t(1) - sig));
      gsum[x] += d[x];
    }
  }
}

// Everything a task needs about the batch, raw pointers only (no tensor ops on shared state).
template <typename scalar_t>
struct Problem {
  int64_t B, H, dqk, dv, max_seq_len, ctx;
  double alpha;
  bool by_len;
  std::vector<int64_t> off, nt;
  const int64_t* ts = nullptr;
  const scalar_t* pos_w = nullptr;
  const scalar_t* ts_w = nullptr;
  int64_t npos = 0, nts = 0;
  const Bucketer* bucketer = nullptr;

  int64_t len(int64_t b) const { return off[b + 1] - off[b]; }

  // generative-recommenders' clamped ids: contextual prefix -> 0, every target -> one id
  static inline int64_t id(int64_t p, int64_t c, int64_t cap) {
    return std::min(std::max<int64_t>(p - c + 1, 0), cap);
  }
  inline bool valid(int64_t i, int64_t j, int64_t n, int64_t ntb) const {
    if (i == j) return true;
    const int64_t cap = n - ctx + 1 - ntb;
    const int64_t ri = id(i, ctx, cap), rj = id(j, ctx, cap);
    return ri > rj || (ctx > 0 && ri == 0 && rj < cap);
  }
  // visible key range [0, kend) of query rows [i0, i1)
  int64_t key_end(int64_t i0, int64_t i1, int64_t n) const { return i0 < ctx ? n : std::min(i1, n); }

  // bias[r * w + c] = rab(i0 + r, j0 + c); scale[...] = valid / N (0 where masked);
  // row_end[r] = 1 + the last valid column of row r (0 if none): the elementwise work stops there
  void tile(int64_t b, int64_t i0, int64_t m, int64_t j0, int64_t w, scalar_t* bias,
            scalar_t* scale, int64_t* row_end) const {
    const int64_t n = len(b), s0 = off[b], ntb = nt.empty() ? 0 : nt[b];
    const scalar_t inv = scalar_t(1) / static_cast<scalar_t>(by_len ? std::max<int64_t>(n, 1) : max_seq_len);
    for (int64_t r = 0; r < m; ++r) {
      const int64_t i = i0 + r;
      const int64_t tq = ts ? ts[s0 + std::min(i + 1, n - 1)] : 0;
      scalar_t* brow = bias + r * w;
      scalar_t* srow = scale + r * w;
      if (pos_w) {
        const scalar_t* prow = pos_w + (max_seq_len - 1 + j0 - i);  // pos_w[msl - 1 + j - i], j = j0 + c
        std::copy(prow, prow + w, brow);
      } else {
        std::fill(brow, brow + w, scalar_t(0));
      }
      if (ts_w) {
        const int64_t* tk = ts + s0 + j0;
        for (int64_t c = 0; c < w; ++c) brow[c] += ts_w[(*bucketer)(tq - tk[c])];
      }
      int64_t last = 0;
      if (ntb == 0 && ctx == 0) {  // plain causal: columns j0 + c <= i
        last = std::min<int64_t>(std::max<int64_t>(i - j0 + 1, 0), w);
        std::fill(srow, srow + last, inv);
        std::fill(srow + last, srow + w, scalar_t(0));
      } else {
        for (int64_t c = 0; c < w; ++c) {
          const bool ok = valid(i, j0 + c, n, ntb);
          srow[c] = ok ? inv : scalar_t(0);
          if (ok) last = c + 1;
        }
      }
      row_end[r] = last;
    }
  }

  // table gradients of one tile: dpos[...] += g, dts[...] += g for every valid pair
  void tile_grad(int64_t b, int64_t i0, int64_t m, int64_t j0, int64_t w, const scalar_t* g,
                 const scalar_t* scale, double* dpos, double* dts) const {
    const int64_t n = len(b), s0 = off[b];
    for (int64_t r = 0; r < m; ++r) {
      const int64_t i = i0 + r;
      const int64_t tq = ts ? ts[s0 + std::min(i + 1, n - 1)] : 0;
      for (int64_t c = 0; c < w; ++c) {
        if (scale[r * w + c] == scalar_t(0)) continue;
        const double gv = g[r * w + c];
        const int64_t j = j0 + c;
        if (pos_w) dpos[max_seq_len - 1 + j - i] += gv;
        if (ts_w) dts[(*bucketer)(tq - ts[s0 + j])] += gv;
      }
    }
  }
};

// rows [r0, r1) of a [T, row] buffer = 0
template <typename scalar_t>
void zero_rows(scalar_t* base, int64_t r0, int64_t r1, int64_t row) {
  if (r1 > r0) std::fill(base + r0 * row, base + r1 * row, scalar_t(0));
}

// (sequence, query tile) tasks of the forward, most work first: dynamic scheduling then balances
// the heavy tail
struct Task { int64_t b, i0, cost; };

template <typename ProblemT>
std::vector<Task> query_tiles(const ProblemT& P, int64_t tile) {
  std::vector<Task> tasks;
  for (int64_t b = 0; b < P.B; ++b) {
    const int64_t n = P.len(b);
    for (int64_t i0 = 0; i0 < n; i0 += tile) {
      const int64_t i1 = std::min(i0 + tile, n);
      tasks.push_back({b, i0, (i1 - i0) * P.key_end(i0, i1, n)});
    }
  }
  return tasks;
}

// the backward's order: sequences by length, longest first
template <typename ProblemT>
std::vector<int64_t> longest_first(const ProblemT& P) {
  std::vector<int64_t> order(P.B);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return P.len(a) > P.len(b); });
  return order;
}

inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

inline int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// per-thread float64 accumulators of the bias tables' gradients, summed into dpos / dts at the end
struct TableGrads {
  int nthreads;
  int64_t npos, nts;
  std::vector<double> pos, ts;

  template <typename ProblemT>
  explicit TableGrads(const ProblemT& P)
      : nthreads(max_threads()), npos(P.pos_w ? P.npos : 0), nts(P.ts_w ? P.nts : 0),
        pos(nthreads * npos, 0.0), ts(nthreads * nts, 0.0) {}
  double* pos_of(int tid) { return npos ? pos.data() + tid * npos : nullptr; }
  double* ts_of(int tid) { return nts ? ts.data() + tid * nts : nullptr; }
  void reduce(std::vector<double>& dpos, std::vector<double>& dts) const {
    for (int t = 0; t < nthreads; ++t) {
      for (int64_t i = 0; i < npos; ++i) dpos[i] += pos[t * npos + i];
      for (int64_t i = 0; i < nts; ++i) dts[i] += ts[t * nts + i];
    }
  }
};

template <typename scalar_t>
void forward_impl(const Problem<scalar_t>& P, scalar_t* q, scalar_t* k, scalar_t* v, scalar_t* out) {
  const std::vector<Task> tasks = query_tiles(P, kTile);
  const int64_t ntask = static_cast<int64_t>(tasks.size());
#pragma omp parallel
  {
    std::vector<scalar_t> bias, scale, sbuf;
    std::vector<int64_t> row_end;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < ntask; ++t) {
      const int64_t b = tasks[t].b, i0 = tasks[t].i0, n = P.len(b), s0 = P.off[b];
      const int64_t i1 = std::min(i0 + kTile, n), m = i1 - i0, kend = P.key_end(i0, i1, n);
      bias.resize(m * kend);
      scale.resize(m * kend);
      sbuf.resize(m * kend);
      row_end.resize(m);
      P.tile(b, i0, m, 0, kend, bias.data(), scale.data(), row_end.data());
      const scalar_t alpha = static_cast<scalar_t>(P.alpha);
      const int64_t ldq = P.H * P.dqk, ldv = P.H * P.dv;
      for (int64_t h = 0; h < P.H; ++h) {
        // S = Q_tile K^T, P = silu(alpha S + bias) * valid / N, O_tile = P V
        gemm<scalar_t>(false, true, m, kend, P.dqk, 1, q + (s0 + i0) * ldq + h * P.dqk, ldq,
                       k + s0 * ldq + h * P.dqk, ldq, 0, sbuf.data(), kend);
        for (int64_t r = 0; r < m; ++r) {
          scalar_t* srow = sbuf.data() + r * kend;
          silu_fwd<scalar_t>(srow, bias.data() + r * kend, scale.data() + r * kend, alpha, row_end[r]);
          std::fill(srow + row_end[r], srow + kend, scalar_t(0));  // masked tail (causal diagonal)
        }
        gemm<scalar_t>(false, false, m, P.dv, kend, 1, sbuf.data(), kend, v + s0 * ldv + h * P.dv, ldv,
                       0, out + (s0 + i0) * ldv + h * P.dv, ldv);
      }
    }
  }
}

template <typename scalar_t>
void backward_impl(const Problem<scalar_t>& P, scalar_t* go, scalar_t* q, scalar_t* k, scalar_t* v,
                   scalar_t* dq, scalar_t* dk, scalar_t* dv, std::vector<double>& dpos,
                   std::vector<double>& dts) {
  const std::vector<int64_t> order = longest_first(P);
  TableGrads grads(P);
  const scalar_t alpha = static_cast<scalar_t>(P.alpha);
  const int64_t ldq = P.H * P.dqk, ldv = P.H * P.dv;
#pragma omp parallel num_threads(grads.nthreads)
  {
    double* my_dpos = grads.pos_of(thread_id());
    double* my_dts = grads.ts_of(thread_id());
    std::vector<scalar_t> bias, scale, sb, pb, dpb, gsum;
    std::vector<int64_t> row_end;
#pragma omp for schedule(dynamic, 1)
    for (int64_t oi = 0; oi < P.B; ++oi) {
      const int64_t b = order[oi], n = P.len(b), s0 = P.off[b];
      // this task owns rows [s0, s0 + n) of dq, dk, dv: zero them, then accumulate
      zero_rows(dq, s0, s0 + n, P.H * P.dqk);
      zero_rows(dk, s0, s0 + n, P.H * P.dqk);
      zero_rows(dv, s0, s0 + n, P.H * P.dv);
      for (int64_t j0 = 0; j0 < n; j0 += kTile) {
        const int64_t w = std::min(kTile, n - j0);
        // rows that can see keys [j0, j0 + w): the contextual prefix and rows >= j0
        const int64_t ranges[2][2] = {{0, std::min(P.ctx, j0)}, {j0, n}};
        for (const auto& rg : ranges) {
          const int64_t r0 = rg[0], m = std::min(rg[1], n) - rg[0];
          if (m <= 0) continue;
          const int64_t e = m * w;
          bias.resize(e); scale.resize(e); sb.resize(e); pb.resize(e); dpb.resize(e);
          gsum.assign(e, scalar_t(0));
          row_end.resize(m);
          P.tile(b, r0, m, j0, w, bias.data(), scale.data(), row_end.data());
          for (int64_t h = 0; h < P.H; ++h) {
            const scalar_t* qh = q + (s0 + r0) * ldq + h * P.dqk;
            const scalar_t* kh = k + (s0 + j0) * ldq + h * P.dqk;
            const scalar_t* vh = v + (s0 + j0) * ldv + h * P.dv;
            const scalar_t* goh = go + (s0 + r0) * ldv + h * P.dv;
            gemm<scalar_t>(false, true, m, w, P.dqk, 1, qh, ldq, kh, ldq, 0, sb.data(), w);     // S = Q K^T
            gemm<scalar_t>(false, true, m, w, P.dv, 1, goh, ldv, vh, ldv, 0, dpb.data(), w);   // dP = dO V^T
            for (int64_t r = 0; r < m; ++r) {
              const int64_t o = r * w, len = row_end[r];
              silu_bwd<scalar_t>(sb.data() + o, bias.data() + o, scale.data() + o, alpha, len, pb.data() + o,
                                 dpb.data() + o, gsum.data() + o);
              std::fill(pb.data() + o + len, pb.data() + o + w, scalar_t(0));  // masked tail
              std::fill(dpb.data() + o + len, dpb.data() + o + w, scalar_t(0));
            }
            gemm<scalar_t>(true, false, w, P.dv, m, 1, pb.data(), w, goh, ldv, 1,                // dv += P^T dO
                           dv + (s0 + j0) * ldv + h * P.dv, ldv);
            gemm<scalar_t>(true, false, w, P.dqk, m, alpha, dpb.data(), w, qh, ldq, 1,           // dk += a dS^T Q
                           dk + (s0 + j0) * ldq + h * P.dqk, ldq);
            gemm<scalar_t>(false, false, m, P.dqk, w, alpha, dpb.data(), w, kh, ldq, 1,          // dq += a dS K
                           dq + (s0 + r0) * ldq + h * P.dqk, ldq);
          }
          if (P.pos_w || P.ts_w) P.tile_grad(b, r0, m, j0, w, gsum.data(), scale.data(), my_dpos, my_dts);
        }
      }
    }
  }
  grads.reduce(dpos, dts);
}

// ---------------------------------------------------------------------------------------------
// bfloat16 path: q, k, v, dO stay bf16 and every matrix product is a bf16 GEMM (oneDNN through
// at::mm_out: AVX512-BF16 / AMX where the CPU has them) with fp32 accumulation inside the GEMM and
// one rounding of its output; SiLU and its derivative run in fp32.  It is used only where bf16
// GEMM was measured faster than fp32 (torchrec_ascend.device, which sets the switch below through
// hstu_set_bf16_gemm); otherwise bf16 inputs are widened and computed in fp32.
// Tiles are larger than fp32's (bf16 GEMM needs bigger products to reach its rate), and the
// backward runs per key tile over *all* rows that see it, so dk and dv of a tile come from one
// product each; dq is accumulated over key tiles in an fp32 buffer.
using bf16 = c10::BFloat16;
std::atomic<bool> g_bf16_gemm{false};
constexpr int64_t kTileBf16 = 128;

inline at::Tensor bview(const bf16* p, int64_t rows, int64_t cols, int64_t ld) {
  return at::from_blob(const_cast<bf16*>(p), {rows, cols}, {ld, 1}, at::TensorOptions().dtype(at::kBFloat16));
}

// C [m, n] (contiguous scratch) = A B, bf16 operands (views), bf16 output
inline void mm_bf16(bf16* C, int64_t m, int64_t n, const at::Tensor& A, const at::Tensor& B) {
  if (m <= 0 || n <= 0) return;
  at::Tensor Cv = at::from_blob(C, {m, n}, at::TensorOptions().dtype(at::kBFloat16));
  at::mm_out(Cv, A, B);
}

inline void to_f32(const bf16* __restrict x, float* __restrict y, int64_t e) {
  for (int64_t i = 0; i < e; ++i) y[i] = static_cast<float>(x[i]);
}
inline void to_bf16(const float* __restrict x, bf16* __restrict y, int64_t e, float mul = 1.0f) {
  for (int64_t i = 0; i < e; ++i) y[i] = static_cast<bf16>(x[i] * mul);
}
// rows [0, m) of a [m, cols] contiguous buffer -> rows of a strided [*, ld] destination
inline void put_rows(const bf16* src, int64_t m, int64_t cols, bf16* dst, int64_t ld) {
  for (int64_t r = 0; r < m; ++r) std::copy(src + r * cols, src + (r + 1) * cols, dst + r * ld);
}

void forward_bf16(const Problem<float>& P, const bf16* q, const bf16* k, const bf16* v, bf16* out) {
  const std::vector<Task> tasks = query_tiles(P, kTileBf16);
  const int64_t ntask = static_cast<int64_t>(tasks.size());
  const int64_t ldq = P.H * P.dqk, ldv = P.H * P.dv;
  const float alpha = static_cast<float>(P.alpha);
#pragma omp parallel
  {
    std::vector<float> bias, scale, sf;
    std::vector<bf16> sb, ob;
    std::vector<int64_t> row_end;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < ntask; ++t) {
      const int64_t b = tasks[t].b, i0 = tasks[t].i0, n = P.len(b), s0 = P.off[b];
      const int64_t i1 = std::min(i0 + kTileBf16, n), m = i1 - i0, kend = P.key_end(i0, i1, n), e = m * kend;
      bias.resize(e); scale.resize(e); sf.resize(e); sb.resize(e); ob.resize(m * P.dv); row_end.resize(m);
      P.tile(b, i0, m, 0, kend, bias.data(), scale.data(), row_end.data());
      for (int64_t h = 0; h < P.H; ++h) {
        mm_bf16(sb.data(), m, kend, bview(q + (s0 + i0) * ldq + h * P.dqk, m, P.dqk, ldq),
                bview(k + s0 * ldq + h * P.dqk, kend, P.dqk, ldq).t());              // S = Q K^T
        to_f32(sb.data(), sf.data(), e);
        for (int64_t r = 0; r < m; ++r) {
          float* srow = sf.data() + r * kend;
          silu_fwd_f32(srow, bias.data() + r * kend, scale.data() + r * kend, alpha, row_end[r]);
          std::fill(srow + row_end[r], srow + kend, 0.0f);
        }
        to_bf16(sf.data(), sb.data(), e);                                             // P (bf16)
        mm_bf16(ob.data(), m, P.dv, bview(sb.data(), m, kend, kend),
                bview(v + s0 * ldv + h * P.dv, kend, P.dv, ldv));                     // O = P V
        put_rows(ob.data(), m, P.dv, out + (s0 + i0) * ldv + h * P.dv, ldv);
      }
    }
  }
}

void backward_bf16(const Problem<float>& P, const bf16* go, const bf16* q, const bf16* k, const bf16* v,
                   bf16* dq, bf16* dk, bf16* dv, std::vector<double>& dpos, std::vector<double>& dts) {
  const std::vector<int64_t> order = longest_first(P);
  TableGrads grads(P);
  const float alpha = static_cast<float>(P.alpha);
  const int64_t ldq = P.H * P.dqk, ldv = P.H * P.dv;
#pragma omp parallel num_threads(grads.nthreads)
  {
    double* my_dpos = grads.pos_of(thread_id());
    double* my_dts = grads.ts_of(thread_id());
    std::vector<float> bias, scale, sf, pf, df, gsum, dqa;
    std::vector<bf16> sb, db, tmp;
    std::vector<int64_t> row_end;
#pragma omp for schedule(dynamic, 1)
    for (int64_t oi = 0; oi < P.B; ++oi) {
      const int64_t b = order[oi], n = P.len(b), s0 = P.off[b];
      dqa.assign(n * ldq, 0.0f);  // dq of this sequence, accumulated over key tiles in fp32
      for (int64_t j0 = 0; j0 < n; j0 += kTileBf16) {
        const int64_t w = std::min(kTileBf16, n - j0);
        // every row that can see keys [j0, j0 + w): rows >= j0, and with a contextual prefix all
        // rows (the prefix sees every key; the rows between are masked to zero)
        const int64_t r0 = P.ctx > 0 ? 0 : j0, m = n - r0, e = m * w;
        bias.resize(e); scale.resize(e); sf.resize(e); pf.resize(e); df.resize(e);
        sb.resize(e); db.resize(e); gsum.assign(e, 0.0f); row_end.resize(m);
        tmp.resize(std::max(m, w) * std::max(P.dqk, P.dv));
        P.tile(b, r0, m, j0, w, bias.data(), scale.data(), row_end.data());
        for (int64_t h = 0; h < P.H; ++h) {
          const bf16* qh = q + (s0 + r0) * ldq + h * P.dqk;
          const bf16* kh = k + (s0 + j0) * ldq + h * P.dqk;
          const bf16* vh = v + (s0 + j0) * ldv + h * P.dv;
          const bf16* goh = go + (s0 + r0) * ldv + h * P.dv;
          mm_bf16(sb.data(), m, w, bview(qh, m, P.dqk, ldq), bview(kh, w, P.dqk, ldq).t());   // S = Q K^T
          mm_bf16(db.data(), m, w, bview(goh, m, P.dv, ldv), bview(vh, w, P.dv, ldv).t());    // dP = dO V^T
          to_f32(sb.data(), sf.data(), e);
          to_f32(db.data(), df.data(), e);
          for (int64_t r = 0; r < m; ++r) {
            const int64_t o = r * w, len = row_end[r];
            silu_bwd_f32(sf.data() + o, bias.data() + o, scale.data() + o, alpha, len, pf.data() + o,
                         df.data() + o, gsum.data() + o);
            std::fill(pf.data() + o + len, pf.data() + o + w, 0.0f);
            std::fill(df.data() + o + len, df.data() + o + w, 0.0f);
          }
          to_bf16(pf.data(), sb.data(), e);           // P
          to_bf16(df.data(), db.data(), e, alpha);    // alpha dS
          mm_bf16(tmp.data(), w, P.dv, bview(sb.data(), m, w, w).t(), bview(goh, m, P.dv, ldv));   // dv = P^T dO
          put_rows(tmp.data(), w, P.dv, dv + (s0 + j0) * ldv + h * P.dv, ldv);
          mm_bf16(tmp.data(), w, P.dqk, bview(db.data(), m, w, w).t(), bview(qh, m, P.dqk, ldq));  // dk = a dS^T Q
          put_rows(tmp.data(), w, P.dqk, dk + (s0 + j0) * ldq + h * P.dqk, ldq);
          mm_bf16(tmp.data(), m, P.dqk, bview(db.data(), m, w, w), bview(kh, w, P.dqk, ldq));      // dq += a dS K
          for (int64_t r = 0; r < m; ++r) {
            float* acc = dqa.data() + (r0 + r) * ldq + h * P.dqk;
            const bf16* src = tmp.data() + r * P.dqk;
            for (int64_t c = 0; c < P.dqk; ++c) acc[c] += static_cast<float>(src[c]);
          }
        }
        if (P.pos_w || P.ts_w) P.tile_grad(b, r0, m, j0, w, gsum.data(), scale.data(), my_dpos, my_dts);
      }
      to_bf16(dqa.data(), dq + s0 * ldq, n * ldq);
    }
  }
  grads.reduce(dpos, dts);
}

std::vector<int64_t> int_vec(const at::Tensor& t) {
  auto c = t.to(at::kLong).contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

// bf16 inputs take the bf16-GEMM path where it was switched on (measured faster than fp32).
bool bf16_path(const at::Tensor& q) { return q.scalar_type() == at::kBFloat16 && g_bf16_gemm.load(); }

// Compute dtype of the GEMMs' operands: bf16 on the bf16 path; float for other half / bfloat16
// inputs (on CPUs without half GEMM instructions it is ~100x slower than fp32); else as is.
at::ScalarType compute_type(const at::Tensor& q) {
  if (bf16_path(q)) return at::kBFloat16;
  return (q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16) ? at::kFloat : q.scalar_type();
}

struct Inputs {
  at::Tensor q, k, v, pos_w, ts_w, ts;
  std::vector<int64_t> off, nt;
  std::unique_ptr<Bucketer> bucketer;
};

Inputs prepare(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& offsets,
               const c10::optional<at::Tensor>& num_targets, const c10::optional<at::Tensor>& pos_w,
               const c10::optional<at::Tensor>& ts_w, const c10::optional<at::Tensor>& timestamps) {
  TORCH_CHECK_VALUE(q.dim() == 3 && k.sizes() == q.sizes() && v.dim() == 3 && v.size(0) == q.size(0) &&
                        v.size(1) == q.size(1),
                    "hstu_mha: q, k [T, H, dqk] and v [T, H, dv] expected");
  const auto ct = compute_type(q);
  const auto table_t = ct == at::kBFloat16 ? at::kFloat : ct;  // bias tables: fp32 on the bf16 path
  Inputs in;
  in.q = q.to(ct).contiguous();
  in.k = k.to(ct).contiguous();
  in.v = v.to(ct).contiguous();
  in.off = int_vec(offsets);
  TORCH_CHECK(!in.off.empty() && in.off.back() <= q.size(0), "offsets: invalid for T=", q.size(0));
  if (num_targets.has_value()) in.nt = int_vec(*num_targets);
  if (pos_w.has_value()) in.pos_w = pos_w->to(table_t).contiguous();
  if (ts_w.has_value()) {
    TORCH_CHECK(timestamps.has_value(), "ts_w needs timestamps");
    in.ts_w = ts_w->to(table_t).contiguous();
    in.ts = timestamps->to(at::kLong).contiguous();
    in.bucketer = std::make_unique<Bucketer>(in.ts_w.numel() - 1);
  }
  return in;
}

template <typename scalar_t>
Problem<scalar_t> problem(const Inputs& in, double alpha, int64_t max_seq_len, bool by_len, int64_t ctx) {
  Problem<scalar_t> P;
  P.B = static_cast<int64_t>(in.off.size()) - 1;
  P.H = in.q.size(1);
  P.dqk = in.q.size(2);
  P.dv = in.v.size(2);
  P.max_seq_len = max_seq_len;
  P.ctx = ctx;
  P.alpha = alpha;
  P.by_len = by_len;
  P.off = in.off;
  P.nt = in.nt;
  if (in.pos_w.defined()) {
    P.pos_w = in.pos_w.data_ptr<scalar_t>();
    P.npos = in.pos_w.numel();
    TORCH_CHECK(P.npos == 2 * max_seq_len - 1, "pos_w: expected 2 * max_seq_len - 1 entries");
  }
  if (in.ts_w.defined()) {
    P.ts_w = in.ts_w.data_ptr<scalar_t>();
    P.nts = in.ts_w.numel();
    P.ts = in.ts.data_ptr<int64_t>();
    P.bucketer = in.bucketer.get();
  }
  for (int64_t b = 0; b < P.B; ++b) {
    TORCH_CHECK(P.len(b) >= 0 && P.len(b) <= max_seq_len, "offsets: sequence ", b, " has length ",
                P.len(b), " outside [0, max_seq_len=", max_seq_len, "]");
  }
  return P;
}

// out: CPU, `dtype`, `sizes`, contiguous (the kernels write through raw pointers)
void check_out(const char* name, const at::Tensor& t, at::IntArrayRef sizes, at::ScalarType dtype) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, ": must be a CPU tensor, got device ", t.device());
  TORCH_CHECK_VALUE(t.scalar_type() == dtype, name, ": dtype must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.sizes() == sizes, name, ": shape must be ", sizes, ", got ", t.sizes());
  TORCH_CHECK_VALUE(t.is_contiguous(), name, ": must be contiguous");
}

// Where the kernel writes: `out` itself when it has the compute dtype, else an fp32 buffer that
// is copied into `out` afterwards (half / bfloat16 outputs).
at::Tensor work_buffer(const at::Tensor& out, at::ScalarType ct) {
  return out.scalar_type() == ct ? out : at::empty(out.sizes(), out.options().dtype(ct));
}

}  // namespace

void hstu_mha_fwd_out(const at::Tensor& out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& offsets, double alpha, int64_t max_seq_len, bool norm_by_seq_len,
                      const c10::optional<at::Tensor>& num_targets, int64_t contextual_seq_len,
                      const c10::optional<at::Tensor>& pos_w, const c10::optional<at::Tensor>& ts_w,
                      const c10::optional<at::Tensor>& timestamps) {
  Inputs in = prepare(q, k, v, offsets, num_targets, pos_w, ts_w, timestamps);
  check_out("out", out, {q.size(0), q.size(1), v.size(2)}, q.scalar_type());
  at::Tensor work = work_buffer(out, in.q.scalar_type());
  if (in.q.scalar_type() == at::kBFloat16) {
    auto P = problem<float>(in, alpha, max_seq_len, norm_by_seq_len, contextual_seq_len);
    bf16* o = work.data_ptr<bf16>();
    const int64_t row = P.H * P.dv;
    zero_rows(o, 0, P.off.front(), row);
    zero_rows(o, P.off.back(), q.size(0), row);
    forward_bf16(P, in.q.data_ptr<bf16>(), in.k.data_ptr<bf16>(), in.v.data_ptr<bf16>(), o);
    if (!work.is_same(out)) out.copy_(work);
    return;
  }
  AT_DISPATCH_FLOATING_TYPES(in.q.scalar_type(), "hstu_mha_fwd", [&] {
    auto P = problem<scalar_t>(in, alpha, max_seq_len, norm_by_seq_len, contextual_seq_len);
    scalar_t* o = work.data_ptr<scalar_t>();
    // rows outside every sequence are zero; every row of a sequence is written by its tile
    const int64_t row = P.H * P.dv;
    zero_rows(o, 0, P.off.front(), row);
    zero_rows(o, P.off.back(), q.size(0), row);
    forward_impl<scalar_t>(P, in.q.data_ptr<scalar_t>(), in.k.data_ptr<scalar_t>(),
                           in.v.data_ptr<scalar_t>(), o);
  });
  if (!work.is_same(out)) out.copy_(work);
}

at::Tensor hstu_mha_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& offsets, double alpha, int64_t max_seq_len, bool norm_by_seq_len,
                        const c10::optional<at::Tensor>& num_targets, int64_t contextual_seq_len,
                        const c10::optional<at::Tensor>& pos_w, const c10::optional<at::Tensor>& ts_w,
                        const c10::optional<at::Tensor>& timestamps) {
  TORCH_CHECK_VALUE(q.dim() == 3 && v.dim() == 3, "hstu_mha: q, k [T, H, dqk] and v [T, H, dv] expected");
  at::Tensor out = at::empty({q.size(0), q.size(1), v.size(2)}, q.options());
  hstu_mha_fwd_out(out, q, k, v, offsets, alpha, max_seq_len, norm_by_seq_len, num_targets,
                   contextual_seq_len, pos_w, ts_w, timestamps);
  return out;
}

void hstu_mha_bwd_out(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv, const at::Tensor& dpos,
                      const at::Tensor& dts,
                      const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& v, const at::Tensor& offsets, double alpha, int64_t max_seq_len,
                      bool norm_by_seq_len, const c10::optional<at::Tensor>& num_targets,
                      int64_t contextual_seq_len, const c10::optional<at::Tensor>& pos_w,
                      const c10::optional<at::Tensor>& ts_w, const c10::optional<at::Tensor>& timestamps) {
  Inputs in = prepare(q, k, v, offsets, num_targets, pos_w, ts_w, timestamps);
  TORCH_CHECK_VALUE(grad_out.sizes() == at::IntArrayRef({q.size(0), q.size(1), v.size(2)}),
                    "grad_out: expected [T, H, dv] = ", at::IntArrayRef({q.size(0), q.size(1), v.size(2)}),
                    ", got ", grad_out.sizes());
  const auto st = q.scalar_type(), ct = in.q.scalar_type();
  check_out("dq", dq, q.sizes(), st);
  check_out("dk", dk, k.sizes(), st);
  check_out("dv", dv, v.sizes(), st);
  check_out("dpos", dpos, {in.pos_w.defined() ? in.pos_w.numel() : 0}, st);
  check_out("dts", dts, {in.ts_w.defined() ? in.ts_w.numel() : 0}, st);
  at::Tensor go = grad_out.to(ct).contiguous();
  at::Tensor wq = work_buffer(dq, ct), wk = work_buffer(dk, ct), wv = work_buffer(dv, ct);
  auto put = [](const at::Tensor& dst, const std::vector<double>& src) {
    at::Tensor d64 = at::from_blob(const_cast<double*>(src.data()), {static_cast<int64_t>(src.size())},
                                   at::TensorOptions().dtype(at::kDouble));
    dst.copy_(d64);
  };
  if (ct == at::kBFloat16) {
    auto P = problem<float>(in, alpha, max_seq_len, norm_by_seq_len, contextual_seq_len);
    bf16 *gq = wq.data_ptr<bf16>(), *gk = wk.data_ptr<bf16>(), *gv = wv.data_ptr<bf16>();
    const int64_t T = q.size(0);
    for (const auto& [ptr, d] : {std::pair<bf16*, int64_t>{gq, P.dqk}, {gk, P.dqk}, {gv, P.dv}}) {
      zero_rows(ptr, 0, P.off.front(), P.H * d);
      zero_rows(ptr, P.off.back(), T, P.H * d);
    }
    std::vector<double> gp(dpos.numel(), 0.0), gt(dts.numel(), 0.0);
    backward_bf16(P, go.data_ptr<bf16>(), in.q.data_ptr<bf16>(), in.k.data_ptr<bf16>(), in.v.data_ptr<bf16>(),
                  gq, gk, gv, gp, gt);
    put(dpos, gp);
    put(dts, gt);
    return;
  }
  AT_DISPATCH_FLOATING_TYPES(ct, "hstu_mha_bwd", [&] {
    auto P = problem<scalar_t>(in, alpha, max_seq_len, norm_by_seq_len, contextual_seq_len);
    scalar_t *gq = wq.data_ptr<scalar_t>(), *gk = wk.data_ptr<scalar_t>(), *gv = wv.data_ptr<scalar_t>();
    // rows outside every sequence get zero gradients (the rows of sequence b are zeroed by b's task)
    const int64_t T = q.size(0);
    for (const auto& [ptr, d] : {std::pair<scalar_t*, int64_t>{gq, P.dqk}, {gk, P.dqk}, {gv, P.dv}}) {
      zero_rows(ptr, 0, P.off.front(), P.H * d);
      zero_rows(ptr, P.off.back(), T, P.H * d);
    }
    std::vector<double> gp(dpos.numel(), 0.0), gt(dts.numel(), 0.0);
    backward_impl<scalar_t>(P, go.data_ptr<scalar_t>(), in.q.data_ptr<scalar_t>(), in.k.data_ptr<scalar_t>(),
                            in.v.data_ptr<scalar_t>(), gq, gk, gv, gp, gt);
    // table gradients: accumulated in float64, every entry written here
    put(dpos, gp);
    put(dts, gt);
  });
  if (!wq.is_same(dq)) dq.copy_(wq);
  if (!wk.is_same(dk)) dk.copy_(wk);
  if (!wv.is_same(dv)) dv.copy_(wv);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> hstu_mha_bwd(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& offsets, double alpha, int64_t max_seq_len, bool norm_by_seq_len,
    const c10::optional<at::Tensor>& num_targets, int64_t contextual_seq_len,
    const c10::optional<at::Tensor>& pos_w, const c10::optional<at::Tensor>& ts_w,
    const c10::optional<at::Tensor>& timestamps) {
  at::Tensor dq = at::empty(q.sizes(), q.options()), dk = at::empty(k.sizes(), k.options());
  at::Tensor dv = at::empty(v.sizes(), v.options());
  at::Tensor dpos = at::empty({pos_w.has_value() ? pos_w->numel() : 0}, q.options());
  at::Tensor dts = at::empty({ts_w.has_value() ? ts_w->numel() : 0}, q.options());
  hstu_mha_bwd_out(dq, dk, dv, dpos, dts, grad_out, q, k, v, offsets, alpha, max_seq_len, norm_by_seq_len,
                   num_targets, contextual_seq_len, pos_w, ts_w, timestamps);
  return {dq, dk, dv, dpos, dts};
}

void bind_hstu(pybind11::module& m) {
  m.def("hstu_set_bf16_gemm", [](bool on) { g_bf16_gemm.store(on); },
        "bf16 inputs: compute with bf16 GEMMs (true; where measured faster) or widen to fp32 (false, the default)");
  m.def("hstu_bf16_gemm", []() { return g_bf16_gemm.load(); }, "whether bf16 inputs use bf16 GEMMs");
  m.def("hstu_mha_fwd", &hstu_mha_fwd, "fused jagged HSTU attention, forward (OpenMP)");
  m.def("hstu_mha_fwd_out", &hstu_mha_fwd_out,
        "hstu_mha_fwd writing into a caller-provided contiguous CPU `out` [T, H, dv] of q's dtype "
        "(every element written)");
  m.def("hstu_mha_bwd", &hstu_mha_bwd, "fused jagged HSTU attention, backward (OpenMP)");
  m.def("hstu_mha_bwd_out", &hstu_mha_bwd_out,
        "hstu_mha_bwd writing into caller-provided contiguous CPU dq, dk, dv (shapes of q, k, v) and "
        "dpos, dts (shapes of pos_w, ts_w, or [0] when absent), all of q's dtype (every element written)");
}

}  // namespace torchrec_ascend
