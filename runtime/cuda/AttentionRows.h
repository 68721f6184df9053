//===- AttentionRows.h - The flash kernels on rows of their own -------------===//
//
// Private to runtime/cuda: Attention.cu's flash kernels with keys that are not the queries'
// own rows (another number of them, their own segment ids), what ring attention's block steps
// (RingAttention.cu) run on. The causal mask still needs as many keys as queries.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_CUDA_ATTENTIONROWS_H
#define BONSAI_RUNTIME_CUDA_ATTENTIONROWS_H

#include "bonsai/runtime/CudaKernels.h"

namespace bonsai::rt::cuda::detail {

/// flashAttention of q [B, Sq, H, D] against k, v [B, Sk, kvHeads, D]: o and lse [B, H, Sq].
/// Segment ids: [B, Sq] and [B, Sk], both or neither. Errors name `kernel`.
void attentionRows(const char *kernel, const Context &ctx, const TensorView &q, const TensorView &k,
                   const TensorView &v, bool causal, double scale, const TensorView &o,
                   const TensorView &lse, const TensorView *querySegments,
                   const TensorView *keySegments);

/// flashAttentionGrad of attentionRows from a given o and lse (a ring's final ones: the
/// gradient of the block's share of the whole softmax).
void attentionRowsGrad(const char *kernel, const Context &ctx, const TensorView &dout,
                       const TensorView &q, const TensorView &k, const TensorView &v,
                       const TensorView &o, const TensorView &lse, bool causal, double scale,
                       const TensorView &dq, const TensorView &dk, const TensorView &dv,
                       const TensorView *querySegments, const TensorView *keySegments);

} // namespace bonsai::rt::cuda::detail

#endif // BONSAI_RUNTIME_CUDA_ATTENTIONROWS_H
