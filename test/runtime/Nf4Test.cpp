//===- Nf4Test.cpp - NF4 quantization, the CPU and CUDA Dequantize kernels -===//
//
// The CPU quantizer is checked against properties computed independently here (the layout's
// size from the byte formula, each code the nearest level by a double-precision search, the
// absmax codes against the block maxima, determinism, bad input); bit-exactness against the
// NumPy reference of the same algorithm is test/EndToEnd/quantize.test. The CPU Dequantize
// kernel must equal dequantizeNf4 in every storage type, and the CUDA kernel must equal the
// CPU kernel bit for bit on fresh random data (ragged sizes, a tail of fewer than eight
// elements, an unaligned output), outputs poisoned with NaN first. GPU tests skip with "no GPU
// here" on a machine without one. Plans: an NF4 lm_head (the small test plan with a Dequantize
// kernel before its linear) loads, binds f32 weights and checkpoint bytes, initializes, and
// computes the loss of the f32 plan holding the dequantized weight; every malformed NF4 tensor
// or kernel is rejected at load with a message naming it.
//
//===----------------------------------------------------------------------===//

#include "TestPlans.h"

#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/Executor.h"
#include "bonsai/runtime/Nf4.h"
#include "bonsai/runtime/Safetensors.h"
#include "bonsai/runtime/Tensor.h"

#ifdef BONSAI_HAVE_CUDA
#include "CudaTestUtil.h"
#include "bonsai/runtime/CudaKernels.h"
#include <cuda_runtime_api.h>
#endif

#include "bonsai/runtime/Init.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

using namespace bonsai::rt;

