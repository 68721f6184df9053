//===- BonsaiElementwise.cpp - Scalar forms of the elementwise ops --------===//
//
// ElementwiseOpInterface for every op whose results are computed element by element, and the
// verifier, cost and kernel parameters of bonsai.fused_elementwise, whose regions are built
// from these scalar forms. Each scalar form follows the formula of the op's CPU kernel
// (runtime/cpu/Elementwise.cpp, Backward.cpp): operands widened to f32, computed in f32,
// rounded once to the result's element type.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"

#include "OpUtils.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/TypeUtilities.h"

#include <cmath>

using namespace mlir;
using namespace mlir::bonsai;
using namespace mlir::bonsai::detail;

namespace {

/// Whether `type` is an element type scalar forms are written for.
bool isScalarStorageType(Type type) { return isa<BFloat16Type, Float16Type, Float32Type>(type); }

/// Builds f32 scalar arithmetic at an insertion point.
struct ScalarBuilder {
  OpBuilder &b;
  Location loc;

  /// `v` widened to f32 (exact for bf16 and f16).
  Value widen(Value v) {
    if (v.getType().isF32())
      return v;
    return arith::ExtFOp::create(b, loc, b.getF32Type(), v);
  }
  /// `v` (f32) rounded to nearest even into `type`.
  Value round(Value v, Type type) {
    if (type.isF32())
      return v;
    return arith::TruncFOp::create(b, loc, type, v);
  }
  Value constant(double value) {
    return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(float(value)));
  }
  Value add(Value x, Value y) { return arith::AddFOp::create(b, loc, x, y); }
  Value sub(Value x, Value y) { return arith::SubFOp::create(b, loc, x, y); }
  Value mul(Value x, Value y) { return arith::MulFOp::create(b, loc, x, y); }
  Value div(Value x, Value y) { return arith::DivFOp::create(b, loc, x, y); }
  Value neg(Value x) { return arith::NegFOp::create(b, loc, x); }
  Value exp(Value x) { return math::ExpOp::create(b, loc, x); }
  Value tanh(Value x) { return math::TanhOp::create(b, loc, x); }
  Value erf(Value x) { return math::ErfOp::create(b, loc, x); }

  /// 1 / (1 + exp(-x)).
  Value sigmoid(Value x) { return div(constant(1.0), add(constant(1.0), exp(neg(x)))); }
  /// x / (1 + exp(-x)), as the CPU kernel writes it.
  Value silu(Value x) { return div(x, add(constant(1.0), exp(neg(x)))); }
  /// d/dx x sigmoid(x) = s (1 + x (1 - s)).
  Value siluDerivative(Value x) {
    Value s = sigmoid(x);
    return mul(s, add(constant(1.0), mul(x, sub(constant(1.0), s))));
  }
};

constexpr double kPi = 3.14159265358979323846;
/// GeLU's tanh form: 0.5 x (1 + tanh(c (x + a x^3))) with these constants (GPT-2's gelu_new).
const double kGeluTanhC = std::sqrt(2.0 / kPi);
constexpr double kGeluTanhA = 0.044715;

/// Checks that every operand and result of `op` has a scalar form and that `operands` match
/// the operands' element types.
LogicalResult checkScalarTypes(Operation *op, ValueRange operands) {
  if (operands.size() != op->getNumOperands())
    return failure();
  for (auto [operand, scalar] : llvm::zip(op->getOperands(), operands)) {
    Type element = getElementTypeOrSelf(operand.getType());
    if (!isScalarStorageType(element) || scalar.getType() != element)
      return failure();
  }
  return success(llvm::all_of(op->getResultTypes(), [](Type t) {
    return isScalarStorageType(getElementTypeOrSelf(t));
  }));
}

/// The element type of result `i` of `op`.
Type resultElement(Operation *op, unsigned i) {
  return getElementTypeOrSelf(op->getResult(i).getType());
}

/// `dy` times `derivative(x)`, the shape of every unary gradient.
template <typename Derivative>
LogicalResult buildUnaryGrad(Operation *op, OpBuilder &b, Location loc, ValueRange operands,
                             SmallVectorImpl<Value> &results, Derivative derivative) {
  if (failed(checkScalarTypes(op, operands)))
    return failure();
  ScalarBuilder s{b, loc};
  Value dy = s.widen(operands[0]), x = s.widen(operands[1]);
  results.push_back(s.round(s.mul(dy, derivative(s, x)), resultElement(op, 0)));
  return success();
}

/// The scalar GeLU of `x`, tanh form or exact (erf).
Value buildGelu(ScalarBuilder &s, Value x, bool tanhForm) {
  Value inner;
  if (tanhForm) {
    Value cube = s.mul(s.mul(x, x), x);
    Value u = s.mul(s.constant(kGeluTanhC), s.add(x, s.mul(s.constant(kGeluTanhA), cube)));
    inner = s.tanh(u);
  } else {
    inner = s.erf(s.div(x, s.constant(std::sqrt(2.0))));
  }
  return s.mul(s.mul(s.constant(0.5), x), s.add(s.constant(1.0), inner));
}

