//===- ElementwiseKernels.cpp - Programs and PTX for fused elementwise ops ===//
//
// The portable program of a bonsai.fused_elementwise region (one instruction per scalar op)
// and its PTX kernel. The kernel is built as a gpu.module around a clone of the region:
//
//   gpu.func @k(%in0: memref<N0xT0>, ..., %out0: memref<NxT>, ..., %n: i64) kernel {
//     scf.for %i = blockIdx.x * blockDim.x + threadIdx.x to %n step blockDim.x * gridDim.x {
//       %a = memref.load %in0[%i mod N0]    (input 0's element; the region's argument)
//       ... the region's body ...
//       memref.store %y, %out0[%i]          (what it yields)
//     }
//   }
//
// When every input is a scalar or a whole number of 8-element vectors (and so is N), the
// loop above becomes the fallback of a vector loop that each thread runs over 8 consecutive
// elements: one 16-byte vector.load per operand, the region cloned once per lane, one
// vector.store per output. Scalar bf16 loads move 64 bytes per warp instruction; the vector
// loop moves 512. Which loop runs is decided at launch from the buffers' alignment.
//
// Lowered by upstream MLIR: math functions expanded into polynomials made of arith ops
// (no libdevice: the PTX does not depend on a CUDA toolkit), scf -> cf, gpu -> nvvm with the
// bare-pointer calling convention (a kernel parameter per buffer, not a memref descriptor),
// then gpu-module-to-binary with format=isa (LLVM's NVPTX backend) for #nvvm.target<chip>.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Conversion/ElementwiseKernels.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVM.h"
#include "mlir/Conversion/GPUToNVVM/GPUToNVVM.h"
#include "mlir/Conversion/GPUToNVVM/GPUToNVVMPass.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/NVVMToLLVM/NVVMToLLVM.h"
#include "mlir/Conversion/ReconcileUnrealizedCasts/ReconcileUnrealizedCasts.h"
#include "mlir/Conversion/SCFToControlFlow/SCFToControlFlow.h"
#include "mlir/Conversion/VectorToLLVM/ConvertVectorToLLVM.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Math/Transforms/Passes.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/TypeUtilities.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Target/LLVM/NVVM/Target.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/GPU/GPUToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/NVVM/NVVMToLLVMIRTranslation.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/raw_ostream.h"

#include <cstring>

using namespace mlir;
using namespace mlir::bonsai;

//===----------------------------------------------------------------------===//
// The portable program
//===----------------------------------------------------------------------===//

