// Direct dispatcher kernels: a csrc function registered as the CPU kernel of
// torchrec_ascend::<op> itself, so that a call costs one dispatcher hop instead of the Python
// path (Python kernel -> registry -> pybind).  The registry (torchrec_ascend/ops/registry/) decides
// when: while an op's CPU choice is the csrc kernel it holds the handle `register_direct` returns;
// when the choice changes it drops the handle, and the torch::Library destructors take the
// kernels out of the dispatcher's table again (the registry's Python CPU kernel, registered
// underneath, serves the op then).  Nothing here reads the environment or keeps a per-call flag.
//
// Ops with an autograd formula also get an AutogradCPU kernel: without a gradient to record (grad
// mode off, or no input requires grad) it redispatches below autograd in C++; otherwise it calls
// the Python autograd implementation built from the same OpSpec (the one torch.library registers
// for the other devices).
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace torchrec_ascend::direct {

inline bool requires_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }
inline bool requires_grad(const std::optional<at::Tensor>& t) {
  return t.has_value() && requires_grad(*t);
}
template <class T>
inline bool requires_grad(const T&) {
  return false;
}

// The kernels of one op, in the dispatcher while this object lives (held by the registry).
// Hidden like pybind11's own types: it is bound to Python and holds a pybind11::object.
struct __attribute__((visibility("hidden"))) Registration {
  explicit Registration(pybind11::object grad) : grad(std::move(grad)) {}
  pybind11::object grad;                             // Python autograd implementation, or None
  std::vector<std::unique_ptr<torch::Library>> libs;  // destroyed first: they use `grad`
  ~Registration() { libs.clear(); }
};

// Drops the dispatcher's one-time "Overriding a previously registered kernel" warning while a
// direct kernel goes on top of the registry's Python CPU kernel (the override is the design).
class QuietOverride : public c10::WarningHandler {
 public:
  void process(const c10::Warning& w) override {
    if (w.msg().find("Overriding a previously registered kernel") == std::string::npos) {
      previous_->process(w);
    }
  }
  c10::WarningHandler* previous_ = c10::WarningUtils::get_warning_handler();
};

template <class Ret, class... Args>
Ret call_python(PyObject* fn, Args&&... args) {
  pybind11::gil_scoped_acquire gil;
  pybind11::object out = pybind11::reinterpret_borrow<pybind11::object>(fn)(
      std::forward<Args>(args)...);
  if constexpr (!std::is_void_v<Ret>) return out.template cast<Ret>();
}

template <auto Fn>
struct Kernel;

template <class Ret, class... Args, Ret (*Fn)(Args...)>
struct Kernel<Fn> {
  static std::unique_ptr<Registration> make(const std::string& op, pybind11::object grad) {
    auto reg = std::make_unique<Registration>(std::move(grad));
    QuietOverride quiet;
    c10::WarningUtils::WarningHandlerGuard guard(&quiet);
    auto cpu = std::make_unique<torch::Library>(torch::Library::IMPL, "torchrec_ascend",
                                                c10::DispatchKey::CPU, __FILE__, __LINE__);
    cpu->impl(op.c_str(), TORCH_FN(Fn));
    reg->libs.push_back(std::move(cpu));
    if (!reg->grad.is_none()) {
      auto handle = c10::Dispatcher::singleton()
                        .findSchemaOrThrow(("torchrec_ascend::" + op).c_str(), "")
                        .template typed<Ret(Args...)>();
      PyObject* fn = reg->grad.ptr();  // alive as long as the kernel (see Registration)
      auto ag = std::make_unique<torch::Library>(torch::Library::IMPL, "torchrec_ascend",
                                                 c10::DispatchKey::AutogradCPU, __FILE__, __LINE__);
      ag->impl(op.c_str(), [handle, fn](Args... args) -> Ret {
        if (!c10::GradMode::is_enabled() || !(requires_grad(args) || ...)) {
          at::AutoDispatchBelowADInplaceOrView below;
          return handle.call(args...);
        }
        return call_python<Ret>(fn, args...);
      });
      reg->libs.push_back(std::move(ag));
    }
    return reg;
  }
};

// One op that has a direct kernel.
struct Entry {
  std::string name;
  std::unique_ptr<Registration> (*make)(const std::string& op, pybind11::object grad);
};

template <auto Fn>
Entry entry(const char* name) {
  return Entry{name, &Kernel<Fn>::make};
}

// Every op with a direct kernel (filled by the bind_<area> functions before bind(), then read
// only).
inline std::vector<Entry>& table() {
  static auto* t = new std::vector<Entry>();
  return *t;
}

// Python API used by torchrec_ascend/ops/registry/.
inline void bind(pybind11::module& m) {
  pybind11::class_<Registration>(m, "DirectRegistration",
                                 "An op's direct kernels, registered while this object lives.");
  m.def("direct_ops", [] {
    std::vector<std::string> out;
    for (const auto& e : table()) out.push_back(e.name);
    return out;
  }, "Ops that have a direct dispatcher kernel.");
  m.def(
      "register_direct",
      [](const std::string& name, pybind11::object grad) -> std::unique_ptr<Registration> {
        for (const auto& e : table()) {
          if (e.name == name) return e.make(name, std::move(grad));
        }
        TORCH_CHECK_VALUE(false, "name: ", name, " has no direct kernel");
        return nullptr;
      },
      pybind11::arg("name"), pybind11::arg("grad"),
      "Register the direct CPU kernel of an op (and, with grad, its AutogradCPU kernel calling "
      "grad when a gradient is recorded); dropping the returned object deregisters them.");
}

}  // namespace torchrec_ascend::direct
