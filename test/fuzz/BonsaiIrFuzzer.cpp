//===- BonsaiIrFuzzer.cpp - libFuzzer target: model and recipe IR ---------===//
//
// Feeds each input to the MLIR parser as a bonsai module, as bonsai-opt and bonsai-compile
// read a model or a recipe: the bonsai, bonsai_plan and func dialects' parsers, every op's
// verifier (the recipe's directives among them), then the bonsai-verify-model pass that opens
// the pipeline (unique parameter names, integer inputs, one f32 loss). Any input must end in a
// module or diagnostics; a crash, an assertion or a sanitizer report is a bug.
//
// The context is made once per process: loading the dialects for every input would cost more
// than parsing it. Diagnostics are swallowed, since malformed input is the normal case.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Dialect/Bonsai/IR/BonsaiDialect.h"
#include "bonsai/Dialect/Plan/IR/PlanDialect.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"

#include <cstdint>
#include <string>

using namespace mlir;

// LLVM's allocators poison their free slab memory for ASan in code compiled with it (this
// harness, the dialects), and Debian's MLIR libraries, compiled without, never unpoison it:
// the two together make false use-after-poison reports. Manual poisoning is turned off.
extern "C" const char *__asan_default_options() { return "allow_user_poisoning=0"; }

namespace {

MLIRContext &context() {
  static MLIRContext *context = [] {
    DialectRegistry registry;
    registry.insert<bonsai::BonsaiDialect, bonsai::plan::PlanDialect, func::FuncDialect>();
    auto *ctx = new MLIRContext(registry, MLIRContext::Threading::DISABLED);
    ctx->loadAllAvailableDialects();
    return ctx;
  }();
  return *context;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  MLIRContext &ctx = context();
  ScopedDiagnosticHandler quiet(&ctx, [](Diagnostic &) { return success(); });
  ParserConfig config(&ctx);
  // MLIR's lexer stops at the NUL that a file's MemoryBuffer always ends with, and reads past
  // the end of a buffer without one: the input is copied into a string, which has it, as
  // bonsai-opt and bonsai-compile read files.
  std::string text(reinterpret_cast<const char *>(data), size);
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(text, config, "fuzz.mlir");
  if (!module)
    return 0;
  PassManager pm(&ctx);
  pm.addPass(bonsai::createBonsaiVerifyModelPass());
  (void)pm.run(*module);
  return 0;
}
