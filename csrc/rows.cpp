// Row-wise fp32 kernels of the losses, each one pass over a row-major [N, D] tensor (a row is
// reread from L1, never from memory): torch's composites of the same formulas take 3-5 passes,
// each at memory speed on the [tokens, D] / [tokens, negatives] tensors of a training step.
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
//   logsumexp_rows(x, bias) -> lse        lse[r] = log sum_c exp(x[r, c] + bias[c]) (bias optional)
//       (modules/logsumexp.py; torch.logsumexp's value, an all -inf row's -inf included)
//   logsumexp_rows_bwd(g, x, bias, lse) -> dx     dx[r, c] = g[r] exp(x[r, c] + bias[c] - lse[r])
//       (an all -inf row: 0, where torch's backward gives nan)
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

#include "hstu_math.h"
#include "isa.h"
#include "parallel.h"
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

TRASC_VECTOR_CLONES void l2_rows(const float* x, int64_t r0, int64_t r1, int64_t D, float eps, float scale, float* y,
                                 float* inv, bool* clamped) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * D;
    const float norm = std::sqrt(row_dot(xr, xr, D));
    clamped[r] = norm <= eps;
    const float s = scale / (norm > eps ? norm : eps);
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
// flipped; an involution): the row maximum as an integer maximum, which GCC vectorises (its float
// compare-and-select it leaves scalar, for NaN and signed-zero rules)
__attribute__((always_inline)) inline int32_t ordered_bits(float z) {
  int32_t i;
  std::memcpy(&i, &z, 4);
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
    const float norm = std::sqrt(row_dot(xr, xr, D));
    clamped[r] = norm <= eps;
    const float s = 1.0f / (norm > eps ? norm : eps);
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

// max_c x[c] + b[c] (kBias false: b unused)
template <bool kBias>
__attribute__((always_inline)) inline float row_max(const float* x, const float* b, int64_t D) {
  int32_t acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = ordered_bits(-std::numeric_limits<float>::infinity());
  int64_t c = 0;
  for (; c + kLanes <= D; c += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const int32_t z = ordered_bits(kBias ? x[c + l] + b[c + l] : x[c + l]);
      acc[l] = acc[l] < z ? z : acc[l];
    }
  for (; c < D; ++c) {
    const int32_t z = ordered_bits(kBias ? x[c] + b[c] : x[c]);
    acc[c % kLanes] = acc[c % kLanes] < z ? z : acc[c % kLanes];
  }
  int32_t m = acc[0];
  for (int l = 1; l < kLanes; ++l) m = m < acc[l] ? acc[l] : m;
  return from_ordered_bits(m);
}

__attribute__((always_inline)) inline float exp_or_zero(float z) {
  return z < -87.33654475f ? 0.0f : hstu::exp_f32(z);
}

template <bool kBias>
__attribute__((always_inline)) inline void lse_range(const float* x, const float* b, int64_t r0, int64_t r1,
                                                     int64_t D, float* lse) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * D;
    float m = row_max<kBias>(xr, b, D);
    if (m == -std::numeric_limits<float>::infinity()) {  // every term 0 (exp_f32 would clamp, not 0)
      lse[r] = m;
      continue;
    }
    if (!std::isfinite(m)) m = 0.0f;  // torch.logsumexp's shift: a +inf (or nan) row by 0
    float acc[kLanes] = {};
    int64_t c = 0;
    for (; c + kLanes <= D; c += kLanes)
      for (int l = 0; l < kLanes; ++l) acc[l] += exp_or_zero(xr[c + l] + (kBias ? b[c + l] : 0.0f) - m);
    for (; c < D; ++c) acc[c % kLanes] += exp_or_zero(xr[c] + (kBias ? b[c] : 0.0f) - m);
    lse[r] = std::log(lanes_sum(acc)) + m;
  }
}

template <bool kBias>
__attribute__((always_inline)) inline void lse_bwd_range(const float* g, const float* x, const float* b,
                                                         const float* lse, int64_t r0, int64_t r1, int64_t D,
                                                         float* dx) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * D;
    const float gr = g[r], l = lse[r];
    float* d = dx + r * D;
    if (l == -std::numeric_limits<float>::infinity()) {
      for (int64_t c = 0; c < D; ++c) d[c] = 0.0f;
      continue;
    }
    for (int64_t c = 0; c < D; ++c) d[c] = gr * exp_or_zero(xr[c] + (kBias ? b[c] : 0.0f) - l);
  }
}

TRASC_VECTOR_CLONES void lse_rows(const float* x, const float* b, int64_t r0, int64_t r1, int64_t D, float* lse) {
  if (b) lse_range<true>(x, b, r0, r1, D, lse);
  else lse_range<false>(x, b, r0, r1, D, lse);
}

