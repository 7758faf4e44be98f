// Simulated NPU (test infrastructure): aten kernels of the PrivateUse1 device and its fallback.
//
// Tensor creation, views, resizing and copies are real PrivateUse1 kernels over host memory.
// Every other aten op reaches the boxed fallback, which runs the CPU kernel on CPU copies of the
// arguments (at::native::cpu_fallback: in-place and out= arguments are copied back).  The
// fallback refuses fbgemm::* and torchrec_ascend::* ops: those must be served by a PrivateUse1
// kernel registered by torchrec_ascend.ops, so a missing one fails loudly.
#include "simnpu.h"

#include <ATen/EmptyTensor.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace simnpu {

namespace {

constexpr c10::DispatchKeySet kKeys(c10::DispatchKey::PrivateUse1);

void check_options(std::optional<c10::Layout> layout, std::optional<bool> pin) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "simulated npu: only strided tensors are supported");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin), "simulated npu: pin_memory is for cpu tensors");
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin, std::optional<c10::MemoryFormat> fmt) {
  check_options(layout, pin);
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_generic(size, allocator(), kKeys, c10::dtype_or_default(dtype), fmt);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin) {
  check_options(layout, pin);
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_strided_generic(size, stride, allocator(), kKeys,
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  return at::native::view(self, size);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> fmt) {
  return at::native::resize_(self, size, fmt);
}

// A CPU tensor over the same host bytes (zero-copy); it keeps the storage alive.
at::Tensor host_view(const at::Tensor& t) {
  if (!t.device().is_privateuseone()) return t;
  c10::Storage keep = t.storage();
  return at::from_blob(
      t.data_ptr(), t.sizes(), t.strides(), [keep](void*) {}, t.options().device(at::kCPU));
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  TORCH_CHECK(self.defined() && dst.defined(), "simulated npu: copy of an undefined tensor");
  at::Tensor d = host_view(dst);
  d.copy_(host_view(self));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  return at::native::_local_scalar_dense_cpu(host_view(self));
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& src) {
  return at::native::set_tensor_(self, src);
}

at::Tensor& set_storage(at::Tensor& self, at::Storage src) { return at::native::set_(self, src); }

at::Tensor& set_storage_offset(at::Tensor& self, at::Storage src, int64_t offset,
                               c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::cpu::set_(self, src, offset, size, stride);
}

// Work on the simulated device is synchronous: a tensor used on another stream needs no record.
void record_stream(at::Tensor& /*self*/, c10::Stream /*s*/) {}

bool refused(const std::string& name) {
  return name.rfind("fbgemm::", 0) == 0 || name.rfind("torchrec_ascend::", 0) == 0;
}

}  // namespace

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& name = op.schema().operator_name();
  if (refused(name.name)) {
    const std::string full = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
    TORCH_CHECK_NOT_IMPLEMENTED(false, "no npu kernel for ", full,
                " (simulated npu: fbgemm:: and torchrec_ascend:: ops must be registered for "
                "PrivateUse1 by torchrec_ascend.ops; the CPU kernel is never used in their place)");
  }
  at::native::cpu_fallback(op, stack);
}

// ------------------------------------------------------------------------------ masking
// mask(op): route one op's PrivateUse1 dispatch back to the fallback (as if no kernel were
// registered), so tests can prove a missing fbgemm kernel fails.  unmask(op) restores it.

namespace {
std::mutex g_mask_mu;
std::map<std::string, std::unique_ptr<torch::Library>> g_masks;
}  // namespace

void mask(const std::string& qualname) {
  const auto sep = qualname.find("::");
  TORCH_CHECK(sep != std::string::npos, "mask: op name must be 'namespace::name', got ", qualname);
  std::lock_guard<std::mutex> lock(g_mask_mu);
  if (g_masks.count(qualname)) return;
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, qualname.substr(0, sep),
                                              c10::DispatchKey::PrivateUse1, "simnpu", 0);
  const std::string op_name = qualname.substr(sep + 2);
  lib->impl(op_name.c_str(), torch::CppFunction::makeFromBoxedFunction<&fallback>());
  g_masks.emplace(qualname, std::move(lib));
}

void unmask(const std::string& qualname) {
  std::lock_guard<std::mutex> lock(g_mask_mu);
  g_masks.erase(qualname);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("resize_", resize_);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset);
  m.impl("record_stream", record_stream);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

}  // namespace simnpu
