// Row-wise kernels of the losses (fp32 arithmetic; fp32 rows, and bf16 ones for logsumexp), each
// one pass over a row-major [N, D] tensor (a row is reread from L1, never from memory): torch's
// composites of the same formulas take 3-5 passes, each at memory speed on the [tokens, D] /
// [tokens, negatives] tensors of a training step.
//
//   l2_normalize_rows(x, eps, scale) -> y, inv, clamped
//       inv[r] = scale / max(||x_r||, eps), y = x * inv, clamped[r] = ||x_r|| <= eps
//       (modules/l2norm.py: F.normalize's value times scale)
//   l2_normalize_rows_bwd(dy, y, inv, clamped, scale) -> dx
//       dx = inv (dy - y <dy, y> / scale^2); a clamped row: inv dy
//   l2_dot_rows(q, x, eps) -> out, inv, clamped
//       out[r] = <q_r, x_r> inv[r], inv[r] = 1 / max(||x_r||, eps): q's dot product with x's row
//       normalised (the sampled softmax's positive logit), without the normalised rows
//   l2_dot_rows_bwd(g, q, x, out, inv, clamped) -> dq, dx
//       dq = g inv x, dx = g inv (q - y out) with y = inv x (a clamped row: g inv q)
//   logsumexp_rows(x, bias, ex_ptr, ex_cols) -> lse
//       lse[r] = log sum_c exp(x[r, c] + bias[c]) over the row's columns not excluded (bias and
//       the exclusions optional; exclusions by row, CSR: row r leaves out ex_cols[ex_ptr[r] ..
//       ex_ptr[r + 1]]); x fp32 or bf16 (modules/logsumexp.py; torch.logsumexp's value on the
//       excluded entries set to -inf, an all -inf row's -inf included)
//   logsumexp_rows_bwd(g, x, bias, lse, ex_ptr, ex_cols) -> dx (x's dtype)
//       dx[r, c] = g[r] exp(x[r, c] + bias[c] - lse[r]), 0 where excluded (and on a row whose lse
//       is -inf, where torch's backward gives nan)
//
// Sums run in 16 lanes (element c into lane c % 16), the lanes added pairwise in a fixed order:
// the same result on every thread count.  exp is hstu::exp_f32 (~1 ulp), 0 below ln(FLT_MIN) as
// torch's exp gives (exp_f32 clamps there: a masked logit's term and gradient are exactly 0).
#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "bf16_bits.h"
#include "hstu_math.h"
#include "isa.h"
#include "parallel.h"
#include "tensor_checks.h"
#include "torchrec_ascend.h"

namespace torchrec_ascend {

namespace {

constexpr int kLanes = 16;

__attribute__((always_inline)) inline float lanes_sum(float* acc) {
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

// sum_c a[c] b[c] over a row
__attribute__((always_inline)) inline float row_dot(const float* a, const float* b, int64_t D) {
  float acc[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= D; c += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[c + l] * b[c + l];
  for (; c < D; ++c) acc[c % kLanes] += a[c] * b[c];
  return lanes_sum(acc);
}

// scale / max(||x||, eps) of a row; clamped: ||x|| <= eps (F.normalize's rule)
__attribute__((always_inline)) inline float inv_norm(const float* x, int64_t D, float eps, float scale,
                                                     bool& clamped) {
  const float norm = std::sqrt(row_dot(x, x, D));
  clamped = norm <= eps;
  return scale / (norm > eps ? norm : eps);
}

TRASC_VECTOR_CLONES void l2_rows(const float* x, int64_t r0, int64_t r1, int64_t D, float eps, float scale, float* y,
                                 float* inv, bool* clamped) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * D;
    const float s = inv_norm(xr, D, eps, scale, clamped[r]);
    inv[r] = s;
    float* yr = y + r * D;
    for (int64_t c = 0; c < D; ++c) yr[c] = xr[c] * s;
  }
}

TRASC_VECTOR_CLONES void l2_rows_bwd(const float* dy, const float* y, const float* inv, const bool* clamped,
                                     int64_t r0, int64_t r1, int64_t D, float inv_scale2, float* dx) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* g = dy + r * D;
    const float* yr = y + r * D;
    const float s = clamped[r] ? 0.0f : row_dot(g, yr, D) * inv_scale2;
    const float k = inv[r];
    float* d = dx + r * D;
    for (int64_t c = 0; c < D; ++c) d[c] = (g[c] - yr[c] * s) * k;
  }
}

