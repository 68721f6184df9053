//===- Loss.cu - cross_entropy and cross_entropy_grad on CUDA --------------===//
//
// The mean token cross-entropy (PyTorch's reduction="mean" with ignore_index) and its gradient.
// Each row (one position's logits over the vocabulary) is read once by one block (one warp for
// short rows) with 16-byte vector loads, computing its log-sum-exp by an online softmax (the
// running maximum and the rescaled sum in a single pass, merged across threads in a fixed
// order). The forward writes each row's loss to scratch and a single block then sums the rows
// in fp64 in a fixed order, so the loss is the same on every run. The gradient reads each row
// twice (the statistics, then the output), the second time from cache.
//
// Labels are validated on the device: a label outside [0, vocab) that is not ignore_index is
// recorded in ctx.deviceError (kLabelOutOfRange) and its row is treated as ignored, so nothing
// is read out of bounds; the executor then fails the step.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"

#include "CudaCheck.h"
#include "DeviceUtil.cuh"

#include <string>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {

/// The label of `row` when it counts (not ignored, in range), else -1; records a bad label.
__device__ __forceinline__ int64_t rowLabel(const void *labels, bool wide, int64_t row,
                                            int64_t vocab, int64_t ignoreIndex,
                                            DeviceError *error, int32_t kernelIndex,
                                            bool report) {
  int64_t label = loadIndexAt(labels, wide, row);
  if (label == ignoreIndex)
    return -1;
  if (label < 0 || label >= vocab) {
    if (report)
      recordError(error, kernelIndex, kLabelOutOfRange, row, label);
    return -1;
  }
  return label;
}

template <typename T, int VW>
__global__ void crossEntropyRowKernel(const T *logits, const void *labels, bool wide,
                                      int64_t rows, int64_t vocab, int64_t ignoreIndex,
                                      float *nll, DeviceError *error, int32_t kernelIndex) {
  __shared__ float scratch[64];
  int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows)
    return;
  int64_t label = rowLabel(labels, wide, row, vocab, ignoreIndex, error, kernelIndex,
                           threadIdx.x == 0);
  if (label < 0) {
    // Uniform across the row's threads: no barrier is skipped by some and not others.
    if (threadIdx.x == 0)
      nll[row] = -__builtin_huge_valf(); // not counted: no row's loss can be -inf
    return;
  }
  const T *xr = logits + row * vocab;
  SoftmaxState st;
  forRow<VW>(xr, vocab, threadIdx.x, blockDim.x, [&](int64_t i, auto width) {
    constexpr int N = decltype(width)::value;
    float v[N];
    loadF<N>(xr + i, v);
    softmaxAccumulate(st, v);
  });
  st = rowSoftmaxReduce(st, scratch);
  if (threadIdx.x == 0) {
    // log sum exp = (m + log2 s) ln 2 with m in log2 units.
    float lse = (st.m + log2f(st.s)) * 0.6931471805599453f;
    nll[row] = lse - toFloat(xr[label]);
  }
}

/// loss = mean of the counted rows' nll (NaN when none counts), summed in fp64 by one block:
/// thread t adds rows t, t + blockDim.x, ... in order, then the block combines in a fixed tree.
__global__ void crossEntropyMeanKernel(const float *nll, int64_t rows, void *loss,
                                       DType lossType) {
  __shared__ double sums[1024];
  __shared__ int64_t counts[1024];
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    float v = nll[r];
    // Ignored rows hold -inf; a NaN loss (NaN logits) still counts and propagates.
    if (v != -__builtin_huge_valf()) {
      sum += double(v);
      ++count;
    }
  }
  sums[threadIdx.x] = sum;
  counts[threadIdx.x] = count;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half) {
      sums[threadIdx.x] += sums[threadIdx.x + half];
      counts[threadIdx.x] += counts[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    // 0/0, as PyTorch: a batch of only ignored labels has a NaN loss.
    float result = counts[0] ? float(sums[0] / double(counts[0])) : __int_as_float(0x7fc00000);
    storeScalar(loss, lossType, result);
  }
}

/// Counts the rows whose label counts (deterministic: integer sums), recording bad labels.
__global__ void countLabelsKernel(const void *labels, bool wide, int64_t rows, int64_t vocab,
                                  int64_t ignoreIndex, int64_t *count, DeviceError *error,
                                  int32_t kernelIndex) {
  __shared__ int64_t counts[1024];
  int64_t c = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    c += rowLabel(labels, wide, r, vocab, ignoreIndex, error, kernelIndex, true) >= 0 ? 1 : 0;
  counts[threadIdx.x] = c;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half)
      counts[threadIdx.x] += counts[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    *count = counts[0];
}

