// Direct dispatcher kernels: a csrc function registered as the CPU kernel of
// torchrec_ascend::<op> itself, so that a call costs one dispatcher hop instead of the Python
// path (Python kernel -> registry.run -> choose -> pybind).  ops/registry.py stays the one place
// that decides which backend runs:
//
//   * it installs an op's direct kernel (`_direct_install`) instead of its Python CPU kernel, and
//     hands over that Python kernel as the fallback;
//   * after every change of the forcing state (use_backend enter/exit) it tells each op whether
//     its registry choice on CPU is the csrc kernel (`_direct_set_python(name, false)`) or not;
//   * the direct kernel runs the csrc function only when the registry said so and
//     $TORCHREC_ASCEND_BACKEND is unset (the variable is read by the registry at call time, so a
//     set variable always takes the Python path, which honours it); otherwise it calls the
//     Python fallback with the same arguments.
//
// Ops with an autograd formula also get an AutogradCPU kernel: without a gradient to record (grad
// mode off, or no input requires grad) it redispatches below autograd in C++; otherwise it calls
// the Python autograd implementation built from the same OpSpec (the one torch.library registers
// for the other devices).
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace torchrec_ascend::direct {

// Per-op routing state.  Leaked on purpose: it outlives the interpreter and the dispatcher.
struct Route {
  std::atomic<bool> python{true};     // registry choice on CPU is not the csrc kernel
  PyObject* fallback = nullptr;       // the registry's Python CPU kernel (new reference)
  PyObject* grad_fallback = nullptr;  // Python autograd implementation (new reference) or null
};

inline bool env_forced() {
  const char* e = std::getenv("TORCHREC_ASCEND_BACKEND");
  return e != nullptr && e[0] != '\0';
}

inline bool requires_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }
inline bool requires_grad(const std::optional<at::Tensor>& t) {
  return t.has_value() && requires_grad(*t);
}
template <class T>
inline bool requires_grad(const T&) {
  return false;
}

template <class Ret, class... Args>
Ret call_python(PyObject* fn, Args&&... args) {
  pybind11::gil_scoped_acquire gil;
  TORCH_CHECK(fn != nullptr, "torchrec_ascend: direct kernel has no Python fallback installed");
  pybind11::object out = pybind11::reinterpret_borrow<pybind11::object>(fn)(
      std::forward<Args>(args)...);
  if constexpr (!std::is_void_v<Ret>) return out.cast<Ret>();
}

// Tag tells apart ops served by one csrc function (the three pooled-embedding permutes).
template <auto Fn, int Tag = 0>
struct Kernel;

template <class Ret, class... Args, Ret (*Fn)(Args...), int Tag>
struct Kernel<Fn, Tag> {
  using Sig = Ret(Args...);
  using Handle = c10::TypedOperatorHandle<Sig>;

  static Route& route() {
    static Route* r = new Route();
    return *r;
  }
  static std::optional<Handle>& handle() {
    static auto* h = new std::optional<Handle>();
    return *h;
  }

  // CPU kernel of torchrec_ascend::<op>.
  static Ret cpu(Args... args) {
    Route& r = route();
    if (r.python.load(std::memory_order_relaxed) || env_forced()) {
      return call_python<Ret>(r.fallback, args...);
    }
    return Fn(args...);
  }

  // AutogradCPU kernel (ops with a gradient).
  static Ret autograd_cpu(Args... args) {
    if (!c10::GradMode::is_enabled() || !(requires_grad(args) || ...)) {
      at::AutoDispatchBelowADInplaceOrView below;
      return handle()->call(args...);
    }
    return call_python<Ret>(route().grad_fallback, args...);
  }
};

// One op that has a direct kernel.
struct Entry {
  const char* name;
  Route& (*route)();
  void (*install)(const char* name, bool autograd);
};

template <auto Fn, int Tag = 0>
Entry entry(const char* name) {
  return Entry{name, &Kernel<Fn, Tag>::route, [](const char* op, bool autograd) {
                 using K = Kernel<Fn, Tag>;
                 // one library per op and key; never destroyed (the kernels stay for the
                 // process: routing, not deregistration, switches them off)
                 auto* cpu = new torch::Library(torch::Library::IMPL, "torchrec_ascend",
                                                c10::DispatchKey::CPU, __FILE__, __LINE__);
                 cpu->impl(op, TORCH_FN(K::cpu));
                 if (autograd) {
                   K::handle() = c10::Dispatcher::singleton()
                                     .findSchemaOrThrow((std::string("torchrec_ascend::") + op).c_str(), "")
                                     .template typed<typename K::Sig>();
                   auto* ag = new torch::Library(torch::Library::IMPL, "torchrec_ascend",
                                                 c10::DispatchKey::AutogradCPU, __FILE__, __LINE__);
                   ag->impl(op, TORCH_FN(K::autograd_cpu));
                 }
               }};
}

// Every op with a direct kernel (filled by the bind_<area> functions before bind()).
inline std::vector<Entry>& table() {
  static auto* t = new std::vector<Entry>();
  return *t;
}

inline Entry* find(const std::string& name) {
  for (auto& e : table()) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

// Python API used by ops/registry.py.
inline void bind(pybind11::module& m) {
  m.def("_direct_ops", [] {
    std::vector<std::string> out;
    for (auto& e : table()) out.emplace_back(e.name);
    return out;
  }, "Ops that have a direct dispatcher kernel.");
  m.def(
      "_direct_install",
      [](const std::string& name, pybind11::object fallback, pybind11::object grad_fallback) {
        Entry* e = find(name);
        TORCH_CHECK_VALUE(e != nullptr, "name: ", name, " has no direct kernel");
        Route& r = e->route();
        TORCH_CHECK_VALUE(r.fallback == nullptr, "name: ", name, " is already installed");
        r.fallback = fallback.inc_ref().ptr();
        if (!grad_fallback.is_none()) r.grad_fallback = grad_fallback.inc_ref().ptr();
        e->install(e->name, !grad_fallback.is_none());
      },
      "Register the direct CPU (and, with grad_fallback, AutogradCPU) kernel of an op.");
  m.def(
      "_direct_set_python",
      [](const std::string& name, bool python) {
        Entry* e = find(name);
        TORCH_CHECK_VALUE(e != nullptr, "name: ", name, " has no direct kernel");
        e->route().python.store(python);
      },
      "Route an op's CPU calls to its Python fallback (True) or its csrc kernel (False).");
  m.def(
      "_direct_routes_python",
      [](const std::string& name) {
        Entry* e = find(name);
        TORCH_CHECK_VALUE(e != nullptr, "name: ", name, " has no direct kernel");
        return e->route().python.load() || env_forced();
      },
      "Whether a CPU call of the op now takes the Python path.");
}

}  // namespace torchrec_ascend::direct
