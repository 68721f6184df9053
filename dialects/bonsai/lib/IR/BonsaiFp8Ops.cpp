//===- BonsaiFp8Ops.cpp - FP8 GEMMs and their scaling state ----------------===//
//
// Verifiers, costs and kernel interfaces of the ops bonsai-fp8 creates (BonsaiFp8Ops.td). The
// verifiers check what plan validation (runtime/src/Plan.cpp) checks for kinds Fp8Linear ..
// Fp8LinearBackwardSharedInput, so that a malformed op is reported at its source location rather
// than when a plan is loaded: shapes, element types, the state [3, 4 + H] with H in [1, 1024], the
// statistics [2, 4], the workspace size, and GEMM dimensions that FP8 tensor cores take (multiples
// of 16).
//
//===----------------------------------------------------------------------===//

#include "OpUtils.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"

using namespace mlir;
using namespace mlir::bonsai;
using namespace mlir::bonsai::detail;

/// Fails unless `value` has exactly `expected` as type.
static LogicalResult expectTypeOf(Operation *op, StringRef what, Value value, Type expected) {
  if (value.getType() == expected)
    return success();
  return op->emitOpError() << what << " type: expected " << expected << ", got " << value.getType();
}

/// The head-room of the scales: 0 to 16 powers of two, as the recipe's `margin`.
static LogicalResult verifyFp8Margin(Operation *op, int64_t margin) {
  if (margin < 0 || margin > 16)
    return op->emitOpError() << "margin must be in [0, 16], got " << margin;
  return success();
}

/// The scaling state: f32 [3, 4 + H] with H in [1, kMaxAmaxHistory].
static LogicalResult verifyFp8State(Operation *op, Value state) {
  RankedTensorType type = tensorType(state);
  int64_t rows = Fp8LinearOp::kStateRows, columns = Fp8LinearOp::kStateColumns;
  if (!type.getElementType().isF32() || type.getRank() != 2 || type.getDimSize(0) != rows ||
      type.getDimSize(1) <= columns ||
      type.getDimSize(1) > columns + Fp8LinearOp::kMaxAmaxHistory)
    return op->emitOpError() << "state must be f32 [" << rows << ", " << columns
                             << " + H] with an amax history H of 1 to "
                             << Fp8LinearOp::kMaxAmaxHistory << " steps, got " << type;
  return success();
}

/// A GEMM's statistics: f32 [2, 4].
static LogicalResult verifyFp8Stats(Operation *op, StringRef what, Value stats) {
  RankedTensorType type = tensorType(stats);
  if (!type.getElementType().isF32() ||
      type.getShape() != ArrayRef<int64_t>{Fp8LinearOp::kStatsRows, Fp8LinearOp::kStatsColumns})
    return op->emitOpError() << what << " must be f32 [" << Fp8LinearOp::kStatsRows << ", "
                             << Fp8LinearOp::kStatsColumns
                             << "] (amax, underflow, saturation, scale of each cast operand), got "
                             << type;
  return success();
}

/// The workspace: f32 [fp8::gemmWorkspaceBytes(a, b) / 4] for the cast operands `a` and `b`.
static LogicalResult verifyFp8Workspace(Operation *op, Value workspace, Value a, Value b) {
  int64_t aElements = getNumElements(tensorType(a)), bElements = getNumElements(tensorType(b));
  int64_t expected = Fp8LinearOp::getWorkspaceElements(aElements, bElements);
  RankedTensorType type = tensorType(workspace);
  if (!type.getElementType().isF32() || type.getRank() != 1 || type.getDimSize(0) != expected)
    return op->emitOpError() << "workspace must be tensor<" << expected
                             << "xf32> (the FP8 codes of " << aElements << " and " << bElements
                             << " elements, and the device's scales), got " << type;
  return success();
}

/// M, N and K of the GEMM are multiples of 16 (cuBLASLt's FP8 kernels).
static LogicalResult verifyFp8Dimensions(Operation *op, int64_t m, int64_t n, int64_t k) {
  int64_t multiple = Fp8LinearOp::kDimensionMultiple;
  for (auto [name, value] : {std::pair<StringRef, int64_t>{"M (rows of the input)", m},
                             {"N (output features)", n},
                             {"K (input features)", k}})
    if (value % multiple != 0)
      return op->emitOpError() << name << " is " << value << "; FP8 GEMMs need M, N and K to be "
                               << "multiples of " << multiple;
  return success();
}

