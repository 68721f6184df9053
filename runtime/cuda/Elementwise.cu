//===- Elementwise.cu - Elementwise kernels of the CUDA backend ------------===//
//
// add, mul (rhs broadcast over lhs's trailing dimensions), silu, gelu, swiglu, their
// gradients, fill, cast and accumulate. Every kernel is a grid-stride loop over 16-byte vectors
// (8 bf16/f16 or 4 f32 elements per access, several vectors in flight per thread) with a scalar
// tail, computing in fp32 and rounding once into the output; unaligned operands fall back to
// scalar accesses. Each element is read and written by one thread, so an output may be one of
// the inputs (in place); partially overlapping operands are read from a copy. Operands of
// mixed float dtypes run through fp32 copies (F32Staging), as the CPU backend computes.
//
// Broadcasting collapses the shapes to at most kMaxDims alternating groups (broadcast or not)
// and walks them with a mixed-radix counter that each thread advances by the grid stride, so
// the loop does no division. The counter's 64-bit arithmetic costs more than a 16-byte vector
// takes to move, though: the common shapes, which collapse to [rows, cols] with rhs one value
// per row (DoRA's row scales of a weight) or one row (a bias), take a kernel with 32-bit
// indices instead (matrixBroadcastKernel).
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"

#include "CudaCheck.h"
#include "DeviceUtil.cuh"

#include <array>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {

constexpr int kThreads = 256;

//===----------------------------------------------------------------------===//
// The map kernel: NO outputs from NI inputs of one storage type, elementwise.
//===----------------------------------------------------------------------===//

template <int NI, int NO> struct Operands {
  const void *in[NI];
  void *out[NO];
};

/// Vectors per thread per sweep: enough loads in flight to cover memory latency, bounded by
/// registers for the many-input kernels.
template <int NI> constexpr int kUnroll = NI >= 3 ? 1 : (NI == 2 ? 2 : 4);

template <typename T, int VW, int NI, int NO, typename Op>
__global__ void __launch_bounds__(kThreads) mapKernel(Operands<NI, NO> p, int64_t n, Op op) {
  constexpr int U = kUnroll<NI>;
  const int64_t vectors = n / VW;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * U;
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x * U + threadIdx.x; base < vectors;
       base += stride) {
    float in[U][NI][VW];
    // Every load of the sweep is issued before the first use.
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int64_t v = base + int64_t(u) * blockDim.x;
      if (v < vectors) {
#pragma unroll
        for (int k = 0; k < NI; ++k)
          loadF<VW>(static_cast<const T *>(p.in[k]) + v * VW, in[u][k]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int64_t v = base + int64_t(u) * blockDim.x;
      if (v < vectors) {
        float out[NO][VW];
#pragma unroll
        for (int e = 0; e < VW; ++e) {
          float a[NI], r[NO];
#pragma unroll
          for (int k = 0; k < NI; ++k)
            a[k] = in[u][k][e];
          op(a, r);
#pragma unroll
          for (int j = 0; j < NO; ++j)
            out[j][e] = r[j];
        }
#pragma unroll
        for (int j = 0; j < NO; ++j)
          storeF<VW>(static_cast<T *>(p.out[j]) + v * VW, out[j]);
      }
    }
  }
  // The last n % VW elements, one per thread of the first block.
  int64_t i = vectors * VW + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (blockIdx.x == 0 && i < n) {
    float a[NI], r[NO];
#pragma unroll
    for (int k = 0; k < NI; ++k)
      a[k] = toFloat(static_cast<const T *>(p.in[k])[i]);
    op(a, r);
#pragma unroll
    for (int j = 0; j < NO; ++j)
      static_cast<T *>(p.out[j])[i] = fromFloat<T>(r[j]);
  }
}

