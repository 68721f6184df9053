//===- BonsaiGaLoreOps.cpp - GaLore refresh, projection and update --------===//
//
// Verifiers and costs of the ops `bonsai-galore` creates. The shapes of the projector, the
// projected gradient and the moments all follow from the weight's shape, the rank and the
// side; the verifiers check each against them so that a wrong rewrite fails where it is made.
//
//===----------------------------------------------------------------------===//

#include "OpUtils.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"

using namespace mlir;
using namespace mlir::bonsai;
using namespace mlir::bonsai::detail;

/// The expected projector shape of a gradient `shape` projected on `left` at rank `rank`.
static SmallVector<int64_t> projectorShape(ArrayRef<int64_t> shape, bool left, int64_t rank) {
  return {left ? shape[0] : shape[1], rank};
}

/// The projected gradient's shape: r x n on the left, m x r on the right.
static SmallVector<int64_t> projectedShape(ArrayRef<int64_t> shape, bool left, int64_t rank) {
  if (left)
    return {rank, shape[1]};
  return {shape[0], rank};
}

/// Checks that `value` is an f32 tensor of `shape`.
static LogicalResult expectF32(Operation *op, StringRef what, Value value,
                               ArrayRef<int64_t> shape) {
  RankedTensorType type = tensorType(value);
  if (type.getElementType().isF32() && type.getShape() == shape)
    return success();
  return op->emitOpError() << what << " must be an f32 tensor of shape " << fmt(shape) << ", got "
                           << type;
}

/// Checks the gradient (2-D) and the side: the projected side is the smaller one, so that
/// the state is smallest (either side of a square matrix).
static LogicalResult verifySide(Operation *op, RankedTensorType gradient, bool left) {
  if (failed(expectRank(op, "gradient", gradient, 2)))
    return failure();
  int64_t m = gradient.getDimSize(0), n = gradient.getDimSize(1);
  if ((left && m > n) || (!left && m < n))
    return op->emitOpError() << "projects the " << (left ? "left" : "right") << " side of a " << m
                             << "x" << n << " gradient; GaLore projects the smaller side";
  return success();
}

//===----------------------------------------------------------------------===//
// GaloreRefreshOp
//===----------------------------------------------------------------------===//

int64_t GaloreRefreshOp::getSmallSide() {
  ArrayRef<int64_t> shape = tensorType(getGradient()).getShape();
  return getLeft() ? shape[0] : shape[1];
}

int64_t GaloreRefreshOp::getLargeSide() {
  ArrayRef<int64_t> shape = tensorType(getGradient()).getShape();
  return getLeft() ? shape[1] : shape[0];
}

int64_t GaloreRefreshOp::getWorkspaceElements(int64_t small, int64_t large, int64_t rank) {
  // Y (s x r) and Z (l x r) in f32, then the fp64 Gram matrix and triangular factor (r x r
  // each, two f32 slots per element), then a few scalars.
  return (small + large) * rank + 4 * rank * rank + 64;
}

LogicalResult GaloreRefreshOp::verify() {
  RankedTensorType gradient = tensorType(getGradient());
  if (failed(verifySide(*this, gradient, getLeft())))
    return failure();
  int64_t rank = getRank(), gap = getUpdateProjGap();
  int64_t small = std::min(gradient.getDimSize(0), gradient.getDimSize(1));
  if (rank <= 0 || rank >= small)
    return emitOpError() << "rank " << rank << " must be positive and below min(m, n) = " << small;
  if (gap <= 0)
    return emitOpError() << "update_proj_gap must be positive, got " << gap;
  // The accessors return the attributes' raw bits unsigned: read them back as signed.
  int64_t offset = int64_t(getOffset()), powerIterations = int64_t(getPowerIterations());
  int64_t slot = int64_t(getSlot());
  if (offset < 0 || offset >= gap)
    return emitOpError() << "offset " << offset << " must be in [0, update_proj_gap = " << gap
                         << ")";
  if (getProjectorKind() != "svd" && getProjectorKind() != "randomized")
    return emitOpError() << "unknown projector_kind '" << getProjectorKind()
                         << "'; expected 'svd' or 'randomized'";
  if (powerIterations < 0 || powerIterations > 16)
    return emitOpError() << "power_iterations must be in [0, 16], got " << powerIterations;
  if (failed(expectF32(*this, "projector", getProjector(),
                       projectorShape(gradient.getShape(), getLeft(), rank))))
    return failure();
  RankedTensorType status = tensorType(getStatus());
  if (!status.getElementType().isF32() || status.getRank() != 1)
    return emitOpError() << "status must be a 1-D f32 tensor, got " << status;
  if (slot < 0 || slot >= status.getDimSize(0))
    return emitOpError() << "slot " << slot << " is outside the status vector of "
                         << status.getDimSize(0) << " weights";
  int64_t workspace =
      getWorkspaceElements(small, std::max(gradient.getDimSize(0), gradient.getDimSize(1)), rank);
  return expectF32(*this, "workspace", getWorkspace(), {workspace});
}

