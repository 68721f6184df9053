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
// LinearGeLUOp
//===----------------------------------------------------------------------===//

LogicalResult LinearGeLUOp::verify() {
  RankedTensorType input = tensorType(getInput()), weight = tensorType(getWeight());
  if (input.getRank() < 1)
    return emitOpError("input must have rank at least 1 (its last dimension is the features)");
  if (failed(expectRank(*this, "weight", weight, 2)))
    return failure();
  int64_t in = input.getShape().back(), out = weight.getDimSize(0);
  if (weight.getDimSize(1) != in)
    return emitOpError() << "weight shape: expected [out, " << in
                         << "] (Hugging Face [out, in] layout for input features " << in
                         << "), got " << fmt(weight.getShape());
  Type element = input.getElementType();
  if (!isa<Float32Type, Float16Type, BFloat16Type>(element))
    return emitOpError() << "element type must be f32, f16 or bf16 (a GEMM with a GELU "
                            "epilogue), got "
                         << element;
  if (failed(expectElementType(*this, "weight", weight.getElementType(), element)))
    return failure();
  if (Value bias = getBias()) {
    RankedTensorType biasType = tensorType(bias);
    if (failed(expectShape(*this, "bias", biasType.getShape(), {out})) ||
        failed(expectElementType(*this, "bias", biasType.getElementType(), element)))
      return failure();
  }
  SmallVector<int64_t> shape(input.getShape().drop_back());
  shape.push_back(out);
  auto expected = RankedTensorType::get(shape, element);
  for (auto [name, value] : {std::pair<StringRef, Value>{"result", getResult()},
                             {"pre_activation", getPreActivation()}})
    if (value.getType() != expected)
      return emitOpError() << name << " type: expected " << expected << ", got "
                           << value.getType();
  return success();
}

OpCost LinearGeLUOp::getForwardCost() {
  RankedTensorType input = tensorType(getInput());
  int64_t k = input.getShape().back(), n = tensorType(getWeight()).getDimSize(0);
  int64_t m = getNumElements(input) / k;
  OpCost cost = streamingBytes(*this);
  cost.matmulFlops = 2 * m * k * n;
  // The bias add and the tanh GELU (8 per element, as bonsai.gelu counts it).
  cost.vectorFlops = m * n * ((getBias() ? 1 : 0) + 8);
  return cost;
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