/// The checks every FP8 GEMM shares: the margin, the state, the statistics, and the workspace
/// of the cast operands `a` and `b`.
static LogicalResult verifyFp8Gemm(Operation *op, Value state, Value stats, Value workspace,
                                   Value a, Value b) {
  if (failed(verifyFp8Margin(op, cast<IntegerAttr>(op->getAttr("margin")).getInt())) ||
      failed(verifyFp8State(op, state)) || failed(verifyFp8Stats(op, "stats", stats)))
    return failure();
  return verifyFp8Workspace(op, workspace, a, b);
}

/// 2·M·N·K on tensor cores, with the two casts (a pass over each operand counting the
/// statistics) as vector work; every operand read and result written once, plus the casts'
/// codes written to the workspace and read back by the GEMM.
static OpCost fp8GemmCost(Operation *op, int64_t m, int64_t n, int64_t k, Value a, Value b,
                          Value workspace) {
  OpCost cost = streamingBytes(op);
  int64_t codes = getNumElements(tensorType(a)) + getNumElements(tensorType(b));
  cost.bytesWritten -= getStorageBytes(workspace.getType());
  cost.bytesWritten += codes;
  cost.bytesRead += codes;
  cost.matmulFlops = 2 * m * n * k;
  cost.vectorFlops = 4 * codes;
  return cost;
}

//===----------------------------------------------------------------------===//
// Fp8LinearOp
//===----------------------------------------------------------------------===//

/// The checks of y = x · Wᵀ (+ b) shared by fp8_linear and fp8_linear_with_input_cast: x
/// [..., K], W [N, K] and the bias [N] of one element type, y [..., N] of it, dimensions FP8
/// GEMMs take.
static LogicalResult verifyFp8Linear(Operation *op, Value input, Value weight, Value bias,
                                     Value result) {
  RankedTensorType x = tensorType(input), w = tensorType(weight);
  if (x.getRank() < 1)
    return op->emitOpError("input must have rank at least 1 (its last dimension is K)");
  if (failed(expectRank(op, "weight", w, 2)))
    return failure();
  int64_t k = x.getShape().back(), n = w.getDimSize(0);
  if (w.getDimSize(1) != k)
    return op->emitOpError() << "weight shape: expected [N, " << k << "] ([out, in] for input "
                             << "features " << k << "), got " << fmt(w.getShape());
  Type element = x.getElementType();
  if (failed(expectElementType(op, "weight", w.getElementType(), element)))
    return failure();
  if (bias)
    if (failed(expectShape(op, "bias", tensorType(bias).getShape(), {n})) ||
        failed(expectElementType(op, "bias", tensorType(bias).getElementType(), element)))
      return failure();
  SmallVector<int64_t> shape(x.getShape());
  shape.back() = n;
  if (failed(expectTypeOf(op, "result", result, RankedTensorType::get(shape, element))))
    return failure();
  return verifyFp8Dimensions(op, getNumElements(x) / k, n, k);
}

LogicalResult Fp8LinearOp::verify() {
  if (failed(verifyFp8Linear(*this, getInput(), getWeight(), getBias(), getResult())))
    return failure();
  return verifyFp8Gemm(*this, getState(), getStats(), getWorkspace(), getInput(), getWeight());
}

OpCost Fp8LinearOp::getForwardCost() {
  int64_t k = tensorType(getWeight()).getDimSize(1), n = tensorType(getWeight()).getDimSize(0);
  return fp8GemmCost(*this, getNumElements(tensorType(getInput())) / k, n, k, getInput(),
                     getWeight(), getWorkspace());
}

SmallVector<unsigned> Fp8LinearOp::getWorkspaceResults() {
  // A sibling that shares the input's cast reads the codes afterwards: then it is not scratch.
  if (!getWorkspace().use_empty())
    return {};
  return {cast<OpResult>(getWorkspace()).getResultNumber()};
}

//===----------------------------------------------------------------------===//
// Fp8LinearGradInputOp
//===----------------------------------------------------------------------===//

/// The checks of dx = dy · W shared by the input gradient and the fused backward: dy [..., N]
/// and W [N, K] of one element type, `result` (named `resultName`) [..., K] of it, dimensions
/// FP8 GEMMs take. Returns dx's shape.
static FailureOr<SmallVector<int64_t>> verifyFp8GradInput(Operation *op, Value resultGrad,
                                                          Value weight, Value result,
                                                          StringRef resultName) {
  RankedTensorType dy = tensorType(resultGrad), w = tensorType(weight);
  if (dy.getRank() < 1)
    return op->emitOpError("result_grad must have rank at least 1 (its last dimension is N)");
  if (failed(expectRank(op, "weight", w, 2)))
    return failure();
  int64_t n = dy.getShape().back(), k = w.getDimSize(1);
  if (w.getDimSize(0) != n)
    return op->emitOpError() << "weight shape: expected [" << n << ", K] ([out, in] for output "
                             << "features " << n << "), got " << fmt(w.getShape());
  Type element = dy.getElementType();
  if (failed(expectElementType(op, "weight", w.getElementType(), element)))
    return failure();
  SmallVector<int64_t> shape(dy.getShape());
  shape.back() = k;
  if (failed(expectTypeOf(op, resultName, result, RankedTensorType::get(shape, element))) ||
      failed(verifyFp8Dimensions(op, getNumElements(dy) / n, n, k)))
    return failure();
  return shape;
}

LogicalResult Fp8LinearGradInputOp::verify() {
  if (failed(verifyFp8GradInput(*this, getResultGrad(), getWeight(), getResult(), "result")))
    return failure();
  return verifyFp8Gemm(*this, getState(), getStats(), getWorkspace(), getResultGrad(),
                       getWeight());
}

OpCost Fp8LinearGradInputOp::getForwardCost() {
  int64_t n = tensorType(getWeight()).getDimSize(0), k = tensorType(getWeight()).getDimSize(1);
  return fp8GemmCost(*this, getNumElements(tensorType(getResultGrad())) / n, n, k,
                     getResultGrad(), getWeight(), getWorkspace());
}

SmallVector<unsigned> Fp8LinearGradInputOp::getWorkspaceResults() {
  return {cast<OpResult>(getWorkspace()).getResultNumber()};
}

//===----------------------------------------------------------------------===//
// Fp8LinearGradWeightOp
//===----------------------------------------------------------------------===//

/// The checks of dW = dyᵀ · x shared by the weight gradient and its accumulating form: dy
/// [..., N] and x [..., K] with the same leading dimensions and element type, `result` (what
/// `resultName` names) [N, K], dimensions FP8 GEMMs take, and the state, stats and workspace.
static LogicalResult verifyFp8GradWeight(Operation *op, Value resultGrad, Value input,
                                         RankedTensorType result, StringRef resultName,
                                         Value state, Value stats, Value workspace) {
  RankedTensorType dy = tensorType(resultGrad), x = tensorType(input);
  if (dy.getRank() < 1)
    return op->emitOpError("result_grad must have rank at least 1 (its last dimension is N)");
  if (x.getShape().drop_back() != dy.getShape().drop_back())
    return op->emitOpError() << "input " << fmt(x.getShape()) << " and result_grad "
                             << fmt(dy.getShape())
                             << " must have the same leading dimensions (the positions)";
  if (failed(expectElementType(op, "input", x.getElementType(), dy.getElementType())))
    return failure();
  int64_t n = dy.getShape().back(), k = x.getShape().back();
  if (result.getShape() != ArrayRef<int64_t>{n, k})
    return op->emitOpError() << resultName << " shape: expected [" << n << ", " << k
                             << "] ([N, K]), got " << fmt(result.getShape());
  if (failed(verifyFp8Dimensions(op, getNumElements(dy) / n, n, k)))
    return failure();
  return verifyFp8Gemm(op, state, stats, workspace, resultGrad, input);
}

LogicalResult Fp8LinearGradWeightOp::verify() {
  return verifyFp8GradWeight(*this, getResultGrad(), getInput(), tensorType(getResult()),
                             "result", getState(), getStats(), getWorkspace());
}

OpCost Fp8LinearGradWeightOp::getForwardCost() {
  RankedTensorType dy = tensorType(getResultGrad());
  int64_t n = dy.getShape().back(), k = tensorType(getInput()).getShape().back();
  return fp8GemmCost(*this, getNumElements(dy) / n, n, k, getResultGrad(), getInput(),
                     getWorkspace());
}

