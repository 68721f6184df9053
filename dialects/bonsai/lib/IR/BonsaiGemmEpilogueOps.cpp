//===- BonsaiGemmEpilogueOps.cpp - GEMMs with fused epilogues -------------===//
//
// Verifiers and costs of the GEMM-epilogue ops (BonsaiGemmEpilogueOps.td), and the
// AccumulatingProducerOpInterface of linear_grad_weight: its GEMM can add its product into a
// gradient accumulator (beta = 1) instead of writing a temporary that bonsai.accumulate adds.
//
//===----------------------------------------------------------------------===//

#include "OpUtils.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"

using namespace mlir;
using namespace mlir::bonsai;
using namespace mlir::bonsai::detail;

//===----------------------------------------------------------------------===//
// Forward GEMMs with an epilogue: LinearGeLUOp, LinearAddOp
//===----------------------------------------------------------------------===//

/// The checks of y = x · Wᵀ shared by the forward GEMMs with an epilogue: input [..., in] and
/// weight [out, in] of one f32, f16 or bf16 element type (`epilogue` names the op's in the
/// message). Returns y's type, [..., out] of that element type.
static FailureOr<RankedTensorType> verifyEpilogueGemm(Operation *op, Value inputValue,
                                                      Value weightValue, StringRef epilogue) {
  RankedTensorType input = tensorType(inputValue), weight = tensorType(weightValue);
  if (input.getRank() < 1)
    return op->emitOpError("input must have rank at least 1 (its last dimension is the features)");
  if (failed(expectRank(op, "weight", weight, 2)))
    return failure();
  int64_t in = input.getShape().back();
  if (weight.getDimSize(1) != in)
    return op->emitOpError() << "weight shape: expected [out, " << in
                             << "] (Hugging Face [out, in] layout for input features " << in
                             << "), got " << fmt(weight.getShape());
  Type element = input.getElementType();
  if (!isa<Float32Type, Float16Type, BFloat16Type>(element))
    return op->emitOpError() << "element type must be f32, f16 or bf16 (a GEMM " << epilogue
                             << "), got " << element;
  if (failed(expectElementType(op, "weight", weight.getElementType(), element)))
    return failure();
  SmallVector<int64_t> shape(input.getShape().drop_back());
  shape.push_back(weight.getDimSize(0));
  return RankedTensorType::get(shape, element);
}

/// Each named value has type `expected`.
static LogicalResult expectTypes(Operation *op, RankedTensorType expected,
                                 ArrayRef<std::pair<StringRef, Value>> values) {
  for (auto [name, value] : values)
    if (value.getType() != expected)
      return op->emitOpError() << name << " type: expected " << expected << ", got "
                               << value.getType();
  return success();
}

/// The cost of y = x · Wᵀ streamed once, with `vectorFlopsPerElement` of y in the epilogue.
static OpCost epilogueGemmCost(Operation *op, Value input, Value weight,
                               int64_t vectorFlopsPerElement) {
  int64_t k = tensorType(input).getShape().back(), n = tensorType(weight).getDimSize(0);
  int64_t m = getNumElements(tensorType(input)) / k;
  OpCost cost = streamingBytes(op);
  cost.matmulFlops = 2 * m * k * n;
  cost.vectorFlops = m * n * vectorFlopsPerElement;
  return cost;
}

LogicalResult LinearGeLUOp::verify() {
  FailureOr<RankedTensorType> expected =
      verifyEpilogueGemm(*this, getInput(), getWeight(), "with a GELU epilogue");
  if (failed(expected))
    return failure();
  if (Value bias = getBias()) {
    RankedTensorType biasType = tensorType(bias);
    if (failed(expectShape(*this, "bias", biasType.getShape(), {expected->getShape().back()})) ||
        failed(expectElementType(*this, "bias", biasType.getElementType(),
                                 expected->getElementType())))
      return failure();
  }
  return expectTypes(*this, *expected,
                     {{"result", getResult()}, {"pre_activation", getPreActivation()}});
}

OpCost LinearGeLUOp::getForwardCost() {
  // The bias add and the tanh GELU (8 per element, as bonsai.gelu counts it).
  return epilogueGemmCost(*this, getInput(), getWeight(), (getBias() ? 1 : 0) + 8);
}

LogicalResult LinearAddOp::verify() {
  FailureOr<RankedTensorType> expected =
      verifyEpilogueGemm(*this, getInput(), getWeight(), "that adds into its addend");
  if (failed(expected))
    return failure();
  return expectTypes(*this, *expected, {{"addend", getAddend()}, {"result", getResult()}});
}

OpCost LinearAddOp::getForwardCost() {
  // The addend, added in the epilogue.
  return epilogueGemmCost(*this, getInput(), getWeight(), 1);
}

//===----------------------------------------------------------------------===//
// LinearGradWeightAccumulateOp
//===----------------------------------------------------------------------===//

/// Storage a cuBLASLt GEMM (and the CPU GEMM) reads and writes.
static bool isGemmStorage(Type element) {
  return isa<Float32Type, Float16Type, BFloat16Type>(element);
}

LogicalResult LinearGradWeightAccumulateOp::verify() {
  RankedTensorType dy = tensorType(getResultGrad()), x = tensorType(getInput());
  RankedTensorType acc = tensorType(getAccumulator());
  if (dy.getRank() < 1 || dy.getShape().drop_back() != x.getShape().drop_back())
    return emitOpError() << "result_grad " << fmt(dy.getShape()) << " and input "
                         << fmt(x.getShape()) << " differ in their leading dimensions";
  for (auto [name, type] : {std::pair<StringRef, RankedTensorType>{"result_grad", dy},
                            {"input", x},
                            {"accumulator", acc}})
    if (!isGemmStorage(type.getElementType()))
      return emitOpError() << name << " element type must be f32, f16 or bf16, got "
                           << type.getElementType();
  return expectShape(*this, "accumulator", acc.getShape(),
                     {dy.getShape().back(), x.getShape().back()});
}

OpCost LinearGradWeightAccumulateOp::getForwardCost() {
  OpCost cost = streamingBytes(*this);
  // The accumulator is read (beta = 1) and written.
  cost.bytesWritten = getStorageBytes(getAccumulator().getType());
  cost.matmulFlops =
      2 * getNumElements(tensorType(getResultGrad())) * tensorType(getInput()).getShape().back();
  cost.vectorFlops = getNumElements(tensorType(getAccumulator()));
  return cost;
}

//===----------------------------------------------------------------------===//
// AccumulatingProducerOpInterface of LinearGradWeightOp
//===----------------------------------------------------------------------===//

bool LinearGradWeightOp::canAccumulateInto(Value accumulator) {
  auto acc = dyn_cast<RankedTensorType>(accumulator.getType());
  return acc && acc.getShape() == getResult().getType().getShape() &&
         isGemmStorage(acc.getElementType()) &&
         isGemmStorage(tensorType(getResultGrad()).getElementType()) &&
         isGemmStorage(tensorType(getInput()).getElementType());
}

Operation *LinearGradWeightOp::buildAccumulating(OpBuilder &builder, Value accumulator) {
  return LinearGradWeightAccumulateOp::create(builder, getLoc(), getResultGrad(), getInput(),
                                              accumulator);
}
