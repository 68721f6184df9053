//===- PlanFuzzer.cpp - libFuzzer target: the plan loader ------------------===//
//
// Feeds each input to loadPlanBuffer as a plan file's bytes: the flatbuffer verifier, then the
// loader's semantic checks (arenas, tensors, views, kernels against the kernel table,
// adapters, generated kernels). A plan it accepts is printed as `bonsai-run --print-plan`
// would, which walks everything the loader filled in. Any input must end in a plan or an
// rt::Error; an escaping exception of another type, a crash or a sanitizer report is a bug.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Plan.h"
#include "bonsai/runtime/PlanPrinter.h"
#include "bonsai/runtime/Tensor.h"

#include <cstdint>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace bonsai::rt;
  // A copy: the verifier needs 8-byte aligned memory, which libFuzzer's buffer need not be.
  std::vector<uint8_t> bytes(data, data + size);
  try {
    LoadedPlan plan = loadPlanBuffer(bytes.data(), bytes.size(), "fuzz.plan");
    (void)printPlan(plan);
  } catch (const Error &) {
  }
  return 0;
}
