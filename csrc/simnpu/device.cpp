// Simulated NPU (test infrastructure): the PrivateUse1 device runtime.
//
// Memory is ordinary host memory (c10::alloc_cpu) tagged with a PrivateUse1 device, so a
// simulated-device tensor and a CPU view of it can alias the same bytes.  Streams and events
// exist (ids, a current stream per thread and device, event timestamps) but all work is
// synchronous: waits, queries and synchronizations complete at once.
#include "simnpu.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

namespace simnpu {

namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
thread_local c10::DeviceIndex tl_device = 0;

c10::DeviceIndex read_device_count() {
  const char* env = std::getenv("TORCHREC_ASCEND_SIMNPU_DEVICES");
  if (env == nullptr || *env == '\0') return 8;
  const int n = std::atoi(env);
  return static_cast<c10::DeviceIndex>(n < 1 ? 1 : (n > 64 ? 64 : n));
}

void check_index(c10::DeviceIndex d) {
  TORCH_CHECK(d >= 0 && d < device_count(), "simulated npu: device index ", static_cast<int>(d),
              " out of range [0, ", static_cast<int>(device_count()), ")");
}

// ------------------------------------------------------------------------------ allocator

void host_free(void* p) { c10::free_cpu(p); }

struct HostBackedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    return {p, p, &host_free, c10::Device(kType, current_device())};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &host_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count) std::memcpy(dest, src, count);
  }
};

HostBackedAllocator g_allocator;

// Pinned host memory (what DDP's reducer and pin_memory() ask the accelerator for): ordinary
// host memory whose blocks are remembered, so isPinnedPtr can answer for any address inside one.
std::mutex g_pinned_mu;
std::map<const char*, size_t> g_pinned;  // block start -> size

void pinned_free(void* p) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mu);
    g_pinned.erase(static_cast<const char*>(p));
  }
  c10::free_cpu(p);
}

bool is_pinned(const void* data) {
  const char* q = static_cast<const char*>(data);
  std::lock_guard<std::mutex> lock(g_pinned_mu);
  auto it = g_pinned.upper_bound(q);
  if (it == g_pinned.begin()) return false;
  --it;
  return q < it->first + (it->second ? it->second : 1);
}

struct PinnedHostAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = c10::alloc_cpu(nbytes ? nbytes : 1);
    {
      std::lock_guard<std::mutex> lock(g_pinned_mu);
      g_pinned[static_cast<const char*>(p)] = nbytes;
    }
    return {p, p, &pinned_free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &pinned_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count) std::memcpy(dest, src, count);
  }
};

PinnedHostAllocator g_pinned_allocator;

// ------------------------------------------------------------------------------ streams & events

// current stream id per (thread, device); 0 is the default stream
thread_local std::unordered_map<c10::DeviceIndex, c10::StreamId> tl_streams;
std::atomic<c10::StreamId> g_next_stream{1};

struct SimEvent {
  std::chrono::steady_clock::time_point when;
};

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  GuardImpl() = default;
  explicit GuardImpl(c10::DeviceType t) {
    TORCH_CHECK(t == kType, "simulated npu guard for ", t);
  }
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = current_device();
    set_device(d.index());
    return c10::Device(kType, old);
  }
  c10::Device getDevice() const override { return c10::Device(kType, current_device()); }
  void setDevice(c10::Device d) const override { set_device(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0) tl_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const noexcept override {
    auto idx = d.index() < 0 ? tl_device : d.index();
    auto it = tl_streams.find(idx);
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, idx),
                       it == tl_streams.end() ? 0 : it->second);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, d.index() < 0 ? tl_device : d.index()), 0);
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/ = 0) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, d.index() < 0 ? tl_device : d.index()),
                       g_next_stream++);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high*/ = false) const override {
    return getNewStream(d);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    auto old = getStream(s.device());
    tl_streams[s.device_index()] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }
  void record(void** event, const c10::Stream& /*stream*/, const c10::DeviceIndex /*idx*/,
              const c10::EventFlag /*flag*/) const override {
    if (*event == nullptr) *event = new SimEvent();
    static_cast<SimEvent*>(*event)->when = std::chrono::steady_clock::now();
  }
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex /*idx*/) const noexcept override {
    delete static_cast<SimEvent*>(event);
  }
  bool queryStream(const c10::Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {}
  void synchronizeEvent(void* /*event*/) const override {}
  void synchronizeDevice(const c10::DeviceIndex /*idx*/) const override {}
  double elapsedTime(void* e1, void* e2, const c10::DeviceIndex /*idx*/) const override {
    TORCH_CHECK(e1 && e2, "simulated npu: both events must be recorded before elapsed_time");
    auto d = static_cast<SimEvent*>(e2)->when - static_cast<SimEvent*>(e1)->when;
    return std::chrono::duration<double, std::milli>(d).count();
  }
  void recordDataPtrOnStream(const c10::DataPtr& /*ptr*/, const c10::Stream& /*stream*/) const override {}
};

// ------------------------------------------------------------------------------ hooks

struct Hooks final : at::PrivateUse1HooksInterface {
  void init() const override {}
  bool hasPrimaryContext(c10::DeviceIndex /*idx*/) const override { return true; }
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_device(d); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = current_device();
    set_device(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    if (d < 0 || d >= device_count()) return current_device();
    return exchangeDevice(d);
  }
  bool isPinnedPtr(const void* data) const override { return data != nullptr && is_pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
  // Random numbers for the simulated device come from the CPU generator (the CPU fallback
  // kernels draw them), so the default generator of every simulated device is the CPU one.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex /*idx*/) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Generator getNewGenerator(c10::DeviceIndex /*idx*/) const override {
    return at::detail::createCPUGenerator();
  }
  at::Device getDeviceFromPtr(void* /*data*/) const override {
    return at::Device(kType, current_device());
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    const size_t old = impl->nbytes();
    c10::DataPtr fresh = g_allocator.allocate(newsize);
    const size_t keep = old < newsize ? old : newsize;
    if (keep) std::memcpy(fresh.get(), impl->data(), keep);
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

}  // namespace

c10::DeviceIndex device_count() noexcept {
  static const c10::DeviceIndex n = read_device_count();
  return n;
}

c10::DeviceIndex current_device() noexcept { return tl_device; }

void set_device(c10::DeviceIndex d) {
  if (d < 0) return;  // "current device": nothing to change
  check_index(d);
  tl_device = d;
}

c10::Allocator* allocator() { return &g_allocator; }

void register_runtime() {
  static bool done = false;
  if (done) return;
  done = true;
  c10::SetAllocator(kType, &g_allocator);
  static Hooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
}

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

}  // namespace simnpu
