// Registration of the op families: the one helper the XNNPACK, Vulkan and Metal files use.
//
// A family is a set of context classes and operators that one mobile backend's graphs name.
// Its file declares them once, on a `Family`:
//
//   void declare(Family& f) {
//     f.context<Conv2dOpContext>("xnnpack", "Conv2dOpContext");  // class + pickled state
//     f.op("prepacked::conv2d_clamp_run(Tensor X, ...) -> Tensor Y",   // schema + CPU kernel
//          TORCH_FN(run_op<Conv2dOpContext>));
//   }
//   static Family family("XNNPACK", "prepacked", &declare);
//
// and `family.register_once()` registers all of it the first time it is called, unless torch already
// provides the family (then torch's own ops stay in use and nothing is registered). Nothing
// here runs at load time: fxmobile._C registers a family when Python asks for it
// (fxmobile.backends.library). The names torch is checked for come from the declarations, so
// the check and the registration cannot disagree.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace fxmobile {

enum class Provider { kNative, kFxMobile };

// __getstate__ hands out a list the caller may change: give it a copy, never the context's own.
inline c10::impl::GenericList detached_state(const c10::impl::GenericList& state) {
  return state.copy();
}
template <typename State>
State detached_state(const State& state) {
  return state;
}

// A context class `Context` declares its pickled state, which is upstream's, element for element:
//   using State = ...;             // a std::tuple, or a c10::impl::GenericList
//   State state() const;           // (or a const reference) what __getstate__ returns
//   explicit Context(State state); // what __setstate__ calls; packs again
// Upstream's __setstate__ rebuilds the context from the state alone, and so does this: nothing
// a context derives (packed weights, the chosen kernel path) is ever pickled.
template <typename Context>
void def_context(const char* ns, const char* name) {
  using State = typename Context::State;
  torch::class_<Context>(ns, name).def_pickle(
      [](const c10::intrusive_ptr<Context>& self) -> State {
        return detached_state(self->state());
      },
      [](State state) -> c10::intrusive_ptr<Context> {
        return c10::make_intrusive<Context>(std::move(state));
      });
}

// The kernel of a prepack op whose arguments are the elements of Context::State, in order
// (upstream's XNNPACK and Metal contexts pickle exactly their prepack arguments).
template <typename Context, typename State = typename Context::State>
struct PrepackOp;
template <typename Context, typename... Args>
struct PrepackOp<Context, std::tuple<Args...>> {
  static c10::intrusive_ptr<Context> call(Args... args) {
    return c10::make_intrusive<Context>(std::tuple<Args...>(std::move(args)...));
  }
};

// The kernel of a run op: the context's own run.
template <typename Context>
at::Tensor run_op(const at::Tensor& input, const c10::intrusive_ptr<Context>& context) {
  return context->run(input);
}

class Family {
 public:
  // `name` is for messages ("XNNPACK"); every op is in `op_namespace` ("prepacked");
  // `declare` adds the classes and ops (it runs once, here).
  Family(const char* name, const char* op_namespace, void (*declare)(Family&));
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;

  // A context class, registered as torch.classes.<ns>.<name> with its pickled state.
  template <typename Context>
  Family& context(const char* ns, const char* name) {
    classes_.push_back(std::string(ns) + "." + name);
    class_registrations_.emplace_back([ns, name] { def_context<Context>(ns, name); });
    return *this;
  }

  // An operator with upstream's schema and its CPU kernel (TORCH_FN(fn)).
  template <typename Kernel>
  Family& op(const char* schema, Kernel cpu_kernel) {
    return add_op(schema, [cpu_kernel] { return torch::CppFunction(cpu_kernel); }, true);
  }

  // An operator whose tensor arguments may all be None (or an empty list): a CPU kernel could
  // not be dispatched to without a tensor, so its kernel serves every dispatch key.
  template <typename Kernel>
  Family& op_for_any_device(const char* schema, Kernel kernel) {
    return add_op(schema, [kernel] { return torch::CppFunction(kernel); }, false);
  }

  // Registers the classes, then the operators, at most once (thread-safe); returns who
  // provides the family. A torch that provides only part of it cannot be completed without
  // clashing: that throws, naming what is there and what is missing.
  Provider register_once();

 private:
  struct Op {
    std::string schema;
    std::string name; // "ns::op", from the schema
    // Made at registration, after the classes: a kernel's signature names them.
    std::function<torch::CppFunction()> make_kernel;
    bool cpu_only;
  };

  Family& add_op(
      const char* schema,
      std::function<torch::CppFunction()> make_kernel,
      bool cpu_only);
  bool is_native() const;
  void do_register();

  const char* name_;
  const char* namespace_;
  std::vector<std::string> classes_; // "ns.Class"
  std::vector<std::function<void()>> class_registrations_;
  std::vector<Op> ops_;
  std::mutex mutex_;
  std::optional<Provider> provider_;
  // Kept alive for the life of the process: destroying a Library deregisters its ops.
  std::unique_ptr<torch::Library> def_library_;
  std::unique_ptr<torch::Library> cpu_library_;
};

Provider register_xnnpack();
Provider register_vulkan();
Provider register_metal();

} // namespace fxmobile