namespace {

std::vector<float> randomNormal(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(n);
  for (float &v : x)
    v = normal(rng);
  return x;
}

std::vector<uint8_t> quantize(const std::vector<float> &x, uint64_t b = 64, uint64_t d = 256) {
  std::vector<uint8_t> q(nf4StorageBytes(x.size(), b, d));
  quantizeNf4(x.data(), x.size(), b, d, q.data());
  return q;
}

uint8_t codeAt(const std::vector<uint8_t> &q, size_t i) {
  return i % 2 == 0 ? q[i / 2] >> 4 : q[i / 2] & 0xf;
}

TEST(Nf4, LayoutSizes) {
  // codes, absmax codes, padding to 4, scales, offset.
  struct Case {
    uint64_t n, b, d, bytes;
  } cases[] = {
      {64, 64, 256, 32 + 1 + 3 + 4 + 4},
      {64 * 3, 64, 256, 96 + 3 + 1 + 4 + 4},
      {64 * 4, 64, 256, 128 + 4 + 0 + 4 + 4},
      {64 * 257, 64, 256, 64 * 257 / 2 + 257 + 3 + 8 + 4},
      {100, 64, 256, 50 + 2 + 0 + 4 + 4},
      {101, 16, 2, 51 + 7 + 2 + 16 + 4},
  };
  for (const Case &c : cases) {
    Nf4Layout l = nf4Layout(c.n, c.b, c.d);
    EXPECT_EQ(l.bytes, c.bytes) << c.n << " elements, block " << c.b << ", double " << c.d;
    EXPECT_EQ(l.scalesOffset % 4, 0u);
    EXPECT_EQ(nf4StorageBytes(c.n, c.b, c.d), c.bytes);
  }
  // A Llama-2-7B q_proj costs 4.127 bits per element.
  double bits = 8.0 * double(nf4StorageBytes(4096 * 4096, 64, 256)) / (4096.0 * 4096.0);
  EXPECT_NEAR(bits, 4.127, 1e-3);
  EXPECT_THROW(nf4Layout(64, 0, 256), Error);
}

TEST(Nf4, CodesAreNearestLevels) {
  const uint64_t b = 64, d = 4;
  std::vector<float> x = randomNormal(b * 37, 1, 0.05f);
  std::vector<uint8_t> q = quantize(x, b, d);
  Nf4Layout l = nf4Layout(x.size(), b, d);
  for (uint64_t k = 0; k < l.numBlocks; ++k) {
    float a = 0;
    for (uint64_t i = k * b; i < (k + 1) * b; ++i)
      a = std::max(a, std::fabs(x[i]));
    for (uint64_t i = k * b; i < (k + 1) * b; ++i) {
      // The nearest level by exact distance from fl32(x / a); ties go to the lower index.
      double v = double(x[i] / a);
      int best = 0;
      for (int c = 1; c < 16; ++c)
        if (std::fabs(v - double(kNf4Levels[c])) < std::fabs(v - double(kNf4Levels[best])))
          best = c;
      ASSERT_EQ(codeAt(q, i), best) << "element " << i << " (x/a = " << v << ")";
    }
    // The dequantized absmax is within one 8-bit step of the true one.
    float scale;
    std::memcpy(&scale, q.data() + l.scalesOffset + 4 * (k / d), 4);
    EXPECT_NEAR(nf4BlockScale(q.data(), l, k), a, scale / 127 / 2 * 1.0001) << "block " << k;
  }
}

TEST(Nf4, RoundTripDeterministicAndZeroBlocks) {
  std::vector<float> x = randomNormal(64 * 300, 2);
  std::fill(x.begin() + 64, x.begin() + 128, 0.0f); // block 1 is all zero
  std::vector<uint8_t> q1 = quantize(x), q2 = quantize(x);
  EXPECT_EQ(q1, q2);
  std::vector<float> y(x.size());
  dequantizeNf4(q1.data(), x.size(), 64, 256, y.data());
  for (size_t i = 64; i < 128; ++i)
    ASSERT_EQ(y[i], 0.0f) << i;
  for (size_t k = 0; k < x.size() / 64; ++k) {
    float a = 0;
    for (size_t i = k * 64; i < (k + 1) * 64; ++i)
      a = std::max(a, std::fabs(x[i]));
    // Half the widest level gap (0.30 between -1 and -0.70) plus the absmax's 8-bit error.
    for (size_t i = k * 64; i < (k + 1) * 64; ++i)
      ASSERT_LE(std::fabs(y[i] - x[i]), 0.16f * a + 0.02f) << i;
  }
  std::vector<uint16_t> bf(x.size());
  dequantizeNf4Bf16(q1.data(), x.size(), 64, 256, bf.data());
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(bf[i], f32ToBf16(y[i])) << i;
}

TEST(Nf4, RejectsBadInput) {
  std::vector<float> x = randomNormal(128, 3);
  x[77] = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint8_t> q(nf4StorageBytes(128, 64, 256));
  try {
    quantizeNf4(x.data(), 128, 64, 256, q.data());
    FAIL() << "a NaN was quantized";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("element 77"), std::string::npos) << e.what();
  }
  EXPECT_THROW(quantizeNf4(x.data(), 128, 63, 256, q.data()), Error);
}

TEST(Nf4, CpuDequantizeKernel) {
  std::vector<int64_t> shape = {48, 64};
  std::vector<float> x = randomNormal(48 * 64, 4, 0.02f);
  std::vector<uint8_t> q = quantize(x);
  TensorView qv{q.data(), DType::NF4, shape, 64, 256};
  EXPECT_EQ(qv.bytes(), q.size());
  std::vector<float> expected(x.size());
  dequantizeNf4(q.data(), x.size(), 64, 256, expected.data());
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    std::vector<uint8_t> out(x.size() * dtypeSize(dtype), 0xff);
    TensorView y{out.data(), dtype, shape};
    cpu::dequantize(qv, y);
    std::vector<float> got(x.size());
    loadF32(y, got.data());
    std::vector<float> want(x.size());
    std::vector<uint8_t> rounded(out.size());
    TensorView r{rounded.data(), dtype, shape};
    storeF32(expected.data(), r);
    loadF32(r, want.data());
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(got[i], want[i]) << dtypeName(dtype) << " element " << i;
  }
  TensorView wrongShape{nullptr, DType::F32, {64, 48}};
  std::vector<float> sink(48 * 64);
  wrongShape.data = sink.data();
  EXPECT_THROW(cpu::dequantize(qv, wrongShape), Error);
}