SmallVector<unsigned> Fp8LinearGradWeightOp::getWorkspaceResults() {
  return {cast<OpResult>(getWorkspace()).getResultNumber()};
}

/// f32 only: cuBLASLt's FP8 GEMM adding into a bf16 C (beta = 1) gave sums off by tens of bf16
/// ulps on the H200, where an f32 C was within the tensor cores' accumulation precision
/// (CudaFp8Test); training plans keep their gradient accumulators in f32.
bool Fp8LinearGradWeightOp::canAccumulateInto(Value accumulator) {
  auto acc = dyn_cast<RankedTensorType>(accumulator.getType());
  return acc && acc.getShape() == getResult().getType().getShape() &&
         acc.getElementType().isF32();
}

Operation *Fp8LinearGradWeightOp::buildAccumulating(OpBuilder &builder, Value accumulator) {
  return Fp8LinearGradWeightAccumulateOp::create(
      builder, getLoc(), TypeRange{getStats().getType(), getWorkspace().getType()},
      getResultGrad(), getInput(), getState(), accumulator, getCurrent(), getMargin());
}

//===----------------------------------------------------------------------===//
// Fp8LinearGradWeightAccumulateOp
//===----------------------------------------------------------------------===//

LogicalResult Fp8LinearGradWeightAccumulateOp::verify() {
  RankedTensorType acc = tensorType(getAccumulator());
  if (!acc.getElementType().isF32())
    return emitOpError() << "accumulator element type must be f32 (FP8 GEMMs add into f32 "
                            "accumulators only), got "
                         << acc.getElementType();
  return verifyFp8GradWeight(*this, getResultGrad(), getInput(), acc, "accumulator",
                             getState(), getStats(), getWorkspace());
}

OpCost Fp8LinearGradWeightAccumulateOp::getForwardCost() {
  RankedTensorType dy = tensorType(getResultGrad());
  int64_t n = dy.getShape().back(), k = tensorType(getInput()).getShape().back();
  OpCost cost = fp8GemmCost(*this, getNumElements(dy) / n, n, k, getResultGrad(), getInput(),
                            getWorkspace());
  // The accumulator, read as an operand (beta = 1), is also written, one addition an element.
  cost.bytesWritten += getStorageBytes(getAccumulator().getType());
  cost.vectorFlops += getNumElements(tensorType(getAccumulator()));
  return cost;
}

SmallVector<unsigned> Fp8LinearGradWeightAccumulateOp::getInPlaceOperands() {
  return {getAccumulatorMutable().getOperandNumber()};
}

SmallVector<unsigned> Fp8LinearGradWeightAccumulateOp::getWorkspaceResults() {
  return {cast<OpResult>(getWorkspace()).getResultNumber()};
}

//===----------------------------------------------------------------------===//
// Fp8LinearBackwardOp
//===----------------------------------------------------------------------===//

LogicalResult Fp8LinearBackwardOp::verify() {
  RankedTensorType dy = tensorType(getResultGrad()), w = tensorType(getWeight());
  RankedTensorType x = tensorType(getInput()), acc = tensorType(getAccumulator());
  FailureOr<SmallVector<int64_t>> shape =
      verifyFp8GradInput(*this, getResultGrad(), getWeight(), getInputGrad(), "input_grad");
  if (failed(shape))
    return failure();
  int64_t n = dy.getShape().back(), k = w.getDimSize(1);
  if (x.getShape() != ArrayRef<int64_t>(*shape))
    return emitOpError() << "input shape: expected " << fmt(*shape)
                         << " (result_grad's positions, the weight's K), got " << fmt(x.getShape());
  if (failed(expectElementType(*this, "input", x.getElementType(), dy.getElementType())))
    return failure();
  if (!acc.getElementType().isF32())
    return emitOpError() << "accumulator element type must be f32 (FP8 GEMMs add into f32 "
                            "accumulators only), got "
                         << acc.getElementType();
  if (acc.getShape() != ArrayRef<int64_t>{n, k})
    return emitOpError() << "accumulator shape: expected [" << n << ", " << k << "] ([N, K]), got "
                         << fmt(acc.getShape());
  if (failed(verifyFp8Margin(*this, getMargin())) || failed(verifyFp8State(*this, getState())) ||
      failed(verifyFp8Stats(*this, "input_grad_stats", getInputGradStats())) ||
      failed(verifyFp8Stats(*this, "weight_grad_stats", getWeightGradStats())))
    return failure();
  // The two GEMMs' workspaces, one after the other.
  int64_t dyElements = getNumElements(dy);
  int64_t expected = getWorkspaceElements(dyElements, getNumElements(w)) +
                     getWorkspaceElements(dyElements, getNumElements(x));
  RankedTensorType workspace = tensorType(getWorkspace());
  if (!workspace.getElementType().isF32() || workspace.getRank() != 1 ||
      workspace.getDimSize(0) != expected)
    return emitOpError() << "workspace must be tensor<" << expected
                         << "xf32> (the workspaces of the input and the weight gradient's FP8 "
                            "GEMMs), got "
                         << workspace;
  return success();
}

