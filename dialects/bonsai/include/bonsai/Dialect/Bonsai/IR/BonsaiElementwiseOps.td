//===- BonsaiElementwiseOps.td - Fused elementwise regions ---*- tablegen -*-===//
//
// The op bonsai-fuse's `elementwise` family forms from chains of ops implementing
// ElementwiseOpInterface: one kernel whose body is the chain's scalar computation, compiled to
// PTX for GPUs and to a portable program for the CPU (docs/fusion.md).
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_BONSAIELEMENTWISEOPS_TD
#define BONSAI_DIALECT_BONSAI_IR_BONSAIELEMENTWISEOPS_TD


def Bonsai_FusedElementwiseOp : Bonsai_Op<"fused_elementwise", [Pure, IsolatedFromAbove,
    SingleBlock, DeclareOpInterfaceMethods<Bonsai_CostOpInterface>,
    DeclareOpInterfaceMethods<Bonsai_KernelOpInterface, ["getKernelParams"]>]> {
  let summary = "a chain of elementwise ops computed by one generated kernel";
  let description = [{
    Every result has the same shape (the iteration space); an input has that shape or a
    trailing part of it (after leading 1s), and is then read at the element index modulo its
    size (a bias, GPT-2's position embeddings). The region computes one element: its block
    arguments are the inputs' elements (their element types), its body scalar `arith` and
    `math` ops, and `bonsai.yield` gives the results' elements (their element types).

    `bonsai-generate-elementwise-kernels` compiles the body and records the result in the
    op: `generated_kernel` (the kernel's name), `program` (the portable program the CPU
    backend interprets, encoded as in include/bonsai/Conversion/ElementwiseKernels.h) and,
    for a GPU target, `ptx` and `arch`. Lowering to a plan passes them to the
    `fused_elementwise` launch.

    ```mlir
    %r = bonsai.fused_elementwise ins(%x, %b : tensor<2x64xbf16>, tensor<64xbf16>) {
    ^bb0(%a: bf16, %c: bf16):
      %0 = arith.extf %a : bf16 to f32
      %1 = arith.extf %c : bf16 to f32
      %2 = arith.addf %0, %1 : f32
      %3 = arith.truncf %2 : f32 to bf16
      bonsai.yield %3 : bf16
    } -> tensor<2x64xbf16>
    ```
  }];
  let arguments = (ins Variadic<Bonsai_ComputeTensor>:$inputs,
                   OptionalAttr<StrAttr>:$generated_kernel,
                   OptionalAttr<DenseI32ArrayAttr>:$program,
                   OptionalAttr<StrAttr>:$ptx,
                   OptionalAttr<StrAttr>:$arch);
  let results = (outs Variadic<Bonsai_ComputeTensor>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    `ins` `(` ($inputs^ `:` type($inputs))? `)` attr-dict-with-keyword $body `->` type($results)
  }];
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    /// The shape every result has.
    ::llvm::ArrayRef<int64_t> getIterationShape();
  }];
}

def Bonsai_YieldOp : Bonsai_Op<"yield", [Pure, Terminator,
    HasParent<"FusedElementwiseOp">]> {
  let summary = "the result elements of a fused elementwise region";
  let description = [{
    ```mlir
    bonsai.yield %y : bf16
    ```
  }];
  let arguments = (ins Variadic<AnyType>:$values);
  let assemblyFormat = "($values^ `:` type($values))? attr-dict";
}

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAIELEMENTWISEOPS_TD
