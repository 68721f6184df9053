//===- Linear.cu - linear, matmul and the linear gradients on CUDA --------===//
//
// The GEMM kernels of the CUDA backend, all through the context's GemmEngine (cuBLASLt, fp32
// accumulation, no TF32):
//
//   linear             y[rows, out] = x[rows, in] w[out, in]ᵀ (+ bias[out])
//   matmul             c[b, m, n] = a[b, m, k] b[b, k, n] (strided batch)
//   linear_grad_input  dx[rows, in] = dy[rows, out] w[out, in]
//   linear_grad_weight dw[out, in] = dy[rows, out]ᵀ x[rows, in]
//   linear_gelu        pre = x wᵀ (+ bias), y = gelu_tanh(pre) (fusion family gemm-epilogue)
//   linear_grad_weight_accumulate  acc += dyᵀ x (beta = 1, fusion family gemm-epilogue)
//   linear_add         y = addend + x wᵀ (beta = 1, the addend as C; fusion family gemm-epilogue)
//
// When A, B and C share a dtype (the usual case) the GEMM writes the output directly, and
// linear's bias is added by cuBLASLt's CUBLASLT_EPILOGUE_BIAS in fp32 before the single rounding
// (cuBLASLt wants the bias in the output's dtype). Otherwise the GEMM runs on the common
// operand dtype (fp32 copies when A and B differ) into an fp32 result, and one small kernel adds
// the bias and rounds once into the output. Either way the result is the CPU kernel's: fp32
// products and sums of the stored values, rounded once. cuBLASLt's results are bit-identical
// run to run for one algorithm (its split-K reductions are ordered), and the engine always
// reruns the algorithm it chose first for a shape, so linear_grad_weight's long sums over
// positions are deterministic too (the tests check it). The engine runs GEMMs of sizes or rows
// that are not 16-byte multiples on padded, aligned copies made by copyMatrices, defined here.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"

#include "CudaCheck.h"
#include "DeviceUtil.cuh"
#include "GemmImpl.h"

#include <algorithm>
#include <cstdint>
#include <string>

namespace bonsai::rt::cuda {

namespace detail {

namespace {

constexpr int kCopyThreads = 256;
/// Elements of a row each thread of copyMatricesKernel moves per row (16 loads in flight).
constexpr int kCopyPerThread = 16;

/// dst = src over dst's extent, zero outside src's: `count` matrices, the rows of all of them
/// (b, r) walked by blockIdx.y, y + gridDim.y, ...; block x moves the columns [x, x + 1)
/// kCopyThreads kCopyPerThread of a row, consecutive threads on consecutive elements, so both
/// sides coalesce whatever the alignment of their rows.
template <typename E>
__global__ void copyMatricesKernel(MatrixSpan src, MatrixSpan dst, int64_t count) {
  const int64_t c0 = int64_t(blockIdx.x) * kCopyThreads * kCopyPerThread + threadIdx.x;
  const int64_t totalRows = count * dst.rows;
  for (int64_t rr = blockIdx.y; rr < totalRows; rr += gridDim.y) {
    const int64_t b = count == 1 ? 0 : rr / dst.rows, r = rr - b * dst.rows;
    const bool inside = r < src.rows;
    const E *s = static_cast<const E *>(src.data) + b * src.stride + r * src.ld;
    E *t = static_cast<E *>(const_cast<void *>(dst.data)) + b * dst.stride + r * dst.ld;
    E v[kCopyPerThread];
#pragma unroll
    for (int i = 0; i < kCopyPerThread; ++i) {
      int64_t c = c0 + int64_t(i) * kCopyThreads;
      v[i] = inside && c < src.cols ? s[c] : E(0);
    }
#pragma unroll
    for (int i = 0; i < kCopyPerThread; ++i) {
      int64_t c = c0 + int64_t(i) * kCopyThreads;
      if (c < dst.cols)
        t[c] = v[i];
    }
  }
}

} // namespace

void copyMatrices(const char *kernel, Stream stream, DType dtype, const MatrixSpan &src,
                  const MatrixSpan &dst, int64_t count) {
  int64_t totalRows = dst.rows * count;
  if (totalRows == 0 || dst.cols == 0)
    return;
  const int64_t perBlock = int64_t(kCopyThreads) * kCopyPerThread;
  dim3 grid(unsigned((dst.cols + perBlock - 1) / perBlock),
            unsigned(std::min<int64_t>(totalRows, 65535)));
  auto launch = [&](auto tag) {
    using E = decltype(tag);
    copyMatricesKernel<E><<<grid, kCopyThreads, 0, stream>>>(src, dst, count);
  };
  switch (dtypeSize(dtype)) {
  case 2:
    launch(uint16_t{});
    break;
  case 4:
    launch(uint32_t{});
    break;
  default:
    fail(kernel, std::string("GEMM storage must be f32, f16 or bf16, not ") + dtypeName(dtype));
  }
  checkLaunch(kernel, "copyMatricesKernel");
}

} // namespace detail

using namespace detail;

namespace {

/// y[r, j] = src[r, j] + bias[j] (fp32 sum, rounded once into TY); src may be y when TY is f32.
template <typename TB, typename TY>
__global__ void addBiasKernel(const float *src, const TB *bias, TY *y, int64_t rows,
                              int64_t cols) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < cols;
         j += int64_t(gridDim.x) * blockDim.x)
      y[r * cols + j] = fromFloat<TY>(src[r * cols + j] + toFloat(bias[j]));
}

/// One row-major GEMM with operands of any float dtypes: C = op(A) op(B) (+ bias[n] per row),
/// `batch` matrices at the given element strides. Inputs overlapping C are read from copies.
void runGemm(const char *kernel, const Context &ctx, bool transA, bool transB, int64_t m,
             int64_t n, int64_t k, const TensorView &aIn, int64_t strideA, const TensorView &bIn,
             int64_t strideB, const TensorView *biasIn, const TensorView &c, int64_t strideC,
             int64_t batch) {
  if (!ctx.gemm)
    fail(kernel, "the context has no GemmEngine");
  if (m == 0 || n == 0 || batch == 0)
    return;
  std::vector<Scratch> keep;
  auto unaliased = [&](const TensorView &t) {
    return overlaps(t, c) ? copyToScratch(kernel, ctx.stream, t, keep) : t;
  };
  TensorView a = unaliased(aIn), b = unaliased(bIn);
  TensorView bias = biasIn ? unaliased(*biasIn) : TensorView{};

  // A and B share one storage type in cuBLASLt: fp32 copies when they differ.
  DType ab = a.dtype == b.dtype ? a.dtype : DType::F32;
  F32Staging staging(kernel, ctx.stream);
  if (a.dtype != ab)
    a = staging.in(a);
  if (b.dtype != ab)
    b = staging.in(b);

  LtEngine &engine = ltEngineOf(kernel, *ctx.gemm);
  GemmCall call;
  call.abType = ab;
  call.transA = transA;
  call.transB = transB;
  call.m = m;
  call.n = n;
  call.k = k;
  call.a = a.data;
  call.b = b.data;
  call.strideA = strideA;
  call.strideB = strideB;
  call.strideC = strideC;
  call.batch = batch;

  bool epilogue = !biasIn || (bias.dtype == c.dtype && k > 0);
  if (c.dtype == ab && epilogue) {
    call.cType = c.dtype;
    call.c = c.data;
    call.bias = biasIn ? bias.data : nullptr;
    engine.run(kernel, ctx.stream, call);
    return;
  }

  // An fp32 result (c itself when it is f32), then the bias and one rounding into c.
  Scratch result(kernel, ctx.stream, c.dtype == DType::F32 ? 0 : size_t(c.numel()) * 4);
  TensorView r = c;
  if (c.dtype != DType::F32) {
    r.dtype = DType::F32;
    r.data = result.get();
  }
  call.cType = DType::F32;
  call.c = r.data;
  engine.run(kernel, ctx.stream, call);
  if (biasIn) {
    // The bias adds along n of every row of every batch matrix: batch * m rows of n when the
    // output is dense, which it is for linear (the only caller with a bias).
    int64_t rows = batch * m;
    dim3 grid(unsigned(std::min<int64_t>((n + 255) / 256, 1024)),
              unsigned(std::min<int64_t>(rows, 65535)));
    dispatchFloat(bias.dtype, [&](auto bTag) {
      dispatchFloat(c.dtype, [&](auto yTag) {
        using TB = decltype(bTag);
        using TY = decltype(yTag);
        addBiasKernel<TB, TY><<<grid, 256, 0, ctx.stream>>>(
            static_cast<const float *>(r.data), static_cast<const TB *>(bias.data),
            static_cast<TY *>(c.data), rows, n);
        checkLaunch(kernel, "addBiasKernel");
      });
    });
  } else if (r.data != c.data) {
    castOnDevice(kernel, ctx.stream, r, c);
  }
}


} // namespace