/// d/dx GeLU(x): tanh form 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2), exact
/// Phi(x) + x phi(x).
Value buildGeluDerivative(ScalarBuilder &s, Value x, bool tanhForm) {
  if (tanhForm) {
    Value x2 = s.mul(x, x);
    Value t = s.tanh(s.mul(s.constant(kGeluTanhC),
                           s.add(x, s.mul(s.constant(kGeluTanhA), s.mul(x2, x)))));
    Value left = s.mul(s.constant(0.5), s.add(s.constant(1.0), t));
    Value slope = s.mul(s.constant(kGeluTanhC),
                        s.add(s.constant(1.0), s.mul(s.constant(3.0 * kGeluTanhA), x2)));
    Value right = s.mul(s.mul(s.mul(s.constant(0.5), x), s.sub(s.constant(1.0), s.mul(t, t))),
                        slope);
    return s.add(left, right);
  }
  Value cdf = s.mul(s.constant(0.5),
                    s.add(s.constant(1.0), s.erf(s.div(x, s.constant(std::sqrt(2.0))))));
  Value pdf = s.mul(s.exp(s.mul(s.constant(-0.5), s.mul(x, x))),
                    s.constant(1.0 / std::sqrt(2.0 * kPi)));
  return s.add(cdf, s.mul(x, pdf));
}

} // namespace

//===----------------------------------------------------------------------===//
// ElementwiseOpInterface
//===----------------------------------------------------------------------===//

LogicalResult AddOp::buildScalarComputation(OpBuilder &b, Location loc, ValueRange operands,
                                            SmallVectorImpl<Value> &results) {
  if (failed(checkScalarTypes(*this, operands)))
    return failure();
  ScalarBuilder s{b, loc};
  results.push_back(s.round(s.add(s.widen(operands[0]), s.widen(operands[1])),
                            resultElement(*this, 0)));
  return success();
}

LogicalResult MulOp::buildScalarComputation(OpBuilder &b, Location loc, ValueRange operands,
                                            SmallVectorImpl<Value> &results) {
  if (failed(checkScalarTypes(*this, operands)))
    return failure();
  ScalarBuilder s{b, loc};
  results.push_back(s.round(s.mul(s.widen(operands[0]), s.widen(operands[1])),
                            resultElement(*this, 0)));
  return success();
}

LogicalResult SiLUOp::buildScalarComputation(OpBuilder &b, Location loc, ValueRange operands,
                                             SmallVectorImpl<Value> &results) {
  if (failed(checkScalarTypes(*this, operands)))
    return failure();
  ScalarBuilder s{b, loc};
  results.push_back(s.round(s.silu(s.widen(operands[0])), resultElement(*this, 0)));
  return success();
}

LogicalResult GeLUOp::buildScalarComputation(OpBuilder &b, Location loc, ValueRange operands,
                                             SmallVectorImpl<Value> &results) {
  if (failed(checkScalarTypes(*this, operands)))
    return failure();
  ScalarBuilder s{b, loc};
  Value y = buildGelu(s, s.widen(operands[0]), getApproximation() == GeluApproximation::Tanh);
  results.push_back(s.round(y, resultElement(*this, 0)));
  return success();
}

LogicalResult SwiGLUOp::buildScalarComputation(OpBuilder &b, Location loc, ValueRange operands,
                                               SmallVectorImpl<Value> &results) {
  if (failed(checkScalarTypes(*this, operands)))
    return failure();
  ScalarBuilder s{b, loc};
  results.push_back(s.round(s.mul(s.silu(s.widen(operands[0])), s.widen(operands[1])),
                            resultElement(*this, 0)));
  return success();
}

LogicalResult CastOp::buildScalarComputation(OpBuilder &b, Location loc, ValueRange operands,
                                             SmallVectorImpl<Value> &results) {
  // FP8 casts saturate, which the scalar forms do not express: those stay their own kernel.
  if (failed(checkScalarTypes(*this, operands)))
    return failure();
  ScalarBuilder s{b, loc};
  results.push_back(s.round(s.widen(operands[0]), resultElement(*this, 0)));
  return success();
}

LogicalResult SiLUGradOp::buildScalarComputation(OpBuilder &b, Location loc,
                                                 ValueRange operands,
                                                 SmallVectorImpl<Value> &results) {
  return buildUnaryGrad(*this, b, loc, operands, results,
                        [](ScalarBuilder &s, Value x) { return s.siluDerivative(x); });
}

LogicalResult GeLUGradOp::buildScalarComputation(OpBuilder &b, Location loc,
                                                 ValueRange operands,
                                                 SmallVectorImpl<Value> &results) {
  bool tanhForm = getApproximation() == GeluApproximation::Tanh;
  return buildUnaryGrad(*this, b, loc, operands, results, [&](ScalarBuilder &s, Value x) {
    return buildGeluDerivative(s, x, tanhForm);
  });
}

