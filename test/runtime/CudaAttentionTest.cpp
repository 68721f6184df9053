//===- CudaAttentionTest.cpp - CUDA attention and attentionGrad against the CPU ===//
//
// cuda::attention and cuda::attentionGrad against the CPU kernels (cpu::attention and
// cpu::attentionGrad, fp64 inside) on the same inputs: fresh random q, k, v and dO from fixed
// seeds (never zeros), every device output poisoned with NaN before the call, every output element
// compared. The CPU kernels get f32 copies of the stored inputs (bf16 and f16 values are exact in
// f32) and write f32, so the reference is not rounded to the storage type. A naive fp64
// reference written here checks both on the short sequences.
//
// Tolerances: f32 runs the FMA path in fp32, errors of a few 1e-7 relative to the output's scale,
// so 1e-4 relative plus 1e-5 of the largest magnitude per element and 2e-5 in norm. bf16 and f16
// round p and ds to the storage type for the tensor-core products and round the outputs, errors
// of a few 1e-3 of the output's scale, so 2e-2 relative plus 1e-2 of the largest magnitude per
// element and 1e-2 in norm (a wrong mask, scale, GQA head or tile edge moves elements by far
// more). Outputs that are zero up to rounding (dq and dk with one key) get an absolute floor of
// 1e-5 (f32) or 1e-4 (bf16, f16). Shapes cover head dims 64, 128 and 40 (padded to 64), 12 and 160
// (the generic path for every storage type), sequence lengths 1, 17, 128 and 257 (ragged against
// the 64- and 128-row tiles), GQA ratios 1, 4 and 8, causal and not.
//
// On an sm_90 GPU with a build that has sm_90a code, the bf16 cases at head dim 128 run the
// warpgroup-MMA kernels (the forward, the dk/dv kernel and the flash dq kernel); the others, and
// every case on other GPUs, the mma.sync or generic kernels.
//
// Also: two runs give bit-identical results, operand errors throw, and one timing test prints
// TFLOP/s for B=4, H=32, S=4096, D=128 causal bf16. Without a GPU every device test skips.
//
// The flash variants (CudaAttentionLse*): cuda::flashAttention's o equals cuda::attention's bit
// for bit and its log-sum-exp cpu::flashAttention's within 1e-5; cuda::flashAttentionGrad, given
// the CPU's o and log-sum-exp, matches cpu::flashAttentionGrad (and cpu::attentionGrad) with the
// tolerances above; reruns are bit-identical; a malformed log-sum-exp throws.
//
//===----------------------------------------------------------------------===//

#ifdef BONSAI_HAVE_CUDA

#include "bonsai/runtime/CudaKernels.h"

#include "CudaTestUtil.h"
#include "bonsai/runtime/CpuKernels.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

using namespace bonsai::rt;
namespace cpu = bonsai::rt::cpu;
namespace cuda = bonsai::rt::cuda;
using bonsai::test::haveGpu;
using bonsai::test::numelOf;

namespace {

using Shape = std::vector<int64_t>;

#define CUDA_OK(call)                                                                              \
  do {                                                                                             \
    cudaError_t status_ = (call);                                                                  \
    ASSERT_EQ(status_, cudaSuccess) << #call << ": " << cudaGetErrorString(status_);               \
  } while (0)

/// Storage bits of x rounded to `dtype` (to nearest even).
void encode(DType dtype, float x, uint8_t *p) {
  if (dtype == DType::F32) {
    std::memcpy(p, &x, 4);
  } else {
    uint16_t h = dtype == DType::BF16 ? f32ToBf16(x) : f32ToF16(x);
    std::memcpy(p, &h, 2);
  }
}

/// A host tensor: storage bytes and the exact values they hold as f32.
struct HostTensor {
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
  std::vector<float> values;

  HostTensor(DType dtype, Shape shape)
      : dtype(dtype), shape(std::move(shape)),
        bytes(size_t(numelOf(this->shape)) * dtypeSize(dtype)),
        values(size_t(numelOf(this->shape))) {}

  /// Stores `x`, each value rounded to the dtype, and keeps the rounded values.
  void set(const std::vector<float> &x) {
    for (size_t i = 0; i < x.size(); ++i)
      encode(dtype, x[i], &bytes[i * dtypeSize(dtype)]);
    TensorView view{bytes.data(), dtype, shape};
    loadF32(view, values.data());
  }
  TensorView f32View() { return TensorView{values.data(), DType::F32, shape}; }
};

/// Uniform values in [lo, hi), none near zero.
HostTensor randomTensor(std::mt19937 &rng, DType dtype, const Shape &shape, float lo, float hi) {
  HostTensor t(dtype, shape);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> x(t.values.size());
  for (float &v : x) {
    do
      v = dist(rng);
    while (std::fabs(v) < 1e-3f * (hi - lo));
  }
  t.set(x);
  return t;
}

/// Device memory for one tensor, freed on scope exit.
class DeviceTensor {
public:
  DeviceTensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
    bytes_ = size_t(numelOf(shape_)) * dtypeSize(dtype_);
    if (cudaMalloc(&data_, std::max<size_t>(bytes_, 16)) != cudaSuccess)
      data_ = nullptr;
  }
  ~DeviceTensor() { cudaFree(data_); }
  DeviceTensor(const DeviceTensor &) = delete;
  DeviceTensor &operator=(const DeviceTensor &) = delete;

  bool ok() const { return data_ != nullptr; }
  TensorView view() const { return TensorView{data_, dtype_, shape_}; }
  size_t bytes() const { return bytes_; }
  void *data() const { return data_; }

