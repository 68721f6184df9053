//===- BonsaiInterfaces.td - bonsai op interfaces ------------*- tablegen -*-===//
//
// Behaviour that passes ask ops about, instead of switching on op kinds: what an op costs, how
// to differentiate it, whether it opens a block of the network, and how a recipe directive
// checks itself against a model.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_BONSAIINTERFACES_TD
#define BONSAI_DIALECT_BONSAI_IR_BONSAIINTERFACES_TD

include "mlir/IR/OpBase.td"

def Bonsai_CostOpInterface : OpInterface<"CostOpInterface"> {
  let cppNamespace = "::mlir::bonsai";
  let description = [{
    The work an op does: FLOPs on tensor cores (GEMM-shaped work), other FLOPs (elementwise and
    reductions), and bytes read and written, assuming every operand is read from and every result
    written to device memory once. The cost report, the remat pass and the scheduler read it.
  }];
  let methods = [
    InterfaceMethod<"Cost of the forward computation.",
      "::mlir::bonsai::OpCost", "getForwardCost", (ins)>,
    InterfaceMethod<[{
        Cost of computing the gradients of the operands for which `needsGradient` holds, given
        the gradients of the results. The default counts twice the forward FLOPs and the
        forward bytes, the usual estimate when every operand needs a gradient.
      }],
      "::mlir::bonsai::OpCost", "getBackwardCost",
      (ins "::llvm::function_ref<bool(::mlir::Value)>":$needsGradient), [{}], [{
        ::mlir::bonsai::OpCost forward = $_op.getForwardCost();
        bool any = false;
        for (::mlir::Value operand : $_op->getOperands())
          any |= needsGradient(operand);
        if (!any)
          return {};
        return forward.scaled(2);
      }]>,
  ];
}

def Bonsai_GradientOpInterface : OpInterface<"GradientOpInterface"> {
  let cppNamespace = "::mlir::bonsai";
  let description = [{
    Reverse-mode differentiation of one op: given the gradients of its results, build the ops
    that compute the gradients of its operands. The autodiff pass walks the forward graph
    backwards and asks every op through this interface; an op without it cannot be
    differentiated, and the pass says so.
  }];
  let methods = [
    InterfaceMethod<[{
        Build the gradients of the operands. `resultGradients` has one value per result (null
        where the result does not influence the loss). On return `operandGradients` has one
        value per operand, null where the operand needs no gradient (see `needsGradient`).
      }],
      "::llvm::LogicalResult", "buildGradients",
      (ins "::mlir::OpBuilder &":$builder,
           "::mlir::ValueRange":$resultGradients,
           "::llvm::function_ref<bool(::mlir::Value)>":$needsGradient,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandGradients)>,
  ];
}

def Bonsai_NormalizationOpInterface : OpInterface<"NormalizationOpInterface"> {
  let cppNamespace = "::mlir::bonsai";
  let description = [{
    A normalisation that opens a block of the network: a pre-norm transformer normalises the
    residual stream at the start of each attention and MLP sublayer, and once more before the
    LM head. The value it normalises is the block's input. The remat pass asks this interface
    which values are block inputs: policy `full` keeps only those (and recomputes each block
    from its input in the backward pass), `selective` keeps them as well as GEMM outputs.
  }];
  let methods = [
    InterfaceMethod<[{
        The value normalised: the residual stream entering the block. The default is the op's
        `input` operand.
      }],
      "::mlir::Value", "getNormalizedInput", (ins), [{}], [{
        return $_op.getInput();
      }]>,
    InterfaceMethod<[{
        Builds, at the builder's insertion point, the fused kernel that adds `lhs` and `rhs`
        (the residual stream and a sublayer's output, same type) and normalises the sum with
        this op's parameters. The fused op's results are the sum (the residual stream, for
        every later reader) and the normalised value, in that order. bonsai-fuse's
        `residual-norm` family asks this; null means the normalisation has no fused variant.
      }],
      "::mlir::Operation *", "buildWithResidualAdd",
      (ins "::mlir::OpBuilder &":$builder, "::mlir::Value":$lhs, "::mlir::Value":$rhs),
      [{}], [{
        return nullptr;
      }]>,
  ];
}

def Bonsai_NormalizationGradOpInterface : OpInterface<"NormalizationGradOpInterface"> {
  let cppNamespace = "::mlir::bonsai";
  let description = [{
    The gradient of a normalisation. Autodiff sums the gradients that reach the residual
    stream with `bonsai.add`; the norm's input gradient is nearly always one of the addends.
    bonsai-fuse's `residual-norm` family asks this interface for the input gradient and for
    the variant of the kernel that adds a given tensor into it as it writes it.
  }];
  let methods = [
    InterfaceMethod<"The result holding the gradient of the normalised input.",
      "::mlir::Value", "getNormalizedInputGrad", (ins), [{}], [{
        return $_op.getInputGrad();
      }]>,
    InterfaceMethod<[{
        Builds, at the builder's insertion point, the fused kernel computing this op's
        gradients with `addend` (the type of the input gradient) added into the input
        gradient. Its results correspond one to one to this op's. Null when there is none.
      }],
      "::mlir::Operation *", "buildWithAddend",
      (ins "::mlir::OpBuilder &":$builder, "::mlir::Value":$addend), [{}], [{
        return nullptr;
      }]>,
  ];
}

def Bonsai_RecomputeOpInterface : OpInterface<"RecomputeOpInterface"> {
  let cppNamespace = "::mlir::bonsai";
  let description = [{
    An op whose results the backward pass recomputes instead of keeping, whatever the remat
    policy: they are cheap to compute from persistent state and large to keep. A dequantized
    NF4 weight is the example: kept from forward to backward, the bf16 weights of every layer
    would be alive at once (the whole model in bf16); dequantized again before the backward
    GEMM, one layer's weight is alive at a time. bonsai-remat asks this interface.
  }];
  let methods = [
    InterfaceMethod<"Whether bonsai-remat must recompute this op's results for the backward "
                    "pass rather than keep them.",
      "bool", "isAlwaysRecomputed", (ins), [{}], [{
        return true;
      }]>,
  ];
}

def Bonsai_LinkOpInterface : OpInterface<"LinkOpInterface"> {
  let cppNamespace = "::mlir::bonsai";
  let description = [{
    A collective whose bytes cross the link between the ranks: over N ranks each rank sends
    and receives (N - 1) / N of the whole tensor, once per pass (an all-reduce makes two: a
    reduce-scatter and an all-gather). The step-time estimate asks this interface. (A local
    copy of a rank's share, `bonsai.shard_slice`, crosses nothing and does not implement it.)
  }];
  let methods = [
    InterfaceMethod<"The ranks the collective spans.",
      "int64_t", "getLinkRanks", (ins), [{}], [{
        return $_op.getRanks();
      }]>,
    InterfaceMethod<"The whole tensor, of which each rank sends and receives its part.",
      "::mlir::Value", "getWholeTensor", (ins), [{}], [{
        return $_op.getFull();
      }]>,
    InterfaceMethod<"How many times the whole tensor's share crosses the link.",
      "unsigned", "getLinkPasses", (ins), [{}], [{
        return 1;
      }]>,
  ];
}

def Bonsai_RecipeDirectiveOpInterface : OpInterface<"RecipeDirectiveOpInterface"> {
  let cppNamespace = "::mlir::bonsai";
  let description = [{
    A directive of a `bonsai.recipe`. Each directive checks itself against the model the recipe
    applies to (for example: LoRA targets must name linears of the model, a GaLore rank must be
    smaller than the matrices it projects).
  }];
  let methods = [
    InterfaceMethod<[{
        Check the directive against `model`, the summary of the function the recipe applies to.
        Emits an error naming the problem and fails if the directive cannot apply.
      }],
      "::llvm::LogicalResult", "verifyAgainstModel",
      (ins "const ::mlir::bonsai::ModelSummary &":$model)>,
    InterfaceMethod<[{
        Name-patterns of the weights this directive applies to (empty if it applies to the whole
        model). Used to diagnose contradictory directives.
      }],
      "::llvm::SmallVector<::llvm::StringRef>", "getTargetPatterns", (ins), [{}], [{
        return {};
      }]>,
  ];
}

def Bonsai_KernelOpInterface : OpInterface<"KernelOpInterface"> {
  let cppNamespace = "::mlir::bonsai";
  let description = [{
    An op that the runtime executes as one kernel. Lowering to `bonsai_plan` asks it for the
    kernel's name and its parameters, with every default made explicit so that the plan does
    not depend on ODS defaults.
  }];
  let methods = [
    InterfaceMethod<"The runtime kernel's name (by default the op's name without dialect).",
      "::llvm::StringRef", "getKernelName", (ins), [{}], [{
        return $_op->getName().stripDialect();
      }]>,
    InterfaceMethod<[{
        The kernel's parameters (epsilon, scale, axis, ...). The default returns the op's
        attributes as set; ops with defaulted attributes return them explicitly.
      }],
      "::mlir::DictionaryAttr", "getKernelParams", (ins), [{}], [{
        return $_op->getAttrDictionary();
      }]>,
    InterfaceMethod<[{
        Operands the kernel reads and updates in place (optimizer updates, accumulation). The
        lowering passes them to the launch as outputs; the others are its inputs.
      }],
      "::llvm::SmallVector<unsigned>", "getInPlaceOperands", (ins), [{}], [{
        return {};
      }]>,
    InterfaceMethod<[{
        Results that are the kernel's scratch (nothing reads them afterwards): the lowering
        declares them as workspace buffers, which the memory planner sizes like any other.
      }],
      "::llvm::SmallVector<unsigned>", "getWorkspaceResults", (ins), [{}], [{
        return {};
      }]>,
    InterfaceMethod<[{
        Whether the kernel's results live in pinned host memory (a copy staged for an update
        that runs on the host): the lowering declares them in a pinned host step arena.
      }],
      "bool", "hasHostResults", (ins), [{}], [{
        return false;
      }]>,
  ];
}

def Bonsai_MultiTensorUpdateOpInterface : OpInterface<"MultiTensorUpdateOpInterface"> {
  let cppNamespace = "::mlir::bonsai";
  let description = [{
    An optimizer update of one parameter that can run, together with the updates of other
    parameters, as one multi-tensor kernel (bonsai-fuse, family `optimizer`). Updates group
    when they are the same op with the same hyper-parameters, read the same shared (scalar)
    operands, and store their tensors in the same element types: then the multi-tensor op
    applies the same per-element formula to each of them.
  }];
  let methods = [
    InterfaceMethod<"The scalar operands every parameter's update reads (step, learning rate, "
                    "gradient norm), in operand order.",
      "::llvm::SmallVector<::mlir::Value>", "getSharedOperands", (ins)>,
    InterfaceMethod<"The per-parameter operands (gradient, parameter, optimizer state, master "
                    "copy when there is one), in operand order.",
      "::llvm::SmallVector<::mlir::Value>", "getTensorOperands", (ins)>,
    InterfaceMethod<"The hyper-parameters, which must be equal for updates to group.",
      "::mlir::DictionaryAttr", "getHyperParameters", (ins)>,
    InterfaceMethod<[{
        Builds at the builder's insertion point the multi-tensor op that applies every update
        of `updates` (ops of this op's kind that group with it, this op among them), in their
        order. The caller erases the updates.
      }],
      "::mlir::Operation *", "buildMultiTensorUpdate",
      (ins "::mlir::OpBuilder &":$builder, "::llvm::ArrayRef<::mlir::Operation *>":$updates)>,
  ];
}

def Bonsai_OptimizerStateOpInterface : OpInterface<"OptimizerStateOpInterface"> {
  let cppNamespace = "::mlir::bonsai";
  let description = [{
    An optimizer update that reads and writes per-parameter training state in place. It says
    which of its operands hold which class of that state: the optimizer's own state (the
    moments, the momentum buffer: what the update carries from one step to the next) and the
    fp32 master copies of parameters stored in bf16 or f16. bonsai-offload asks this
    interface to find the tensors a `bonsai.offload` class names; it never matches names.
  }];
  let methods = [
    InterfaceMethod<[{
        Indices of the operands that hold the optimizer's own state and that the update reads
        and writes. Empty when the update keeps none (SGD without momentum, whose buffer is
        neither read nor needed).
      }],
      "::llvm::SmallVector<unsigned>", "getOptimizerStateOperands", (ins)>,
    InterfaceMethod<"Indices of the operands that hold fp32 master copies (none for "
                    "parameters stored in f32).",
      "::llvm::SmallVector<unsigned>", "getMasterWeightOperands", (ins)>,
    InterfaceMethod<[{
        The index of the parameter operand when the update has a host implementation that
        computes the GPU kernel's bits (runtime/include/bonsai/runtime/HostOptimizer.h), so
        that it may run on the CPU over pinned host memory (`bonsai.offload ... update
        "host"`, docs/offload.md); none otherwise.
      }],
      "::std::optional<unsigned>", "getHostStepParamOperand", (ins), [{}], [{
        return std::nullopt;
      }]>,
  ];
}

def Bonsai_AccumulatingProducerOpInterface : OpInterface<"AccumulatingProducerOpInterface"> {
  let cppNamespace = "::mlir::bonsai";
  let description = [{
    An op whose first result can be added into an accumulator by the op itself, without
    materialising the result: a GEMM whose epilogue computes acc = 1 · acc + A · B. The
    `gemm-epilogue` fusion family replaces `bonsai.accumulate(producer, acc)` by the op
    `buildAccumulating` returns. The op's other results (an FP8 GEMM's statistics and
    workspace) are the built op's results, in the same order.
  }];
  let methods = [
    InterfaceMethod<"Whether the op can add its result into `accumulator` (of the result's "
                    "shape; its element type decides).",
      "bool", "canAccumulateInto", (ins "::mlir::Value":$accumulator)>,
    InterfaceMethod<[{
        Builds at the builder's insertion point the op computing accumulator += this op's
        first result, in place, whose results stand for this op's other results; the caller
        replaces those, then erases this op and the accumulation.
      }],
      "::mlir::Operation *", "buildAccumulating",
      (ins "::mlir::OpBuilder &":$builder, "::mlir::Value":$accumulator)>,
  ];
}

def Bonsai_ElementwiseOpInterface : OpInterface<"ElementwiseOpInterface"> {
  let cppNamespace = "::mlir::bonsai";
  let description = [{
    An op whose every result element depends only on the operand elements at the same
    position (operands of a smaller shape broadcast over the trailing dimensions, where the op
    allows it). It describes one element of its computation as scalar `arith` and `math` ops,
    from which bonsai-fuse's `elementwise` family builds the bodies of
    `bonsai.fused_elementwise` regions, and code generation builds GPU kernels and the CPU
    programs (docs/fusion.md). The fusion family asks this interface; it never names an op.
  }];
  let methods = [
    InterfaceMethod<[{
        Build the scalar computation of one element at the builder's insertion point.
        `operands` holds one scalar per operand, of the operand's element type (bf16, f16 or
        f32); on success `results` holds one scalar per result, of the result's element type.
        The computation is carried out in f32 and rounded once to each result's element type,
        as the op's own kernel stores its result. Fails (building nothing) when an element
        type has no scalar form here (FP8).
      }],
      "::llvm::LogicalResult", "buildScalarComputation",
      (ins "::mlir::OpBuilder &":$builder, "::mlir::Location":$loc,
           "::mlir::ValueRange":$operands,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$results)>,
  ];
}

def Bonsai_TokenwiseOpInterface : OpInterface<"TokenwiseOpInterface"> {
  let cppNamespace = "::mlir::bonsai";
  let description = [{
    An op that computes each token's results from that token's operands alone: given values
    over the rows' tokens ([batch, seq, ...]) it computes any share of the tokens from the same
    share of its operands. bonsai-ring splits the sequence over ranks through such ops
    (docs/ring-attention.md) and asks each instance why it cannot (an axis argument on the
    sequence, a weight that varies by token), naming the reason in its error; an op without
    the interface is refused. Elementwise ops (ElementwiseOpInterface) qualify by their
    broadcast, which the pass checks; attention, which mixes tokens, is what the pass rewrites.
  }];
  let methods = [
    InterfaceMethod<[{
        Why this instance cannot compute a share of the tokens from the same share of its
        operands (empty when it can). `overTokens(i)` says whether operand i is a value over
        the tokens, split with them; the others are read whole by every share. bonsai-ring
        asks with those operands already cut to a share and the results not yet: an answer
        compares no sequence lengths across them.
      }],
      "std::string", "whyNotTokenwise",
      (ins "::llvm::function_ref<bool(unsigned)>":$overTokens), [{}],
      /*defaultImplementation=*/[{ return ""; }]>,
  ];
}

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAIINTERFACES_TD