OpCost Fp8LinearBackwardOp::getForwardCost() {
  RankedTensorType dy = tensorType(getResultGrad());
  int64_t n = dy.getShape().back(), k = tensorType(getWeight()).getDimSize(1);
  int64_t m = getNumElements(dy) / n;
  OpCost cost;
  for (Value operand : getOperands())
    cost.bytesRead += getStorageBytes(operand.getType());
  // dy read once, cast into two layouts; W and x transposed; the codes go through the
  // workspace. The accumulator is read (beta = 1) and written.
  int64_t codes = 2 * getNumElements(dy) + getNumElements(tensorType(getWeight())) +
                  getNumElements(tensorType(getInput()));
  cost.bytesRead += codes;
  cost.bytesWritten = getStorageBytes(getInputGrad().getType()) +
                      2 * getStorageBytes(getInputGradStats().getType()) +
                      getStorageBytes(getAccumulator().getType()) + codes;
  cost.matmulFlops = 2 * (2 * m * n * k);
  cost.vectorFlops = 4 * codes + getNumElements(tensorType(getAccumulator()));
  return cost;
}

SmallVector<unsigned> Fp8LinearBackwardOp::getInPlaceOperands() {
  return {getAccumulatorMutable().getOperandNumber()};
}

SmallVector<unsigned> Fp8LinearBackwardOp::getWorkspaceResults() {
  // A sibling that shares the input's cast reads the codes afterwards: then it is not scratch.
  if (!getWorkspace().use_empty())
    return {};
  return {cast<OpResult>(getWorkspace()).getResultNumber()};
}

//===----------------------------------------------------------------------===//
// Fp8LinearSharedInputOp and Fp8LinearBackwardSharedInputOp
//===----------------------------------------------------------------------===//

/// The op that made the cast a GEMM reads: its kind (for messages), the value that holds the
/// codes, its statistics of the cast, the input it cast and its scaling.
struct InputCastSource {
  StringRef name; ///< e.g. "workspace of a 'bonsai.fp8_linear'"
  Value cast;     ///< the result holding the codes
  Value stats;    ///< its statistics (the row of x in them)
  StringRef statsName;
  Value input;
  bool current;
  int64_t margin;
};

/// The checks of a GEMM that reads the input's cast from another op: `inputCast` is `source`'s
/// result holding the codes (the runtime finds them there by that op's layout), `inputStats`
/// its statistics, and it cast an input of `inputType` with the same scaling.
static LogicalResult verifySharedInputCast(Operation *op, Value inputCast, Value inputStats,
                                           RankedTensorType inputType, bool current, int64_t margin,
                                           std::optional<InputCastSource> source,
                                           StringRef expected) {
  if (!source || source->cast != inputCast)
    return op->emitOpError() << "input_cast must be the " << expected;
  if (source->stats != inputStats)
    return op->emitOpError() << "input_stats must be the " << source->statsName
                             << " of the op whose " << source->name << " is input_cast";
  if (failed(expectTypeOf(op, "the input of input_cast's op", source->input, inputType)))
    return failure();
  if (source->current != current || source->margin != margin)
    return op->emitOpError() << "input_cast's op scales differently (current, margin): the "
                                "input's scale must be the one this GEMM would use";
  return verifyFp8Stats(op, "input_stats", inputStats);
}