void linear(const Context &ctx, const TensorView &x, const TensorView &w,
            const TensorView *bias, const TensorView &y) {
  const char *k = "linear";
  LinearSizes n = checkLinear(k, x, w, bias, y);
  // y [rows, out] = x [rows, in] wᵀ.
  runGemm(k, ctx, /*transA=*/false, /*transB=*/true, n.rows, n.out, n.in, x, 0, w, 0, bias, y, 0,
          1);
}

void matmul(const Context &ctx, const TensorView &a, const TensorView &b, const TensorView &c) {
  const char *k = "matmul";
  checkFloat(k, "a", a);
  checkFloat(k, "b", b);
  checkFloat(k, "c", c);
  int64_t rank = a.rank();
  if (rank < 2 || b.rank() != rank ||
      !std::equal(a.shape.begin(), a.shape.end() - 2, b.shape.begin()) || b.dim(-2) != a.dim(-1))
    fail(k, "a shape " + formatShape(a.shape) + " and b shape " + formatShape(b.shape) +
                " are not [..., m, k] and [..., k, n] with the same batch dimensions");
  int64_t m = a.dim(-2), kk = a.dim(-1), n = b.dim(-1);
  std::vector<int64_t> expected(a.shape.begin(), a.shape.end() - 1);
  expected.push_back(n);
  checkShape(k, "c", c, expected,
             "for a shape " + formatShape(a.shape) + " and b shape " + formatShape(b.shape));
  int64_t batch = 1;
  for (int64_t i = 0; i + 2 < rank; ++i)
    batch *= a.shape[size_t(i)];
  runGemm(k, ctx, false, false, m, n, kk, a, m * kk, b, kk * n, nullptr, c, m * n, batch);
}

void linearGradInput(const Context &ctx, const TensorView &dy, const TensorView &w,
                     const TensorView &dx) {
  const char *k = "linear_grad_input";
  LinearSizes n = checkLinearGradInput(k, dy, w, dx);
  // dx [rows, in] = dy [rows, out] w [out, in].
  runGemm(k, ctx, false, false, n.rows, n.in, n.out, dy, 0, w, 0, nullptr, dx, 0, 1);
}

void linearGradWeight(const Context &ctx, const TensorView &dy, const TensorView &x,
                      const TensorView &dw) {
  const char *k = "linear_grad_weight";
  LinearSizes n = checkLinearGradWeight(k, dy, x, dw);
  // dw [out, in] = dyᵀ [out, rows] x [rows, in].
  runGemm(k, ctx, /*transA=*/true, false, n.out, n.in, n.rows, dy, 0, x, 0, nullptr, dw, 0, 1);
}

void linearGelu(const Context &ctx, const TensorView &x, const TensorView &w,
                const TensorView *bias, const TensorView &y, const TensorView &pre) {
  const char *k = "linear_gelu";
  checkFloat(k, "pre", pre);
  LinearSizes n = checkLinear(k, x, w, bias, y);
  checkShape(k, "pre", pre, y.shape,
             "for x shape " + formatShape(x.shape) + " and w shape " + formatShape(w.shape));
  int64_t in = n.in, out = n.out, rows = n.rows;
  if (!ctx.gemm)
    fail(k, "the context has no GemmEngine");
  // The epilogue needs one storage type for every operand, a non-empty sum, and outputs that
  // no input shares bytes with; otherwise the unfused pair computes the same (y from the
  // rounded pre-activation, as the CPU does).
  bool sameType = allDType(x.dtype, {&w, &y, &pre}) && (!bias || bias->dtype == x.dtype);
  bool disjoint = !overlaps(y, pre) && !overlaps(y, x) && !overlaps(y, w) &&
                  !overlaps(pre, x) && !overlaps(pre, w) &&
                  (!bias || (!overlaps(y, *bias) && !overlaps(pre, *bias)));
  if (!sameType || in == 0 || !disjoint) {
    linear(ctx, x, w, bias, pre);
    gelu(ctx, pre, /*tanh=*/true, y);
    return;
  }
  if (rows == 0 || out == 0)
    return;
  GemmCall call;
  call.abType = call.cType = x.dtype;
  call.transA = false;
  call.transB = true;
  call.m = rows;
  call.n = out;
  call.k = in;
  call.a = x.data;
  call.b = w.data;
  call.c = y.data;
  call.bias = bias ? bias->data : nullptr;
  call.geluAux = pre.data;
  ltEngineOf(k, *ctx.gemm).run(k, ctx.stream, call);
}

