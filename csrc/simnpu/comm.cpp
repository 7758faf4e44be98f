// Simulated NPU (test infrastructure): collectives on simulated-device tensors.
//
// HostStagingBackend wraps a CPU backend (gloo) and hands it CPU views of the simulated-device
// tensors (zero-copy: the memory is host memory), so `npu` tensors take part in collectives the
// way they would through HCCL on a real NPU.
#include "simnpu.h"

#include <ATen/ops/from_blob.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/extension.h>

namespace simnpu {

namespace {

at::Tensor host(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_privateuseone()) return t;
  c10::Storage keep = t.storage();
  return at::from_blob(
      t.data_ptr(), t.sizes(), t.strides(), [keep](void*) {}, t.options().device(at::kCPU));
}

std::vector<at::Tensor> host(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(host(t));
  return out;
}

std::vector<std::vector<at::Tensor>> host(const std::vector<std::vector<at::Tensor>>& ts) {
  std::vector<std::vector<at::Tensor>> out;
  out.reserve(ts.size());
  for (const auto& v : ts) out.push_back(host(v));
  return out;
}

using WorkPtr = c10::intrusive_ptr<c10d::Work>;

class HostStagingBackend final : public c10d::Backend {
 public:
  explicit HostStagingBackend(c10::intrusive_ptr<c10d::Backend> inner)
      : c10d::Backend(inner->getRank(), inner->getSize()), inner_(std::move(inner)) {}

  const std::string getBackendName() const override { return "simnpu(" + inner_->getBackendName() + ")"; }

  WorkPtr broadcast(std::vector<at::Tensor>& t, const c10d::BroadcastOptions& o) override {
    auto h = host(t);
    return inner_->broadcast(h, o);
  }
  WorkPtr allreduce(std::vector<at::Tensor>& t, const c10d::AllreduceOptions& o) override {
    auto h = host(t);
    return inner_->allreduce(h, o);
  }
  WorkPtr allreduce_coalesced(std::vector<at::Tensor>& t,
                              const c10d::AllreduceCoalescedOptions& o) override {
    auto h = host(t);
    return inner_->allreduce_coalesced(h, o);
  }
  WorkPtr reduce(std::vector<at::Tensor>& t, const c10d::ReduceOptions& o) override {
    auto h = host(t);
    return inner_->reduce(h, o);
  }
  WorkPtr allgather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                    const c10d::AllgatherOptions& o) override {
    auto ho = host(out);
    auto hi = host(in);
    return inner_->allgather(ho, hi, o);
  }
  WorkPtr _allgather_base(at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions& o) override {
    auto ho = host(out);
    auto hi = host(in);
    return inner_->_allgather_base(ho, hi, o);
  }
  WorkPtr allgather_coalesced(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                              const c10d::AllgatherOptions& o) override {
    auto ho = host(out);
    auto hi = host(in);
    return inner_->allgather_coalesced(ho, hi, o);
  }
  WorkPtr allgather_into_tensor_coalesced(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                          const c10d::AllgatherOptions& o) override {
    auto ho = host(out);
    auto hi = host(in);
    return inner_->allgather_into_tensor_coalesced(ho, hi, o);
  }
  WorkPtr gather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                 const c10d::GatherOptions& o) override {
    auto ho = host(out);
    auto hi = host(in);
    return inner_->gather(ho, hi, o);
  }
  WorkPtr scatter(std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
                  const c10d::ScatterOptions& o) override {
    auto ho = host(out);
    auto hi = host(in);
    return inner_->scatter(ho, hi, o);
  }
  WorkPtr reduce_scatter(std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
                         const c10d::ReduceScatterOptions& o) override {
    auto ho = host(out);
    auto hi = host(in);
    return inner_->reduce_scatter(ho, hi, o);
  }
  WorkPtr _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                               const c10d::ReduceScatterOptions& o) override {
    auto ho = host(out);
    auto hi = host(in);
    return inner_->_reduce_scatter_base(ho, hi, o);
  }
  WorkPtr reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                          const c10d::ReduceScatterOptions& o) override {
    auto ho = host(out);
    auto hi = host(in);
    return inner_->reduce_scatter_tensor_coalesced(ho, hi, o);
  }
  WorkPtr alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                        std::vector<int64_t>& in_splits, const c10d::AllToAllOptions& o) override {
    auto ho = host(out);
    auto hi = host(in);
    return inner_->alltoall_base(ho, hi, out_splits, in_splits, o);
  }
  WorkPtr alltoall(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                   const c10d::AllToAllOptions& o) override {
    auto ho = host(out);
    auto hi = host(in);
    return inner_->alltoall(ho, hi, o);
  }
  WorkPtr send(std::vector<at::Tensor>& t, int dst, int tag) override {
    auto h = host(t);
    return inner_->send(h, dst, tag);
  }
  WorkPtr recv(std::vector<at::Tensor>& t, int src, int tag) override {
    auto h = host(t);
    return inner_->recv(h, src, tag);
  }
  WorkPtr recvAnysource(std::vector<at::Tensor>& t, int tag) override {
    auto h = host(t);
    return inner_->recvAnysource(h, tag);
  }
  WorkPtr barrier(const c10d::BarrierOptions& o) override { return inner_->barrier(o); }
  void setSequenceNumberForGroup() override { inner_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return inner_->getSequenceNumberForGroup(); }

 private:
  c10::intrusive_ptr<c10d::Backend> inner_;
};

}  // namespace

void bind_comm(pybind11::module_& m) {
  pybind11::module_::import("torch.distributed");
  pybind11::class_<HostStagingBackend, c10d::Backend, c10::intrusive_ptr<HostStagingBackend>>(
      m, "HostStagingBackend")
      .def(pybind11::init<c10::intrusive_ptr<c10d::Backend>>(), pybind11::arg("inner"),
           "Wrap a CPU backend (gloo) so it accepts simulated-npu tensors (zero-copy host views).");
}

}  // namespace simnpu