  bool upload(const HostTensor &t) {
    return cudaMemcpy(data_, t.bytes.data(), bytes_, cudaMemcpyHostToDevice) == cudaSuccess;
  }
  /// Fills every element with a NaN of the dtype, so unwritten elements show.
  bool poison() {
    std::vector<uint8_t> nan(bytes_);
    for (size_t i = 0; i < bytes_; i += dtypeSize(dtype_))
      encode(dtype_, std::numeric_limits<float>::quiet_NaN(), &nan[i]);
    return cudaMemcpy(data_, nan.data(), bytes_, cudaMemcpyHostToDevice) == cudaSuccess;
  }
  std::vector<uint8_t> downloadBytes() const {
    std::vector<uint8_t> out(bytes_);
    if (cudaMemcpy(out.data(), data_, bytes_, cudaMemcpyDeviceToHost) != cudaSuccess)
      out.clear();
    return out;
  }
  /// The stored values as f32 (exact).
  std::vector<float> download() const {
    std::vector<uint8_t> raw = downloadBytes();
    std::vector<float> out(size_t(numelOf(shape_)));
    if (raw.size() != bytes_)
      return {};
    TensorView view{raw.data(), dtype_, shape_};
    loadF32(view, out.data());
    return out;
  }

private:
  DType dtype_;
  Shape shape_;
  size_t bytes_ = 0;
  void *data_ = nullptr;
};

/// Allowed error per element: max(abs * max|expected|, zero) + rel * |expected|; and in norm,
/// ||got - expected|| / ||expected|| <= norm (or ||got|| <= norm when expected is all zeros).
/// `zero` is the rounding noise of a result that is mathematically zero: with one key, p = 1 and
/// D_i = dO_i . o_i = dO_i . v_0 = dp_i0, so dq and dk vanish and the kernels return sums of
/// rounding errors of terms of order one.
struct Tol {
  double abs, rel, norm, zero;
};
constexpr Tol kF32Tol{1e-5, 1e-4, 2e-5, 1e-5};
constexpr Tol kHalfTol{1e-2, 2e-2, 1e-2, 1e-4};

Tol tolFor(DType dtype) { return dtype == DType::F32 ? kF32Tol : kHalfTol; }

/// Compares every element; reports the first few mismatches with their multi-index.
template <typename Ref>
void expectClose(const std::vector<float> &got, const std::vector<Ref> &expected,
                 const Shape &shape, Tol tol, const std::string &what) {
  ASSERT_EQ(got.size(), expected.size()) << what << ": output not read back";
  double maxAbs = 0, errNorm = 0, refNorm = 0;
  for (Ref e : expected)
    maxAbs = std::max(maxAbs, std::fabs(double(e)));
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double g = got[i], e = double(expected[i]), err = std::fabs(g - e);
    errNorm += err * err;
    refNorm += e * e;
    if (!(err <= std::max(tol.abs * maxAbs, tol.zero) + tol.rel * std::fabs(e)) &&
        ++failures <= 5) {
      std::string index;
      int64_t flat = int64_t(i);
      for (size_t k = shape.size(); k-- > 0;) {
        index = std::to_string(flat % shape[k]) + (index.empty() ? "" : ", ") + index;
        flat /= shape[k];
      }
      ADD_FAILURE() << what << " at [" << index << "]: got " << g << ", expected " << e
                    << " (max |expected| " << maxAbs << ")";
    }
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << got.size()
                         << " elements out of tolerance";
  double rel = refNorm > 0 ? std::sqrt(errNorm / refNorm) : std::sqrt(errNorm);
  EXPECT_LE(rel, tol.norm) << what << ": relative error in norm";
}

/// Naive fp64 attention and its gradients, straight from the definitions.
struct NaiveResult {
  std::vector<double> o, dq, dk, dv;
};

NaiveResult naiveAttention(const std::vector<float> &q, const std::vector<float> &k,
                           const std::vector<float> &v, const std::vector<float> &o,
                           const std::vector<float> &dout, int64_t batch, int64_t seq,
                           int64_t heads, int64_t kvHeads, int64_t d, bool causal, double scale) {
  NaiveResult r;
  r.o.assign(q.size(), 0.0);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(k.size(), 0.0);
  int64_t group = heads / kvHeads;
  auto qi = [&](int64_t b, int64_t i, int64_t h) { return ((b * seq + i) * heads + h) * d; };
  auto kj = [&](int64_t b, int64_t j, int64_t g) { return ((b * seq + j) * kvHeads + g) * d; };
  std::vector<double> p(static_cast<size_t>(seq));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < seq; ++i) {
        int64_t g = h / group;
        double sum = 0;
        for (int64_t j = 0; j < seq; ++j) {
          p[size_t(j)] = 0;
          if (causal && j > i)
            continue;
          double s = 0;
          for (int64_t e = 0; e < d; ++e)
            s += double(q[size_t(qi(b, i, h) + e)]) * double(k[size_t(kj(b, j, g) + e)]);
          sum += p[size_t(j)] = std::exp(scale * s);
        }
        double rowDot = 0; // D_i from the given o, as the kernels define it
        for (int64_t e = 0; e < d; ++e)
          rowDot += double(dout[size_t(qi(b, i, h) + e)]) * double(o[size_t(qi(b, i, h) + e)]);
        for (int64_t j = 0; j < seq; ++j) {
          double pj = p[size_t(j)] / sum, dpj = 0;
          for (int64_t e = 0; e < d; ++e) {
            r.o[size_t(qi(b, i, h) + e)] += pj * double(v[size_t(kj(b, j, g) + e)]);
            dpj += double(dout[size_t(qi(b, i, h) + e)]) * double(v[size_t(kj(b, j, g) + e)]);
          }
          double ds = pj * (dpj - rowDot);
          for (int64_t e = 0; e < d; ++e) {
            r.dq[size_t(qi(b, i, h) + e)] += scale * ds * double(k[size_t(kj(b, j, g) + e)]);
            r.dk[size_t(kj(b, j, g) + e)] += scale * ds * double(q[size_t(qi(b, i, h) + e)]);
            r.dv[size_t(kj(b, j, g) + e)] += pj * double(dout[size_t(qi(b, i, h) + e)]);
          }
        }
      }
  return r;
}

std::string dtypeTag(DType dtype) { return dtypeName(dtype); }

/// One attention problem on the host and on the device, with the CPU references.
struct Problem {
  Shape qShape, kShape;
  HostTensor q, k, v, dout, o; ///< o: the CPU forward output rounded to the dtype
  std::vector<float> refO, refDq, refDk, refDv;
  bool causal;
  double scale;
};

Problem makeProblem(DType dtype, int64_t batch, int64_t seq, int64_t heads, int64_t kvHeads,
                    int64_t d, bool causal, uint32_t seed) {
  std::mt19937 rng(seed);
  Shape qShape{batch, seq, heads, d}, kShape{batch, seq, kvHeads, d};
  // q and k in [-2, 2): scaled scores with a spread of about 1.3, a peaked softmax.
  Problem p{qShape,
            kShape,
            randomTensor(rng, dtype, qShape, -2.f, 2.f),
            randomTensor(rng, dtype, kShape, -2.f, 2.f),
            randomTensor(rng, dtype, kShape, -1.f, 1.f),
            randomTensor(rng, dtype, qShape, -1.f, 1.f),
            HostTensor(dtype, qShape),
            {},
            {},
            {},
            {},
            causal,
            1.0 / std::sqrt(double(d))};
  p.refO.resize(size_t(numelOf(qShape)));
  TensorView refO{p.refO.data(), DType::F32, qShape};
  cpu::attention(p.q.f32View(), p.k.f32View(), p.v.f32View(), causal, p.scale, refO);
  p.o.set(p.refO);
  p.refDq.resize(size_t(numelOf(qShape)));
  p.refDk.resize(size_t(numelOf(kShape)));
  p.refDv.resize(size_t(numelOf(kShape)));
  cpu::attentionGrad(p.dout.f32View(), p.q.f32View(), p.k.f32View(), p.v.f32View(), p.o.f32View(),
                     causal, p.scale, TensorView{p.refDq.data(), DType::F32, qShape},
                     TensorView{p.refDk.data(), DType::F32, kShape},
                     TensorView{p.refDv.data(), DType::F32, kShape});
  return p;
}

/// The device results of one forward and one backward call.
struct DeviceRun {
  std::vector<uint8_t> o, dq, dk, dv;
};

/// Uploads the problem, poisons the outputs, runs both kernels on a fresh stream.
void runOnDevice(const Problem &p, DeviceRun &out, std::vector<float> *o = nullptr,
                 std::vector<float> *dq = nullptr, std::vector<float> *dk = nullptr,
                 std::vector<float> *dv = nullptr) {
  DType dtype = p.q.dtype;
  DeviceTensor q(dtype, p.qShape), k(dtype, p.kShape), v(dtype, p.kShape), dout(dtype, p.qShape),
      oIn(dtype, p.qShape), oOut(dtype, p.qShape), dqOut(dtype, p.qShape), dkOut(dtype, p.kShape),
      dvOut(dtype, p.kShape);
  for (DeviceTensor *t : {&q, &k, &v, &dout, &oIn, &oOut, &dqOut, &dkOut, &dvOut})
    ASSERT_TRUE(t->ok()) << "cudaMalloc";
  ASSERT_TRUE(q.upload(p.q) && k.upload(p.k) && v.upload(p.v) && dout.upload(p.dout) &&
              oIn.upload(p.o));
  ASSERT_TRUE(oOut.poison() && dqOut.poison() && dkOut.poison() && dvOut.poison());
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreate(&stream));
  cuda::Context ctx;
  ctx.stream = stream;
  cuda::attention(ctx, q.view(), k.view(), v.view(), p.causal, p.scale, oOut.view());
  // The backward gets the CPU forward output, as the references do.
  cuda::attentionGrad(ctx, dout.view(), q.view(), k.view(), v.view(), oIn.view(), p.causal, p.scale,
                      dqOut.view(), dkOut.view(), dvOut.view());
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamDestroy(stream));
  out.o = oOut.downloadBytes();
  out.dq = dqOut.downloadBytes();
  out.dk = dkOut.downloadBytes();
  out.dv = dvOut.downloadBytes();
  if (o)
    *o = oOut.download();
  if (dq)
    *dq = dqOut.download();
  if (dk)
    *dk = dkOut.download();
  if (dv)
    *dv = dvOut.download();
}

} // namespace

//===----------------------------------------------------------------------===//
// Every output element against the CPU kernels
//===----------------------------------------------------------------------===//

/// (dtype, head dim, sequence length, GQA ratio H / Hkv, causal)
using AttentionParam = std::tuple<DType, int, int, int, bool>;

class CudaAttentionTest : public ::testing::TestWithParam<AttentionParam> {};

TEST_P(CudaAttentionTest, MatchesCpu) {
  BONSAI_SKIP_WITHOUT_GPU();
  auto [dtype, d, seq, ratio, causal] = GetParam();
  const int64_t batch = 2, heads = 8, kvHeads = heads / ratio;
  uint32_t seed =
      uint32_t(d * 100003 + seq * 1009 + ratio * 17 + (causal ? 1 : 0) + int(dtype) * 7);
  Problem p = makeProblem(dtype, batch, seq, heads, kvHeads, d, causal, seed);
  DeviceRun run;
  std::vector<float> o, dq, dk, dv;
  runOnDevice(p, run, &o, &dq, &dk, &dv);
  if (HasFatalFailure())
    return;
  Tol tol = tolFor(dtype);
  expectClose(o, p.refO, p.qShape, tol, "o");
  expectClose(dq, p.refDq, p.qShape, tol, "dq");
  expectClose(dk, p.refDk, p.kShape, tol, "dk");
  expectClose(dv, p.refDv, p.kShape, tol, "dv");

  // The naive fp64 reference agrees with both on the short sequences.
  if (seq <= 17) {
    NaiveResult naive =
        naiveAttention(p.q.values, p.k.values, p.v.values, p.o.values, p.dout.values, batch, seq,
                       heads, kvHeads, d, causal, p.scale);
    expectClose(p.refO, naive.o, p.qShape, kF32Tol, "cpu o vs naive");
    expectClose(p.refDq, naive.dq, p.qShape, kF32Tol, "cpu dq vs naive");
    expectClose(p.refDk, naive.dk, p.kShape, kF32Tol, "cpu dk vs naive");
    expectClose(p.refDv, naive.dv, p.kShape, kF32Tol, "cpu dv vs naive");
    expectClose(o, naive.o, p.qShape, tol, "o vs naive");
    expectClose(dq, naive.dq, p.qShape, tol, "dq vs naive");
    expectClose(dk, naive.dk, p.kShape, tol, "dk vs naive");
    expectClose(dv, naive.dv, p.kShape, tol, "dv vs naive");
  }
}

std::string attentionParamName(const ::testing::TestParamInfo<AttentionParam> &info) {
  auto [dtype, d, seq, ratio, causal] = info.param;
  return dtypeTag(dtype) + "_D" + std::to_string(d) + "_S" + std::to_string(seq) + "_G" +
         std::to_string(ratio) + (causal ? "_causal" : "_full");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionTest,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16, DType::F16),
                                            ::testing::Values(64, 128, 40),
                                            ::testing::Values(1, 17, 128, 257),
                                            ::testing::Values(1, 4, 8), ::testing::Bool()),
                         attentionParamName);

// Head dims the tensor-core kernels do not take (not a multiple of 8, above 128): the generic
// path, for every storage type.
INSTANTIATE_TEST_SUITE_P(GenericHeadDims, CudaAttentionTest,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16),
                                            ::testing::Values(12, 160), ::testing::Values(33),
                                            ::testing::Values(1, 4), ::testing::Bool()),
                         attentionParamName);

//===----------------------------------------------------------------------===//
// Determinism, operand errors, timing
//===----------------------------------------------------------------------===//

TEST(CudaAttention, RunsAreBitIdentical) {
  BONSAI_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::BF16, DType::F32}) {
    for (bool causal : {true, false}) {
      Problem p = makeProblem(dtype, 2, 257, 8, 2, dtype == DType::F32 ? 40 : 128, causal, 77);
      DeviceRun first, second;
      runOnDevice(p, first);
      runOnDevice(p, second);
      if (HasFatalFailure())
        return;
      std::string what = dtypeTag(dtype) + (causal ? " causal" : " full");
      EXPECT_TRUE(first.o == second.o) << what << ": o differs between runs";
      EXPECT_TRUE(first.dq == second.dq) << what << ": dq differs between runs";
      EXPECT_TRUE(first.dk == second.dk) << what << ": dk differs between runs";
      EXPECT_TRUE(first.dv == second.dv) << what << ": dv differs between runs";
    }
  }
}

TEST(CudaAttention, RejectsBadOperands) {
  // The checks run before any CUDA call, so this needs no GPU; the pointers are never read.
  alignas(16) static uint8_t storage[4096];
  cuda::Context ctx;
  auto view = [&](size_t offset, Shape shape, DType dtype = DType::BF16) {
    return TensorView{storage + offset, dtype, std::move(shape)};
  };
  TensorView q = view(0, {1, 4, 4, 8}), k = view(1024, {1, 4, 3, 8}), v = view(2048, {1, 4, 3, 8});
  TensorView o = view(3072, {1, 4, 4, 8});
  // 3 kv heads do not divide 4 query heads.
  EXPECT_THROW(cuda::attention(ctx, q, k, v, true, 0.5, o), Error);
  TensorView k2 = view(1024, {1, 4, 2, 8}), v2 = view(2048, {1, 4, 2, 8});
  // An output overlapping an input.
  EXPECT_THROW(cuda::attention(ctx, q, k2, v2, true, 0.5, view(64, {1, 4, 4, 8})), Error);
  // Integer storage.
  EXPECT_THROW(cuda::attention(ctx, view(0, {1, 4, 4, 8}, DType::I32), k2, v2, true, 0.5, o),
               Error);
  // dk with the shape of q.
  EXPECT_THROW(cuda::attentionGrad(ctx, o, q, k2, v2, o, true, 0.5, view(0, {1, 4, 4, 8}),
                                   view(1024, {1, 4, 4, 8}), v2),
               Error);
}

//===----------------------------------------------------------------------===//
// flashAttention and flashAttentionGrad: the log-sum-exp out of the forward, into the backward
//===----------------------------------------------------------------------===//

namespace {

/// The CPU references of the flash kernels for problem `p`: the log-sum-exp of
/// cpu::flashAttention (its o is p.refO, bit for bit) and the gradients cpu::flashAttentionGrad
/// forms from it.
struct FlashReference {
  Shape lseShape;
  std::vector<float> lse, dq, dk, dv;
};

FlashReference flashReference(Problem &p) {
  FlashReference r;
  r.lseShape = {p.qShape[0], p.qShape[2], p.qShape[1]};
  r.lse.resize(size_t(numelOf(r.lseShape)));
  std::vector<float> o(p.refO.size());
  cpu::flashAttention(p.q.f32View(), p.k.f32View(), p.v.f32View(), p.causal, p.scale,
                      TensorView{o.data(), DType::F32, p.qShape},
                      TensorView{r.lse.data(), DType::F32, r.lseShape});
  EXPECT_TRUE(o == p.refO) << "cpu::flashAttention's o is not cpu::attention's";
  r.dq.resize(p.refDq.size());
  r.dk.resize(p.refDk.size());
  r.dv.resize(p.refDv.size());
  cpu::flashAttentionGrad(p.dout.f32View(), p.q.f32View(), p.k.f32View(), p.v.f32View(),
                          p.o.f32View(), TensorView{r.lse.data(), DType::F32, r.lseShape},
                          p.causal, p.scale, TensorView{r.dq.data(), DType::F32, p.qShape},
                          TensorView{r.dk.data(), DType::F32, p.kShape},
                          TensorView{r.dv.data(), DType::F32, p.kShape});
  return r;
}

/// The device results of one flashAttention and one flashAttentionGrad call.
struct FlashRun {
  std::vector<uint8_t> o, lse, dq, dk, dv;
};

/// Uploads the problem, poisons the outputs, runs flashAttention, then flashAttentionGrad with
/// the CPU's o and log-sum-exp (as the references get them), under Context::deterministic.
void runFlashOnDevice(const Problem &p, const FlashReference &ref, FlashRun &out,
                      bool deterministic = true) {
  DType dtype = p.q.dtype;
  DeviceTensor q(dtype, p.qShape), k(dtype, p.kShape), v(dtype, p.kShape), dout(dtype, p.qShape),
      oIn(dtype, p.qShape), oOut(dtype, p.qShape), lseIn(DType::F32, ref.lseShape),
      lseOut(DType::F32, ref.lseShape), dqOut(dtype, p.qShape), dkOut(dtype, p.kShape),
      dvOut(dtype, p.kShape);
  for (DeviceTensor *t : {&q, &k, &v, &dout, &oIn, &oOut, &lseIn, &lseOut, &dqOut, &dkOut, &dvOut})
    ASSERT_TRUE(t->ok()) << "cudaMalloc";
  HostTensor lseHost(DType::F32, ref.lseShape);
  lseHost.set(ref.lse);
  ASSERT_TRUE(q.upload(p.q) && k.upload(p.k) && v.upload(p.v) && dout.upload(p.dout) &&
              oIn.upload(p.o) && lseIn.upload(lseHost));
  ASSERT_TRUE(oOut.poison() && lseOut.poison() && dqOut.poison() && dkOut.poison() &&
              dvOut.poison());
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreate(&stream));
  cuda::Context ctx;
  ctx.stream = stream;
  ctx.deterministic = deterministic;
  cuda::flashAttention(ctx, q.view(), k.view(), v.view(), p.causal, p.scale, oOut.view(),
                       lseOut.view());
  cuda::flashAttentionGrad(ctx, dout.view(), q.view(), k.view(), v.view(), oIn.view(),
                           lseIn.view(), p.causal, p.scale, dqOut.view(), dkOut.view(),
                           dvOut.view());
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamDestroy(stream));
  out.o = oOut.downloadBytes();
  out.lse = lseOut.downloadBytes();
  out.dq = dqOut.downloadBytes();
  out.dk = dkOut.downloadBytes();
  out.dv = dvOut.downloadBytes();
}

/// Stored bytes of `dtype` as f32 values.
std::vector<float> valuesOf(const std::vector<uint8_t> &bytes, DType dtype, const Shape &shape) {
  std::vector<float> out(size_t(numelOf(shape)));
  if (bytes.size() != out.size() * dtypeSize(dtype))
    return {};
  std::vector<uint8_t> copy = bytes;
  loadF32(TensorView{copy.data(), dtype, shape}, out.data());
  return out;
}

/// The log-sum-exp is an fp32 statistic of exact inputs on every path: the scores are fp32
/// sums, the exponentials and logarithm fast approximations with errors of a few 2^-22.
constexpr Tol kLseTol{1e-5, 1e-5, 1e-5, 1e-5};

} // namespace

class CudaAttentionLseTest : public ::testing::TestWithParam<AttentionParam> {};

TEST_P(CudaAttentionLseTest, MatchesCpu) {
  BONSAI_SKIP_WITHOUT_GPU();
  auto [dtype, d, seq, ratio, causal] = GetParam();
  const int64_t batch = 2, heads = 8, kvHeads = heads / ratio;
  uint32_t seed =
      uint32_t(d * 100019 + seq * 1013 + ratio * 19 + (causal ? 1 : 0) + int(dtype) * 11);
  Problem p = makeProblem(dtype, batch, seq, heads, kvHeads, d, causal, seed);
  FlashReference ref = flashReference(p);
  FlashRun flash;
  runFlashOnDevice(p, ref, flash);
  DeviceRun plain;
  runOnDevice(p, plain);
  if (HasFatalFailure())
    return;
  // The same forward kernel with one more store: o is attention's, bit for bit.
  EXPECT_TRUE(flash.o == plain.o) << "flashAttention's o differs from attention's";
  Tol tol = tolFor(dtype);
  expectClose(valuesOf(flash.lse, DType::F32, ref.lseShape), ref.lse, ref.lseShape, kLseTol,
              "lse");
  expectClose(valuesOf(flash.dq, dtype, p.qShape), ref.dq, p.qShape, tol, "dq");
  expectClose(valuesOf(flash.dk, dtype, p.kShape), ref.dk, p.kShape, tol, "dk");
  expectClose(valuesOf(flash.dv, dtype, p.kShape), ref.dv, p.kShape, tol, "dv");
  // And the gradients from the saved lse are those of attentionGrad, which recomputes it.
  expectClose(valuesOf(flash.dq, dtype, p.qShape), p.refDq, p.qShape, tol, "dq vs attentionGrad");
  expectClose(valuesOf(flash.dv, dtype, p.kShape), p.refDv, p.kShape, tol, "dv vs attentionGrad");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionLseTest,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16, DType::F16),
                                            ::testing::Values(64, 128, 40, 12),
                                            ::testing::Values(1, 17, 257),
                                            ::testing::Values(1, 4), ::testing::Bool()),
                         attentionParamName);

