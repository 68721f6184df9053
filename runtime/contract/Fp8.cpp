//===- Fp8.cpp - The contracts of the Fp8 kernels -------------------------===//
//
// The operand contracts of FP8 GEMMs with delayed scaling and their scale updates (docs/fp8.md):
// what the plan loader checks of each such kernel before any backend runs it (KernelChecker.h).
// Each kind's `verify` checks its attributes, then its operands, then the state it keeps.
//
//===----------------------------------------------------------------------===//

#include "KernelChecker.h"

namespace bonsai::rt::contract {

void KernelChecker::checkFp8State(const TensorInfo &t, const std::string &name) const {
  const std::vector<int64_t> &s = t.shape;
  if (t.dtype != DType::F32 || s.size() != 2 || s[0] != 3 || s[1] < fp8::kStateColumns + 1 ||
      s[1] > fp8::kStateColumns + kMaxFp8History)
    fail(name +
         ": expected an f32 [3, 4 + H] FP8 scaling state (rows input, weight, "
         "output gradient; scale, amax, underflow, saturation, then an amax history of "
         "1 <= H <= " +
         std::to_string(kMaxFp8History) + "), got " + formatShape(s) + " " + dtypeName(t.dtype));
}

void KernelChecker::checkFp8Stats(const TensorInfo &t, const std::string &name) const {
  if (t.dtype != DType::F32 || t.shape != std::vector<int64_t>{2, fp8::kStatsColumns})
    fail(name +
         ": expected f32 [2, 4] FP8 cast statistics (a row per cast operand: amax, "
         "underflow fraction, saturation fraction, scale), got " +
         formatShape(t.shape) + " " + dtypeName(t.dtype));
}

void KernelChecker::checkFp8Dimension(const char *what, int64_t value,
                                      const std::string &from) const {
  if (value % kFp8GemmMultiple != 0)
    fail(std::string(what) + " = " + std::to_string(value) + " (" + from +
         ") is not a multiple of " + std::to_string(kFp8GemmMultiple) +
         ", which FP8 tensor-core GEMMs need");
}

void KernelChecker::checkFp8GemmOperands(int64_t aElements, int64_t bElements, size_t stats,
                                         std::optional<size_t> workspace) const {
  checkFp8State(in(2), inName(2));
  checkFp8Stats(out(stats), outName(stats));
  checkFp8Workspace(workspace.value_or(stats + 1), fp8::gemmWorkspaceBytes(aElements, bElements),
                    "fp8::gemmWorkspaceBytes of casts of " + std::to_string(aElements) + " and " +
                        std::to_string(bElements) + " elements");
}

void KernelChecker::checkFp8TransposedCodes(const TensorInfo &t, const std::string &name, int64_t k,
                                            int64_t m, const std::string &whose) const {
  if (t.dtype != DType::F8E4M3FN || t.shape != std::vector<int64_t>{k, m})
    fail(name + ": expected f8_e4m3 " + formatShape({k, m}) + " (x's transposed codes" +
         (whose.empty() ? "" : ", " + whose) + "), got " + formatShape(t.shape) + " " +
         dtypeName(t.dtype));
}

/// Inputs `cast` and `stats` of a GEMM that reads another's cast of its input (kinds 96 and
/// 97): that kernel's workspace (f32, at least `bytes`, holding the codes of `elements`
/// input elements) and its stats.
void KernelChecker::checkFp8SharedCast(size_t cast, size_t stats, int64_t elements, int64_t bytes,
                                       const std::string &what) const {
  const TensorInfo &c = in(cast);
  int64_t want = bytes / int64_t(sizeof(float));
  if (c.dtype != DType::F32 || c.shape.size() != 1 || c.shape[0] < want)
    fail(inName(cast) + ": expected " + what + ", f32 [" + std::to_string(want) +
         "] or larger for the codes of " + std::to_string(elements) + " elements, got " +
         formatShape(c.shape) + " " + dtypeName(c.dtype));
  checkFp8Stats(in(stats), inName(stats));
}

void KernelChecker::checkFp8Workspace(size_t j, int64_t bytes, const std::string &what) const {
  int64_t want = bytes / int64_t(sizeof(float));
  const TensorInfo &w = out(j);
  if (w.dtype != DType::F32 || w.shape.size() != 1 || w.shape[0] < want)
    fail(outName(j) + ": expected a 1-D f32 workspace of at least " + std::to_string(want) +
         " elements (" + what + "), got " + formatShape(w.shape) + " " + dtypeName(w.dtype));
}

void KernelChecker::checkFp8Attrs() {
  const auto &a = kernel.attrsAs<Fp8Attrs>();
  if (a.margin < 0 || a.margin > kMaxFp8Margin)
    fail("margin must be in [0, " + std::to_string(kMaxFp8Margin) + "], got " +
         std::to_string(a.margin));
  // The gradients' GEMMs always promote their partial sums (docs/fp8.md).
  if (a.fastAccumulation && kernel.kind != KernelKind::Fp8Linear &&
      kernel.kind != KernelKind::Fp8LinearSharedInput &&
      kernel.kind != KernelKind::Fp8LinearWithInputCast)
    fail("fast_accumulation is the forward GEMMs' option (Fp8Linear, Fp8LinearSharedInput, "
         "Fp8LinearWithInputCast); a gradient GEMM always promotes its partial sums to fp32");
}

void KernelChecker::checkFp8LinearShapes() {
  // x [..., K] · w [N, K]ᵀ, or dy [..., N] · w [N, K]: the activation's leading dimensions
  // are M. Fp8LinearWithInputCast also writes xᵀ's codes (output 2, before its workspace).
  bool forward = kernel.kind != KernelKind::Fp8LinearGradInput;
  expectFloat(0);
  expectRankAtLeast(0, 1);
  expectFloat(1);
  expectRank(1, 2);
  const std::vector<int64_t> &a = in(0).shape, &w = in(1).shape;
  int64_t n = w[0], k = w[1], m = in(0).numel / a.back();
  if (a.back() != (forward ? k : n))
    fail(inName(1) + " shape: expected " +
         (forward ? "[out, " + std::to_string(a.back()) + "]"
                  : "[" + std::to_string(a.back()) + ", in]") +
         " ([out, in] layout), got " + formatShape(w));
  std::string rows = "the rows of " + operandNames[0] + " " + formatShape(a);
  checkFp8Dimension("M", m, rows);
  checkFp8Dimension("N", n, "the rows of " + operandNames[1] + " " + formatShape(w));
  checkFp8Dimension("K", k, "the columns of " + operandNames[1] + " " + formatShape(w));
  if (forward && kernel.inputs.size() == 4)
    expectFloatInput(3, {n});
  std::vector<int64_t> shape(a.begin(), a.end() - 1);
  shape.push_back(forward ? n : k);
  expectFloatOutput(0, shape);
  if (kernel.kind == KernelKind::Fp8LinearWithInputCast) {
    checkFp8GemmOperands(in(0).numel, in(1).numel, 1, 3);
    checkFp8TransposedCodes(out(2), outName(2), k, m, "");
  } else {
    checkFp8GemmOperands(in(0).numel, in(1).numel);
  }
}

void KernelChecker::checkFp8GradWeightShapes() {
  expectFloat(0);
  expectFloat(1);
  expectRankAtLeast(0, 1);
  expectRankAtLeast(1, 1);
  const std::vector<int64_t> &dy = in(0).shape, &x = in(1).shape;
  if (dy.size() != x.size() || !std::equal(dy.begin(), dy.end() - 1, x.begin()))
    fail("leading dimensions differ: " + inName(0) + " " + formatShape(dy) + ", " + inName(1) +
         " " + formatShape(x));
  checkFp8Dimension("M", in(0).numel / dy.back(), "the rows of dy " + formatShape(dy));
  checkFp8Dimension("N", dy.back(), "the columns of dy " + formatShape(dy));
  checkFp8Dimension("K", x.back(), "the columns of x " + formatShape(x));
  // dw, or the accumulator after the statistics and the workspace: f32 only (cuBLASLt's
  // FP8 GEMM adding into a bf16 C was off by tens of ulps on the H200, docs/fp8.md).
  const bool accumulate = kernel.kind == KernelKind::Fp8LinearGradWeightAccumulate;
  if (accumulate)
    expectF32Output(2, {dy.back(), x.back()});
  else
    expectFloatOutput(0, {dy.back(), x.back()});
  checkFp8GemmOperands(in(0).numel, in(1).numel, accumulate ? 0 : 1);
}

void KernelChecker::checkFp8BackwardCastShapes() {
  // Fp8LinearBackward with x's transposed codes and scale from another Fp8LinearBackward's
  // workspace and weight-gradient stats (Fp8LinearBackwardSharedInput), or from
  // Fp8LinearWithInputCast's codes and stats (Fp8LinearBackwardFromInputCast).
  expectFloat(0);
  expectRankAtLeast(0, 1);
  expectFloat(1);
  expectRank(1, 2);
  const std::vector<int64_t> &dy = in(0).shape, &w = in(1).shape;
  int64_t n = w[0], k = w[1], m = in(0).numel / dy.back();
  if (dy.back() != n)
    fail(inName(1) + " shape: expected [" + std::to_string(dy.back()) +
         ", in] ([out, in] layout), got " + formatShape(w));
  std::vector<int64_t> shape(dy.begin(), dy.end() - 1);
  shape.push_back(k);
  checkFp8Dimension("M", m, "the rows of dy " + formatShape(dy));
  checkFp8Dimension("N", n, "the rows of w " + formatShape(w));
  checkFp8Dimension("K", k, "the columns of w " + formatShape(w));
  expectFloatOutput(0, shape);
  if (out(0).dtype != in(0).dtype)
    fail(outName(0) + " dtype: expected " + dtypeName(in(0).dtype) + " (as dy), got " +
         dtypeName(out(0).dtype));
  expectF32Output(4, {n, k});
  if (kernel.kind == KernelKind::Fp8LinearBackwardFromInputCast) {
    checkFp8TransposedCodes(in(2), inName(2), k, m, "an Fp8LinearWithInputCast's");
    checkFp8Stats(in(3), inName(3));
  } else {
    // The source's workspace holds at least its x codes and both GEMMs' control blocks.
    checkFp8SharedCast(2, 3, m * k,
                       fp8::gemmWorkspaceBytes(0, 0) + fp8::gemmWorkspaceBytes(0, m * k),
                       "an Fp8LinearBackward's workspace holding x's transposed codes");
  }
  checkFp8State(in(4), inName(4));
  checkFp8Stats(out(1), outName(1));
  checkFp8Stats(out(2), outName(2));
  checkFp8Workspace(3,
                    fp8::gemmWorkspaceBytes(in(0).numel, in(1).numel) +
                        fp8::gemmWorkspaceBytes(in(0).numel, 0),
                    "Fp8LinearBackward's workspace without x's codes");
}

void KernelChecker::checkFp8StateIsPersistent() {
  // The state follows the GEMM operands: input 2, 3 for the fused backward and the forward
  // that shares its input's cast, 4 for the backwards that read another kernel's.
  const size_t state = kernel.kind == KernelKind::Fp8LinearBackwardSharedInput ||
                               kernel.kind == KernelKind::Fp8LinearBackwardFromInputCast
                           ? 4
                       : kernel.kind == KernelKind::Fp8LinearBackward ||
                               kernel.kind == KernelKind::Fp8LinearSharedInput
                           ? 3
                           : 2;
  const ArenaInfo &arena = arenaOf(in(state));
  if (arena.lifetime != Lifetime::Persistent)
    fail(inName(state) + " is in step arena " + std::to_string(in(state).arena) + " '" +
         arena.name + "': FP8 scaling state must live in a persistent arena");
}

void KernelChecker::verifyFp8Gemm(void (KernelChecker::*operands)()) {
  checkFp8Attrs();
  (this->*operands)();
  checkFp8StateIsPersistent();
}

void KernelChecker::verify(kinds::Fp8Linear) {
  verifyFp8Gemm(&KernelChecker::checkFp8LinearShapes);
}

void KernelChecker::verify(kinds::Fp8LinearGradInput) {
  verifyFp8Gemm(&KernelChecker::checkFp8LinearShapes);
}

void KernelChecker::verify(kinds::Fp8LinearGradWeight) {
  verifyFp8Gemm(&KernelChecker::checkFp8GradWeightShapes);
}

void KernelChecker::verify(kinds::Fp8UpdateScales) {
  checkFp8Attrs();
  // Operands.
  expectScalarInput(0, DType::I64);
  for (size_t i = 1; i < kernel.inputs.size(); ++i)
    checkFp8Stats(in(i), inName(i));
  checkFp8State(out(0), outName(0));
  // State.
  // Checkpointed with the optimizer's state, and read before its first update as "no scale
  // yet, no history".
  expectPersistent(0);
  expectInit(0, TensorInit::Zeros,
             "an FP8 state has no scale and no history before the "
             "first update");
  if (out(0).role != TensorRole::OptimizerState)
    fail(outName(0) + " has role " + tensorRoleName(out(0).role) +
         ", expected optimizer state (FP8 scales and histories are checkpointed with it)");
}

void KernelChecker::verify(kinds::Fp8LinearGradWeightAccumulate) {
  verifyFp8Gemm(&KernelChecker::checkFp8GradWeightShapes);
}

void KernelChecker::verify(kinds::Fp8LinearBackward) {
  checkFp8Attrs();
  // Operands.
  // dx = dy [..., N] · w [N, K] and acc [N, K] += dyᵀ · x [..., K]; dy and x share a dtype
  // (one cast launch converts both), dx has it too, acc is f32.
  expectFloat(0);
  expectRankAtLeast(0, 1);
  expectFloat(1);
  expectRank(1, 2);
  const std::vector<int64_t> &dy = in(0).shape, &w = in(1).shape;
  int64_t n = w[0], k = w[1];
  if (dy.back() != n)
    fail(inName(1) + " shape: expected [" + std::to_string(dy.back()) +
         ", in] ([out, in] layout), got " + formatShape(w));
  std::vector<int64_t> shape(dy.begin(), dy.end() - 1);
  shape.push_back(k);
  expectFloatInput(2, shape);
  expectInputDType(2, in(0).dtype);
  checkFp8Dimension("M", in(0).numel / n, "the rows of dy " + formatShape(dy));
  checkFp8Dimension("N", n, "the rows of w " + formatShape(w));
  checkFp8Dimension("K", k, "the columns of w " + formatShape(w));
  expectFloatOutput(0, shape);
  if (out(0).dtype != in(0).dtype)
    fail(outName(0) + " dtype: expected " + dtypeName(in(0).dtype) + " (as dy), got " +
         dtypeName(out(0).dtype));
  expectF32Output(4, {n, k});
  checkFp8State(in(3), inName(3));
  checkFp8Stats(out(1), outName(1));
  checkFp8Stats(out(2), outName(2));
  checkFp8Workspace(
      3,
      fp8::gemmWorkspaceBytes(in(0).numel, in(1).numel) +
          fp8::gemmWorkspaceBytes(in(0).numel, in(2).numel),
      "the workspaces of Fp8LinearGradInput and Fp8LinearGradWeightAccumulate for these operands");
  checkFp8StateIsPersistent();
}

void KernelChecker::verify(kinds::Fp8LinearSharedInput) {
  checkFp8Attrs();
  // Operands.
  // y [..., N] = x [..., K] · w [N, K]ᵀ with x's codes and scale from another Fp8Linear's
  // workspace and stats: y gives M.
  expectFloat(2);
  expectRank(2, 2);
  expectFloatOutput(0, out(0).shape);
  if (out(0).shape.empty())
    fail(outName(0) + " must have at least one dimension");
  const std::vector<int64_t> &w = in(2).shape, &y = out(0).shape;
  int64_t n = w[0], k = w[1];
  if (y.back() != n)
    fail(inName(2) + " shape: expected [" + std::to_string(y.back()) +
         ", in] ([out, in] layout), got " + formatShape(w));
  int64_t m = out(0).numel / n;
  checkFp8Dimension("M", m, "the rows of y " + formatShape(y));
  checkFp8Dimension("N", n, "the rows of w " + formatShape(w));
  checkFp8Dimension("K", k, "the columns of w " + formatShape(w));
  if (kernel.inputs.size() == 5)
    expectFloatInput(4, {n});
  checkFp8SharedCast(0, 1, m * k, fp8::gemmWorkspaceBytes(m * k, 0),
                     "an Fp8Linear's workspace holding x's codes");
  checkFp8State(in(3), inName(3));
  checkFp8Stats(out(1), outName(1));
  checkFp8Workspace(2, fp8::gemmWorkspaceBytes(0, in(2).numel),
                    "fp8::gemmWorkspaceBytes of w's cast alone");
  checkFp8StateIsPersistent();
}

void KernelChecker::verify(kinds::Fp8LinearBackwardSharedInput) {
  verifyFp8Gemm(&KernelChecker::checkFp8BackwardCastShapes);
}

void KernelChecker::verify(kinds::Fp8LinearWithInputCast) {
  verifyFp8Gemm(&KernelChecker::checkFp8LinearShapes);
}

void KernelChecker::verify(kinds::Fp8LinearBackwardFromInputCast) {
  verifyFp8Gemm(&KernelChecker::checkFp8BackwardCastShapes);
}

} // namespace bonsai::rt::contract
