//===- Rope.cu - rope and rope_grad on CUDA --------------------------------===//
//
// Rotary embedding of x [batch, seq, heads, head_dim] (Hugging Face's rotate-half convention)
// and its adjoint, the inverse rotation. The cos and sin of each position's angles are computed
// in fp64 from ropeInverseFrequency (llama3 scaling included), as the CPU kernel does (an fp32
// angle s * theta^(-2i/D) is off by up to 2.4e-4 rad at position 4096), and rounded to fp32.
// Positions by index (no positions tensor): ropeTableKernel computes the [seq, D/2] table once
// into scratch, and ropeTableApplyKernel rotates every (i, i + D/2) pair of every head and token
// over one flat range, 16-byte loads, the table read through the cache (every head and batch
// row shares it). With a positions tensor (packed rows) ropeKernel takes a block per token and
// computes that token's table in shared memory. Each pair is read and written by one thread,
// so y may be x (in place).
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"

#include "CudaCheck.h"
#include "DeviceUtil.cuh"

#include <string>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {

/// The cos and sin of position s's angle of frequency i, in fp64 rounded to fp32.
__device__ __forceinline__ float2 ropeCosSin(double s, const RoPEAttrs &attrs, int64_t i,
                                             int64_t d) {
  double sn, cs;
  sincos(s * ropeInverseFrequency(attrs, i, d), &sn, &cs);
  return make_float2(float(cs), float(sn));
}

/// Rotates the VW pairs (x[e], x[half + e]) into y: y_lo = lo cos - hi sin, y_hi = hi cos +
/// lo sin.
template <int VW, typename T, typename Index>
__device__ __forceinline__ void rotatePairs(const T *x, T *y, Index half, const float (&c)[VW],
                                            const float (&sn)[VW]) {
  float lo[VW], hi[VW], outLo[VW], outHi[VW];
  loadF<VW>(x, lo);
  loadF<VW>(x + half, hi);
#pragma unroll
  for (int e = 0; e < VW; ++e) {
    outLo[e] = lo[e] * c[e] - hi[e] * sn[e];
    outHi[e] = hi[e] * c[e] + lo[e] * sn[e];
  }
  storeF<VW>(y, outLo);
  storeF<VW>(y + half, outHi);
}

/// The rotation of every pair of every head, a block per token, sin scaled by `sign` (-1: the
/// inverse).
template <typename T, int VW>
__global__ void ropeKernel(const T *x, T *y, int64_t tokens, int64_t seq, int64_t heads,
                           int64_t d, RoPEAttrs attrs, const void *positions, int positionsI64,
                           float sign) {
  extern __shared__ float table[]; // cos[half], then sign * sin[half]
  const int64_t half = d / 2, vectorsPerHead = half / VW, row = heads * d;
  for (int64_t token = blockIdx.x; token < tokens; token += gridDim.x) {
    // The token's position: its index in the sequence, or its positions entry (packed rows).
    const double s = !positions     ? double(token % seq)
                     : positionsI64 ? double(static_cast<const int64_t *>(positions)[token])
                                    : double(static_cast<const int32_t *>(positions)[token]);
    __syncthreads(); // the previous token's readers are done with the table
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      float2 a = ropeCosSin(s, attrs, i, d);
      table[i] = a.x;
      table[half + i] = sign * a.y;
    }
    __syncthreads();
    const T *xr = x + token * row;
    T *yr = y + token * row;
    for (int64_t p = threadIdx.x; p < heads * vectorsPerHead; p += blockDim.x) {
      int64_t h = p / vectorsPerHead, i = (p - h * vectorsPerHead) * VW;
      float c[VW], sn[VW];
#pragma unroll
      for (int e = 0; e < VW; ++e) {
        c[e] = table[i + e];
        sn[e] = table[half + i + e];
      }
      rotatePairs<VW>(xr + h * d + i, yr + h * d + i, half, c, sn);
    }
  }
}

/// table[s, i] = (cos, sin) of position s's angle of frequency i, in fp64 rounded to fp32.
__global__ void ropeTableKernel(float2 *table, int64_t seq, int64_t d, RoPEAttrs attrs) {
  const int64_t half = d / 2;
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < seq * half;
       j += int64_t(gridDim.x) * blockDim.x) {
    int64_t s = j / half;
    table[j] = ropeCosSin(double(s), attrs, j - s * half, d);
  }
}