void linearAdd(const Context &ctx, const TensorView &xIn, const TensorView &wIn,
               const TensorView &addendIn, const TensorView &y) {
  const char *k = "linear_add";
  LinearSizes n = checkLinear(k, xIn, wIn, nullptr, y);
  checkFloat(k, "addend", addendIn);
  checkShape(k, "addend", addendIn, y.shape,
             "for x shape " + formatShape(xIn.shape) + " and w shape " + formatShape(wIn.shape));
  if (!ctx.gemm)
    fail(k, "the context has no GemmEngine");
  if (n.rows == 0 || n.out == 0)
    return;
  // One storage type for every operand, and a non-empty sum; otherwise the unfused pair (the
  // product rounded into y first, as the CPU does). An addend that is y itself is C = D.
  if (!allDType(xIn.dtype, {&wIn, &addendIn, &y}) || n.in == 0) {
    Scratch bytes(k, ctx.stream, size_t(y.numel()) * dtypeSize(y.dtype));
    TensorView product{bytes.get(), y.dtype, y.shape};
    linear(ctx, xIn, wIn, nullptr, product);
    add(ctx, product, addendIn, y);
    return;
  }
  std::vector<Scratch> keep;
  auto unaliased = [&](const TensorView &t) {
    return overlaps(t, y) ? copyToScratch(k, ctx.stream, t, keep) : t;
  };
  TensorView x = unaliased(xIn), w = unaliased(wIn);
  bool inPlace = addendIn.data == y.data;
  TensorView addend = inPlace ? addendIn : unaliased(addendIn);
  GemmCall call;
  call.abType = call.cType = x.dtype;
  call.transA = false;
  call.transB = true;
  call.m = n.rows;
  call.n = n.out;
  call.k = n.in;
  call.a = x.data;
  call.b = w.data;
  call.c = y.data;
  call.addend = inPlace ? nullptr : addend.data;
  call.beta = 1.0f;
  ltEngineOf(k, *ctx.gemm).run(k, ctx.stream, call);
}

void linearGradWeightAccumulate(const Context &ctx, const TensorView &dyIn, const TensorView &xIn,
                                const TensorView &acc) {
  const char *k = "linear_grad_weight_accumulate";
  LinearSizes n = checkLinearGradWeight(k, dyIn, xIn, acc, "acc");
  int64_t out = n.out, in = n.in, rows = n.rows;
  if (!ctx.gemm)
    fail(k, "the context has no GemmEngine");
  if (out == 0 || in == 0 || rows == 0)
    return; // adding an empty sum
  std::vector<Scratch> keep;
  auto unaliased = [&](const TensorView &t) {
    return overlaps(t, acc) ? copyToScratch(k, ctx.stream, t, keep) : t;
  };
  TensorView dy = unaliased(dyIn), x = unaliased(xIn);
  DType ab = dy.dtype == x.dtype ? dy.dtype : DType::F32;
  F32Staging staging(k, ctx.stream);
  if (dy.dtype != ab)
    dy = staging.in(dy);
  if (x.dtype != ab)
    x = staging.in(x);
  // cuBLASLt adds into C of the operands' type or f32; another accumulator (an f16 or bf16 one
  // with f32 operands) takes the product through an fp32 scratch and accumulate.
  bool direct = acc.dtype == ab || acc.dtype == DType::F32;
  Scratch product(k, ctx.stream, direct ? 0 : size_t(acc.numel()) * 4);
  GemmCall call;
  call.abType = ab;
  call.cType = direct ? acc.dtype : DType::F32;
  call.transA = true;
  call.transB = false;
  call.m = out;
  call.n = in;
  call.k = rows;
  call.a = dy.data;
  call.b = x.data;
  call.c = direct ? acc.data : product.get();
  call.beta = direct ? 1.0f : 0.0f;
  ltEngineOf(k, *ctx.gemm).run(k, ctx.stream, call);
  if (!direct)
    accumulate(ctx, TensorView{product.get(), DType::F32, acc.shape}, acc);
}

} // namespace bonsai::rt::cuda