/// The op whose workspace holds x's plain codes at its start: an fp8_linear, or an
/// fp8_linear_with_input_cast.
static std::optional<InputCastSource> forwardCastSource(Value workspace) {
  if (auto linear = workspace.getDefiningOp<Fp8LinearOp>())
    return InputCastSource{
        "workspace",       linear.getWorkspace(), linear.getStats(),          "stats",
        linear.getInput(), linear.getCurrent(),   int64_t(linear.getMargin())};
  if (auto linear = workspace.getDefiningOp<Fp8LinearWithInputCastOp>())
    return InputCastSource{
        "workspace",       linear.getWorkspace(), linear.getStats(),          "stats",
        linear.getInput(), linear.getCurrent(),   int64_t(linear.getMargin())};
  return std::nullopt;
}

LogicalResult Fp8LinearSharedInputOp::verify() {
  RankedTensorType y = tensorType(getResult()), w = tensorType(getWeight());
  if (y.getRank() < 1)
    return emitOpError("result must have rank at least 1 (its last dimension is N)");
  if (failed(expectRank(*this, "weight", w, 2)))
    return failure();
  int64_t n = w.getDimSize(0), k = w.getDimSize(1);
  if (y.getShape().back() != n)
    return emitOpError() << "weight shape: expected [" << y.getShape().back()
                         << ", K] ([out, in] for output features " << y.getShape().back()
                         << "), got " << fmt(w.getShape());
  Type element = y.getElementType();
  if (failed(expectElementType(*this, "weight", w.getElementType(), element)))
    return failure();
  if (Value bias = getBias())
    if (failed(expectShape(*this, "bias", tensorType(bias).getShape(), {n})) ||
        failed(expectElementType(*this, "bias", tensorType(bias).getElementType(), element)))
      return failure();
  SmallVector<int64_t> inputShape(y.getShape());
  inputShape.back() = k;
  if (failed(verifyFp8Dimensions(*this, getNumElements(y) / n, n, k)) ||
      failed(verifySharedInputCast(*this, getInputCast(), getInputStats(),
                                   RankedTensorType::get(inputShape, element), getCurrent(),
                                   getMargin(), forwardCastSource(getInputCast()),
                                   "workspace of a 'bonsai.fp8_linear' (or "
                                   "'bonsai.fp8_linear_with_input_cast')")))
    return failure();
  // Only W is cast here: the workspace of a GEMM whose first operand has no codes of its own.
  if (failed(verifyFp8Margin(*this, getMargin())) || failed(verifyFp8State(*this, getState())) ||
      failed(verifyFp8Stats(*this, "stats", getStats())))
    return failure();
  int64_t expected = getWorkspaceElements(0, getNumElements(w));
  RankedTensorType workspace = tensorType(getWorkspace());
  if (!workspace.getElementType().isF32() || workspace.getRank() != 1 ||
      workspace.getDimSize(0) != expected)
    return emitOpError() << "workspace must be tensor<" << expected << "xf32> (the FP8 codes of "
                         << getNumElements(w) << " weight elements and the device's scales), got "
                         << workspace;
  return success();
}

OpCost Fp8LinearSharedInputOp::getForwardCost() {
  RankedTensorType w = tensorType(getWeight());
  int64_t n = w.getDimSize(0), k = w.getDimSize(1);
  int64_t m = getNumElements(tensorType(getResult())) / n;
  // W is read and cast, its codes written and read back; the input's codes are read once.
  OpCost cost;
  for (Value operand : {getWeight(), getState(), getInputStats()})
    cost.bytesRead += getStorageBytes(operand.getType());
  if (Value bias = getBias())
    cost.bytesRead += getStorageBytes(bias.getType());
  cost.bytesRead += m * k + n * k;
  cost.bytesWritten =
      getStorageBytes(getResult().getType()) + getStorageBytes(getStats().getType()) + n * k;
  cost.matmulFlops = 2 * m * n * k;
  cost.vectorFlops = 4 * n * k;
  return cost;
}

SmallVector<unsigned> Fp8LinearSharedInputOp::getWorkspaceResults() {
  return {cast<OpResult>(getWorkspace()).getResultNumber()};
}