// A float's bits as an int32 that orders as the float does (negative floats' magnitude bits
// flipped; an involution on non-NaN values): the row maximum as an integer maximum, which GCC
// vectorises (its float compare-and-select it leaves scalar, for NaN and signed-zero rules); a
// NaN anywhere makes the maximum NaN, as torch's amax
__attribute__((always_inline)) inline int32_t ordered_bits(float z) {
  int32_t i;
  std::memcpy(&i, &z, 4);
  i = (i & 0x7fffffff) > 0x7f800000 ? 0x7fc00000 : i;  // any NaN as +NaN: above +inf, so it wins
  return i ^ ((i >> 31) & 0x7fffffff);
}
__attribute__((always_inline)) inline float from_ordered_bits(int32_t i) {
  i ^= (i >> 31) & 0x7fffffff;
  float z;
  std::memcpy(&z, &i, 4);
  return z;
}

TRASC_VECTOR_CLONES void l2_dot_rows(const float* q, const float* x, int64_t r0, int64_t r1, int64_t D, float eps,
                                     float* out, float* inv, bool* clamped) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* qr = q + r * D;
    const float* xr = x + r * D;
    const float s = inv_norm(xr, D, eps, 1.0f, clamped[r]);
    inv[r] = s;
    out[r] = row_dot(qr, xr, D) * s;
  }
}

TRASC_VECTOR_CLONES void l2_dot_rows_bwd(const float* g, const float* q, const float* x, const float* out,
                                         const float* inv, const bool* clamped, int64_t r0, int64_t r1, int64_t D,
                                         float* dq, float* dx) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* qr = q + r * D;
    const float* xr = x + r * D;
    const float s = inv[r], gs = g[r] * s;
    const float k = clamped[r] ? 0.0f : out[r] * s;  // y out = x (inv out)
    float* a = dq + r * D;
    float* b = dx + r * D;
    for (int64_t c = 0; c < D; ++c) {
      a[c] = gs * xr[c];
      b[c] = gs * (qr[c] - xr[c] * k);
    }
  }
}

// max_c x[c] (kLanes lanes of ordered bits)
__attribute__((always_inline)) inline float row_max(const float* x, int64_t D) {
  int32_t acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = ordered_bits(-std::numeric_limits<float>::infinity());
  int64_t c = 0;
  for (; c + kLanes <= D; c += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const int32_t z = ordered_bits(x[c + l]);
      acc[l] = acc[l] < z ? z : acc[l];
    }
  for (; c < D; ++c) {
    const int32_t z = ordered_bits(x[c]);
    acc[c % kLanes] = acc[c % kLanes] < z ? z : acc[c % kLanes];
  }
  int32_t m = acc[0];
  for (int l = 1; l < kLanes; ++l) m = m < acc[l] ? acc[l] : m;
  return from_ordered_bits(m);
}

__attribute__((always_inline)) inline float exp_or_zero(float z) {
  return z < -87.33654475f ? 0.0f : hstu::exp_f32(z);
}

// The exclusions of rows (CSR), or none
struct Excluded {
  const int64_t* ptr = nullptr;
  const int64_t* cols = nullptr;
  int64_t begin(int64_t r) const { return ptr ? ptr[r] : 0; }
  int64_t end(int64_t r) const { return ptr ? ptr[r + 1] : 0; }
};

// lse of rows [r0, r1): each row widened into buf (+ bias, excluded entries -inf), then its
// maximum and its sum of exponentials from there (L1)
template <typename T>
__attribute__((always_inline)) inline void lse_range(const T* x, const float* b, const Excluded& ex, int64_t r0,
                                                     int64_t r1, int64_t D, float* buf, float* lse) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * D;
    if (b) {
      for (int64_t c = 0; c < D; ++c) buf[c] = load_f(xr, c) + b[c];
    } else {
      for (int64_t c = 0; c < D; ++c) buf[c] = load_f(xr, c);
    }
    for (int64_t e = ex.begin(r); e < ex.end(r); ++e) buf[ex.cols[e]] = -std::numeric_limits<float>::infinity();
    float m = row_max(buf, D);
    if (m == -std::numeric_limits<float>::infinity() || std::isnan(m)) {  // -inf: every term 0; nan
      lse[r] = m;
      continue;
    }
    if (!std::isfinite(m)) m = 0.0f;  // torch.logsumexp's shift: a +inf row by 0
    float acc[kLanes] = {};
    int64_t c = 0;
    for (; c + kLanes <= D; c += kLanes)
      for (int l = 0; l < kLanes; ++l) acc[l] += exp_or_zero(buf[c + l] - m);
    for (; c < D; ++c) acc[c % kLanes] += exp_or_zero(buf[c] - m);
    lse[r] = std::log(lanes_sum(acc)) + m;
  }
}

// dx rows: g exp(x + b - lse) computed into buf (fp32), then stored in T (one loop each: GCC
// leaves a loop that does both for bf16 scalar)
template <typename T>
__attribute__((always_inline)) inline void lse_bwd_range(const float* g, const T* x, const float* b,
                                                         const float* lse, const Excluded& ex, int64_t r0,
                                                         int64_t r1, int64_t D, float* buf, T* dx) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * D;
    const float gr = g[r], l = lse[r];
    T* d = dx + r * D;
    if (l == -std::numeric_limits<float>::infinity()) {
      for (int64_t c = 0; c < D; ++c) buf[c] = 0.0f;
    } else if (b) {
      for (int64_t c = 0; c < D; ++c) buf[c] = gr * exp_or_zero(load_f(xr, c) + b[c] - l);
    } else {
      for (int64_t c = 0; c < D; ++c) buf[c] = gr * exp_or_zero(load_f(xr, c) - l);
    }
    for (int64_t e = ex.begin(r); e < ex.end(r); ++e) buf[ex.cols[e]] = 0.0f;
    for (int64_t c = 0; c < D; ++c) store_f(d, c, buf[c]);
  }
}

#define TRASC_ROWS_LSE(S, T)                                                                                       \
  TRASC_VECTOR_CLONES void lse_rows_##S(const T* x, const float* b, const Excluded& ex, int64_t r0, int64_t r1,   \
                                        int64_t D, float* buf, float* lse) {                                       \
    lse_range<T>(x, b, ex, r0, r1, D, buf, lse);                                                                   \
  }                                                                                                                \
  TRASC_VECTOR_CLONES void lse_rows_bwd_##S(const float* g, const T* x, const float* b, const float* lse,         \
                                            const Excluded& ex, int64_t r0, int64_t r1, int64_t D, float* buf,    \
                                            T* dx) {                                                               \
    lse_bwd_range<T>(g, x, b, lse, ex, r0, r1, D, buf, dx);                                                        \
  }
TRASC_ROWS_LSE(f32, float)
TRASC_ROWS_LSE(bf16, bf16)
#undef TRASC_ROWS_LSE

inline void lse_rows(const float* x, const float* b, const Excluded& ex, int64_t r0, int64_t r1, int64_t D,
                     float* buf, float* lse) {
  lse_rows_f32(x, b, ex, r0, r1, D, buf, lse);
}
inline void lse_rows(const bf16* x, const float* b, const Excluded& ex, int64_t r0, int64_t r1, int64_t D,
                     float* buf, float* lse) {
  lse_rows_bf16(x, b, ex, r0, r1, D, buf, lse);
}
inline void lse_rows_bwd(const float* g, const float* x, const float* b, const float* lse, const Excluded& ex,
                         int64_t r0, int64_t r1, int64_t D, float* buf, float* dx) {
  lse_rows_bwd_f32(g, x, b, lse, ex, r0, r1, D, buf, dx);
}
inline void lse_rows_bwd(const float* g, const bf16* x, const float* b, const float* lse, const Excluded& ex,
                         int64_t r0, int64_t r1, int64_t D, float* buf, bf16* dx) {
  lse_rows_bwd_bf16(g, x, b, lse, ex, r0, r1, D, buf, dx);
}

// the entry points' tensors (tensor_checks.h): rows [N, D], vectors [n], row masks [n]
at::Tensor rows_f32(const char* name, const at::Tensor& t) { return contiguous_cpu_tensor(name, t, 2, {at::kFloat}); }
at::Tensor vec_f32(const char* name, const at::Tensor& t, int64_t n) {
  return contiguous_cpu_tensor(name, t, 1, {at::kFloat}, n);
}
at::Tensor mask_rows(const char* name, const at::Tensor& t, int64_t n) {
  return contiguous_cpu_tensor(name, t, 1, {at::kBool}, n);
}
at::Tensor rows_f32_bf16(const char* name, const at::Tensor& t) {
  return contiguous_cpu_tensor(name, t, 2, {at::kFloat, at::kBFloat16});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> l2_normalize_rows(const at::Tensor& x, double eps, double scale) {
  const at::Tensor xc = rows_f32("x", x);
  const int64_t N = xc.size(0), D = xc.size(1);
  at::Tensor y = at::empty_like(xc);
  at::Tensor inv = at::empty({N}, xc.options());
  at::Tensor clamped = at::empty({N}, xc.options().dtype(at::kBool));
  const float* xp = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  float* ip = inv.data_ptr<float>();
  bool* cp = clamped.data_ptr<bool>();
  const float e = static_cast<float>(eps), s = static_cast<float>(scale);
  over_rows(N, D, [&](int64_t r0, int64_t r1) { l2_rows(xp, r0, r1, D, e, s, yp, ip, cp); });
  return {y, inv, clamped};
}

at::Tensor l2_normalize_rows_bwd(const at::Tensor& dy, const at::Tensor& y, const at::Tensor& inv,
                                 const at::Tensor& clamped, double scale) {
  const at::Tensor gc = rows_f32("dy", dy), yc = rows_f32("y", y);
  check_same_shape("dy", gc, "y", yc);
  const int64_t N = yc.size(0), D = yc.size(1);
  const at::Tensor ic = vec_f32("inv", inv, N), cc = mask_rows("clamped", clamped, N);
  at::Tensor dx = at::empty_like(yc);
  const float* gp = gc.data_ptr<float>();
  const float* yp = yc.data_ptr<float>();
  const float* ip = ic.data_ptr<float>();
  const bool* cp = cc.data_ptr<bool>();
  float* dp = dx.data_ptr<float>();
  const float is2 = static_cast<float>(1.0 / (scale * scale));
  over_rows(N, D, [&](int64_t r0, int64_t r1) { l2_rows_bwd(gp, yp, ip, cp, r0, r1, D, is2, dp); });
  return dx;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> l2_dot_rows_op(const at::Tensor& q, const at::Tensor& x, double eps) {
  const at::Tensor qc = rows_f32("q", q), xc = rows_f32("x", x);
  check_same_shape("x", xc, "q", qc);
  const int64_t N = xc.size(0), D = xc.size(1);
  at::Tensor out = at::empty({N}, xc.options()), inv = at::empty({N}, xc.options());
  at::Tensor clamped = at::empty({N}, xc.options().dtype(at::kBool));
  const float* qp = qc.data_ptr<float>();
  const float* xp = xc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  float* ip = inv.data_ptr<float>();
  bool* cp = clamped.data_ptr<bool>();
  const float e = static_cast<float>(eps);
  over_rows(N, 2 * D, [&](int64_t r0, int64_t r1) { l2_dot_rows(qp, xp, r0, r1, D, e, op, ip, cp); });
  return {out, inv, clamped};
}

std::tuple<at::Tensor, at::Tensor> l2_dot_rows_bwd_op(const at::Tensor& g, const at::Tensor& q, const at::Tensor& x,
                                                      const at::Tensor& out, const at::Tensor& inv,
                                                      const at::Tensor& clamped) {
  const at::Tensor qc = rows_f32("q", q), xc = rows_f32("x", x);
  check_same_shape("x", xc, "q", qc);
  const int64_t N = xc.size(0), D = xc.size(1);
  const at::Tensor gc = vec_f32("g", g, N), oc = vec_f32("out", out, N), ic = vec_f32("inv", inv, N);
  const at::Tensor cc = mask_rows("clamped", clamped, N);
  at::Tensor dq = at::empty_like(qc), dx = at::empty_like(xc);
  const float* gp = gc.data_ptr<float>();
  const float* qp = qc.data_ptr<float>();
  const float* xp = xc.data_ptr<float>();
  const float* op = oc.data_ptr<float>();
  const float* ip = ic.data_ptr<float>();
  const bool* cp = cc.data_ptr<bool>();
  float* dqp = dq.data_ptr<float>();
  float* dxp = dx.data_ptr<float>();
  over_rows(N, 4 * D, [&](int64_t r0, int64_t r1) { l2_dot_rows_bwd(gp, qp, xp, op, ip, cp, r0, r1, D, dqp, dxp); });
  return {dq, dx};
}

// The optional bias [D] and exclusions (CSR over N rows, columns < D), checked
struct LseExtras {
  at::Tensor bias, ptr, cols;
  Excluded ex;
  const float* b = nullptr;
  LseExtras(int64_t N, int64_t D, const c10::optional<at::Tensor>& bias_, const c10::optional<at::Tensor>& ptr_,
            const c10::optional<at::Tensor>& cols_) {
    if (bias_.has_value() && bias_->defined()) {
      bias = vec_f32("bias", *bias_, D);
      b = bias.data_ptr<float>();
    }
    const bool hp = ptr_.has_value() && ptr_->defined(), hc = cols_.has_value() && cols_->defined();
    TORCH_CHECK_VALUE(hp == hc, "ex_ptr, ex_cols: give both or neither");
    if (!hp) return;
    ptr = contiguous_cpu_tensor("ex_ptr", *ptr_, 1, {at::kLong}, N + 1);
    cols = contiguous_cpu_tensor("ex_cols", *cols_, 1, {at::kLong});
    const int64_t* p = ptr.data_ptr<int64_t>();
    const int64_t nnz = cols.size(0);
    TORCH_CHECK_VALUE(p[0] == 0 && p[N] == nnz, "ex_ptr: must run from 0 to ex_cols' length ", nnz, ", got ", p[0],
                      " .. ", p[N]);
    for (int64_t r = 0; r < N; ++r)
      TORCH_CHECK_VALUE(p[r] <= p[r + 1], "ex_ptr: must not decrease, row ", r, ": ", p[r], " > ", p[r + 1]);
    if (nnz) {
      const int64_t lo = cols.min().item<int64_t>(), hi = cols.max().item<int64_t>();
      TORCH_CHECK_VALUE(lo >= 0 && hi < D, "ex_cols: columns must be in [0, ", D, "), got [", lo, ", ", hi, "]");
    }
    ex.ptr = p;
    ex.cols = cols.data_ptr<int64_t>();
  }
};

at::Tensor logsumexp_rows(const at::Tensor& x, const c10::optional<at::Tensor>& bias,
                          const c10::optional<at::Tensor>& ex_ptr, const c10::optional<at::Tensor>& ex_cols) {
  const at::Tensor xc = rows_f32_bf16("x", x);
  const int64_t N = xc.size(0), D = xc.size(1);
  const LseExtras extra(N, D, bias, ex_ptr, ex_cols);
  at::Tensor lse = at::empty({N}, xc.options().dtype(at::kFloat));
  float* lp = lse.data_ptr<float>();
  by_dtype(xc, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = xc.data_ptr<T>();
    over_rows(N, D, [&](int64_t r0, int64_t r1) {
      std::vector<float> buf(static_cast<size_t>(D > 0 ? D : 1));
      lse_rows(xp, extra.b, extra.ex, r0, r1, D, buf.data(), lp);
    });
  });
  return lse;
}

at::Tensor logsumexp_rows_bwd(const at::Tensor& g, const at::Tensor& x, const c10::optional<at::Tensor>& bias,
                              const at::Tensor& lse, const c10::optional<at::Tensor>& ex_ptr,
                              const c10::optional<at::Tensor>& ex_cols) {
  const at::Tensor xc = rows_f32_bf16("x", x);
  const int64_t N = xc.size(0), D = xc.size(1);
  const at::Tensor gc = vec_f32("g", g, N), lc = vec_f32("lse", lse, N);
  const LseExtras extra(N, D, bias, ex_ptr, ex_cols);
  at::Tensor dx = at::empty_like(xc);
  const float* gp = gc.data_ptr<float>();
  const float* lp = lc.data_ptr<float>();
  by_dtype(xc, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = xc.data_ptr<T>();
    T* dp = dx.data_ptr<T>();
    over_rows(N, D, [&](int64_t r0, int64_t r1) {
      std::vector<float> buf(static_cast<size_t>(D > 0 ? D : 1));
      lse_rows_bwd(gp, xp, extra.b, lp, extra.ex, r0, r1, D, buf.data(), dp);
    });
  });
  return dx;
}

}  // namespace