template <typename T, int VW>
__global__ void crossEntropyGradRowKernel(const void *dloss, DType dlossType,
                                          const int64_t *count, const T *logits,
                                          const void *labels, bool wide, int64_t rows,
                                          int64_t vocab, int64_t ignoreIndex, T *dlogits) {
  __shared__ float scratch[64];
  int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows)
    return;
  const T *xr = logits + row * vocab;
  T *outr = dlogits + row * vocab;
  int64_t label = rowLabel(labels, wide, row, vocab, ignoreIndex, nullptr, 0, false);
  const int64_t n = *count;
  if (label < 0 || n == 0) {
    // With every label ignored the loss is a constant NaN; its gradient is taken to be 0, as
    // the CPU kernel does, so that a micro-batch of padding does not poison the gradients.
    forRow<VW>(outr, vocab, threadIdx.x, blockDim.x, [&](int64_t i, auto width) {
      constexpr int N = decltype(width)::value;
      float z[N] = {};
      storeF<N>(outr + i, z);
    });
    return;
  }
  const float scale = float(double(loadScalar(dloss, dlossType)) / double(n));
  SoftmaxState st;
  forRow<VW>(xr, vocab, threadIdx.x, blockDim.x, [&](int64_t i, auto width) {
    constexpr int N = decltype(width)::value;
    float v[N];
    loadF<N>(xr + i, v);
    softmaxAccumulate(st, v);
  });
  st = rowSoftmaxReduce(st, scratch);
  const float inv = 1.0f / st.s;
  forRow<VW>(xr, vocab, threadIdx.x, blockDim.x, [&](int64_t i, auto width) {
    constexpr int N = decltype(width)::value;
    float v[N];
    loadF<N>(xr + i, v);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      float p = exp2f(fmaf(v[e], kLog2e, -st.m)) * inv;
      v[e] = scale * (p - (i + e == label ? 1.0f : 0.0f));
    }
    storeF<N>(outr + i, v);
  });
}

struct RowLaunch {
  dim3 block;
  unsigned grid;
};

RowLaunch rowLaunch(int64_t rows, int64_t d, int vw) {
  int tpr = threadsPerRow(d, vw);
  if (tpr == 32)
    return {dim3(32, 8), unsigned((rows + 7) / 8)};
  return {dim3(unsigned(tpr), 1), unsigned(rows)};
}

void checkLabels(const char *kernel, const TensorView &logits, const TensorView &labels) {
  checkFloat(kernel, "logits", logits);
  checkIndex(kernel, "labels", labels);
  if (logits.rank() < 1)
    fail(kernel, "logits must have at least one dimension, got shape " +
                     formatShape(logits.shape));
  checkShape(kernel, "labels", labels,
             std::vector<int64_t>(logits.shape.begin(), logits.shape.end() - 1),
             "for logits shape " + formatShape(logits.shape));
}

} // namespace

void crossEntropy(const Context &ctx, const TensorView &logits, const TensorView &labels,
                  int64_t ignoreIndex, const TensorView &loss) {
  const char *k = "cross_entropy";
  checkLabels(k, logits, labels);
  checkFloat(k, "loss", loss);
  if (loss.numel() != 1)
    fail(k, "loss shape " + formatShape(loss.shape) + " is not a scalar");
  int64_t vocab = logits.dim(-1), rows = labels.numel();
  bool wide = labels.dtype == DType::I64;
  Scratch nll(k, ctx.stream, size_t(std::max<int64_t>(rows, 1)) * sizeof(float));
  if (rows > 0) {
    dispatchFloat(logits.dtype, [&](auto tag) {
      using T = decltype(tag);
      auto xp = static_cast<const T *>(logits.data);
      if (vocab == 0) {
        // Every label is out of range (or ignored); the row kernel only validates them.
        crossEntropyRowKernel<T, 1><<<unsigned((rows + 7) / 8), dim3(32, 8), 0, ctx.stream>>>(
            xp, labels.data, wide, rows, vocab, ignoreIndex, nll.as<float>(), ctx.deviceError,
            ctx.kernelIndex);
      } else {
        int vw = rowVectorWidth<T>({logits.data});
        RowLaunch l = rowLaunch(rows, vocab, vw);
        if (vw > 1)
          crossEntropyRowKernel<T, kVec<T>><<<l.grid, l.block, 0, ctx.stream>>>(
              xp, labels.data, wide, rows, vocab, ignoreIndex, nll.as<float>(), ctx.deviceError,
              ctx.kernelIndex);
        else
          crossEntropyRowKernel<T, 1><<<l.grid, l.block, 0, ctx.stream>>>(
              xp, labels.data, wide, rows, vocab, ignoreIndex, nll.as<float>(), ctx.deviceError,
              ctx.kernelIndex);
      }
      checkLaunch(k, "crossEntropyRowKernel");
    });
  }
  // The loss may alias the logits (it is written last, after every row was read).
  meanOfCountedRows(k, ctx.stream, nll.as<float>(), rows, loss);
}

