//===- BonsaiCollectiveOps.td - collectives over data-parallel ranks -*- tablegen -*-===//
//
// The ops bonsai-shard inserts (docs/sharding.md): every rank runs the same step on its own
// micro-batches, and these ops exchange parameters, gradients and the gradient norm between
// the ranks. Shards are flat: one rank's contiguous share of the row-major elements of a
// tensor (#bonsai.sharding). Every rank must run the same collectives in the same order, so
// they are never removed, merged or reordered by a generic pass: they read and write memory.
// The one exception is bonsai-remat gathering a parameter's share again in the backward pass
// (all_gather's RecomputeOpInterface): every rank compiles the same step, so every rank's plan
// has the same clones in the same places.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_BONSAICOLLECTIVEOPS_TD
#define BONSAI_DIALECT_BONSAI_IR_BONSAICOLLECTIVEOPS_TD

class Bonsai_CollectiveOp<string mnemonic, list<string> kernelOverrides = [],
                          list<Trait> traits = []>
    : Bonsai_Op<mnemonic, !listconcat([MemoryEffects<[MemRead, MemWrite]>,
          DeclareOpInterfaceMethods<Bonsai_CostOpInterface>,
          DeclareOpInterfaceMethods<Bonsai_KernelOpInterface, kernelOverrides>], traits)> {
  let hasVerifier = 1;
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
}

def Bonsai_ShardSliceOp : Bonsai_CollectiveOp<"shard_slice"> {
  let summary = "this rank's flat share of a whole tensor (a local copy)";
  let description = [{
    ZeRO-1 and ZeRO-2 keep each parameter whole on every rank and update only this rank's
    share of it: the share is copied out before the update, which then updates it in place.

    ```mlir
    %ws = bonsai.shard_slice %w {ranks = 2 : i64} : (tensor<64x64xf32>) -> tensor<2048xf32>
    ```
  }];
  let arguments = (ins Bonsai_Tensor:$full, I64Attr:$ranks);
  let results = (outs Bonsai_Tensor:$shard);
}

def Bonsai_ReduceScatterOp : Bonsai_CollectiveOp<"reduce_scatter", [],
    [Bonsai_LinkOpInterface]> {
  let summary = "the sum over ranks of a tensor, each rank keeping its flat share";
  let description = [{
    A weight gradient summed over the ranks' micro-batches, of which each rank keeps the
    share it updates.

    ```mlir
    %gs = bonsai.reduce_scatter %dw {ranks = 2 : i64} : (tensor<64x64xf32>) -> tensor<2048xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$full, I64Attr:$ranks);
  let results = (outs Bonsai_ComputeTensor:$shard);
}

def Bonsai_AllGatherOp : Bonsai_CollectiveOp<"all_gather", [],
    [Bonsai_LinkOpInterface,
     DeclareOpInterfaceMethods<Bonsai_RecomputeOpInterface, ["isAlwaysRecomputed"]>]> {
  let summary = "every rank's flat share, concatenated in rank order into the whole tensor";
  let description = [{
    ZeRO-3: a parameter stored as shards, gathered whole before its uses in the forward pass
    and again before those in the backward pass; the gathered tensor lives until its last use.
    What the backward pass computes from a gathered parameter without reading the parameter
    itself (a dequantized NF4 weight, which bonsai-remat dequantizes again) is gathered again
    too: a gather of a parameter's share is always recomputed (RecomputeOpInterface), unless
    `kept` (reshard_after_forward false), when the forward pass's gather serves both passes.

    ```mlir
    %w = bonsai.all_gather %ws {ranks = 2 : i64} : (tensor<2048xf32>) -> tensor<64x64xf32>
    ```
  }];
  let arguments = (ins Bonsai_Tensor:$shard, I64Attr:$ranks, UnitAttr:$kept);
  let results = (outs Bonsai_Tensor:$full);
}

def Bonsai_AllGatherIntoOp : Bonsai_CollectiveOp<"all_gather_into",
    ["getKernelName", "getInPlaceOperands"], [Bonsai_LinkOpInterface]> {
  let summary = "every rank's flat share, gathered in place into a whole tensor";
  let description = [{
    ZeRO-1 and ZeRO-2: the updated shares of a parameter kept whole on every rank, written
    back into it after the update. The runtime kernel is `all_gather`.

    ```mlir
    bonsai.all_gather_into %ws, %w {ranks = 2 : i64} : (tensor<2048xf32>, tensor<64x64xf32>) -> ()
    ```
  }];
  let arguments = (ins Bonsai_Tensor:$shard, Bonsai_Tensor:$full, I64Attr:$ranks);
}

def Bonsai_AllReduceOp : Bonsai_CollectiveOp<"all_reduce", ["getKernelParams"],
    [DeclareOpInterfaceMethods<Bonsai_LinkOpInterface, ["getWholeTensor", "getLinkPasses"]>]> {
  let summary = "the ranks' values combined, every rank keeping the result";
  let description = [{
    `reduction` is `sum` (the sum over ranks), `l2` (the square root of the sum of the
    squares, f32: the global gradient norm from each rank's norm of its gradient shares) or
    `max` (the largest, f32: FP8's amax statistics, the same on every rank so that the ranks'
    delayed scales stay equal).

    ```mlir
    %norm = bonsai.all_reduce %local {ranks = 2 : i64, reduction = "l2"} : (tensor<f32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$input, I64Attr:$ranks,
                   DefaultValuedStrAttr<StrAttr, "sum">:$reduction);
  let results = (outs Bonsai_ComputeTensor:$result);
}

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAICOLLECTIVEOPS_TD
