//===- Fused.cu - The fused LM head (linear_cross_entropy) on CUDA ---------===//
//
// linear_cross_entropy (docs/fusion.md): the LM head, its mean cross-entropy and their
// gradients, chunk by chunk of positions, so that only one chunk of logits exists (in the
// planned workspace). The count of labels is taken over the whole batch first (the mean's
// denominator; bad labels are recorded in ctx.deviceError as cross_entropy records them).
// Then per chunk of n rows:
//
//   logits[n, V] = x_c · Wᵀ                 cuBLASLt, rounded into W's dtype (the workspace)
//   loss_r, dlogits (in place)              one block (or warp) per row: an online softmax
//                                           (the row read once), then the gradient written
//                                           over the row, as cross_entropy_grad writes it
//   dx_c = dlogits · W                      cuBLASLt, straight into dx's rows
//   dW (+)= dlogitsᵀ · x_c                  cuBLASLt with beta = 1 after the first chunk, in
//                                           fp32: dW itself when f32, else the workspace's
//                                           accumulator, rounded once into dW at the end
//
// and finally one block sums the rows' losses in fp64 in a fixed order. Every GEMM and sum
// has an order fixed by the shapes, so results are the same run to run. A vocabulary that is
// not a multiple of 16 bytes of elements (GPT-2's 50257) is padded in the planned workspace:
// W is copied once per call into rows of the padded length with zero rows below, the logits
// chunk has padded rows, and dW accumulates over the padded rows; so cuBLASLt runs every GEMM
// on aligned operands, without LtEngine's per-GEMM padded copies (GemmImpl.h) of W and of
// the chunk.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"
#include "bonsai/runtime/Fusion.h"

#include "CudaCheck.h"
#include "DeviceUtil.cuh"
#include "GemmImpl.h"

#include <algorithm>
#include <string>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {

/// The label of `row` when it counts (not ignored, in range), else -1; records a bad label.
__device__ __forceinline__ int64_t countedLabel(const void *labels, bool wide, int64_t row,
                                                int64_t vocab, int64_t ignoreIndex,
                                                DeviceError *error, int32_t kernelIndex) {
  int64_t label = loadIndexAt(labels, wide, row);
  if (label == ignoreIndex)
    return -1;
  if (label < 0 || label >= vocab) {
    if (error)
      recordError(error, kernelIndex, kLabelOutOfRange, row, label);
    return -1;
  }
  return label;
}

/// One chunk's rows: nll[row] (-inf for rows that do not count) and the logits overwritten by
/// dloss · (softmax - onehot) / count (0 for rows that do not count, and everywhere when no
/// row counts).
template <typename T, int VW>
__global__ void chunkLossGradKernel(T *logits, int64_t stride, const void *labels, bool wide,
                                    int64_t first, int64_t n, int64_t vocab, int64_t ignoreIndex,
                                    const void *dloss, DType dlossType, const int64_t *count,
                                    float *nll) {
  __shared__ float scratch[64];
  int64_t i = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (i >= n)
    return;
  // Columns [vocab, stride) are the padding: zeros from the GEMM, left as they are.
  T *row = logits + i * stride;
  int64_t label = countedLabel(labels, wide, first + i, vocab, ignoreIndex, nullptr, 0);
  const int64_t total = *count;
  if (label < 0 || total == 0) {
    // Uniform across the row's threads: no barrier is skipped by some and not others.
    forRow<VW>(row, vocab, threadIdx.x, blockDim.x, [&](int64_t c, auto width) {
      constexpr int N = decltype(width)::value;
      float z[N] = {};
      storeF<N>(row + c, z);
    });
    if (threadIdx.x == 0)
      nll[first + i] = -__builtin_huge_valf();
    return;
  }
  SoftmaxState st;
  forRow<VW>(row, vocab, threadIdx.x, blockDim.x, [&](int64_t c, auto width) {
    constexpr int N = decltype(width)::value;
    float v[N];
    loadF<N>(row + c, v);
    softmaxAccumulate(st, v);
  });
  st = rowSoftmaxReduce(st, scratch);
  // Every thread has read the logit at the label before any thread overwrites the row.
  const float picked = toFloat(row[label]);
  __syncthreads();
  if (threadIdx.x == 0)
    nll[first + i] = (st.m + log2f(st.s)) * 0.6931471805599453f - picked;
  const float scale = float(double(loadScalar(dloss, dlossType)) / double(total));
  const float inv = 1.0f / st.s;
  forRow<VW>(row, vocab, threadIdx.x, blockDim.x, [&](int64_t c, auto width) {
    constexpr int N = decltype(width)::value;
    float v[N];
    loadF<N>(row + c, v);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      float p = exp2f(fmaf(v[e], kLog2e, -st.m)) * inv;
      v[e] = scale * (p - (c + e == label ? 1.0f : 0.0f));
    }
    storeF<N>(row + c, v);
  });
}

} // namespace

