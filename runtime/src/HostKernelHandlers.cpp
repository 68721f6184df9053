//===- HostKernelHandlers.cpp - Kernels on the host stream of a GPU backend ===//
//
// The handlers of the kinds with trait kHostStep (HostKernelHandlers.h), gathered into a
// table in kernel-table order like the backends' own: a kind has a handler exactly when the
// table gives it the trait, which a static_assert per kind checks.
//
//===----------------------------------------------------------------------===//

#include "HostKernelHandlers.h"

#include "KernelParams.h"

#include <type_traits>
#include <utility>

namespace bonsai::rt {
namespace {

/// The optional master output `j` as the host step's list: empty, or the one master.
std::vector<TensorView> mastersOf(const KernelCall &c, unsigned j) {
  if (const TensorView *master = c.optionalOut(j))
    return {*master};
  return {};
}

void launch(kinds::AdamWUpdate, const KernelCall &c, host::ThreadPool &pool) {
  using In = kinds::AdamWUpdate::In;
  using Out = kinds::AdamWUpdate::Out;
  host::adamwStep(pool, {c.in(In::grad)}, c.in(In::step), c.in(In::lr), c.in(In::norm),
                  adamwHyper(c.attrs<kinds::AdamWUpdate>()), {c.out(Out::param)}, {c.out(Out::m)},
                  {c.out(Out::v)}, mastersOf(c, Out::master));
}

void launch(kinds::SGDUpdate, const KernelCall &c, host::ThreadPool &pool) {
  using In = kinds::SGDUpdate::In;
  using Out = kinds::SGDUpdate::Out;
  host::sgdStep(pool, {c.in(In::grad)}, c.in(In::lr), c.in(In::norm),
                sgdHyper(c.attrs<kinds::SGDUpdate>()), {c.out(Out::param)}, {c.out(Out::momentum)},
                mastersOf(c, Out::master));
}

using HostHandler = void (*)(const KernelCall &, host::ThreadPool &);

/// The handler of kind K, or null where there is no `launch` overload for it.
template <typename K, typename = void> struct HostHandlerOf {
  static constexpr bool exists = false;
  static constexpr HostHandler handler = nullptr;
};
template <typename K>
struct HostHandlerOf<K, std::void_t<decltype(launch(K{}, std::declval<const KernelCall &>(),
                                                    std::declval<host::ThreadPool &>()))>> {
  static void run(const KernelCall &c, host::ThreadPool &pool) { launch(K{}, c, pool); }
  // A flag of its own: a function's address compared with null is not a constant expression
  // under -fsanitize=undefined.
  static constexpr bool exists = true;
  static constexpr HostHandler handler = &run;
};

#define BONSAI_KERNEL_KIND(Name, ...)                                                              \
  static_assert(((kinds::Name::traits & kernel_traits::kHostStep) != 0) ==                         \
                    HostHandlerOf<kinds::Name>::exists,                                            \
                "kind " #Name ": trait kHostStep and a host handler go together");
#include "bonsai/runtime/KernelKinds.def"

constexpr HostHandler kHostHandlers[] = {
#define BONSAI_KERNEL_KIND(Name, ...) HostHandlerOf<kinds::Name>::handler,
#include "bonsai/runtime/KernelKinds.def"
};
static_assert(sizeof kHostHandlers / sizeof kHostHandlers[0] == kKernelKindCount);

} // namespace

void launchOnHost(const KernelCall &call, host::ThreadPool &pool) {
  HostHandler handler = kHostHandlers[kernelKindIndex(call.kernel().kind)];
  if (!handler)
    throw Error(std::string("kind ") + kernelKindName(call.kernel().kind) +
                " has no host implementation");
  handler(call, pool);
}

} // namespace bonsai::rt