TRASC_VECTOR_CLONES void lse_rows_bwd(const float* g, const float* x, const float* b, const float* lse, int64_t r0,
                                      int64_t r1, int64_t D, float* dx) {
  if (b) lse_bwd_range<true>(g, x, b, lse, r0, r1, D, dx);
  else lse_bwd_range<false>(g, x, b, lse, r0, r1, D, dx);
}

at::Tensor rows_f32(const char* name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.device().is_cpu() && t.dim() == 2 && t.scalar_type() == at::kFloat, name,
                    ": expected a 2-D float32 CPU tensor, got ", t.scalar_type(), " ", t.sizes(), " on ", t.device());
  return t.contiguous();
}

at::Tensor vec_f32(const char* name, const at::Tensor& t, int64_t n) {
  TORCH_CHECK_VALUE(t.device().is_cpu() && t.dim() == 1 && t.size(0) == n && t.scalar_type() == at::kFloat, name,
                    ": expected a float32 CPU tensor [", n, "], got ", t.scalar_type(), " ", t.sizes(), " on ",
                    t.device());
  return t.contiguous();
}

at::Tensor mask_rows(const char* name, const at::Tensor& t, int64_t n) {
  TORCH_CHECK_VALUE(t.device().is_cpu() && t.dim() == 1 && t.size(0) == n && t.scalar_type() == at::kBool, name,
                    ": expected a bool CPU tensor [", n, "], got ", t.scalar_type(), " ", t.sizes(), " on ",
                    t.device());
  return t.contiguous();
}

template <typename F>
void over_rows(int64_t rows, int64_t cols, F&& f) {
  parallel_over(rows, rows * cols, [&](int64_t r0, int64_t r1) { f(r0, r1); });
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
  TORCH_CHECK_VALUE(gc.sizes() == yc.sizes(), "dy: expected the shape of y ", yc.sizes(), ", got ", gc.sizes());
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
  TORCH_CHECK_VALUE(qc.sizes() == xc.sizes(), "q, x: expected one shape, got ", qc.sizes(), " and ", xc.sizes());
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
  TORCH_CHECK_VALUE(qc.sizes() == xc.sizes(), "q, x: expected one shape, got ", qc.sizes(), " and ", xc.sizes());
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

at::Tensor logsumexp_rows(const at::Tensor& x, const c10::optional<at::Tensor>& bias) {
  const at::Tensor xc = rows_f32("x", x);
  const int64_t N = xc.size(0), D = xc.size(1);
  at::Tensor bc;
  if (bias.has_value() && bias->defined()) bc = vec_f32("bias", *bias, D);
  at::Tensor lse = at::empty({N}, xc.options());
  const float* xp = xc.data_ptr<float>();
  const float* bp = bc.defined() ? bc.data_ptr<float>() : nullptr;
  float* lp = lse.data_ptr<float>();
  over_rows(N, D, [&](int64_t r0, int64_t r1) { lse_rows(xp, bp, r0, r1, D, lp); });
  return lse;
}

at::Tensor logsumexp_rows_bwd(const at::Tensor& g, const at::Tensor& x, const c10::optional<at::Tensor>& bias,
                              const at::Tensor& lse) {
  const at::Tensor xc = rows_f32("x", x);
  const int64_t N = xc.size(0), D = xc.size(1);
  const at::Tensor gc = vec_f32("g", g, N), lc = vec_f32("lse", lse, N);
  at::Tensor bc;
  if (bias.has_value() && bias->defined()) bc = vec_f32("bias", *bias, D);
  at::Tensor dx = at::empty_like(xc);
  const float* gp = gc.data_ptr<float>();
  const float* xp = xc.data_ptr<float>();
  const float* bp = bc.defined() ? bc.data_ptr<float>() : nullptr;
  const float* lp = lc.data_ptr<float>();
  float* dp = dx.data_ptr<float>();
  over_rows(N, D, [&](int64_t r0, int64_t r1) { lse_rows_bwd(gp, xp, bp, lp, r0, r1, D, dp); });
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
  m.def("logsumexp_rows", &logsumexp_rows, "lse[r] = log sum_c exp(x[r, c] + bias[c]) of fp32 rows, one pass",
        pybind11::arg("x"), pybind11::arg("bias") = pybind11::none());
  m.def("logsumexp_rows_bwd", &logsumexp_rows_bwd, "dx[r, c] = g[r] exp(x[r, c] + bias[c] - lse[r]), one pass",
        pybind11::arg("g"), pybind11::arg("x"), pybind11::arg("bias") = pybind11::none(), pybind11::arg("lse"));
}

}  // namespace torchrec_ascend