/// The checks of a fused backward that does not cast its input (Fp8LinearBackwardSharedInput and
/// Fp8LinearBackwardFromInputCast) after those of dx and of the input's cast: the accumulator,
/// scaling, state, statistics and the workspace (dy's codes in two layouts and W's, and the
/// scales).
template <typename BackwardOp> static LogicalResult verifyBackwardWithoutInputCast(BackwardOp op) {
  RankedTensorType dy = tensorType(op.getResultGrad()), w = tensorType(op.getWeight());
  RankedTensorType acc = tensorType(op.getAccumulator());
  int64_t n = dy.getShape().back(), k = w.getDimSize(1);
  if (!acc.getElementType().isF32())
    return op.emitOpError() << "accumulator element type must be f32 (FP8 GEMMs add into f32 "
                               "accumulators only), got "
                            << acc.getElementType();
  if (acc.getShape() != ArrayRef<int64_t>{n, k})
    return op.emitOpError() << "accumulator shape: expected [" << n << ", " << k
                            << "] ([N, K]), got " << fmt(acc.getShape());
  if (failed(verifyFp8Margin(op, op.getMargin())) || failed(verifyFp8State(op, op.getState())) ||
      failed(verifyFp8Stats(op, "input_grad_stats", op.getInputGradStats())) ||
      failed(verifyFp8Stats(op, "weight_grad_stats", op.getWeightGradStats())))
    return failure();
  // The fused backward's two workspaces without the input's codes.
  int64_t dyElements = getNumElements(dy);
  int64_t expected = BackwardOp::getWorkspaceElements(dyElements, getNumElements(w)) +
                     BackwardOp::getWorkspaceElements(dyElements, 0);
  RankedTensorType workspace = tensorType(op.getWorkspace());
  if (!workspace.getElementType().isF32() || workspace.getRank() != 1 ||
      workspace.getDimSize(0) != expected)
    return op.emitOpError() << "workspace must be tensor<" << expected
                            << "xf32> (the codes of dy in two layouts and of the weight, and the "
                               "device's scales), got "
                            << workspace;
  return success();
}

/// 2 GEMMs of 2·M·N·K; dy read once and cast into two layouts, W transposed, the codes through
/// the workspace; the input's codes read once; the accumulator read (beta = 1) and written.
template <typename BackwardOp> static OpCost backwardWithoutInputCastCost(BackwardOp op) {
  RankedTensorType dy = tensorType(op.getResultGrad());
  int64_t n = dy.getShape().back(), k = tensorType(op.getWeight()).getDimSize(1);
  int64_t m = getNumElements(dy) / n;
  OpCost cost;
  for (Value operand :
       {op.getResultGrad(), op.getWeight(), op.getInputStats(), op.getState(), op.getAccumulator()})
    cost.bytesRead += getStorageBytes(operand.getType());
  int64_t codes = 2 * getNumElements(dy) + getNumElements(tensorType(op.getWeight()));
  cost.bytesRead += codes + m * k;
  cost.bytesWritten = getStorageBytes(op.getInputGrad().getType()) +
                      2 * getStorageBytes(op.getInputGradStats().getType()) +
                      getStorageBytes(op.getAccumulator().getType()) + codes;
  cost.matmulFlops = 2 * (2 * m * n * k);
  cost.vectorFlops = 4 * codes + getNumElements(tensorType(op.getAccumulator()));
  return cost;
}

LogicalResult Fp8LinearBackwardSharedInputOp::verify() {
  RankedTensorType dy = tensorType(getResultGrad());
  FailureOr<SmallVector<int64_t>> shape =
      verifyFp8GradInput(*this, getResultGrad(), getWeight(), getInputGrad(), "input_grad");
  if (failed(shape))
    return failure();
  std::optional<InputCastSource> source;
  if (auto fused = getInputCast().getDefiningOp<Fp8LinearBackwardOp>())
    source = InputCastSource{
        "workspace",      fused.getWorkspace(), fused.getWeightGradStats(), "weight_grad_stats",
        fused.getInput(), fused.getCurrent(),   int64_t(fused.getMargin())};
  if (failed(verifySharedInputCast(*this, getInputCast(), getInputStats(),
                                   RankedTensorType::get(*shape, dy.getElementType()), getCurrent(),
                                   getMargin(), source,
                                   "workspace of a 'bonsai.fp8_linear_backward'")))
    return failure();
  return verifyBackwardWithoutInputCast(*this);
}

OpCost Fp8LinearBackwardSharedInputOp::getForwardCost() {
  return backwardWithoutInputCastCost(*this);
}

SmallVector<unsigned> Fp8LinearBackwardSharedInputOp::getInPlaceOperands() {
  return {getAccumulatorMutable().getOperandNumber()};
}