/// Runs `op` over tensors that share one float dtype and `n` elements.
template <int NI, int NO, typename Op>
void launchMap(const char *kernel, Stream stream, DType dtype,
               const std::array<const void *, NI> &in, const std::array<void *, NO> &out,
               int64_t n, Op op) {
  if (n == 0)
    return;
  Operands<NI, NO> p;
  bool aligned = true;
  for (int k = 0; k < NI; ++k) {
    p.in[k] = in[size_t(k)];
    aligned = aligned && aligned16(in[size_t(k)]);
  }
  for (int j = 0; j < NO; ++j) {
    p.out[j] = out[size_t(j)];
    aligned = aligned && aligned16(out[size_t(j)]);
  }
  dispatchFloat(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int U = kUnroll<NI>;
    if (aligned) {
      constexpr int VW = kVec<T>;
      unsigned grid = gridFor(kernel, std::max<int64_t>(n / VW, 1), int64_t(kThreads) * U);
      mapKernel<T, VW, NI, NO><<<grid, kThreads, 0, stream>>>(p, n, op);
    } else {
      unsigned grid = gridFor(kernel, n, int64_t(kThreads) * U);
      mapKernel<T, 1, NI, NO><<<grid, kThreads, 0, stream>>>(p, n, op);
    }
    checkLaunch(kernel, "mapKernel");
  });
}

/// An elementwise kernel over same-shaped float tensors: inputs that partially overlap an
/// output are copied first, and mixed dtypes are computed in fp32 (F32Staging).
template <int NI, int NO, typename Op>
void elementwise(const char *kernel, const Context &ctx,
                 const std::array<const TensorView *, NI> &ins,
                 const std::array<const TensorView *, NO> &outs, Op op) {
  int64_t n = outs[0]->numel();
  if (n == 0)
    return;
  std::vector<Scratch> keep;
  std::array<TensorView, NI> in;
  std::array<TensorView, NO> out;
  for (int k = 0; k < NI; ++k) {
    in[size_t(k)] = *ins[size_t(k)];
    for (int j = 0; j < NO; ++j)
      if (!safeInPlace(in[size_t(k)], *outs[size_t(j)])) {
        in[size_t(k)] = copyToScratch(kernel, ctx.stream, in[size_t(k)], keep);
        break;
      }
  }
  for (int j = 0; j < NO; ++j)
    out[size_t(j)] = *outs[size_t(j)];

  DType dtype = out[0].dtype;
  bool uniform = true;
  for (const TensorView &t : in)
    uniform = uniform && t.dtype == dtype;
  for (const TensorView &t : out)
    uniform = uniform && t.dtype == dtype;
  F32Staging staging(kernel, ctx.stream);
  if (!uniform) {
    dtype = DType::F32;
    for (TensorView &t : in)
      t = staging.in(t);
    for (TensorView &t : out)
      t = staging.out(t);
  }
  std::array<const void *, NI> inPtr;
  std::array<void *, NO> outPtr;
  for (int k = 0; k < NI; ++k)
    inPtr[size_t(k)] = in[size_t(k)].data;
  for (int j = 0; j < NO; ++j)
    outPtr[size_t(j)] = out[size_t(j)].data;
  launchMap<NI, NO>(kernel, ctx.stream, dtype, inPtr, outPtr, n, op);
  staging.finish();
}

//===----------------------------------------------------------------------===//
// Operations (fp32 in, fp32 out)
//===----------------------------------------------------------------------===//

__device__ __forceinline__ float sigmoidF(float x) { return 1.0f / (1.0f + expf(-x)); }