/// The small test plan with lm_head.weight (16 x 8 = 128 elements) stored as NF4 (2 blocks of
/// 64, so 66 bytes of codes and absmax codes padded to 68; groups of 1 block) and dequantized
/// into an f32 activation that the linear reads.
struct Nf4Plan {
  test::PlanSpec spec;
  uint32_t head = 2, dequantized = 0;
  size_t dequantizeKernel = 2;
};

Nf4Plan nf4PlanSpec() {
  Nf4Plan p;
  p.spec = test::smallPlanSpec();
  test::TensorSpec &head = p.spec.tensors[p.head];
  head.dtype = DType::NF4;
  head.trainable = false;
  head.quantBlock = 64;
  head.quantDoubleBlock = 1;
  head.bytes = int64_t(nf4StorageBytes(128, 64, 1));
  p.dequantized = p.spec.add("lm_head.dequantized", DType::F32, {16, 8}, TensorRole::Activation, 1);
  test::KernelSpec dequantize{KernelKind::Dequantize, {p.head}, {p.dequantized}};
  dequantize.name = "dq";
  p.spec.kernels.insert(p.spec.kernels.begin() + 2, dequantize);
  p.spec.kernels[3].inputs[1] = p.dequantized; // the linear
  return p;
}

std::string loadError(const test::PlanSpec &spec) {
  std::vector<uint8_t> bytes = test::buildPlan(spec);
  try {
    loadPlanBuffer(bytes.data(), bytes.size(), "nf4.plan");
  } catch (const Error &e) {
    return e.what();
  }
  return "";
}

void expectError(const test::PlanSpec &spec, const std::string &part) {
  std::string message = loadError(spec);
  EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: '" << message
                                                   << "'";
}

TEST(Nf4Plan, LoadsAndRejectsMalformedTensorsAndKernels) {
  ASSERT_EQ(loadError(nf4PlanSpec().spec), "");
  Nf4Plan p = nf4PlanSpec();
  p.spec.tensors[p.head].bytes += 4;
  expectError(p.spec, "tensor 2 'lm_head.weight' bytes: expected 80 ([16, 8] nf4 layout), got 84");
  p = nf4PlanSpec();
  p.spec.tensors[p.head].quantBlock = 24;
  expectError(p.spec, "is nf4 with block size 24: expected a power of two in [16, 4096]");
  p = nf4PlanSpec();
  p.spec.tensors[p.head].quantDoubleBlock = 0;
  expectError(p.spec, "is nf4 with double-quantization block 0");
  p = nf4PlanSpec();
  p.spec.tensors[p.head].trainable = true;
  expectError(p.spec, "is a trainable nf4 parameter: NF4 weights are frozen");
  p = nf4PlanSpec();
  p.spec.tensors[p.head].offset += 2;
  expectError(p.spec, "is not a multiple of 4, which the f32 scales of its nf4 layout need");
  p = nf4PlanSpec();
  p.spec.tensors[1].quantBlock = 64;
  expectError(p.spec, "tensor 1 'model.norm.weight' is f32 but has NF4 block sizes");
  p = nf4PlanSpec();
  p.spec.kernels[3].inputs[1] = p.head; // the linear reads the NF4 bytes itself
  expectError(
      p.spec,
      "w (tensor 2 'lm_head.weight') is nf4, which only a Dequantize kernel (or a copy) reads");
  p = nf4PlanSpec();
  p.spec.kernels[p.dequantizeKernel].inputs[0] = 1;
  expectError(p.spec, "q (tensor 1 'model.norm.weight') dtype: expected nf4, got f32");
  p = nf4PlanSpec();
  p.spec.tensors[p.dequantized].shape = {8, 16};
  expectError(p.spec, "shape: expected [16, 8], got [8, 16]");
}

/// The loss of the f32 small plan whose lm_head holds `head`, other weights from `seed`.
float f32Loss(uint64_t seed, const std::vector<float> &head) {
  std::vector<uint8_t> bytes = test::buildPlan(test::smallPlanSpec());
  LoadedPlan plan = loadPlanBuffer(bytes.data(), bytes.size(), "f32.plan");
  Executor e(plan);
  e.initWeights(seed);
  storeF32(head.data(), e.view(2));
  TokenBatch batch;
  batch.batch = 2;
  batch.seq = 4;
  batch.inputs = {1, 2, 3, 4, 5, 6, 7, 8};
  batch.labels = {2, 3, 4, 5, 6, 7, 8, 9};
  return e.forward(batch);
}