namespace {

std::optional<ElementwiseType> getElementwiseType(Type type) {
  if (type.isF32())
    return ElementwiseType::F32;
  if (type.isF16())
    return ElementwiseType::F16;
  if (type.isBF16())
    return ElementwiseType::BF16;
  return std::nullopt;
}

int32_t floatBits(float value) {
  int32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

float bitsFloat(int32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

} // namespace

DenseI32ArrayAttr ElementwiseProgram::encode(MLIRContext *context) const {
  SmallVector<int32_t> words;
  words.push_back(int32_t(inputs.size()));
  for (ElementwiseType type : inputs)
    words.push_back(int32_t(type));
  words.push_back(int32_t(instructions.size()));
  for (const ElementwiseInstruction &inst : instructions)
    words.append({int32_t(inst.opcode), int32_t(inst.type), int32_t(inst.a), int32_t(inst.b),
                  floatBits(inst.imm)});
  words.push_back(int32_t(outputs.size()));
  for (uint16_t output : outputs)
    words.push_back(int32_t(output));
  return DenseI32ArrayAttr::get(context, words);
}

std::optional<ElementwiseProgram> ElementwiseProgram::decode(DenseI32ArrayAttr attr,
                                                             std::string &error) {
  ArrayRef<int32_t> words = attr.asArrayRef();
  size_t pos = 0;
  auto next = [&](int32_t &word) {
    if (pos >= words.size())
      return false;
    word = words[pos++];
    return true;
  };
  auto fits = [](int32_t v, int32_t max) { return v >= 0 && v <= max; };
  ElementwiseProgram program;
  int32_t count;
  if (!next(count) || !fits(count, 0xffff)) {
    error = "bad input count";
    return std::nullopt;
  }
  for (int32_t i = 0; i < count; ++i) {
    int32_t type;
    if (!next(type) || !fits(type, int32_t(ElementwiseType::BF16))) {
      error = "bad type of input " + std::to_string(i);
      return std::nullopt;
    }
    program.inputs.push_back(ElementwiseType(type));
  }
  if (!next(count) || !fits(count, 0xffff)) {
    error = "bad instruction count";
    return std::nullopt;
  }
  for (int32_t i = 0; i < count; ++i) {
    int32_t opcode, type, a, b, imm;
    if (!next(opcode) || !next(type) || !next(a) || !next(b) || !next(imm) ||
        !fits(opcode, kMaxElementwiseOpcode) || !fits(type, int32_t(ElementwiseType::BF16)) ||
        !fits(a, 0xffff) || !fits(b, 0xffff)) {
      error = "bad instruction " + std::to_string(i);
      return std::nullopt;
    }
    program.instructions.push_back({ElementwiseOpcode(opcode), ElementwiseType(type),
                                    uint16_t(a), uint16_t(b), bitsFloat(imm)});
  }
  if (!next(count) || !fits(count, 0xffff)) {
    error = "bad output count";
    return std::nullopt;
  }
  for (int32_t i = 0; i < count; ++i) {
    int32_t reg;
    if (!next(reg) || !fits(reg, 0xffff)) {
      error = "bad output " + std::to_string(i);
      return std::nullopt;
    }
    program.outputs.push_back(uint16_t(reg));
  }
  if (pos != words.size()) {
    error = "trailing words";
    return std::nullopt;
  }
  return program;
}

FailureOr<ElementwiseProgram> mlir::bonsai::buildElementwiseProgram(FusedElementwiseOp op) {
  ElementwiseProgram program;
  DenseMap<Value, uint16_t> registers;
  Block &body = op.getBody().front();
  for (BlockArgument arg : body.getArguments()) {
    registers[arg] = uint16_t(program.inputs.size());
    program.inputs.push_back(*getElementwiseType(arg.getType()));
  }
  // The region verifier allows bf16, f16 and f32 values only, so every type maps.
  for (Operation &operation : body.without_terminator()) {
    ElementwiseInstruction inst;
    if (operation.getNumResults() != 1)
      return operation.emitOpError("has no instruction in elementwise programs");
    inst.type = *getElementwiseType(operation.getResult(0).getType());
    if (operation.getNumOperands() > 0)
      inst.a = registers.lookup(operation.getOperand(0));
    if (operation.getNumOperands() > 1)
      inst.b = registers.lookup(operation.getOperand(1));
    std::optional<ElementwiseOpcode> opcode =
        llvm::TypeSwitch<Operation *, std::optional<ElementwiseOpcode>>(&operation)
            .Case([&](arith::ConstantOp constant) -> std::optional<ElementwiseOpcode> {
              auto value = dyn_cast<FloatAttr>(constant.getValue());
              if (!value || !value.getType().isF32())
                return std::nullopt;
              inst.imm = value.getValue().convertToFloat();
              return ElementwiseOpcode::Constant;
            })
            .Case([](arith::ExtFOp) { return ElementwiseOpcode::Extend; })
            .Case([](arith::TruncFOp) { return ElementwiseOpcode::Truncate; })
            .Case([](arith::AddFOp) { return ElementwiseOpcode::Add; })
            .Case([](arith::SubFOp) { return ElementwiseOpcode::Sub; })
            .Case([](arith::MulFOp) { return ElementwiseOpcode::Mul; })
            .Case([](arith::DivFOp) { return ElementwiseOpcode::Div; })
            .Case([](arith::NegFOp) { return ElementwiseOpcode::Neg; })
            .Case([](math::ExpOp) { return ElementwiseOpcode::Exp; })
            .Case([](math::TanhOp) { return ElementwiseOpcode::Tanh; })
            .Case([](math::ErfOp) { return ElementwiseOpcode::Erf; })
            .Default([](Operation *) { return std::nullopt; });
    if (!opcode)
      return operation.emitOpError("has no instruction in elementwise programs (they hold "
                                   "f32 constants, extf, truncf, addf, subf, mulf, divf, "
                                   "negf, exp, tanh and erf)");
    // Fast-math flags would let the GPU code differ from the program: none are set.
    if (auto fastmath = operation.getAttrOfType<arith::FastMathFlagsAttr>("fastmath");
        fastmath && fastmath.getValue() != arith::FastMathFlags::none)
      return operation.emitOpError("has fast-math flags, which elementwise programs do not "
                                   "carry");
    inst.opcode = *opcode;
    size_t index = program.inputs.size() + program.instructions.size();
    if (index > 0xffff)
      return op.emitOpError("has more than 65535 values, the most a program addresses");
    registers[operation.getResult(0)] = uint16_t(index);
    program.instructions.push_back(inst);
  }
  for (Value value : body.getTerminator()->getOperands())
    program.outputs.push_back(registers.lookup(value));
  return program;
}

//===----------------------------------------------------------------------===//
// PTX
//===----------------------------------------------------------------------===//

void mlir::bonsai::registerElementwiseCodegenDialects(DialectRegistry &registry) {
  registry.insert<arith::ArithDialect, cf::ControlFlowDialect, gpu::GPUDialect, LLVM::LLVMDialect,
                  math::MathDialect, memref::MemRefDialect, NVVM::NVVMDialect, scf::SCFDialect,
                  vector::VectorDialect>();
  arith::registerConvertArithToLLVMInterface(registry);
  cf::registerConvertControlFlowToLLVMInterface(registry);
  registerConvertFuncToLLVMInterface(registry);
  NVVM::registerConvertGpuToNVVMInterface(registry);
  registerConvertMathToLLVMInterface(registry);
  registerConvertMemRefToLLVMInterface(registry);
  registerConvertNVVMToLLVMInterface(registry);
  vector::registerConvertVectorToLLVMInterface(registry);
  NVVM::registerNVVMTargetInterfaceExternalModels(registry);
  registerBuiltinDialectTranslation(registry);
  registerGPUDialectTranslation(registry);
  registerLLVMDialectTranslation(registry);
  registerNVVMDialectTranslation(registry);
}

namespace {

/// Elements of `op`'s iteration space.
int64_t getIterationElements(FusedElementwiseOp op) {
  int64_t numElements = 1;
  for (int64_t dim : op.getIterationShape())
    numElements *= dim;
  return numElements;
}

/// Elements a thread takes per iteration of the vector loop: 16 bytes of bf16 or f16.
constexpr int64_t kVectorWidth = 8;
/// The alignment every buffer must have for that loop: one 16-byte load or store per
/// 8 x 16-bit operand (8 x f32 operands are two).
constexpr int64_t kVectorAlignment = 16;

/// Whether the kernel of `op` gets a vector loop: every input is read whole lanes at a time
/// (a scalar, or a size that the vector width divides, so that `i mod size` of eight
/// consecutive elements starting at a multiple of eight is eight consecutive elements), and
/// the iteration space is whole vectors.
bool canVectorize(FusedElementwiseOp op, ArrayRef<int64_t> inputSizes, int64_t numElements) {
  if (numElements % kVectorWidth != 0)
    return false;
  return llvm::all_of(inputSizes,
                      [](int64_t size) { return size == 1 || size % kVectorWidth == 0; });
}

/// Emits `for i = start; i < count; i += step { outputs[i] = body(inputs[i mod size]) }` at
/// the builder's point: one element per thread per iteration.
void buildScalarLoop(OpBuilder &builder, Location loc, FusedElementwiseOp op, Block &entry,
                     ArrayRef<int64_t> inputSizes, int64_t numElements, Value start, Value count,
                     Value step) {
  auto loop = scf::ForOp::create(builder, loc, start, count, step);
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToStart(loop.getBody());
  Value i = loop.getInductionVar();

  unsigned numInputs = op.getInputs().size();
  Block &body = op.getBody().front();
  IRMapping mapping;
  for (unsigned k = 0; k < numInputs; ++k) {
    // An input smaller than the iteration space is read at i modulo its size.
    Value index = i;
    if (inputSizes[k] == 1)
      index = arith::ConstantIndexOp::create(builder, loc, 0);
    else if (inputSizes[k] != numElements)
      index = arith::RemUIOp::create(builder, loc, i,
                                     arith::ConstantIndexOp::create(builder, loc, inputSizes[k]));
    mapping.map(body.getArgument(k),
                memref::LoadOp::create(builder, loc, entry.getArgument(k), index));
  }
  for (Operation &operation : body.without_terminator())
    builder.clone(operation, mapping);
  for (auto [j, value] : llvm::enumerate(body.getTerminator()->getOperands()))
    memref::StoreOp::create(builder, loc, mapping.lookup(value), entry.getArgument(numInputs + j),
                            i);
}

/// Emits the vector loop: each thread takes kVectorWidth consecutive elements per iteration,
/// loads each operand with one vector load, runs the region once per lane (the body stays
/// scalar: the approximations of exp, tanh and erf are the scalar path's), and stores each
/// output with one vector store. `count` is the element count, a multiple of the width.
void buildVectorLoop(OpBuilder &builder, Location loc, FusedElementwiseOp op, Block &entry,
                     ArrayRef<int64_t> inputSizes, int64_t numElements, Value start, Value count,
                     Value step) {
  Value width = arith::ConstantIndexOp::create(builder, loc, kVectorWidth);
  Value vectors = arith::DivUIOp::create(builder, loc, count, width);
  auto loop = scf::ForOp::create(builder, loc, start, vectors, step);
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToStart(loop.getBody());
  Value first = arith::MulIOp::create(builder, loc, loop.getInductionVar(), width);

  auto alignment = llvm::MaybeAlign(kVectorAlignment);
  unsigned numInputs = op.getInputs().size();
  Block &body = op.getBody().front();
  // Per input: its loaded vector, or (a scalar input) its one element.
  SmallVector<Value> loaded;
  for (unsigned k = 0; k < numInputs; ++k) {
    Value memref = entry.getArgument(k);
    Type elementType = cast<MemRefType>(memref.getType()).getElementType();
    if (inputSizes[k] == 1) {
      loaded.push_back(memref::LoadOp::create(
          builder, loc, memref, ValueRange{arith::ConstantIndexOp::create(builder, loc, 0)}));
      continue;
    }
    Value index = first;
    if (inputSizes[k] != numElements)
      index = arith::RemUIOp::create(builder, loc, first,
                                     arith::ConstantIndexOp::create(builder, loc, inputSizes[k]));
    auto vectorType = VectorType::get({kVectorWidth}, elementType);
    loaded.push_back(vector::LoadOp::create(builder, loc, vectorType, memref, ValueRange{index},
                                            /*nontemporal=*/false, alignment));
  }
  unsigned numOutputs = body.getTerminator()->getNumOperands();
  SmallVector<SmallVector<Value>> lanes(numOutputs);
  for (int64_t lane = 0; lane < kVectorWidth; ++lane) {
    IRMapping mapping;
    for (unsigned k = 0; k < numInputs; ++k) {
      Value element = loaded[k];
      if (isa<VectorType>(element.getType()))
        element = vector::ExtractOp::create(builder, loc, element, ArrayRef<int64_t>{lane});
      mapping.map(body.getArgument(k), element);
    }
    for (Operation &operation : body.without_terminator())
      builder.clone(operation, mapping);
    for (auto [j, value] : llvm::enumerate(body.getTerminator()->getOperands()))
      lanes[j].push_back(mapping.lookup(value));
  }
  for (unsigned j = 0; j < numOutputs; ++j) {
    auto vectorType = VectorType::get({kVectorWidth}, lanes[j].front().getType());
    Value vector = vector::FromElementsOp::create(builder, loc, vectorType, lanes[j]);
    vector::StoreOp::create(builder, loc, vector, entry.getArgument(numInputs + j),
                            ValueRange{first}, /*nontemporal=*/false, alignment);
  }
}

/// Builds the kernel of `op` into `module` (see the file comment).
void buildKernel(FusedElementwiseOp op, ModuleOp module, StringRef name, StringRef arch) {
  MLIRContext *context = op.getContext();
  Location loc = op.getLoc();
  OpBuilder builder = OpBuilder::atBlockEnd(module.getBody());
  module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(), builder.getUnitAttr());
  auto target = NVVM::NVVMTargetAttr::get(context, /*optLevel=*/3, "nvptx64-nvidia-cuda",
                                          arch);
  auto gpuModule =
      gpu::GPUModuleOp::create(builder, loc, name, builder.getArrayAttr({target}));
  builder.setInsertionPointToStart(gpuModule.getBody());

  int64_t numElements = getIterationElements(op);
  SmallVector<Type> params;
  SmallVector<int64_t> inputSizes;
  for (Value input : op.getInputs()) {
    auto type = cast<RankedTensorType>(input.getType());
    inputSizes.push_back(type.getNumElements());
    params.push_back(MemRefType::get({type.getNumElements()}, type.getElementType()));
  }
  for (Type type : op.getResultTypes())
    params.push_back(
        MemRefType::get({numElements}, cast<RankedTensorType>(type).getElementType()));
  params.push_back(builder.getI64Type());
  auto func = gpu::GPUFuncOp::create(builder, loc, name, builder.getFunctionType(params, {}));
  func->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), builder.getUnitAttr());
  Block &entry = func.getBody().front();
  builder.setInsertionPointToStart(&entry);

  // i = blockIdx.x * blockDim.x + threadIdx.x, stepping by the whole grid.
  Value blockId = gpu::BlockIdOp::create(builder, loc, gpu::Dimension::x);
  Value blockDim = gpu::BlockDimOp::create(builder, loc, gpu::Dimension::x);
  Value threadId = gpu::ThreadIdOp::create(builder, loc, gpu::Dimension::x);
  Value gridDim = gpu::GridDimOp::create(builder, loc, gpu::Dimension::x);
  Value start = arith::AddIOp::create(
      builder, loc, arith::MulIOp::create(builder, loc, blockId, blockDim), threadId);
  Value step = arith::MulIOp::create(builder, loc, blockDim, gridDim);
  Value count =
      arith::IndexCastOp::create(builder, loc, builder.getIndexType(), entry.getArguments().back());

  if (!canVectorize(op, inputSizes, numElements)) {
    buildScalarLoop(builder, loc, op, entry, inputSizes, numElements, start, count, step);
  } else {
    // The vector loop needs every buffer 16-byte aligned and a count of whole vectors. The
    // plan's buffers are (the arena and its offsets are 256-byte aligned), but a view into
    // another tensor need not be: such a launch takes the scalar loop (a uniform branch).
    Value zero = arith::ConstantIndexOp::create(builder, loc, 0);
    Value width = arith::ConstantIndexOp::create(builder, loc, kVectorWidth);
    Value misaligned = arith::RemUIOp::create(builder, loc, count, width);
    Value mask = arith::ConstantIndexOp::create(builder, loc, kVectorAlignment - 1);
    for (BlockArgument buffer : entry.getArguments().drop_back()) {
      if (cast<MemRefType>(buffer.getType()).getNumElements() == 1)
        continue; // read one element at a time in both loops
      Value address = memref::ExtractAlignedPointerAsIndexOp::create(builder, loc, buffer);
      misaligned = arith::OrIOp::create(builder, loc, misaligned,
                                        arith::AndIOp::create(builder, loc, address, mask));
    }
    Value aligned = arith::CmpIOp::create(builder, loc, arith::CmpIPredicate::eq, misaligned, zero);
    auto branch = scf::IfOp::create(builder, loc, aligned, /*withElseRegion=*/true);
    builder.setInsertionPointToStart(branch.thenBlock());
    buildVectorLoop(builder, loc, op, entry, inputSizes, numElements, start, count, step);
    builder.setInsertionPointToStart(branch.elseBlock());
    buildScalarLoop(builder, loc, op, entry, inputSizes, numElements, start, count, step);
  }
  builder.setInsertionPointToEnd(&entry);
  gpu::ReturnOp::create(builder, loc);
}

} // namespace

