// Simulated NPU (test infrastructure): shared declarations of torchrec_ascend._simnpu.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

namespace simnpu {

c10::DeviceIndex device_count() noexcept;
c10::DeviceIndex current_device() noexcept;
void set_device(c10::DeviceIndex d);
c10::Allocator* allocator();
// allocator + hooks (the guard and the aten kernels register themselves when the library loads)
void register_runtime();

}  // namespace simnpu