void linearCrossEntropy(const Context &ctx, const TensorView &x, const TensorView &w,
                        const TensorView &labels, const TensorView &dloss, int64_t ignoreIndex,
                        int64_t chunkRows, const TensorView &loss, const TensorView &dx,
                        const TensorView &workspace, const TensorView *dw) {
  const char *k = "linear_cross_entropy";
  checkFloat(k, "x", x);
  checkFloat(k, "w", w);
  checkIndex(k, "labels", labels);
  checkFloat(k, "dloss", dloss);
  checkFloat(k, "loss", loss);
  checkFloat(k, "dx", dx);
  checkFloat(k, "workspace", workspace);
  if (x.rank() < 1 || w.rank() != 2 || w.dim(1) != x.dim(-1) || w.dtype != x.dtype)
    fail(k, "w shape " + formatShape(w.shape) + " should be [vocab, " +
                std::to_string(x.rank() ? x.dim(-1) : 0) + "] of x's dtype for x shape " +
                formatShape(x.shape));
  checkShape(k, "labels", labels, std::vector<int64_t>(x.shape.begin(), x.shape.end() - 1),
             "for x shape " + formatShape(x.shape));
  checkSameShape(k, "dx", dx, "x", x);
  if (dx.dtype != x.dtype)
    fail(k, "dx must have x's dtype");
  if (dloss.numel() != 1 || loss.numel() != 1)
    fail(k, "dloss and loss must be scalars");
  if (dw) {
    checkFloat(k, "dw", *dw);
    checkSameShape(k, "dw", *dw, "w", w);
  }
  if (chunkRows <= 0)
    fail(k, "chunk_rows must be positive, got " + std::to_string(chunkRows));
  if (!ctx.gemm)
    fail(k, "the context has no GemmEngine");
  const int64_t vocab = w.dim(0), hidden = w.dim(1), rows = labels.numel();
  const int64_t elementBytes = int64_t(dtypeSize(x.dtype));
  LinearCrossEntropyWorkspace layout =
      linearCrossEntropyWorkspace(rows, vocab, hidden, chunkRows, elementBytes, dw != nullptr);
  if (workspace.dtype != DType::F32 || workspace.numel() != layout.total)
    fail(k, "workspace must be " + std::to_string(layout.total) + " f32 elements, got " +
                formatShape(workspace.shape));
  float *ws = static_cast<float *>(workspace.data);
  void *logits = ws + layout.logits;
  float *nll = ws + layout.losses;
  auto *count = reinterpret_cast<int64_t *>(ws + layout.counter);
  const bool wide = labels.dtype == DType::I64;
  const int64_t paddedVocab = layout.paddedVocab;
  const bool padded = paddedVocab != vocab;

  countLabels(k, ctx.stream, labels.data, wide, rows, vocab, ignoreIndex, count, ctx.deviceError,
              ctx.kernelIndex);

  // Every GEMM runs with the vocabulary padded to a multiple of 16 bytes (cuBLASLt's fast
  // kernels want it): on W's rows copied once into the workspace, zeros below them, so that
  // the padded logits are exact zeros and add nothing to dx or dW.
  const void *wp = w.data;
  if (padded) {
    wp = ws + layout.weight;
    copyMatrices(k, ctx.stream, w.dtype, MatrixSpan{w.data, vocab, hidden, hidden, 0},
                 MatrixSpan{wp, paddedVocab, hidden, hidden, 0}, 1);
  }
  LtEngine &engine = ltEngineOf(k, *ctx.gemm);
  // dW accumulates in fp32 over [paddedVocab, hidden]: in dw itself when it is f32 and
  // unpadded, else in the workspace; its first vocab rows are dW.
  TensorView accumulator;
  if (dw) {
    accumulator = *dw;
    if (dw->dtype != DType::F32 || padded) {
      accumulator.dtype = DType::F32;
      accumulator.data = ws + layout.accumulator;
    }
  }
  const int64_t chunk = std::min(rows, chunkRows);
  const char *xBytes = static_cast<const char *>(x.data);
  char *dxBytes = static_cast<char *>(dx.data);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    const void *xc = xBytes + r0 * hidden * elementBytes;
    // logits = x_c wᵀ, in W's dtype.
    GemmCall forward;
    forward.abType = forward.cType = x.dtype;
    forward.transB = true;
    forward.m = n;
    forward.n = paddedVocab;
    forward.k = hidden;
    forward.a = xc;
    forward.b = wp;
    forward.c = logits;
    engine.run(k, ctx.stream, forward);

    dispatchFloat(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      auto lp = static_cast<T *>(logits);
      // Rows start on 16-byte boundaries (paddedVocab elements apart); forRow peels the
      // unaligned head of a row should the workspace itself not be aligned.
      int tpr = threadsPerRow(vocab, kVec<T>);
      dim3 block = tpr == 32 ? dim3(32, 8) : dim3(unsigned(tpr), 1);
      unsigned grid = unsigned(tpr == 32 ? (n + 7) / 8 : n);
      chunkLossGradKernel<T, kVec<T>>
          <<<grid, block, 0, ctx.stream>>>(lp, paddedVocab, labels.data, wide, r0, n, vocab,
                                           ignoreIndex, dloss.data, dloss.dtype, count, nll);
      checkLaunch(k, "chunkLossGradKernel");
    });

    // dx_c = dlogits w.
    GemmCall input;
    input.abType = input.cType = x.dtype;
    input.m = n;
    input.n = hidden;
    input.k = paddedVocab;
    input.a = logits;
    input.b = wp;
    input.c = dxBytes + r0 * hidden * elementBytes;
    engine.run(k, ctx.stream, input);

    if (dw) {
      // dW (+)= dlogitsᵀ x_c, in fp32.
      GemmCall weight;
      weight.abType = x.dtype;
      weight.cType = DType::F32;
      weight.transA = true;
      weight.m = paddedVocab;
      weight.n = hidden;
      weight.k = n;
      weight.beta = r0 == 0 ? 0.0f : 1.0f;
      weight.a = logits;
      weight.b = xc;
      weight.c = accumulator.data;
      engine.run(k, ctx.stream, weight);
    }
  }
  if (rows == 0 && dw)
    checkCuda(cudaMemsetAsync(accumulator.data, 0, size_t(vocab * hidden) * 4, ctx.stream),
              "cudaMemsetAsync", k);
  if (dw && accumulator.data != dw->data) {
    // The first vocab rows of the row-major [paddedVocab, hidden] accumulator.
    TensorView rowsOfW = accumulator;
    rowsOfW.shape = dw->shape;
    castOnDevice(k, ctx.stream, rowsOfW, *dw);
  }
  meanOfCountedRows(k, ctx.stream, nll, rows, loss);
}

} // namespace bonsai::rt::cuda