// The tensor-core kernels start their blocks in chunks of 8 (batch, head) groups, tile-major
// within a chunk (tileOf in Attention.cu): 3 x 4 = 12 query-head groups and 12 or 3 kv-head
// groups leave a last chunk narrower than the others, which the shapes above (16, 4 and 2 groups)
// never do. Both the plain and the flash kernels, causal and not.
TEST(CudaAttention, GroupsBeyondOneOrderChunk) {
  BONSAI_SKIP_WITHOUT_GPU();
  for (int64_t kvHeads : {4, 1}) {
    for (bool causal : {true, false}) {
      Problem p = makeProblem(DType::BF16, 3, 257, 4, kvHeads, 64, causal,
                              uint32_t(91 + kvHeads * 2 + (causal ? 1 : 0)));
      DeviceRun plain;
      std::vector<float> o, dq, dk, dv;
      runOnDevice(p, plain, &o, &dq, &dk, &dv);
      FlashReference ref = flashReference(p);
      FlashRun flash;
      runFlashOnDevice(p, ref, flash);
      if (HasFatalFailure())
        return;
      SCOPED_TRACE(std::to_string(kvHeads) + " kv heads" + (causal ? ", causal" : ", full"));
      EXPECT_TRUE(flash.o == plain.o) << "flashAttention's o differs from attention's";
      Tol tol = tolFor(DType::BF16);
      expectClose(o, p.refO, p.qShape, tol, "o");
      expectClose(dq, p.refDq, p.qShape, tol, "dq");
      expectClose(dk, p.refDk, p.kShape, tol, "dk");
      expectClose(dv, p.refDv, p.kShape, tol, "dv");
      expectClose(valuesOf(flash.dq, DType::BF16, p.qShape), ref.dq, p.qShape, tol, "flash dq");
      expectClose(valuesOf(flash.dk, DType::BF16, p.kShape), ref.dk, p.kShape, tol, "flash dk");
      expectClose(valuesOf(flash.dv, DType::BF16, p.kShape), ref.dv, p.kShape, tol, "flash dv");
    }
  }
}

// Context::deterministic off: on Hopper, bf16 at head dim 64 and 128 forms dq in the dk/dv pass,
// adding it into f32 sums in the order the key blocks run (other paths ignore the flag). dk and
// dv come out of the same arithmetic as the deterministic path's, bit for bit (the row
// statistics are summed as the dq kernel sums them); dq is held to the same tolerance against
// the CPU.
class CudaAttentionReducingDqTest : public ::testing::TestWithParam<AttentionParam> {};

TEST_P(CudaAttentionReducingDqTest, MatchesCpuAndDeterministicPath) {
  BONSAI_SKIP_WITHOUT_GPU();
  auto [dtype, d, seq, ratio, causal] = GetParam();
  const int64_t batch = 2, heads = 8, kvHeads = heads / ratio;
  Problem p = makeProblem(dtype, batch, seq, heads, kvHeads, d, causal,
                          uint32_t(d * 7919 + seq * 31 + ratio * 5 + (causal ? 1 : 0)));
  FlashReference ref = flashReference(p);
  FlashRun fixed, reduced;
  runFlashOnDevice(p, ref, fixed, /*deterministic=*/true);
  runFlashOnDevice(p, ref, reduced, /*deterministic=*/false);
  if (HasFatalFailure())
    return;
  EXPECT_TRUE(reduced.dk == fixed.dk) << "dk differs from the deterministic path's";
  EXPECT_TRUE(reduced.dv == fixed.dv) << "dv differs from the deterministic path's";
  Tol tol = tolFor(dtype);
  expectClose(valuesOf(reduced.dq, dtype, p.qShape), ref.dq, p.qShape, tol, "dq");
  expectClose(valuesOf(reduced.dk, dtype, p.kShape), ref.dk, p.kShape, tol, "dk");
  expectClose(valuesOf(reduced.dv, dtype, p.kShape), ref.dv, p.kShape, tol, "dv");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionReducingDqTest,
                         ::testing::Combine(::testing::Values(DType::BF16, DType::F16),
                                            ::testing::Values(64, 128),
                                            ::testing::Values(1, 17, 257, 300),
                                            ::testing::Values(1, 4), ::testing::Bool()),
                         attentionParamName);

// flashAttentionQkv and flashAttentionQkvGrad: q, k and v read out of one packed tensor and
// their gradients written into one. The kernels are those of flashAttention and
// flashAttentionGrad with other row strides, so every output equals theirs bit for bit on every
// path (the warpgroup, mma.sync and generic kernels), but dq with Context::deterministic off,
// whose reducing pass sums in an order that differs from run to run (held to the CPU then).

namespace {

/// Joins the heads of `parts` ([B, S, heads_i, D] bytes of one dtype) position by position into
/// [B, S, sum heads_i, D].
std::vector<uint8_t> packHeads(const std::vector<const std::vector<uint8_t> *> &parts,
                               const std::vector<int64_t> &heads, int64_t positions, size_t unit) {
  int64_t width = 0;
  for (int64_t h : heads)
    width += h;
  std::vector<uint8_t> packed(size_t(positions * width) * unit);
  int64_t first = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const size_t bytes = size_t(heads[i]) * unit;
    for (int64_t pos = 0; pos < positions; ++pos)
      std::memcpy(&packed[(size_t(pos * width + first)) * unit], &(*parts[i])[size_t(pos) * bytes],
                  bytes);
    first += heads[i];
  }
  return packed;
}

/// The inverse of packHeads: the heads of `packed` split position by position into `parts`.
void unpackHeads(const std::vector<uint8_t> &packed,
                 const std::vector<std::vector<uint8_t> *> &parts,
                 const std::vector<int64_t> &heads, int64_t positions, size_t unit) {
  int64_t width = 0;
  for (int64_t h : heads)
    width += h;
  if (packed.size() != size_t(positions * width) * unit)
    return; // a failed download: the parts stay empty and the comparisons fail
  int64_t first = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const size_t bytes = size_t(heads[i]) * unit;
    parts[i]->resize(size_t(positions) * bytes);
    for (int64_t pos = 0; pos < positions; ++pos)
      std::memcpy(&(*parts[i])[size_t(pos) * bytes], &packed[size_t(pos * width + first) * unit],
                  bytes);
    first += heads[i];
  }
}

} // namespace

using PackedParam = std::tuple<DType, int, int, int, bool, bool>;

