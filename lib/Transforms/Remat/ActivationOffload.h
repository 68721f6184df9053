//===- ActivationOffload.h - Saved activations kept in host memory -*- C++ -*-===//
//
// Private to lib/Transforms: the third choice of bonsai-remat for a saved activation, next to
// keeping it on the device and recomputing it: keeping it in pinned host memory between the
// forward and the backward pass (docs/remat.md, "Offloading activations"). bonsai-remat
// chooses on the unfused graph; bonsai-offload-activations places the copies after fusion.
// Ops are named by their position among the forward ops (collectForwardOps).
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_LIB_TRANSFORMS_REMAT_ACTIVATIONOFFLOAD_H
#define BONSAI_LIB_TRANSFORMS_REMAT_ACTIVATIONOFFLOAD_H

#include "RematGraph.h"

namespace mlir::bonsai::remat {

/// The forward ops whose results may be offloaded once `recompute` is applied: candidates
/// (pure, costed kernels read only by forward and backward ops) that own a buffer (not views),
/// are not recomputed, are read by a backward op or a clone (directly or through views), and
/// are in `materialized` (the fused plan gives them a buffer: a value fusion never writes out,
/// the LM head's logits under a fused loss, must not be forced out by a copy).
BitVector getOffloadable(const ForwardGraph &g, const BitVector &recompute,
                         const BitVector &materialized);

/// The function attribute through which bonsai-remat hands its choice to
/// bonsai-offload-activations, which runs after fusion (copies placed before fusion would
/// hide the patterns' operands from it): at most how many bytes of saved activations to
/// offload, those with the longest stay between the passes first.
constexpr StringLiteral kOffloadActivationsAttr = "bonsai.offload_activations";

} // namespace mlir::bonsai::remat

#endif // BONSAI_LIB_TRANSFORMS_REMAT_ACTIVATIONOFFLOAD_H
