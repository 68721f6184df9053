//===- GenerateElementwiseKernels.cpp - Compile fused elementwise regions -===//
//
// The `bonsai-generate-elementwise-kernels` pass (see Passes.td): every fused elementwise
// op gets its program and, for a GPU target, its PTX. Identical regions over identical shapes
// (the same chain in every layer) compile once and share a kernel name, which the plan
// emitter turns into one entry of the plan's generated kernels.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Conversion/ElementwiseKernels.h"
#include "bonsai/Conversion/Passes.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIGENERATEELEMENTWISEKERNELSPASS
#include "bonsai/Conversion/Passes.h.inc"

namespace {

/// What makes two fused ops the same kernel: the program and the sizes of the buffers.
std::string getKernelKey(FusedElementwiseOp op, DenseI32ArrayAttr program) {
  std::string key;
  llvm::raw_string_ostream os(key);
  os << program;
  for (Value value : op->getOperands())
    os << " " << cast<RankedTensorType>(value.getType()).getNumElements();
  os << " ->";
  for (Value value : op->getResults())
    os << " " << cast<RankedTensorType>(value.getType()).getNumElements();
  return key;
}

struct GenerateElementwiseKernelsPass
    : impl::BonsaiGenerateElementwiseKernelsPassBase<GenerateElementwiseKernelsPass> {
  using Base::Base;

  void getDependentDialects(DialectRegistry &registry) const override {
    registerElementwiseCodegenDialects(registry);
  }

  void runOnOperation() override {
    StringRef arch = target;
    bool gpu = arch.starts_with("sm_");
    if (!gpu && arch != "cpu") {
      getOperation().emitError() << "bonsai-generate-elementwise-kernels: target '" << arch
                                 << "' is neither cpu nor a GPU architecture sm_XX";
      return signalPassFailure();
    }
    struct Kernel {
      StringAttr name;
      StringAttr ptx;
    };
    llvm::StringMap<Kernel> kernels;
    WalkResult walk = getOperation().walk([&](FusedElementwiseOp op) {
      FailureOr<ElementwiseProgram> program = buildElementwiseProgram(op);
      if (failed(program))
        return WalkResult::interrupt();
      Builder b(op.getContext());
      DenseI32ArrayAttr encoded = program->encode(op.getContext());
      auto [it, inserted] = kernels.try_emplace(getKernelKey(op, encoded));
      if (inserted) {
        it->second.name = b.getStringAttr("fused_elementwise_" + Twine(kernels.size() - 1));
        ++numKernels;
        if (gpu) {
          FailureOr<std::string> ptx =
              generateElementwisePTX(op, it->second.name.getValue(), arch);
          if (failed(ptx))
            return WalkResult::interrupt();
          it->second.ptx = b.getStringAttr(*ptx);
          if (printPtx)
            llvm::outs() << "// PTX of " << it->second.name.getValue() << "\n" << *ptx << "\n";
        }
      }
      op.setGeneratedKernelAttr(it->second.name);
      op.setProgramAttr(encoded);
      if (gpu) {
        op.setPtxAttr(it->second.ptx);
        op.setArchAttr(b.getStringAttr(arch));
      } else {
        op.removePtxAttr();
        op.removeArchAttr();
      }
      return WalkResult::advance();
    });
    if (walk.wasInterrupted())
      signalPassFailure();
  }
};

} // namespace
} // namespace mlir::bonsai