namespace detail {
void meanOfCountedRows(const char *kernel, Stream stream, const float *nll, int64_t rows,
                       const TensorView &loss) {
  crossEntropyMeanKernel<<<1, 1024, 0, stream>>>(nll, rows, loss.data, loss.dtype);
  checkLaunch(kernel, "crossEntropyMeanKernel");
}

void countLabels(const char *kernel, Stream stream, const void *labels, bool wide, int64_t rows,
                 int64_t vocab, int64_t ignoreIndex, int64_t *count, DeviceError *error,
                 int32_t kernelIndex) {
  countLabelsKernel<<<1, 1024, 0, stream>>>(labels, wide, rows, vocab, ignoreIndex, count, error,
                                            kernelIndex);
  checkLaunch(kernel, "countLabelsKernel");
}
} // namespace detail

void crossEntropyGrad(const Context &ctx, const TensorView &dloss, const TensorView &logitsIn,
                      const TensorView &labels, int64_t ignoreIndex,
                      const TensorView &dlogits) {
  const char *k = "cross_entropy_grad";
  checkFloat(k, "dloss", dloss);
  checkLabels(k, logitsIn, labels);
  checkFloat(k, "dlogits", dlogits);
  if (dloss.numel() != 1)
    fail(k, "dloss shape " + formatShape(dloss.shape) + " is not a scalar");
  checkSameShape(k, "dlogits", dlogits, "logits", logitsIn);
  int64_t vocab = logitsIn.dim(-1), rows = labels.numel();
  bool wide = labels.dtype == DType::I64;

  std::vector<Scratch> keep;
  // Labels and dloss are read by every row while dlogits is written.
  TensorView labelsV = overlaps(labels, dlogits) ? copyToScratch(k, ctx.stream, labels, keep)
                                                 : labels;
  TensorView dlossV = overlaps(dloss, dlogits) ? copyToScratch(k, ctx.stream, dloss, keep)
                                               : dloss;
  TensorView logits =
      safeInPlace(logitsIn, dlogits) ? logitsIn : copyToScratch(k, ctx.stream, logitsIn, keep);
  Scratch count(k, ctx.stream, sizeof(int64_t));
  countLabels(k, ctx.stream, labelsV.data, wide, rows, vocab, ignoreIndex, count.as<int64_t>(),
              ctx.deviceError, ctx.kernelIndex);
  if (rows == 0 || vocab == 0)
    return;

  F32Staging staging(k, ctx.stream);
  TensorView x = logits, out = dlogits;
  if (x.dtype != out.dtype) {
    x = staging.in(x);
    out = staging.out(out);
  }
  dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto xp = static_cast<const T *>(x.data);
    auto op = static_cast<T *>(out.data);
    int vw = rowVectorWidth<T>({x.data, out.data});
    RowLaunch l = rowLaunch(rows, vocab, vw);
    if (vw > 1)
      crossEntropyGradRowKernel<T, kVec<T>><<<l.grid, l.block, 0, ctx.stream>>>(
          dlossV.data, dlossV.dtype, count.as<int64_t>(), xp, labelsV.data, wide, rows, vocab,
          ignoreIndex, op);
    else
      crossEntropyGradRowKernel<T, 1><<<l.grid, l.block, 0, ctx.stream>>>(
          dlossV.data, dlossV.dtype, count.as<int64_t>(), xp, labelsV.data, wide, rows, vocab,
          ignoreIndex, op);
    checkLaunch(k, "crossEntropyGradRowKernel");
  });
  staging.finish();
}

} // namespace bonsai::rt::cuda
