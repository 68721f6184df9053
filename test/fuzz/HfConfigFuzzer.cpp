//===- HfConfigFuzzer.cpp - libFuzzer target: Hugging Face config.json ----===//
//
// Feeds each input to bonsai-import-hf's importer as config.json: the JSON, the architecture
// and every key the graph depends on (parseModelConfig), then, for a config it accepts, the
// forward graph built with the dialect's builders at batch 1 and sequence min(8, positions),
// packed when the family allows it, and verified as the tool verifies it. Any input must end
// in a verified module or an ImportError or rt::Error; a crash, a module that does not verify
// or a sanitizer report is a bug.
//
// The importer refuses configs with more layers than the checkpoint has tensors before it
// builds anything (checkLayerCount); the fuzzer stands in a checkpoint of 64 tensors.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Import/HfImport.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiDialect.h"
#include "bonsai/runtime/Tensor.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>

using namespace mlir;
using namespace mlir::bonsai::hf;

// LLVM's allocators poison their free slab memory for ASan in code compiled with it (this
// harness, the dialects), and Debian's MLIR libraries, compiled without, never unpoison it:
// the two together make false use-after-poison reports. Manual poisoning is turned off.
extern "C" const char *__asan_default_options() { return "allow_user_poisoning=0"; }

namespace {

MLIRContext &context() {
  static MLIRContext *context = [] {
    DialectRegistry registry;
    registry.insert<mlir::bonsai::BonsaiDialect, func::FuncDialect>();
    auto *ctx = new MLIRContext(registry, MLIRContext::Threading::DISABLED);
    ctx->loadAllAvailableDialects();
    return ctx;
  }();
  return *context;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ModelConfig config;
  try {
    config = parseModelConfig(std::string_view(reinterpret_cast<const char *>(data), size),
                              "fuzz/config.json");
    checkLayerCount(config, 64);
  } catch (const ImportError &) {
    return 0;
  } catch (const ::bonsai::rt::Error &) {
    return 0;
  }
  MLIRContext &ctx = context();
  std::string diagnostics;
  ScopedDiagnosticHandler collect(&ctx, [&](Diagnostic &d) {
    llvm::raw_string_ostream(diagnostics) << d << "\n";
    return success();
  });
  OpBuilder b(&ctx);
  OwningOpRef<ModuleOp> module = ModuleOp::create(b.getUnknownLoc());
  try {
    buildForward(*module, b.getF32Type(), config, /*batch=*/1,
                 /*seq=*/std::min<int64_t>(8, config.positions),
                 /*packed=*/config.family == Family::Llama, "transformer.");
  } catch (const ImportError &) {
    return 0;
  }
  // The importer promises that a config it accepts builds a valid model.
  if (failed(verify(*module))) {
    llvm::errs() << "an accepted config built a model that does not verify:\n" << diagnostics;
    std::abort();
  }
  return 0;
}