TEST(Nf4Plan, InitBindAndForwardEqualTheDequantizedF32Plan) {
  Nf4Plan p = nf4PlanSpec();
  std::vector<uint8_t> bytes = test::buildPlan(p.spec);
  LoadedPlan plan = loadPlanBuffer(bytes.data(), bytes.size(), "nf4.plan");
  TokenBatch batch;
  batch.batch = 2;
  batch.seq = 4;
  batch.inputs = {1, 2, 3, 4, 5, 6, 7, 8};
  batch.labels = {2, 3, 4, 5, 6, 7, 8, 9};

  // Random init draws what an f32 tensor would get, then quantizes it.
  Executor e(plan);
  e.initWeights(5);
  std::vector<float> drawn(128);
  initTensor("lm_head.weight", InitRule::Normal, 5,
             TensorView{drawn.data(), DType::F32, {16, 8}});
  std::vector<uint8_t> expected = quantize(drawn, 64, 1);
  const auto *stored = static_cast<const uint8_t *>(e.view(p.head).data);
  ASSERT_EQ(std::vector<uint8_t>(stored, stored + expected.size()), expected);
  std::vector<float> dequantized(128);
  dequantizeNf4(expected.data(), 128, 64, 1, dequantized.data());
  float loss = e.forward(batch);
  EXPECT_EQ(loss, f32Loss(5, dequantized));
  EXPECT_NE(loss, f32Loss(5, drawn)) << "quantization changed nothing";

  // Binding f32 weights quantizes them; binding the U8 storage copies it.
  std::string dir = test::makeTempDir("nf4-bind");
  std::vector<float> table(16 * 8), norm(8, 1.0f), head = randomNormal(128, 9, 0.1f);
  for (size_t i = 0; i < table.size(); ++i)
    table[i] = float(i % 7) * 0.01f;
  writeSafetensors(dir + "/w.safetensors",
                   {{"model.embed_tokens.weight", DType::F32, {16, 8}, table.data()},
                    {"model.norm.weight", DType::F32, {8}, norm.data()},
                    {"lm_head.weight", DType::F32, {16, 8}, head.data()}});
  Executor bound(plan);
  bound.bindWeights(Checkpoint::open(dir + "/w.safetensors"));
  std::vector<uint8_t> quantized = quantize(head, 64, 1);
  stored = static_cast<const uint8_t *>(bound.view(p.head).data);
  ASSERT_EQ(std::vector<uint8_t>(stored, stored + quantized.size()), quantized);
  writeSafetensors(dir + "/q.safetensors",
                   {{"model.embed_tokens.weight", DType::F32, {16, 8}, table.data()},
                    {"model.norm.weight", DType::F32, {8}, norm.data()},
                    {"lm_head.weight", DType::NF4, {int64_t(quantized.size())}, quantized.data()}});
  Executor raw(plan);
  raw.bindWeights(Checkpoint::open(dir + "/q.safetensors"));
  stored = static_cast<const uint8_t *>(raw.view(p.head).data);
  ASSERT_EQ(std::vector<uint8_t>(stored, stored + quantized.size()), quantized);
  EXPECT_EQ(bound.forward(batch), raw.forward(batch));

  // Storage of another size, or integers, are named as mis-shaped.
  std::vector<uint8_t> shortBytes(quantized.size() - 4);
  writeSafetensors(dir + "/bad.safetensors",
                   {{"model.embed_tokens.weight", DType::F32, {16, 8}, table.data()},
                    {"model.norm.weight", DType::F32, {8}, norm.data()},
                    {"lm_head.weight", DType::NF4, {int64_t(shortBytes.size())}, shortBytes.data()}});
  Executor bad(plan);
  try {
    bad.bindWeights(Checkpoint::open(dir + "/bad.safetensors"));
    FAIL() << "76 bytes were bound as an 80-byte NF4 tensor";
  } catch (const Error &err) {
    EXPECT_NE(std::string(err.what()).find("lm_head.weight (plan [16, 8] nf4, checkpoint [76] U8)"),
              std::string::npos)
        << err.what();
  }
  test::removeTree(dir);
}