struct AddOp {
  __device__ void operator()(const float *a, float *r) const { r[0] = a[0] + a[1]; }
};
struct MulOp {
  __device__ void operator()(const float *a, float *r) const { r[0] = a[0] * a[1]; }
};
struct SquareOp {
  __device__ void operator()(const float *a, float *r) const { r[0] = a[0] * a[0]; }
};
struct SqrtOp {
  __device__ void operator()(const float *a, float *r) const { r[0] = sqrtf(a[0]); }
};
struct SiluOp {
  __device__ void operator()(const float *a, float *r) const {
    r[0] = a[0] / (1.0f + expf(-a[0]));
  }
};
struct GeluOp {
  bool tanhForm;
  __device__ void operator()(const float *a, float *r) const {
    float x = a[0];
    if (tanhForm) {
      const float c = 0.7978845608028654f; // sqrt(2 / pi)
      r[0] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
    } else {
      r[0] = 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
    }
  }
};
struct SwigluOp {
  __device__ void operator()(const float *a, float *r) const {
    r[0] = a[0] / (1.0f + expf(-a[0])) * a[1];
  }
};
/// d/dx x sigmoid(x) = s (1 + x (1 - s)).
__device__ __forceinline__ float siluDerivative(float x) {
  float s = sigmoidF(x);
  return s * (1.0f + x * (1.0f - s));
}
struct SiluGradOp {
  __device__ void operator()(const float *a, float *r) const { r[0] = a[0] * siluDerivative(a[1]); }
};
struct GeluGradOp {
  bool tanhForm;
  __device__ void operator()(const float *a, float *r) const {
    float x = a[1], d;
    if (tanhForm) {
      const float c = 0.7978845608028654f, k = 0.044715f;
      float t = tanhf(c * (x + k * x * x * x));
      d = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * k * x * x);
    } else {
      const float invSqrt2Pi = 0.3989422804014327f;
      d = 0.5f * (1.0f + erff(x * 0.7071067811865476f)) + x * expf(-0.5f * x * x) * invSqrt2Pi;
    }
    r[0] = a[0] * d;
  }
};
struct SwigluGradOp {
  // a = {dy, gate, up}; r = {dgate, dup}.
  __device__ void operator()(const float *a, float *r) const {
    float s = sigmoidF(a[1]);
    r[0] = a[0] * a[2] * (s * (1.0f + a[1] * (1.0f - s)));
    r[1] = a[0] * (a[1] * s);
  }
};

//===----------------------------------------------------------------------===//
// Broadcasting binary kernel
//===----------------------------------------------------------------------===//

constexpr int kMaxDims = 8;

/// lhs's shape collapsed into groups, outermost first, padded in front with groups of 1:
/// sizes, rhs strides (0 for broadcast groups) and the grid stride in the same mixed radix.
struct Broadcast {
  int64_t size[kMaxDims];
  int64_t rhsStride[kMaxDims];
  int64_t step[kMaxDims];
};

/// out[0 .. VW) = op(a[e], b[e]) lane by lane, each result rounded once into T.
template <int VW, typename T, typename Op>
__device__ __forceinline__ void storeBinary(T *out, const float (&a)[VW], const float (&b)[VW],
                                            Op op) {
  float r[VW];
#pragma unroll
  for (int e = 0; e < VW; ++e) {
    float x[2] = {a[e], b[e]}, y[1];
    op(x, y);
    r[e] = y[0];
  }
  storeF<VW>(out, r);
}

template <typename T, int VW, typename Op>
__global__ void __launch_bounds__(kThreads)
    broadcastKernel(const T *lhs, const T *rhs, T *out, int64_t n, Broadcast g, Op op) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * VW;
  int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * VW;
  if (i >= n)
    return;
  int64_t digit[kMaxDims];
  int64_t rest = i;
#pragma unroll
  for (int d = kMaxDims - 1; d > 0; --d) {
    digit[d] = rest % g.size[d];
    rest /= g.size[d];
  }
  digit[0] = rest;
  const bool innerBroadcast = g.rhsStride[kMaxDims - 1] == 0;
  for (; i < n; i += stride) {
    int64_t offset = 0;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d)
      offset += digit[d] * g.rhsStride[d];
    float a[VW], b[VW];
    loadF<VW>(lhs + i, a);
    if (innerBroadcast) {
      float v = toFloat(rhs[offset]);
#pragma unroll
      for (int e = 0; e < VW; ++e)
        b[e] = v;
    } else {
      loadF<VW>(rhs + offset, b);
    }
    storeBinary<VW>(out + i, a, b, op);
    // Advance the counter by the grid stride; the top group takes the final carry.
    int64_t carry = 0;