OpCost GaloreRefreshOp::getForwardCost() {
  // Amortised over update_proj_gap steps: the refresh runs on one step in T. Per refresh the
  // range finder does 1 + 2 q GEMMs of s x l x r (the exact projector one s x l x s Gram).
  int64_t s = getSmallSide(), l = getLargeSide(), r = getRank();
  int64_t gemms = getProjectorKind() == "svd" ? 0 : 1 + 2 * getPowerIterations();
  int64_t flops = getProjectorKind() == "svd" ? 2 * s * s * l : 2 * gemms * s * l * r;
  OpCost cost;
  cost.matmulFlops = flops / getUpdateProjGap();
  cost.bytesRead = getStorageBytes(getGradient().getType()) / getUpdateProjGap();
  cost.bytesWritten = getStorageBytes(getProjector().getType()) / getUpdateProjGap();
  return cost;
}

//===----------------------------------------------------------------------===//
// GaloreProjectOp
//===----------------------------------------------------------------------===//

LogicalResult GaloreProjectOp::verify() {
  RankedTensorType gradient = tensorType(getGradient());
  if (failed(verifySide(*this, gradient, getLeft())))
    return failure();
  RankedTensorType projector = tensorType(getProjector());
  if (failed(expectRank(*this, "projector", projector, 2)))
    return failure();
  int64_t rank = projector.getDimSize(1);
  if (failed(expectF32(*this, "projector", getProjector(),
                       projectorShape(gradient.getShape(), getLeft(), rank))))
    return failure();
  return expectF32(*this, "result", getResult(),
                   projectedShape(gradient.getShape(), getLeft(), rank));
}

OpCost GaloreProjectOp::getForwardCost() {
  OpCost cost = streamingBytes(*this);
  cost.matmulFlops =
      2 * getNumElements(tensorType(getGradient())) * tensorType(getProjector()).getDimSize(1);
  return cost;
}

//===----------------------------------------------------------------------===//
// GaloreAdamWUpdateOp
//===----------------------------------------------------------------------===//

LogicalResult GaloreAdamWUpdateOp::verify() {
  RankedTensorType param = tensorType(getParam());
  if (failed(verifySide(*this, param, getLeft())))
    return failure();
  RankedTensorType projector = tensorType(getProjector());
  if (failed(expectRank(*this, "projector", projector, 2)))
    return failure();
  int64_t rank = projector.getDimSize(1);
  SmallVector<int64_t> reduced = projectedShape(param.getShape(), getLeft(), rank);
  if (failed(expectF32(*this, "projector", getProjector(),
                       projectorShape(param.getShape(), getLeft(), rank))) ||
      failed(expectF32(*this, "projected gradient", getProjected(), reduced)) ||
      failed(expectF32(*this, "exp_avg", getExpAvg(), reduced)) ||
      failed(expectF32(*this, "exp_avg_sq", getExpAvgSq(), reduced)))
    return failure();
  if (getMaster() && failed(expectF32(*this, "master", getMaster(), param.getShape())))
    return failure();
  for (auto [name, v] : {std::pair<StringRef, double>{"beta1", getBeta1().convertToDouble()},
                         {"beta2", getBeta2().convertToDouble()}})
    if (!(v >= 0 && v < 1))
      return emitOpError() << name << " must be in [0, 1), got " << v;
  if (!(getScale().convertToDouble() > 0))
    return emitOpError() << "scale must be positive, got " << getScale().convertToDouble();
  return success();
}

OpCost GaloreAdamWUpdateOp::getForwardCost() {
  OpCost cost = streamingBytes(*this);
  int64_t weight = getNumElements(tensorType(getParam()));
  int64_t rank = tensorType(getProjector()).getDimSize(1);
  cost.matmulFlops = 2 * weight * rank;
  cost.vectorFlops = 12 * getNumElements(tensorType(getProjected())) + 3 * weight;
  cost.bytesWritten = cost.bytesRead - getStorageBytes(getProjector().getType());
  return cost;
}

// Operand groups: projected, step, lr, grad_norm, projector, param, exp_avg, exp_avg_sq,
// master. The projector is state too, but the refresh and the projection read it as well:
// it is not the update's alone, so it is not offered for offload.
SmallVector<unsigned> GaloreAdamWUpdateOp::getOptimizerStateOperands() {
  return odsOperandIndices(*this, {6, 7});
}
SmallVector<unsigned> GaloreAdamWUpdateOp::getMasterWeightOperands() {
  return odsOperandIndices(*this, {8});
}
