//===- ModelSummary.h - What a recipe needs to know about a model ---------===//
//
// A ModelSummary lists a model function's parameters and linears, with their Hugging Face names
// and shapes. Recipe directives check themselves against it (do the LoRA targets name linears?
// is the GaLore rank smaller than each matrix?), and passes use it to resolve target patterns.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_MODELSUMMARY_H
#define BONSAI_DIALECT_BONSAI_IR_MODELSUMMARY_H

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Operation.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"

namespace mlir::bonsai {

/// One `bonsai.param` of the model.
struct ParamSummary {
  Operation *op = nullptr;
  llvm::StringRef name;
  /// The whole tensor's type (also when bonsai-shard has made the op one rank's share).
  RankedTensorType type;
  bool trainable = false;
  /// Added by a pass with its own initializer (bonsai-insert-lora's adapters carry
  /// `bonsai.init`), not bound from the checkpoint: never what a recipe's weight patterns mean.
  bool addedByPass = false;
};

/// One `bonsai.linear` whose weight is (a view of) a parameter.
struct LinearSummary {
  Operation *op = nullptr;
  /// The parameter the weight comes from, through views, casts and dequantization.
  const ParamSummary *weight = nullptr;
  /// The module path of the weight: its name without a trailing ".weight".
  llvm::StringRef modulePath;
  int64_t inFeatures = 0;
  int64_t outFeatures = 0;
};

/// Parameters, linears and sequence length of a model function.
class ModelSummary {
public:
  /// Summarises `function` (a func.func holding bonsai ops).
  explicit ModelSummary(Operation *function);

  Operation *getFunction() const { return function; }
  llvm::ArrayRef<ParamSummary> getParams() const { return params; }
  llvm::ArrayRef<LinearSummary> getLinears() const { return linears; }
  /// The sequence length seen by the attention ops, or 0 if the model has none.
  int64_t getSequenceLength() const { return sequenceLength; }

  /// The linears whose weight matches `pattern` (see matchesTargetPattern).
  llvm::SmallVector<const LinearSummary *> matchLinears(llvm::StringRef pattern) const;

  /// The linears matched by any of `patterns`, each once, in model order.
  llvm::SmallVector<const LinearSummary *>
  matchLinears(llvm::ArrayRef<llvm::StringRef> patterns) const;

private:
  Operation *function;
  llvm::SmallVector<ParamSummary> params;
  llvm::SmallVector<LinearSummary> linears;
  int64_t sequenceLength = 0;
};

/// PEFT's `target_modules` rule, extended with globs: a pattern with `*`, `?` or `[` is a glob
/// over the whole weight name; any other pattern matches a module path equal to it or ending in
/// "." followed by it.
bool matchesTargetPattern(llvm::StringRef pattern, llvm::StringRef modulePath,
                          llvm::StringRef weightName);

/// Checks that LoRA (with `dora`, DoRA) adapters of rank `rank` apply to the linears that
/// `targets` match: every pattern matches a linear; the rank is positive and below min(in, out)
/// of each; no matched weight has another use (a tied weight would be adapted in one use
/// only); for DoRA, no matched linear has a bias and each weight is its parameter in [out, in]
/// layout (possibly cast or dequantized), whose row norms initialize the magnitude. Emits the
/// first problem through `emitError` (the directive or the pass) and fails.
llvm::LogicalResult
verifyLoraTargets(llvm::function_ref<InFlightDiagnostic()> emitError,
                  llvm::ArrayRef<llvm::StringRef> targets, int64_t rank, bool dora,
                  const ModelSummary &model);

} // namespace mlir::bonsai

#endif // BONSAI_DIALECT_BONSAI_IR_MODELSUMMARY_H