void bind_rows(pybind11::module& m) {
  m.def("l2_normalize_rows", &l2_normalize_rows,
        "(y, inv, clamped): y = x * scale / max(||x_row||, eps) of fp32 rows, one pass", pybind11::arg("x"),
        pybind11::arg("eps"), pybind11::arg("scale"));
  m.def("l2_normalize_rows_bwd", &l2_normalize_rows_bwd, "dx of l2_normalize_rows from dy, one pass",
        pybind11::arg("dy"), pybind11::arg("y"), pybind11::arg("inv"), pybind11::arg("clamped"),
        pybind11::arg("scale"));
  m.def("l2_dot_rows", &l2_dot_rows_op,
        "(out, inv, clamped): out[r] = <q_r, x_r> / max(||x_r||, eps) of fp32 rows, one pass", pybind11::arg("q"),
        pybind11::arg("x"), pybind11::arg("eps"));
  m.def("l2_dot_rows_bwd", &l2_dot_rows_bwd_op, "(dq, dx) of l2_dot_rows from g [N], one pass", pybind11::arg("g"),
        pybind11::arg("q"), pybind11::arg("x"), pybind11::arg("out"), pybind11::arg("inv"),
        pybind11::arg("clamped"));
  m.def("logsumexp_rows", &logsumexp_rows,
        "lse[r] = log sum_c exp(x[r, c] + bias[c]) of fp32 / bf16 rows over the columns not excluded (CSR), one pass",
        pybind11::arg("x"), pybind11::arg("bias") = pybind11::none(), pybind11::arg("ex_ptr") = pybind11::none(),
        pybind11::arg("ex_cols") = pybind11::none());
  m.def("logsumexp_rows_bwd", &logsumexp_rows_bwd,
        "dx[r, c] = g[r] exp(x[r, c] + bias[c] - lse[r]) in x's dtype, 0 where excluded, one pass", pybind11::arg("g"),
        pybind11::arg("x"), pybind11::arg("bias") = pybind11::none(), pybind11::arg("lse"),
        pybind11::arg("ex_ptr") = pybind11::none(), pybind11::arg("ex_cols") = pybind11::none());
}

}  // namespace torchrec_ascend