#pragma unroll
    for (int d = kMaxDims - 1; d > 0; --d) {
      digit[d] += g.step[d] + carry;
      carry = digit[d] >= g.size[d] ? 1 : 0;
      digit[d] -= carry * g.size[d];
    }
    digit[0] += g.step[0] + carry;
  }
}

/// How rhs spreads over lhs viewed as [rows, cols] (row-major).
enum class MatrixBroadcast {
  PerRow,    ///< rhs[i / cols]: one value per row (a scalar rhs is the one-row case)
  PerColumn, ///< rhs[i % cols]: one row, repeated
};

/// out = op(lhs, rhs) over n = rows x cols elements, VW consecutive ones per thread per
/// iteration (cols a multiple of VW, so a vector never straddles two rows). n < 2^30, so the
/// 32-bit index plus the grid stride cannot wrap.
template <typename T, int VW, MatrixBroadcast B, typename Op>
__global__ void __launch_bounds__(kThreads)
    matrixBroadcastKernel(const T *lhs, const T *rhs, T *out, uint32_t n, uint32_t cols, Op op) {
  const uint32_t stride = gridDim.x * blockDim.x * VW;
  for (uint32_t i = (blockIdx.x * blockDim.x + threadIdx.x) * VW; i < n; i += stride) {
    float a[VW], b[VW];
    loadF<VW>(lhs + i, a);
    if constexpr (B == MatrixBroadcast::PerRow) {
      float v = toFloat(rhs[i / cols]);
#pragma unroll
      for (int e = 0; e < VW; ++e)
        b[e] = v;
    } else {
      loadF<VW>(rhs + i % cols, b);
    }
    storeBinary<VW>(out + i, a, b, op);
  }
}

/// Launches matrixBroadcastKernel over the collapsed groups `sizes` / `broadcast` when they
/// form one of its two patterns and n is small enough for 32-bit indices; false otherwise.
template <typename T, typename Op>
bool launchMatrixBroadcast(const char *kernel, const Context &ctx, const T *lhs, const T *rhs,
                           T *out, int64_t n, const std::vector<int64_t> &sizes,
                           const std::vector<bool> &broadcast, Op op) {
  if (n >= (int64_t(1) << 30) || sizes.empty() || sizes.size() > 2)
    return false;
  // One group is all broadcast (rhs a scalar: one row of n columns); two alternate.
  bool perRow = broadcast.back();
  if (sizes.size() == 1 && !perRow)
    return false; // rhs as large as lhs: the map kernel's case
  uint32_t cols = uint32_t(sizes.back());
  constexpr int VW = kVec<T>;
  bool vector = aligned16(lhs) && aligned16(out) && cols % VW == 0 && (perRow || aligned16(rhs));
  int width = vector ? VW : 1;
  unsigned grid = gridFor(kernel, n / width, kThreads);
  auto launch = [&](auto widthTag, auto patternTag) {
    matrixBroadcastKernel<T, decltype(widthTag)::value, decltype(patternTag)::value>
        <<<grid, kThreads, 0, ctx.stream>>>(lhs, rhs, out, uint32_t(n), cols, op);
  };
  using Row = std::integral_constant<MatrixBroadcast, MatrixBroadcast::PerRow>;
  using Column = std::integral_constant<MatrixBroadcast, MatrixBroadcast::PerColumn>;
  if (vector)
    perRow ? launch(std::integral_constant<int, VW>(), Row())
           : launch(std::integral_constant<int, VW>(), Column());
  else
    perRow ? launch(std::integral_constant<int, 1>(), Row())
           : launch(std::integral_constant<int, 1>(), Column());
  checkLaunch(kernel, "matrixBroadcastKernel");
  return true;
}

template <typename Op>
void binary(const char *kernel, const Context &ctx, const TensorView &lhs, const TensorView &rhs,
            const TensorView &out, Op op) {
  checkFloat(kernel, "lhs", lhs);
  checkFloat(kernel, "rhs", rhs);
  checkFloat(kernel, "out", out);
  bool broadcastable = rhs.rank() <= lhs.rank();
  int64_t lead = lhs.rank() - rhs.rank();
  for (int64_t d = 0; broadcastable && d < rhs.rank(); ++d) {
    int64_t r = rhs.shape[size_t(d)], l = lhs.shape[size_t(lead + d)];
    broadcastable = r == l || r == 1;
  }
  if (!broadcastable)
    fail(kernel, "rhs shape " + formatShape(rhs.shape) +
                     " does not broadcast over the trailing dimensions of lhs shape " +
                     formatShape(lhs.shape));
  checkSameShape(kernel, "out", out, "lhs", lhs);
  int64_t n = lhs.numel();
  if (n == 0)
    return;
  if (rhs.numel() == n) {
    elementwise<2, 1>(kernel, ctx, {&lhs, &rhs}, {&out}, op);
    return;
  }

  // Collapse: drop lhs dimensions of 1, merge neighbours that are both broadcast or both not.
  std::vector<int64_t> sizes, strides;
  std::vector<bool> broadcast;
  std::vector<int64_t> rhsStride(size_t(rhs.rank()));
  for (int64_t d = rhs.rank() - 1, s = 1; d >= 0; --d) {
    rhsStride[size_t(d)] = s;
    s *= rhs.shape[size_t(d)];
  }
  for (int64_t d = 0; d < lhs.rank(); ++d) {
    int64_t size = lhs.shape[size_t(d)];
    if (size == 1)
      continue;
    bool b = d < lead || rhs.shape[size_t(d - lead)] == 1;
    int64_t stride = b ? 0 : rhsStride[size_t(d - lead)];
    if (!sizes.empty() && broadcast.back() == b) {
      sizes.back() *= size;
      strides.back() = stride; // the innermost dimension's stride
    } else {
      sizes.push_back(size);
      strides.push_back(stride);
      broadcast.push_back(b);
    }
  }
  if (sizes.size() > size_t(kMaxDims))
    fail(kernel, "rhs shape " + formatShape(rhs.shape) + " broadcasts over lhs shape " +
                     formatShape(lhs.shape) + " in more than " + std::to_string(kMaxDims) +
                     " alternating groups of dimensions");

  std::vector<Scratch> keep;
  TensorView l = lhs, r = rhs, o = out;
  if (!safeInPlace(l, o))
    l = copyToScratch(kernel, ctx.stream, l, keep);
  if (overlaps(r, o))
    r = copyToScratch(kernel, ctx.stream, r, keep);
  F32Staging staging(kernel, ctx.stream);
  if (!(l.dtype == r.dtype && l.dtype == o.dtype)) {
    l = staging.in(l);
    r = staging.in(r);
    o = staging.out(o);
  }

  Broadcast g;
  size_t pad = size_t(kMaxDims) - sizes.size();
  for (size_t d = 0; d < size_t(kMaxDims); ++d) {
    g.size[d] = d < pad ? 1 : sizes[d - pad];
    g.rhsStride[d] = d < pad ? 0 : strides[d - pad];
  }
  dispatchFloat(o.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (launchMatrixBroadcast(kernel, ctx, static_cast<const T *>(l.data),
                              static_cast<const T *>(r.data), static_cast<T *>(o.data), n, sizes,
                              broadcast, op))
      return;
    constexpr int VW = kVec<T>;
    bool vector = aligned16(l.data) && aligned16(r.data) && aligned16(o.data) &&
                  g.size[kMaxDims - 1] % VW == 0;
    int width = vector ? VW : 1;
    unsigned grid = gridFor(kernel, n / width, kThreads);
    int64_t step = int64_t(grid) * kThreads * width;
    for (int d = kMaxDims - 1; d > 0; --d) {
      g.step[d] = step % g.size[d];
      step /= g.size[d];
    }
    g.step[0] = step;
    const T *lp = static_cast<const T *>(l.data), *rp = static_cast<const T *>(r.data);
    T *op_ = static_cast<T *>(o.data);
    if (vector)
      broadcastKernel<T, VW><<<grid, kThreads, 0, ctx.stream>>>(lp, rp, op_, n, g, op);
    else
      broadcastKernel<T, 1><<<grid, kThreads, 0, ctx.stream>>>(lp, rp, op_, n, g, op);
    checkLaunch(kernel, "broadcastKernel");
  });
  staging.finish();
}

template <typename Op>
void unary(const char *kernel, const Context &ctx, const TensorView &x, const TensorView &y,
           Op op) {
  checkFloat(kernel, "x", x);
  checkFloat(kernel, "y", y);
  checkSameShape(kernel, "y", y, "x", x);
  elementwise<1, 1>(kernel, ctx, {&x}, {&y}, op);
}

template <typename Op>
void unaryGrad(const char *kernel, const Context &ctx, const TensorView &dy, const TensorView &x,
               const TensorView &dx, Op op) {
  checkFloat(kernel, "dy", dy);
  checkFloat(kernel, "x", x);
  checkFloat(kernel, "dx", dx);
  checkSameShape(kernel, "x", x, "dy", dy);
  checkSameShape(kernel, "dx", dx, "dy", dy);
  elementwise<2, 1>(kernel, ctx, {&dy, &x}, {&dx}, op);
}

//===----------------------------------------------------------------------===//
// fill, cast, accumulate
//===----------------------------------------------------------------------===//

template <typename T, int VW>
__global__ void __launch_bounds__(kThreads) fillKernel(T *y, int64_t n, float value) {
  const int64_t vectors = n / VW;
  float v[VW];
#pragma unroll
  for (int e = 0; e < VW; ++e)
    v[e] = value;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors;
       i += int64_t(gridDim.x) * blockDim.x)
    storeF<VW>(y + i * VW, v);
  int64_t i = vectors * VW + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (blockIdx.x == 0 && i < n)
    y[i] = fromFloat<T>(value);
}

template <typename TI, typename TO, int VW>
__global__ void __launch_bounds__(kThreads) castKernel(const TI *x, TO *y, int64_t n) {
  const int64_t vectors = n / VW;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v[VW];
    loadF<VW>(x + i * VW, v);
    storeF<VW>(y + i * VW, v);
  }
  int64_t i = vectors * VW + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (blockIdx.x == 0 && i < n)
    y[i] = fromFloat<TO>(toFloat(x[i]));
}

template <typename TG, typename TA, int VW>
__global__ void __launch_bounds__(kThreads) accumulateKernel(const TG *g, TA *acc, int64_t n) {
  const int64_t vectors = n / VW;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors;
       i += int64_t(gridDim.x) * blockDim.x) {
    float a[VW], b[VW];
    loadF<VW>(acc + i * VW, a);
    loadF<VW>(g + i * VW, b);
#pragma unroll
    for (int e = 0; e < VW; ++e)
      a[e] += b[e];
    storeF<VW>(acc + i * VW, a);
  }
  int64_t i = vectors * VW + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (blockIdx.x == 0 && i < n)
    acc[i] = fromFloat<TA>(toFloat(acc[i]) + toFloat(g[i]));
}

/// The widest vector both types can use: 16 bytes of the wider type.
template <typename A, typename B> constexpr int kPairVec = int(16 / std::max(sizeof(A), sizeof(B)));

} // namespace

namespace detail {

void castOnDevice(const char *kernel, Stream stream, const TensorView &x, const TensorView &y) {
  int64_t n = x.numel();
  if (n == 0)
    return;
  dispatchFloat(x.dtype, [&](auto inTag) {
    dispatchFloat(y.dtype, [&](auto outTag) {
      using TI = decltype(inTag);
      using TO = decltype(outTag);
      constexpr int VW = kPairVec<TI, TO>;
      const TI *xp = static_cast<const TI *>(x.data);
      TO *yp = static_cast<TO *>(y.data);
      if (aligned16(x.data) && aligned16(y.data)) {
        unsigned grid = gridFor(kernel, std::max<int64_t>(n / VW, 1), kThreads);
        castKernel<TI, TO, VW><<<grid, kThreads, 0, stream>>>(xp, yp, n);
      } else {
        castKernel<TI, TO, 1><<<gridFor(kernel, n, kThreads), kThreads, 0, stream>>>(xp, yp, n);
      }
      checkLaunch(kernel, "castKernel");
    });
  });
}

} // namespace detail

void add(const Context &ctx, const TensorView &lhs, const TensorView &rhs,
         const TensorView &out) {
  binary("add", ctx, lhs, rhs, out, AddOp{});
}

void mul(const Context &ctx, const TensorView &lhs, const TensorView &rhs,
         const TensorView &out) {
  binary("mul", ctx, lhs, rhs, out, MulOp{});
}

void square(const Context &ctx, const TensorView &x, const TensorView &y) {
  unary("square", ctx, x, y, SquareOp{});
}

void squareRoot(const Context &ctx, const TensorView &x, const TensorView &y) {
  unary("sqrt", ctx, x, y, SqrtOp{});
}

void silu(const Context &ctx, const TensorView &x, const TensorView &y) {
  unary("silu", ctx, x, y, SiluOp{});
}

void gelu(const Context &ctx, const TensorView &x, bool tanh, const TensorView &y) {
  unary("gelu", ctx, x, y, GeluOp{tanh});
}

void swiglu(const Context &ctx, const TensorView &gate, const TensorView &up,
            const TensorView &y) {
  const char *k = "swiglu";
  checkFloat(k, "gate", gate);
  checkFloat(k, "up", up);
  checkFloat(k, "y", y);
  checkSameShape(k, "up", up, "gate", gate);
  checkSameShape(k, "y", y, "gate", gate);
  elementwise<2, 1>(k, ctx, {&gate, &up}, {&y}, SwigluOp{});
}

void siluGrad(const Context &ctx, const TensorView &dy, const TensorView &x,
              const TensorView &dx) {
  unaryGrad("silu_grad", ctx, dy, x, dx, SiluGradOp{});
}

void geluGrad(const Context &ctx, const TensorView &dy, const TensorView &x, bool tanh,
              const TensorView &dx) {
  unaryGrad("gelu_grad", ctx, dy, x, dx, GeluGradOp{tanh});
}

void swigluGrad(const Context &ctx, const TensorView &dy, const TensorView &gate,
                const TensorView &up, const TensorView &dgate, const TensorView &dup) {
  const char *k = "swiglu_grad";
  checkFloat(k, "dy", dy);
  checkFloat(k, "gate", gate);
  checkFloat(k, "up", up);
  checkFloat(k, "dgate", dgate);
  checkFloat(k, "dup", dup);
  checkSameShape(k, "gate", gate, "dy", dy);
  checkSameShape(k, "up", up, "dy", dy);
  checkSameShape(k, "dgate", dgate, "dy", dy);
  checkSameShape(k, "dup", dup, "dy", dy);
  if (overlaps(dgate, dup))
    fail(k, "dgate and dup overlap");
  elementwise<3, 2>(k, ctx, {&dy, &gate, &up}, {&dgate, &dup}, SwigluGradOp{});
}