LogicalResult SwiGLUGradOp::buildScalarComputation(OpBuilder &b, Location loc,
                                                   ValueRange operands,
                                                   SmallVectorImpl<Value> &results) {
  if (failed(checkScalarTypes(*this, operands)))
    return failure();
  ScalarBuilder s{b, loc};
  Value dy = s.widen(operands[0]), gate = s.widen(operands[1]), up = s.widen(operands[2]);
  // d gate = dy up silu'(gate), d up = dy gate sigmoid(gate) = dy silu(gate).
  results.push_back(
      s.round(s.mul(s.mul(dy, up), s.siluDerivative(gate)), resultElement(*this, 0)));
  results.push_back(
      s.round(s.mul(s.mul(dy, gate), s.sigmoid(gate)), resultElement(*this, 1)));
  return success();
}

//===----------------------------------------------------------------------===//
// FusedElementwiseOp
//===----------------------------------------------------------------------===//

/// Whether an input of shape `input` is read at the element index modulo its size in an
/// iteration space of shape `space`: after its leading 1s it is a trailing part of `space`.
static bool isTrailingPart(ArrayRef<int64_t> input, ArrayRef<int64_t> space) {
  while (!input.empty() && input.front() == 1)
    input = input.drop_front();
  return input.size() <= space.size() && space.take_back(input.size()) == input;
}

ArrayRef<int64_t> FusedElementwiseOp::getIterationShape() {
  return cast<RankedTensorType>(getResult(0).getType()).getShape();
}

LogicalResult FusedElementwiseOp::verify() {
  if (getNumResults() == 0)
    return emitOpError("must have at least one result");
  ArrayRef<int64_t> shape = getIterationShape();
  for (auto [i, result] : llvm::enumerate(getResults()))
    if (failed(expectShape(*this, "result " + std::to_string(i),
                           tensorType(result).getShape(), shape)))
      return failure();
  for (auto [i, input] : llvm::enumerate(getInputs()))
    if (!isTrailingPart(tensorType(input).getShape(), shape))
      return emitOpError() << "input " << i << " shape " << fmt(tensorType(input).getShape())
                           << " is neither the iteration shape " << fmt(shape)
                           << " nor a trailing part of it";
  if (getProgram() && !getGeneratedKernel())
    return emitOpError("has a program but no generated_kernel");
  if (getPtx().has_value() != getArch().has_value())
    return emitOpError("ptx and arch go together");
  return success();
}

LogicalResult FusedElementwiseOp::verifyRegions() {
  Block &body = getBody().front();
  if (body.getNumArguments() != getInputs().size())
    return emitOpError() << "body has " << body.getNumArguments() << " arguments for "
                         << getInputs().size() << " inputs";
  for (auto [i, pair] : llvm::enumerate(llvm::zip(body.getArguments(), getInputs()))) {
    auto [arg, input] = pair;
    Type element = tensorType(input).getElementType();
    if (arg.getType() != element)
      return emitOpError() << "body argument " << i << " type: expected " << element
                           << " (the element type of input " << i << "), got "
                           << arg.getType();
  }
  auto yield = dyn_cast<YieldOp>(body.getTerminator());
  if (!yield)
    return emitOpError("body must end with bonsai.yield");
  if (yield.getValues().size() != getNumResults())
    return emitOpError() << "body yields " << yield.getValues().size() << " values for "
                         << getNumResults() << " results";
  for (auto [i, pair] : llvm::enumerate(llvm::zip(yield.getValues(), getResults()))) {
    auto [value, result] = pair;
    Type element = tensorType(result).getElementType();
    if (value.getType() != element)
      return yield.emitOpError() << "value " << i << " type: expected " << element
                                 << " (the element type of result " << i << "), got "
                                 << value.getType();
  }
  // The body is one element's computation: scalar arith and math, nothing with regions,
  // memory or side effects (the generated kernels and the CPU program have no such thing).
  for (Operation &op : body.without_terminator()) {
    if (!isa<arith::ArithDialect, math::MathDialect>(op.getDialect()) ||
        op.getNumRegions() != 0 || !isPure(&op))
      return op.emitOpError("is not a scalar arith or math op, which is all a fused "
                            "elementwise body may hold");
    SmallVector<Type> types(op.getOperandTypes());
    llvm::append_range(types, op.getResultTypes());
    for (Type type : types)
      if (!isScalarStorageType(type))
        return op.emitOpError() << "has a value of type " << type
                                << "; fused elementwise bodies compute on bf16, f16 and f32";
  }
  return success();
}

OpCost FusedElementwiseOp::getForwardCost() {
  // One read of every input and one write of every result: what the fusion is for.
  OpCost cost = streamingBytes(*this);
  int64_t ops = std::distance(getBody().front().begin(), getBody().front().end()) - 1;
  cost.vectorFlops = ops * getNumElements(cast<ShapedType>(getResult(0).getType()));
  return cost;
}

DictionaryAttr FusedElementwiseOp::getKernelParams() {
  // What code generation recorded (bonsai-generate-elementwise-kernels); the plan emitter
  // says so when it is missing.
  Builder b(getContext());
  SmallVector<NamedAttribute> params;
  for (StringRef name : {"generated_kernel", "program", "ptx", "arch"})
    if (Attribute attr = (*this)->getAttr(name))
      params.push_back(b.getNamedAttr(name, attr));
  return b.getDictionaryAttr(params);
}