FailureOr<std::string> mlir::bonsai::generateElementwisePTX(FusedElementwiseOp op,
                                                            StringRef name, StringRef arch) {
  MLIRContext *context = op.getContext();
  OwningOpRef<ModuleOp> module = ModuleOp::create(op.getLoc());
  buildKernel(op, *module, name, arch);

  // Math functions become arith polynomials before anything else sees them: the NVVM
  // lowering would otherwise call libdevice's __nv_expf, __nv_tanhf and __nv_erff.
  {
    RewritePatternSet patterns(context);
    populateMathPolynomialApproximationPatterns(patterns, [](StringRef name) {
      return name == math::ExpOp::getOperationName() ||
             name == math::TanhOp::getOperationName() ||
             name == math::ErfOp::getOperationName();
    });
    if (failed(applyPatternsGreedily(*module, std::move(patterns))))
      return op.emitOpError("elementwise kernel '") << name << "': math approximation failed";
  }

  // The approximations are built from math.fma, math.floor and math.absf. The NVVM lowering
  // turns those into libdevice calls (__nv_fmaf, ...), which only resolve where a CUDA
  // toolkit's libdevice is found at compile time; as calls of LLVM's own intrinsics they
  // become single PTX instructions (fma.rn.f32, cvt.rmi.f32.f32, abs.f32) wherever it runs.
  module->walk([&](Operation *mathOp) {
    StringRef intrinsic =
        llvm::TypeSwitch<Operation *, StringRef>(mathOp)
            .Case([](math::FmaOp) { return "llvm.fma.f32"; })
            .Case([](math::FloorOp) { return "llvm.floor.f32"; })
            .Case([](math::AbsFOp) { return "llvm.fabs.f32"; })
            .Default([](Operation *) { return StringRef(); });
    if (intrinsic.empty() || !mathOp->getResult(0).getType().isF32())
      return;
    OpBuilder rewriter(mathOp);
    auto call = LLVM::CallIntrinsicOp::create(rewriter, mathOp->getLoc(),
                                              rewriter.getF32Type(),
                                              rewriter.getStringAttr(intrinsic),
                                              mathOp->getOperands());
    mathOp->replaceAllUsesWith(call);
    mathOp->erase();
  });

  PassManager pm(context);
  pm.addPass(createSCFToControlFlowPass());
  ConvertGpuOpsToNVVMOpsOptions nvvm;
  // One pointer per buffer rather than a memref descriptor: the runtime passes raw pointers.
  nvvm.useBarePtrCallConv = true;
  // 32-bit indices when every index fits with room for the grid stride (the runtime launches
  // at most a few thousand blocks of 256): a broadcast input's `i mod size` is then one 32-bit
  // multiply-high instead of an emulated 64-bit one, and the address arithmetic halves.
  if (getIterationElements(op) <= (int64_t(1) << 30))
    nvvm.indexBitwidth = 32;
  pm.addNestedPass<gpu::GPUModuleOp>(createConvertGpuOpsToNVVMOps(nvvm));
  pm.addPass(createReconcileUnrealizedCastsPass());
  GpuModuleToBinaryPassOptions binary;
  // PTX text ("isa"): LLVM's NVPTX backend alone, no ptxas; the driver JIT-compiles it.
  binary.compilationTarget = "isa";
  pm.addPass(createGpuModuleToBinaryPass(binary));
  std::string diagnostics;
  LogicalResult compiled = failure();
  {
    // Upstream diagnostics name internal steps; collect them into one error on the op.
    ScopedDiagnosticHandler handler(context, [&](Diagnostic &diag) {
      diagnostics += "\n  " + diag.str();
      return success();
    });
    compiled = pm.run(*module);
  }
  if (failed(compiled))
    return op.emitOpError("elementwise kernel '")
           << name << "' for " << arch << " could not be compiled to PTX:" << diagnostics;
  for (auto binaryOp : module->getBody()->getOps<gpu::BinaryOp>())
    for (Attribute object : binaryOp.getObjects())
      if (auto gpuObject = dyn_cast<gpu::ObjectAttr>(object)) {
        StringRef ptx = gpuObject.getObject().getValue();
        // The plan's PTX is loaded alone: a call to anything outside it cannot resolve.
        if (ptx.contains(".extern"))
          return op.emitOpError("elementwise kernel '")
                 << name << "': its PTX calls external functions (libdevice?)";
        return ptx.str();
      }
  return op.emitOpError("elementwise kernel '") << name << "': the GPU pipeline produced no PTX";
}