#ifdef BONSAI_HAVE_CUDA

void ok(cudaError_t status, const char *call) {
  ASSERT_EQ(status, cudaSuccess) << call << ": " << cudaGetErrorString(status);
}

/// The CUDA kernel against the CPU kernel, bit for bit, for `numel` elements with the output
/// `misalign` bytes past a 256-byte boundary.
void checkCuda(int64_t numel, uint32_t b, uint32_t d, DType dtype, size_t misalign,
               uint32_t seed) {
  std::vector<float> x = randomNormal(size_t(numel), seed, 0.03f);
  std::vector<uint8_t> q(nf4StorageBytes(uint64_t(numel), b, d));
  quantizeNf4(x.data(), uint64_t(numel), b, d, q.data());
  std::vector<int64_t> shape = {numel};
  size_t outBytes = size_t(numel) * dtypeSize(dtype);
  std::vector<uint8_t> want(outBytes);
  cpu::dequantize(TensorView{q.data(), DType::NF4, shape, b, d},
                  TensorView{want.data(), dtype, shape});

  uint8_t *dq = nullptr, *dy = nullptr;
  ok(cudaMalloc(reinterpret_cast<void **>(&dq), q.size()), "cudaMalloc");
  ok(cudaMalloc(reinterpret_cast<void **>(&dy), outBytes + 256), "cudaMalloc");
  ok(cudaMemcpy(dq, q.data(), q.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  ok(cudaMemset(dy, 0xff, outBytes + 256), "cudaMemset"); // NaN in every float type
  cuda::Context ctx;
  ctx.stream = nullptr;
  cuda::dequantize(ctx, TensorView{dq, DType::NF4, shape, b, d},
                   TensorView{dy + misalign, dtype, shape});
  ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<uint8_t> got(outBytes);
  ok(cudaMemcpy(got.data(), dy + misalign, outBytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  cudaFree(dq);
  cudaFree(dy);
  size_t size = dtypeSize(dtype);
  for (int64_t i = 0; i < numel; ++i)
    ASSERT_EQ(std::memcmp(got.data() + i * size, want.data() + i * size, size), 0)
        << dtypeName(dtype) << " element " << i << " of " << numel << " (block " << b
        << ", misalign " << misalign << ")";
}

TEST(CudaNf4, MatchesCpuBitForBit) {
  BONSAI_SKIP_WITHOUT_GPU();
  uint32_t seed = 10;
  for (DType dtype : {DType::BF16, DType::F32, DType::F16}) {
    checkCuda(176 * 64, 64, 256, dtype, 0, seed++);      // tiny_llama's MLP
    checkCuda(64 * 1000 + 32, 64, 3, dtype, 0, seed++);  // partial block, many groups
    checkCuda(64 * 300 + 5, 64, 256, dtype, 0, seed++);  // a tail of 5
    checkCuda(4096, 16, 1, dtype, 2 * dtypeSize(dtype), seed++); // unaligned output
    checkCuda(1 << 20, 256, 256, dtype, 0, seed++);
  }
}

/// The fused NF4 GEMM (Nf4Gemm.cu) against the CPU: x · dequantize(W)ᵀ with W's dequantized
/// values rounded to bf16 (as the kernel's tiles are), accumulated in double; M ragged (rows
/// past the last full tile), several K steps. Tolerance: bf16 rounding of the output (2^-8
/// relative) plus fp32 accumulation, against the largest output.
TEST(CudaNf4, FusedGemmMatchesCpu) {
  BONSAI_SKIP_WITHOUT_GPU();
  const int64_t m = 200, n = 256, k = 320;
  std::vector<float> xf = randomNormal(size_t(m * k), 21), w = randomNormal(size_t(n * k), 22, 0.02f);
  std::vector<uint16_t> x(xf.size());
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = f32ToBf16(xf[i]);
  std::vector<uint8_t> q(nf4StorageBytes(uint64_t(n * k), 64, 3));
  quantizeNf4(w.data(), uint64_t(n * k), 64, 3, q.data());
  std::vector<uint16_t> wq(size_t(n * k));
  dequantizeNf4Bf16(q.data(), uint64_t(n * k), 64, 3, wq.data());
  std::vector<double> want(size_t(m * n));
  double largest = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t l = 0; l < k; ++l)
        sum += double(bf16ToF32(x[size_t(i * k + l)])) * double(bf16ToF32(wq[size_t(j * k + l)]));
      want[size_t(i * n + j)] = sum;
      largest = std::max(largest, std::fabs(sum));
    }
  void *dx = nullptr, *dq = nullptr, *dy = nullptr;
  ok(cudaMalloc(&dx, x.size() * 2), "cudaMalloc");
  ok(cudaMalloc(&dq, q.size()), "cudaMalloc");
  ok(cudaMalloc(&dy, want.size() * 2), "cudaMalloc");
  ok(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  ok(cudaMemcpy(dq, q.data(), q.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  ok(cudaMemset(dy, 0xff, want.size() * 2), "cudaMemset");
  TensorView xv{dx, DType::BF16, {m, k}}, qv{dq, DType::NF4, {n, k}, 64, 3},
      yv{dy, DType::BF16, {m, n}};
  ASSERT_EQ(cuda::nf4LinearProblem(xv, qv, yv), "");
  cuda::Context ctx;
  cuda::nf4Linear(ctx, xv, qv, yv);
  ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<uint16_t> got(want.size());
  ok(cudaMemcpy(got.data(), dy, got.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
  cudaFree(dx);
  cudaFree(dq);
  cudaFree(dy);
  for (size_t i = 0; i < want.size(); ++i) {
    double g = bf16ToF32(got[i]);
    ASSERT_LE(std::fabs(g - want[i]), std::fabs(want[i]) / 128 + 1e-4 * largest)
        << "y[" << i / size_t(n) << ", " << i % size_t(n) << "] = " << g << ", expected " << want[i];
  }
  // Shapes it does not take are named.
  TensorView wide{dq, DType::NF4, {100, k}, 64, 3};
  EXPECT_NE(cuda::nf4LinearProblem(xv, wide, yv).find("out % 128 == 0"), std::string::npos);
}

TEST(CudaNf4, PerfDequantize) {
  BONSAI_SKIP_WITHOUT_GPU();
  // Llama-2-7B's MLP weight (11008 x 4096) to bf16, as every QLoRA step does per layer.
  const int64_t numel = 11008LL * 4096;
  std::vector<float> x = randomNormal(size_t(numel), 7, 0.02f);
  std::vector<uint8_t> q(nf4StorageBytes(uint64_t(numel), 64, 256));
  quantizeNf4(x.data(), uint64_t(numel), 64, 256, q.data());
  uint8_t *dq = nullptr, *dy = nullptr;
  ok(cudaMalloc(reinterpret_cast<void **>(&dq), q.size()), "cudaMalloc");
  ok(cudaMalloc(reinterpret_cast<void **>(&dy), size_t(numel) * 2), "cudaMalloc");
  ok(cudaMemcpy(dq, q.data(), q.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda::Context ctx;
  ctx.stream = nullptr;
  std::vector<int64_t> shape = {11008, 4096};
  TensorView qv{dq, DType::NF4, shape, 64, 256}, yv{dy, DType::BF16, shape};
  cuda::dequantize(ctx, qv, yv);
  ok(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const int reps = 50;
  cudaEventRecord(start);
  for (int r = 0; r < reps; ++r)
    cuda::dequantize(ctx, qv, yv);
  cudaEventRecord(stop);
  ok(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  double seconds = ms / 1e3 / reps;
  double bytes = double(q.size()) + double(numel) * 2;
  std::printf("NF4 dequantize 11008x4096 -> bf16: %.1f us, %.0f GB/s (%.2f Gelem/s)\n",
              seconds * 1e6, bytes / seconds / 1e9, double(numel) / seconds / 1e9);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(dq);
  cudaFree(dy);
}

#endif // BONSAI_HAVE_CUDA

} // namespace