/// The same rotation over every vector pair (token, head, VW-wide run i of the first half)
/// as one flat range of `pairs`, the angles from `table` (sin scaled by `sign`). Index is the
/// type of the flat index: 32-bit where every offset fits.
template <typename T, int VW, typename Index>
__global__ void ropeTableApplyKernel(const T *x, T *y, Index pairs, Index seq, Index heads,
                                     Index d, const float2 *table, float sign) {
  const Index half = d / 2, vectorsPerHead = half / VW;
  for (Index p = Index(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs;
       p += Index(gridDim.x) * blockDim.x) {
    Index row = p / vectorsPerHead; // token * heads + head
    Index i = (p - row * vectorsPerHead) * VW;
    Index s = (row / heads) % seq;
    const float2 *angles = table + s * half + i;
    float c[VW], sn[VW];
#pragma unroll
    for (int e = 0; e < VW; ++e) {
      c[e] = angles[e].x;
      sn[e] = sign * angles[e].y;
    }
    rotatePairs<VW>(x + row * d + i, y + row * d + i, half, c, sn);
  }
}

void runRope(const char *kernel, const char *xName, const char *yName, const Context &ctx,
             const TensorView &xIn, const RoPEAttrs &attrs, const TensorView *positions,
             const TensorView &y, float sign) {
  double theta = attrs.theta;
  checkFloat(kernel, xName, xIn);
  checkFloat(kernel, yName, y);
  if (xIn.rank() != 4 || xIn.dim(3) % 2 != 0)
    fail(kernel, std::string(xName) + " shape " + formatShape(xIn.shape) +
                     " is not [batch, seq, heads, head_dim] with an even head_dim");
  checkSameShape(kernel, yName, y, xName, xIn);
  if (!(theta > 0.0))
    fail(kernel, "theta " + std::to_string(theta) + " is not positive");
  int64_t batch = xIn.dim(0), seq = xIn.dim(1), heads = xIn.dim(2), d = xIn.dim(3);
  int64_t tokens = batch * seq;
  if (positions) {
    if (positions->dtype != DType::I32 && positions->dtype != DType::I64)
      fail(kernel, std::string("positions must be i32 or i64, not ") +
                       dtypeName(positions->dtype));
    if (positions->shape != std::vector<int64_t>{batch, seq})
      fail(kernel, "positions shape " + formatShape(positions->shape) + " should be [" +
                       std::to_string(batch) + ", " + std::to_string(seq) + "] ([batch, seq])");
  }
  const void *pos = positions ? positions->data : nullptr;
  int posI64 = positions && positions->dtype == DType::I64 ? 1 : 0;
  if (xIn.numel() == 0)
    return;
  std::vector<Scratch> keep;
  TensorView x = safeInPlace(xIn, y) ? xIn : copyToScratch(kernel, ctx.stream, xIn, keep);
  F32Staging staging(kernel, ctx.stream);
  TensorView xs = x, ys = y;
  if (x.dtype != y.dtype) {
    xs = staging.in(x);
    ys = staging.out(y);
  }
  int64_t half = d / 2;
  size_t smem = size_t(d) * sizeof(float);
  if (smem > 48 * 1024)
    fail(kernel, "head_dim " + std::to_string(d) + " exceeds the 12288 the kernel's table holds");
  dispatchFloat(xs.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int VW = kVec<T>;
    bool vector = half % VW == 0 && aligned16(xs.data) && aligned16(ys.data);
    int64_t work = heads * (vector ? half / VW : half);
    int threads = int(std::min<int64_t>(256, std::max<int64_t>(32, (work + 31) / 32 * 32)));
    unsigned grid = unsigned(std::min<int64_t>(tokens, int64_t(1) << 30));
    auto xp = static_cast<const T *>(xs.data);
    auto yp = static_cast<T *>(ys.data);
    if (!pos) {
      Scratch table(kernel, ctx.stream, size_t(seq * half) * sizeof(float2));
      auto tp = table.as<float2>();
      ropeTableKernel<<<gridFor(kernel, seq * half, 256), 256, 0, ctx.stream>>>(tp, seq, d,
                                                                              attrs);
      checkLaunch(kernel, "ropeTableKernel");
      int64_t pairs = tokens * work;
      auto launch = [&](auto vw, auto index) {
        constexpr int W = decltype(vw)::value;
        using Index = decltype(index);
        ropeTableApplyKernel<T, W, Index><<<gridFor(kernel, pairs, 256), 256, 0, ctx.stream>>>(
            xp, yp, Index(pairs), Index(seq), Index(heads), Index(d), tp, sign);
      };
      // 32-bit indices when every element offset fits.
      bool fits32 = xs.numel() < (int64_t(1) << 31);
      if (vector && fits32)
        launch(Width<VW>{}, int32_t{});
      else if (vector)
        launch(Width<VW>{}, int64_t{});
      else if (fits32)
        launch(Width<1>{}, int32_t{});
      else
        launch(Width<1>{}, int64_t{});
      checkLaunch(kernel, "ropeTableApplyKernel");
      return;
    }
    if (vector)
      ropeKernel<T, VW>
          <<<grid, threads, smem, ctx.stream>>>(xp, yp, tokens, seq, heads, d, attrs, pos,
                                                posI64, sign);
    else
      ropeKernel<T, 1><<<grid, threads, smem, ctx.stream>>>(xp, yp, tokens, seq, heads, d,
                                                             attrs, pos, posI64, sign);
    checkLaunch(kernel, "ropeKernel");
  });
  staging.finish();
}

} // namespace

void rope(const Context &ctx, const TensorView &x, double theta, const TensorView &y) {
  rope(ctx, x, RoPEAttrs{theta}, nullptr, y);
}

void rope(const Context &ctx, const TensorView &x, const RoPEAttrs &a,
          const TensorView *positions, const TensorView &y) {
  runRope("rope", "x", "y", ctx, x, a, positions, y, 1.0f);
}

void ropeGrad(const Context &ctx, const TensorView &dy, double theta, const TensorView &dx) {
  ropeGrad(ctx, dy, RoPEAttrs{theta}, nullptr, dx);
}

void ropeGrad(const Context &ctx, const TensorView &dy, const RoPEAttrs &a,
              const TensorView *positions, const TensorView &dx) {
  // The transpose of [[c, -s], [s, c]] is the rotation by -angle.
  runRope("rope_grad", "dy", "dx", ctx, dy, a, positions, dx, -1.0f);
}

} // namespace bonsai::rt::cuda