std::string packedParamName(const ::testing::TestParamInfo<PackedParam> &info) {
  const auto &[dtype, d, seq, ratio, causal, deterministic] = info.param;
  return std::string(dtypeName(dtype)) + "_D" + std::to_string(d) + "_S" + std::to_string(seq) +
         "_G" + std::to_string(ratio) + (causal ? "_causal" : "_full") +
         (deterministic ? "" : "_nd");
}

class CudaAttentionPackedTest : public ::testing::TestWithParam<PackedParam> {};

TEST_P(CudaAttentionPackedTest, EqualsSeparateTensorsBitForBit) {
  BONSAI_SKIP_WITHOUT_GPU();
  auto [dtype, d, seq, ratio, causal, deterministic] = GetParam();
  const int64_t batch = 2, heads = 8, kvHeads = heads / ratio, positions = batch * seq;
  Problem p = makeProblem(dtype, batch, seq, heads, kvHeads, d, causal,
                          uint32_t(d * 613 + seq * 7 + ratio * 3 + (causal ? 1 : 0)));
  FlashReference ref = flashReference(p);
  FlashRun apart;
  runFlashOnDevice(p, ref, apart, deterministic);
  if (HasFatalFailure())
    return;

  const size_t unit = size_t(d) * dtypeSize(dtype);
  const Shape qkvShape{batch, seq, heads + 2 * kvHeads, d};
  HostTensor qkvHost(dtype, qkvShape), lseHost(DType::F32, ref.lseShape);
  qkvHost.bytes =
      packHeads({&p.q.bytes, &p.k.bytes, &p.v.bytes}, {heads, kvHeads, kvHeads}, positions, unit);
  lseHost.set(ref.lse);
  DeviceTensor qkv(dtype, qkvShape), dout(dtype, p.qShape), oIn(dtype, p.qShape),
      lseIn(DType::F32, ref.lseShape), oOut(dtype, p.qShape), lseOut(DType::F32, ref.lseShape),
      dqkv(dtype, qkvShape);
  for (DeviceTensor *t : {&qkv, &dout, &oIn, &lseIn, &oOut, &lseOut, &dqkv})
    ASSERT_TRUE(t->ok()) << "cudaMalloc";
  ASSERT_TRUE(qkv.upload(qkvHost) && dout.upload(p.dout) && oIn.upload(p.o) &&
              lseIn.upload(lseHost));
  ASSERT_TRUE(oOut.poison() && lseOut.poison() && dqkv.poison());
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreate(&stream));
  cuda::Context ctx;
  ctx.stream = stream;
  ctx.deterministic = deterministic;
  cuda::flashAttentionQkv(ctx, qkv.view(), p.causal, p.scale, oOut.view(), lseOut.view());
  cuda::flashAttentionQkvGrad(ctx, dout.view(), qkv.view(), oIn.view(), lseIn.view(), p.causal,
                              p.scale, dqkv.view());
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamDestroy(stream));

  EXPECT_TRUE(oOut.downloadBytes() == apart.o) << "o differs from flashAttention's";
  EXPECT_TRUE(lseOut.downloadBytes() == apart.lse) << "lse differs from flashAttention's";
  std::vector<uint8_t> dq, dk, dv;
  unpackHeads(dqkv.downloadBytes(), {&dq, &dk, &dv}, {heads, kvHeads, kvHeads}, positions, unit);
  EXPECT_TRUE(dk == apart.dk) << "dk differs from flashAttentionGrad's";
  EXPECT_TRUE(dv == apart.dv) << "dv differs from flashAttentionGrad's";
  if (deterministic) {
    EXPECT_TRUE(dq == apart.dq) << "dq differs from flashAttentionGrad's";
  } else {
    // The reducing pass adds each dq tile's sums in the order the key blocks finish, which
    // differs from run to run (docs/cuda.md): dq is held to the CPU as in the other tests.
    expectClose(valuesOf(dq, dtype, p.qShape), ref.dq, p.qShape, tolFor(dtype), "dq");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionPackedTest,
                         ::testing::Combine(::testing::Values(DType::BF16, DType::F32),
                                            ::testing::Values(64, 128, 40),
                                            ::testing::Values(17, 257), ::testing::Values(1, 4),
                                            ::testing::Bool(), ::testing::Bool()),
                         packedParamName);

TEST(CudaAttentionPacked, RejectsQkvThatDoesNotPackTheHeads) {
  BONSAI_SKIP_WITHOUT_GPU();
  // o has 4 heads: 4 + 2 KV must be the packed width with KV dividing 4.
  DeviceTensor qkv(DType::BF16, {1, 8, 7, 64}), o(DType::BF16, {1, 8, 4, 64}),
      lse(DType::F32, {1, 4, 8});
  ASSERT_TRUE(qkv.ok() && o.ok() && lse.ok());
  cuda::Context ctx;
  try {
    cuda::flashAttentionQkv(ctx, qkv.view(), true, 0.125, o.view(), lse.view());
    ADD_FAILURE() << "no error for a packed width of 7 against 4 query heads";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("does not hold 4 query heads"), std::string::npos)
        << e.what();
  }
}

TEST(CudaAttentionLse, RunsAreBitIdentical) {
  BONSAI_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::BF16, DType::F32}) {
    Problem p = makeProblem(dtype, 2, 257, 8, 2, dtype == DType::F32 ? 40 : 128, true, 78);
    FlashReference ref = flashReference(p);
    FlashRun first, second;
    runFlashOnDevice(p, ref, first);
    runFlashOnDevice(p, ref, second);
    if (HasFatalFailure())
      return;
    std::string what = dtypeTag(dtype);
    EXPECT_TRUE(first.o == second.o) << what << ": o differs between runs";
    EXPECT_TRUE(first.lse == second.lse) << what << ": lse differs between runs";
    EXPECT_TRUE(first.dq == second.dq) << what << ": dq differs between runs";
    EXPECT_TRUE(first.dk == second.dk) << what << ": dk differs between runs";
    EXPECT_TRUE(first.dv == second.dv) << what << ": dv differs between runs";
  }
}

TEST(CudaAttentionLse, RejectsBadLogSumExp) {
  // The checks run before any CUDA call, so this needs no GPU; the pointers are never read.
  alignas(16) static uint8_t storage[8192];
  cuda::Context ctx;
  auto view = [&](size_t offset, Shape shape, DType dtype = DType::BF16) {
    return TensorView{storage + offset, dtype, std::move(shape)};
  };
  TensorView q = view(0, {1, 4, 4, 8}), k = view(1024, {1, 4, 2, 8}), v = view(2048, {1, 4, 2, 8});
  TensorView o = view(3072, {1, 4, 4, 8}), dout = view(4096, {1, 4, 4, 8});
  TensorView dq = view(5120, {1, 4, 4, 8}), dk = view(6144, {1, 4, 2, 8}),
             dv = view(6656, {1, 4, 2, 8});
  // Not [batch, heads, seq] = [1, 4, 4].
  EXPECT_THROW(cuda::flashAttention(ctx, q, k, v, true, 0.5, o, view(7168, {1, 4, 2}, DType::F32)),
               Error);
  // bf16 storage.
  EXPECT_THROW(cuda::flashAttention(ctx, q, k, v, true, 0.5, o, view(7168, {1, 4, 4})), Error);
  // Overlapping o.
  EXPECT_THROW(cuda::flashAttention(ctx, q, k, v, true, 0.5, o, view(3072, {1, 4, 4}, DType::F32)),
               Error);
  // The grad's lse overlapping dk.
  EXPECT_THROW(cuda::flashAttentionGrad(ctx, dout, q, k, v, o, view(6144, {1, 4, 4}, DType::F32),
                                        true, 0.5, dq, dk, dv),
               Error);
}

namespace {

/// Fills a device tensor of `n` bf16 values with uniform values in [-1, 1) from a fast
/// generator (the tensors here hold 67M elements each).
bool fillRandomBf16(void *device, int64_t n, uint64_t seed) {
  std::vector<uint16_t> host(static_cast<size_t>(n));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    float u = float(x >> 40) * (1.f / float(1 << 24)); // [0, 1)
    host[size_t(i)] = f32ToBf16(2.f * u - 1.f);
  }
  return cudaMemcpy(device, host.data(), size_t(n) * 2, cudaMemcpyHostToDevice) == cudaSuccess;
}

} // namespace

TEST(CudaAttention, TimingB4H32S4096D128) {
  BONSAI_SKIP_WITHOUT_GPU();
  const int64_t batch = 4, seq = 4096, heads = 32, d = 128;
  const Shape shape{batch, seq, heads, d};
  DeviceTensor q(DType::BF16, shape), k(DType::BF16, shape), v(DType::BF16, shape),
      dout(DType::BF16, shape), o(DType::BF16, shape), dq(DType::BF16, shape),
      dk(DType::BF16, shape), dv(DType::BF16, shape);
  for (DeviceTensor *t : {&q, &k, &v, &dout, &o, &dq, &dk, &dv})
    ASSERT_TRUE(t->ok()) << "cudaMalloc";
  const int64_t n = numelOf(shape);
  ASSERT_TRUE(fillRandomBf16(q.data(), n, 1) && fillRandomBf16(k.data(), n, 2) &&
              fillRandomBf16(v.data(), n, 3) && fillRandomBf16(dout.data(), n, 4));
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  cuda::Context ctx;
  ctx.stream = stream;
  const double scale = 1.0 / std::sqrt(double(d));

  // Median milliseconds of `reps` timed runs after two warm-ups.
  auto timeMs = [&](const std::function<void()> &fn, int reps) {
    for (int i = 0; i < 2; ++i)
      fn();
    std::vector<float> ms;
    for (int i = 0; i < reps; ++i) {
      cudaEventRecord(start, stream);
      fn();
      cudaEventRecord(stop, stream);
      cudaEventSynchronize(stop);
      float t = 0;
      cudaEventElapsedTime(&t, start, stop);
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return double(ms[ms.size() / 2]);
  };

  for (bool causal : {true, false}) {
    auto forward = [&] {
      cuda::attention(ctx, q.view(), k.view(), v.view(), causal, scale, o.view());
    };
    auto backward = [&] {
      cuda::attentionGrad(ctx, dout.view(), q.view(), k.view(), v.view(), o.view(), causal, scale,
                          dq.view(), dk.view(), dv.view());
    };
    double fwdMs = timeMs(forward, 10);
    double bwdMs = timeMs(backward, 10);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    // FLOPs as FlashAttention counts them: 4 B H D S^2 for the two products, halved by the
    // causal mask (S (S + 1) / 2 pairs); the backward counts 2.5 times the forward.
    double pairs = causal ? double(seq) * double(seq + 1) / 2 : double(seq) * double(seq);
    double fwdFlops = 4.0 * batch * heads * d * pairs, bwdFlops = 2.5 * fwdFlops;
    std::printf("attention bf16 B=%lld H=%lld S=%lld D=%lld %s: forward %.3f ms %.1f TFLOP/s, "
                "backward %.3f ms %.1f TFLOP/s, forward+backward %.3f ms %.1f TFLOP/s\n",
                (long long)batch, (long long)heads, (long long)seq, (long long)d,
                causal ? "causal" : "full", fwdMs, fwdFlops / fwdMs * 1e-9, bwdMs,
                bwdFlops / bwdMs * 1e-9, fwdMs + bwdMs,
                (fwdFlops + bwdFlops) / (fwdMs + bwdMs) * 1e-9);
  }
  // The outputs of the last runs are finite (a NaN here would mean a broken kernel).
  std::vector<float> dqHost = dq.download();
  ASSERT_FALSE(dqHost.empty());
  for (size_t i = 0; i < dqHost.size(); i += 4099)
    ASSERT_TRUE(std::isfinite(dqHost[i])) << "dq element " << i;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
}

#endif // BONSAI_HAVE_CUDA