SmallVector<unsigned> Fp8LinearBackwardSharedInputOp::getWorkspaceResults() {
  return {cast<OpResult>(getWorkspace()).getResultNumber()};
}

//===----------------------------------------------------------------------===//
// Fp8UpdateScalesOp
//===----------------------------------------------------------------------===//

LogicalResult Fp8UpdateScalesOp::verify() {
  if (failed(verifyFp8State(*this, getState())) ||
      failed(verifyFp8Stats(*this, "forward_stats", getForwardStats())))
    return failure();
  if (Value backward = getBackwardStats())
    if (failed(verifyFp8Stats(*this, "backward_stats", backward)))
      return failure();
  return verifyFp8Margin(*this, getMargin());
}

OpCost Fp8UpdateScalesOp::getForwardCost() {
  // The state is read and written back; a few operations per history entry.
  OpCost cost;
  for (Value operand : getOperands())
    cost.bytesRead += getStorageBytes(operand.getType());
  cost.bytesWritten = getStorageBytes(getState().getType());
  cost.vectorFlops = 2 * getNumElements(tensorType(getState()));
  return cost;
}

SmallVector<unsigned> Fp8UpdateScalesOp::getInPlaceOperands() {
  // The state is the last operand, after the optional backward statistics.
  return {getNumOperands() - 1};
}

//===----------------------------------------------------------------------===//
// Fp8LinearWithInputCastOp and Fp8LinearBackwardFromInputCastOp
//===----------------------------------------------------------------------===//

LogicalResult Fp8LinearWithInputCastOp::verify() {
  RankedTensorType x = tensorType(getInput());
  if (failed(verifyFp8Linear(*this, getInput(), getWeight(), getBias(), getResult())))
    return failure();
  int64_t k = x.getShape().back();
  auto expected =
      RankedTensorType::get({k, getNumElements(x) / k}, Float8E4M3FNType::get(getContext()));
  if (failed(expectTypeOf(*this, "input_cast", getInputCast(), expected)))
    return failure();
  return verifyFp8Gemm(*this, getState(), getStats(), getWorkspace(), getInput(), getWeight());
}

OpCost Fp8LinearWithInputCastOp::getForwardCost() {
  int64_t k = tensorType(getWeight()).getDimSize(1), n = tensorType(getWeight()).getDimSize(0);
  // fp8_linear's; the transposed codes are a result, written once more.
  return fp8GemmCost(*this, getNumElements(tensorType(getInput())) / k, n, k, getInput(),
                     getWeight(), getWorkspace());
}

SmallVector<unsigned> Fp8LinearWithInputCastOp::getWorkspaceResults() {
  // A sibling that shares the input's cast reads the codes afterwards: then it is not scratch.
  if (!getWorkspace().use_empty())
    return {};
  return {cast<OpResult>(getWorkspace()).getResultNumber()};
}

LogicalResult Fp8LinearBackwardFromInputCastOp::verify() {
  RankedTensorType dy = tensorType(getResultGrad());
  FailureOr<SmallVector<int64_t>> shape =
      verifyFp8GradInput(*this, getResultGrad(), getWeight(), getInputGrad(), "input_grad");
  if (failed(shape))
    return failure();
  std::optional<InputCastSource> source;
  if (auto forward = getInputCast().getDefiningOp<Fp8LinearWithInputCastOp>())
    source = InputCastSource{
        "input_cast",       forward.getInputCast(), forward.getStats(),          "stats",
        forward.getInput(), forward.getCurrent(),   int64_t(forward.getMargin())};
  if (failed(verifySharedInputCast(*this, getInputCast(), getInputStats(),
                                   RankedTensorType::get(*shape, dy.getElementType()), getCurrent(),
                                   getMargin(), source,
                                   "input_cast of a 'bonsai.fp8_linear_with_input_cast'")))
    return failure();
  return verifyBackwardWithoutInputCast(*this);
}

OpCost Fp8LinearBackwardFromInputCastOp::getForwardCost() {
  return backwardWithoutInputCastCost(*this);
}

SmallVector<unsigned> Fp8LinearBackwardFromInputCastOp::getInPlaceOperands() {
  return {getAccumulatorMutable().getOperandNumber()};
}

SmallVector<unsigned> Fp8LinearBackwardFromInputCastOp::getWorkspaceResults() {
  return {cast<OpResult>(getWorkspace()).getResultNumber()};
}
