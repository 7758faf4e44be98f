// Simulated NPU (test infrastructure): the torchrec_ascend._simnpu Python module.
#include "simnpu.h"

#include <torch/extension.h>

namespace simnpu {
void mask(const std::string& qualname);
void unmask(const std::string& qualname);
void bind_comm(pybind11::module_& m);
}  // namespace simnpu

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Simulated NPU (PrivateUse1 over host memory) for torchrec_ascend tests";
  m.def("register_runtime", &simnpu::register_runtime, "install allocator and device hooks");
  m.def("device_count", []() { return static_cast<int>(simnpu::device_count()); });
  m.def("current_device", []() { return static_cast<int>(simnpu::current_device()); });
  m.def("set_device", [](int d) { simnpu::set_device(static_cast<c10::DeviceIndex>(d)); });
  m.def("mask", &simnpu::mask, "route op's PrivateUse1 dispatch to the (refusing) fallback");
  m.def("unmask", &simnpu::unmask, "undo mask()");
  simnpu::bind_comm(m);
}
