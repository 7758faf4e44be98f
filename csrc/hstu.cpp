// Fused jagged HSTU attention on CPU (torchrec_ascend::hstu_mha forward and backward): the torch
// side.  Checks the arguments, converts the tensors into a hstu::Problem, picks the engine of the
// inputs' dtype (measured once per process: csrc/hstu_choice.cpp) and runs the one driver
// (csrc/hstu_driver.h) on it.
//
// dtypes: float64 on the BLAS engine; float32 on the fp32 choice (AVX-512 micro-kernels or BLAS);
// bfloat16 on the bf16 choice (AMX or AVX512-BF16 tiles with fp32 accumulation, or widened to
// fp32 where that measured faster); float16 widened to fp32.  Bias tables are used in fp32
// (float64 for float64 inputs); their gradients are summed in float64.
#include <torch/extension.h>

#include <cstring>
#include <memory>
#include <tuple>
#include <vector>

#include "hstu_choice.h"
#include "hstu_kernel.h"
#include "torchrec_ascend.h"

namespace torchrec_ascend {

namespace {

std::vector<int64_t> int_vec(const at::Tensor& t) {
  auto c = t.to(at::kLong).contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

// How a call computes: the engine and the dtype of the operands it reads.
struct Plan {
  hstu::Engine engine = hstu::Engine::kBlas;
  at::ScalarType operand = at::kFloat;  // q, k, v, grad_out as the engine reads them
  at::ScalarType acc = at::kFloat;      // bias tables (and the Problem's sums)
};

Plan plan_for(at::ScalarType st) {
  Plan p;
  if (st == at::kDouble) {
    p.engine = hstu::Engine::kBlas;
    p.operand = p.acc = at::kDouble;
    return p;
  }
  if (st == at::kBFloat16) {
    const hstu::Choice c = hstu::chosen_engine(hstu::Dtype::kBFloat16);
    p.engine = c.engine;
    p.operand = c.widen ? at::kFloat : at::kBFloat16;
    return p;
  }
  TORCH_CHECK_VALUE(st == at::kFloat || st == at::kHalf, "hstu_mha: q must be float64, float32, bfloat16 or float16, got ",
                    st);
  p.engine = hstu::chosen_engine(hstu::Dtype::kFloat).engine;  // float16: widened to fp32
  return p;
}

struct Inputs {
  Plan plan;
  at::Tensor q, k, v, pos_w, ts_w, ts;
  std::vector<int64_t> off, nt;
  std::unique_ptr<hstu::Bucketer> bucketer;
};

Inputs prepare(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& offsets,
               const c10::optional<at::Tensor>& num_targets, const c10::optional<at::Tensor>& pos_w,
               const c10::optional<at::Tensor>& ts_w, const c10::optional<at::Tensor>& timestamps) {
  TORCH_CHECK_VALUE(q.dim() == 3 && k.sizes() == q.sizes() && v.dim() == 3 && v.size(0) == q.size(0) &&
                        v.size(1) == q.size(1),
                    "hstu_mha: q, k [T, H, dqk] and v [T, H, dv] expected");
  Inputs in;
  in.plan = plan_for(q.scalar_type());
  const auto ot = in.plan.operand, at_ = in.plan.acc;
  in.q = q.to(ot).contiguous();
  in.k = k.to(ot).contiguous();
  in.v = v.to(ot).contiguous();
  in.off = int_vec(offsets);
  TORCH_CHECK(!in.off.empty() && in.off.back() <= q.size(0), "offsets: invalid for T=", q.size(0));
  if (num_targets.has_value()) in.nt = int_vec(*num_targets);
  if (pos_w.has_value()) in.pos_w = pos_w->to(at_).contiguous();
  if (ts_w.has_value()) {
    TORCH_CHECK(timestamps.has_value(), "ts_w needs timestamps");
    in.ts_w = ts_w->to(at_).contiguous();
    in.ts = timestamps->to(at::kLong).contiguous();
    TORCH_CHECK_VALUE(in.ts_w.numel() >= 1, "ts_w: needs at least one bucket");
    in.bucketer = std::make_unique<hstu::Bucketer>(in.ts_w.numel() - 1);
  }
  return in;
}

template <typename acc_t>
hstu::Problem<acc_t> problem(const Inputs& in, double alpha, int64_t max_seq_len, bool by_len, int64_t ctx) {
  hstu::Problem<acc_t> P;
  P.B = static_cast<int64_t>(in.off.size()) - 1;
  P.H = in.q.size(1);
  P.dqk = in.q.size(2);
  P.dv = in.v.size(2);
  P.max_seq_len = max_seq_len;
  P.ctx = ctx;
  P.alpha = alpha;
  P.by_len = by_len;
  P.off = in.off.data();
  P.nt = in.nt.empty() ? nullptr : in.nt.data();
  TORCH_CHECK(in.nt.empty() || static_cast<int64_t>(in.nt.size()) == P.B, "num_targets: expected ", P.B, " entries");
  if (in.pos_w.defined()) {
    P.pos_w = in.pos_w.data_ptr<acc_t>();
    TORCH_CHECK(in.pos_w.numel() == 2 * max_seq_len - 1, "pos_w: expected 2 * max_seq_len - 1 entries");
  }
  if (in.ts_w.defined()) {
    P.ts_w = in.ts_w.data_ptr<acc_t>();
    P.nts = in.ts_w.numel();
    P.ts = in.ts.data_ptr<int64_t>();
    P.bucketer = in.bucketer.get();
  }
  for (int64_t b = 0; b < P.B; ++b) {
    TORCH_CHECK(P.len(b) >= 0 && P.len(b) <= max_seq_len, "offsets: sequence ", b, " has length ", P.len(b),
                " outside [0, max_seq_len=", max_seq_len, "]");
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

// Where the kernel writes: `out` itself when it has the operand dtype, else a buffer of that
// dtype copied into `out` afterwards.  Rows outside every sequence are zeroed here (the kernels
// write exactly the rows of the sequences).
at::Tensor work_buffer(const at::Tensor& out, at::ScalarType ct, int64_t first, int64_t last) {
  at::Tensor w = out.scalar_type() == ct ? out : at::empty(out.sizes(), out.options().dtype(ct));
  if (first > 0) w.narrow(0, 0, first).zero_();
  if (last < w.size(0)) w.narrow(0, last, w.size(0) - last).zero_();
  return w;
}

}  // namespace

void hstu_mha_fwd_out(const at::Tensor& out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& offsets, double alpha, int64_t max_seq_len, bool norm_by_seq_len,
                      const c10::optional<at::Tensor>& num_targets, int64_t contextual_seq_len,
                      const c10::optional<at::Tensor>& pos_w, const c10::optional<at::Tensor>& ts_w,
                      const c10::optional<at::Tensor>& timestamps) {
  Inputs in = prepare(q, k, v, offsets, num_targets, pos_w, ts_w, timestamps);
  check_out("out", out, {q.size(0), q.size(1), v.size(2)}, q.scalar_type());
  at::Tensor work = work_buffer(out, in.q.scalar_type(), in.off.front(), in.off.back());
  if (in.plan.acc == at::kDouble) {
    auto P = problem<double>(in, alpha, max_seq_len, norm_by_seq_len, contextual_seq_len);
    hstu::forward(in.plan.engine, P, in.q.data_ptr<double>(), in.k.data_ptr<double>(), in.v.data_ptr<double>(),
                  work.data_ptr<double>());
  } else {
    auto P = problem<float>(in, alpha, max_seq_len, norm_by_seq_len, contextual_seq_len);
    hstu::forward(in.plan.engine, P, in.q.data_ptr(), in.k.data_ptr(), in.v.data_ptr(), work.data_ptr());
  }
  if (!work.is_same(out)) out.copy_(work);
}

at::Tensor hstu_mha_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& offsets,
                        double alpha, int64_t max_seq_len, bool norm_by_seq_len,
                        const c10::optional<at::Tensor>& num_targets, int64_t contextual_seq_len,
                        const c10::optional<at::Tensor>& pos_w, const c10::optional<at::Tensor>& ts_w,
                        const c10::optional<at::Tensor>& timestamps) {
  TORCH_CHECK_VALUE(q.dim() == 3 && v.dim() == 3, "hstu_mha: q, k [T, H, dqk] and v [T, H, dv] expected");
  at::Tensor out = at::empty({q.size(0), q.size(1), v.size(2)}, q.options());
  hstu_mha_fwd_out(out, q, k, v, offsets, alpha, max_seq_len, norm_by_seq_len, num_targets, contextual_seq_len,
                   pos_w, ts_w, timestamps);
  return out;
}

void hstu_mha_bwd_out(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv, const at::Tensor& dpos,
                      const at::Tensor& dts, const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& v, const at::Tensor& offsets, double alpha, int64_t max_seq_len,
                      bool norm_by_seq_len, const c10::optional<at::Tensor>& num_targets,
                      int64_t contextual_seq_len, const c10::optional<at::Tensor>& pos_w,
                      const c10::optional<at::Tensor>& ts_w, const c10::optional<at::Tensor>& timestamps) {
  Inputs in = prepare(q, k, v, offsets, num_targets, pos_w, ts_w, timestamps);
  TORCH_CHECK_VALUE(grad_out.sizes() == at::IntArrayRef({q.size(0), q.size(1), v.size(2)}),
                    "grad_out: expected [T, H, dv] = ", at::IntArrayRef({q.size(0), q.size(1), v.size(2)}), ", got ",
                    grad_out.sizes());
  const auto st = q.scalar_type(), ct = in.q.scalar_type();
  check_out("dq", dq, q.sizes(), st);
  check_out("dk", dk, k.sizes(), st);
  check_out("dv", dv, v.sizes(), st);
  check_out("dpos", dpos, {in.pos_w.defined() ? in.pos_w.numel() : 0}, st);
  check_out("dts", dts, {in.ts_w.defined() ? in.ts_w.numel() : 0}, st);
  at::Tensor go = grad_out.to(ct).contiguous();
  const int64_t first = in.off.front(), last = in.off.back();
  at::Tensor wq = work_buffer(dq, ct, first, last), wk = work_buffer(dk, ct, first, last),
             wv = work_buffer(dv, ct, first, last);
  std::vector<double> gp(dpos.numel(), 0.0), gt(dts.numel(), 0.0);
  if (in.plan.acc == at::kDouble) {
    auto P = problem<double>(in, alpha, max_seq_len, norm_by_seq_len, contextual_seq_len);
    hstu::backward(in.plan.engine, P, go.data_ptr<double>(), in.q.data_ptr<double>(), in.k.data_ptr<double>(),
                   in.v.data_ptr<double>(), wq.data_ptr<double>(), wk.data_ptr<double>(), wv.data_ptr<double>(),
                   gp.data(), gt.data());
  } else {
    auto P = problem<float>(in, alpha, max_seq_len, norm_by_seq_len, contextual_seq_len);
    hstu::backward(in.plan.engine, P, go.data_ptr(), in.q.data_ptr(), in.k.data_ptr(), in.v.data_ptr(),
                   wq.data_ptr(), wk.data_ptr(), wv.data_ptr(), gp.data(), gt.data());
  }
  // table gradients: summed in float64, every entry written here
  auto put = [](const at::Tensor& dst, std::vector<double>& src) {
    dst.copy_(at::from_blob(src.data(), {static_cast<int64_t>(src.size())}, at::TensorOptions().dtype(at::kDouble)));
  };
  put(dpos, gp);
  put(dts, gt);
  if (!wq.is_same(dq)) dq.copy_(wq);
  if (!wk.is_same(dk)) dk.copy_(wk);
  if (!wv.is_same(dv)) dv.copy_(wv);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> hstu_mha_bwd(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& offsets, double alpha, int64_t max_seq_len, bool norm_by_seq_len,
    const c10::optional<at::Tensor>& num_targets, int64_t contextual_seq_len, const c10::optional<at::Tensor>& pos_w,
    const c10::optional<at::Tensor>& ts_w, const c10::optional<at::Tensor>& timestamps) {
  at::Tensor dq = at::empty(q.sizes(), q.options()), dk = at::empty(k.sizes(), k.options());
  at::Tensor dv = at::empty(v.sizes(), v.options());
  at::Tensor dpos = at::empty({pos_w.has_value() ? pos_w->numel() : 0}, q.options());
  at::Tensor dts = at::empty({ts_w.has_value() ? ts_w->numel() : 0}, q.options());
  hstu_mha_bwd_out(dq, dk, dv, dpos, dts, grad_out, q, k, v, offsets, alpha, max_seq_len, norm_by_seq_len,
                   num_targets, contextual_seq_len, pos_w, ts_w, timestamps);
  return {dq, dk, dv, dpos, dts};
}

namespace {
hstu::Dtype dtype_arg(const std::string& name) {
  if (name == "float32") return hstu::Dtype::kFloat;
  if (name == "bfloat16") return hstu::Dtype::kBFloat16;
  throw std::invalid_argument("dtype: '" + name + "' is not one of float32, bfloat16");
}
}  // namespace

void bind_hstu_layer(pybind11::module& m);  // csrc/hstu_layer.cpp

void bind_hstu(pybind11::module& m) {
  bind_hstu_layer(m);
  m.def("hstu_mha_fwd", &hstu_mha_fwd, "fused jagged HSTU attention, forward (OpenMP)");
  m.def("hstu_mha_fwd_out", &hstu_mha_fwd_out,
        "hstu_mha_fwd writing into a caller-provided contiguous CPU `out` [T, H, dv] of q's dtype "
        "(every element written)");
  m.def("hstu_mha_bwd", &hstu_mha_bwd, "fused jagged HSTU attention, backward (OpenMP)");
  m.def("hstu_mha_bwd_out", &hstu_mha_bwd_out,
        "hstu_mha_bwd writing into caller-provided contiguous CPU dq, dk, dv (shapes of q, k, v) and "
        "dpos, dts (shapes of pos_w, ts_w, or [0] when absent), all of q's dtype (every element written)");
  m.def(
      "hstu_engine",
      [](const std::string& dtype) {
        const hstu::Choice c = hstu::chosen_engine(dtype_arg(dtype));
        return std::make_tuple(c.name, c.reason);
      },
      "(engine, why) of the HSTU attention for dtype 'float32' / 'bfloat16' on this CPU: measured on first use");
  m.def(
      "hstu_set_engine", [](const std::string& dtype, const std::string& name) {
        hstu::force_engine(dtype_arg(dtype), name);
      },
      "force the HSTU attention engine of 'float32' / 'bfloat16' (tests, benchmarks); '' measures again");
  m.def(
      "hstu_engines", [](const std::string& dtype) { return hstu::usable_engines(dtype_arg(dtype)); },
      "the HSTU attention engines of 'float32' / 'bfloat16' that run on this CPU");
}

}  // namespace torchrec_ascend