void fill(const Context &ctx, double value, const TensorView &y) {
  const char *k = "fill";
  checkFloat(k, "y", y);
  int64_t n = y.numel();
  if (n == 0)
    return;
  // One rounding of `value` into fp32 here and one into y's dtype on the device, as the CPU
  // kernel stores float(value).
  float v = float(value);
  if (v == 0.0f && !std::signbit(v)) {
    checkCuda(cudaMemsetAsync(y.data, 0, y.bytes(), ctx.stream), "cudaMemsetAsync", k);
    return;
  }
  dispatchFloat(y.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int VW = kVec<T>;
    T *yp = static_cast<T *>(y.data);
    if (aligned16(y.data))
      fillKernel<T, VW><<<gridFor(k, std::max<int64_t>(n / VW, 1), kThreads), kThreads, 0,
                          ctx.stream>>>(yp, n, v);
    else
      fillKernel<T, 1><<<gridFor(k, n, kThreads), kThreads, 0, ctx.stream>>>(yp, n, v);
    checkLaunch(k, "fillKernel");
  });
}

void cast(const Context &ctx, const TensorView &x, const TensorView &y) {
  const char *k = "cast";
  checkFloat(k, "x", x);
  checkFloat(k, "y", y);
  checkSameShape(k, "y", y, "x", x);
  if (x.numel() == 0)
    return;
  if (x.dtype == y.dtype) {
    if (x.data != y.data) {
      std::vector<Scratch> keep;
      TensorView src = overlaps(x, y) ? copyToScratch(k, ctx.stream, x, keep) : x;
      checkCuda(cudaMemcpyAsync(y.data, src.data, x.bytes(), cudaMemcpyDeviceToDevice,
                                ctx.stream),
                "cudaMemcpyAsync", k);
    }
    return;
  }
  std::vector<Scratch> keep;
  TensorView src = overlaps(x, y) ? copyToScratch(k, ctx.stream, x, keep) : x;
  castOnDevice(k, ctx.stream, src, y);
}

/// acc = max(acc, x), NaN propagating as the CPU reference does: a few FP8 statistics a
/// launch, so one thread per element.
__global__ void __launch_bounds__(kThreads) accumulateMaxKernel(const float *x, float *acc,
                                                                int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v = x[i], a = acc[i];
    acc[i] = isnan(v) || v > a ? v : a;
  }
}

void accumulateMax(const Context &ctx, const TensorView &x, const TensorView &acc) {
  const char *k = "accumulate_max";
  checkF32(k, "x", x, x.shape);
  checkF32(k, "acc", acc, x.shape);
  int64_t n = acc.numel();
  if (n == 0)
    return;
  accumulateMaxKernel<<<gridFor(k, n, kThreads), kThreads, 0, ctx.stream>>>(
      static_cast<const float *>(x.data), static_cast<float *>(acc.data), n);
  checkLaunch(k, "accumulateMaxKernel");
}

void accumulate(const Context &ctx, const TensorView &g, const TensorView &acc) {
  const char *k = "accumulate";
  checkFloat(k, "g", g);
  checkFloat(k, "acc", acc);
  checkSameShape(k, "g", g, "acc", acc);
  int64_t n = acc.numel();
  if (n == 0)
    return;
  std::vector<Scratch> keep;
  TensorView src = safeInPlace(g, acc) ? g : copyToScratch(k, ctx.stream, g, keep);
  dispatchFloat(src.dtype, [&](auto gTag) {
    dispatchFloat(acc.dtype, [&](auto aTag) {
      using TG = decltype(gTag);
      using TA = decltype(aTag);
      constexpr int VW = kPairVec<TG, TA>;
      const TG *gp = static_cast<const TG *>(src.data);
      TA *ap = static_cast<TA *>(acc.data);
      if (aligned16(src.data) && aligned16(acc.data))
        accumulateKernel<TG, TA, VW><<<gridFor(k, std::max<int64_t>(n / VW, 1), kThreads),
                                       kThreads, 0, ctx.stream>>>(gp, ap, n);
      else
        accumulateKernel<TG, TA, 1>
            <<<gridFor(k, n, kThreads), kThreads, 0, ctx.stream>>>(gp, ap, n);
      checkLaunch(k, "accumulateKernel");
    });
  });
}

} // namespace bonsai::rt::cuda
