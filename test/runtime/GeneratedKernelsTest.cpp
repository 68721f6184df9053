//===- GeneratedKernelsTest.cpp - Generated PTX against the CPU interpreter ===//
//
// The PTX the compiler generates for test/runtime/Inputs/fused_elementwise.mlir (checked in as
// fused_elementwise_sm90.ptx; a lit test regenerates it and fails when it is stale) is loaded
// through cuda::GeneratedKernels and run on fresh random data, against cpu::fusedElementwise
// running the same program (written out below; the lit test checks it is the kernel's). The
// kernel uses every opcode, a broadcast input, bf16, f16 and f32. Outputs are poisoned with
// NaN before the launch, so an element left unwritten fails.
//
// Tolerance: the PTX computes exp, tanh and erf with MLIR's polynomial approximations (a few
// f32 ulp) where the interpreter calls the C library, and the output rounds to bf16 / f16: an
// output may differ by one unit of its last place when the f32 values straddle a rounding
// boundary, plus 1e-5 absolute. The same run is also captured into a CUDA Graph and
// replayed, and must reproduce the eager result bit for bit.
//
// The same program without PTX (a plan compiled for the CPU) runs on the CUDA backend's device
// interpreter and is held to the same tolerance (CUDA's expf, tanhf and erff are within 2 ulp).
//
// Built with the CUDA backend; skips without a GPU ("no GPU here").
//
//===----------------------------------------------------------------------===//

#ifdef BONSAI_HAVE_CUDA

#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/CudaKernels.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace bonsai::rt {
namespace {

using Op = ElementwiseOpcode;

void cudaOk(cudaError_t status, const char *call) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorString(status));
}

bool haveGpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

/// The program of fused_elementwise.mlir, register by register.
ElementwiseProgramInfo fixtureProgram() {
  ElementwiseProgramInfo p;
  p.inputs = {DType::BF16, DType::BF16, DType::F32};
  p.instructions = {
      {Op::Extend, DType::F32, 0, 0, 0},      // r3 = x
      {Op::Extend, DType::F32, 1, 0, 0},      // r4 = b
      {Op::Add, DType::F32, 3, 4, 0},         // r5 = x + b
      {Op::Tanh, DType::F32, 5, 0, 0},        // r6
      {Op::Constant, DType::F32, 0, 0, 0.5f}, // r7
      {Op::Mul, DType::F32, 6, 7, 0},         // r8
      {Op::Truncate, DType::BF16, 8, 0, 0},   // r9: output 0
      {Op::Neg, DType::F32, 2, 0, 0},         // r10 = -g
      {Op::Exp, DType::F32, 10, 0, 0},        // r11
      {Op::Constant, DType::F32, 0, 0, 1.0f}, // r12
      {Op::Add, DType::F32, 12, 11, 0},       // r13
      {Op::Div, DType::F32, 2, 13, 0},        // r14 = silu(g)
      {Op::Erf, DType::F32, 2, 0, 0},         // r15
      {Op::Sub, DType::F32, 14, 15, 0},       // r16
      {Op::Truncate, DType::F16, 16, 0, 0},   // r17: output 1
  };
  p.outputs = {9, 17};
  return p;
}

std::string readFixture() {
  std::ifstream in(std::string(BONSAI_TEST_DATA_DIR) + "/fused_elementwise_sm90.ptx");
  if (!in)
    throw std::runtime_error("cannot read the PTX fixture");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Host storage for a tensor and a device copy, `offset` elements into its allocation (an
/// offset of one leaves a 16-bit tensor 2-byte aligned: the generated kernel's scalar loop).
struct Pair {
  std::vector<uint8_t> host;
  void *allocation = nullptr;
  void *device = nullptr;
  TensorView hostView, deviceView;

  Pair(DType dtype, std::vector<int64_t> shape, int64_t offset = 0) {
    hostView.dtype = deviceView.dtype = dtype;
    hostView.shape = deviceView.shape = shape;
    host.resize(size_t(hostView.numel()) * dtypeSize(dtype));
    hostView.data = host.data();
    size_t skip = size_t(offset) * dtypeSize(dtype);
    cudaOk(cudaMalloc(&allocation, host.size() + skip), "cudaMalloc");
    device = static_cast<uint8_t *>(allocation) + skip;
    deviceView.data = device;
  }
  ~Pair() { cudaFree(allocation); }
  void upload() { cudaOk(cudaMemcpy(device, host.data(), host.size(), cudaMemcpyHostToDevice), "upload"); }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> bytes(host.size());
    cudaOk(cudaMemcpy(bytes.data(), device, bytes.size(), cudaMemcpyDeviceToHost), "download");
    return bytes;
  }
};

void fillRandom(Pair &p, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> values(size_t(p.hostView.numel()));
  for (float &v : values)
    v = dist(rng);
  storeF32(values.data(), p.hostView);
  p.upload();
}

/// Units of the last place of `dtype` at `x`.
float ulp(float x, DType dtype) {
  int bits = dtype == DType::BF16 ? 8 : dtype == DType::F16 ? 11 : 24;
  int e;
  std::frexp(std::max(std::fabs(x), 6.1e-5f), &e);
  return std::ldexp(1.0f, e - bits);
}

/// Runs `info` through cuda::GeneratedKernels (eagerly, then captured in a graph) against
/// cpu::fusedElementwise on the same data; `offset` places the output y0 that many elements
/// into its allocation.
void expectMatchesCpu(const GeneratedKernelInfo &info, int64_t offset = 0) {
  cuda::GeneratedKernels kernels({info});

  const std::vector<int64_t> shape = {64, 1000};
  Pair x(DType::BF16, shape), b(DType::BF16, {1000}), g(DType::F32, shape);
  Pair y0(DType::BF16, shape, offset), y1(DType::F16, shape);
  fillRandom(x, 11, 4.0f);
  fillRandom(b, 12, 1.0f);
  fillRandom(g, 13, 6.0f);
  cudaOk(cudaMemset(y0.device, 0xff, y0.host.size()), "poison");
  cudaOk(cudaMemset(y1.device, 0xff, y1.host.size()), "poison");

  cudaStream_t stream;
  cudaOk(cudaStreamCreate(&stream), "cudaStreamCreate");
  cuda::Context ctx;
  ctx.stream = stream;
  kernels.launch(ctx, 0, {&x.deviceView, &b.deviceView, &g.deviceView},
                 {&y0.deviceView, &y1.deviceView});
  cudaOk(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::vector<uint8_t> eager0 = y0.download(), eager1 = y1.download();

  cpu::fusedElementwise(info.program, {&x.hostView, &b.hostView, &g.hostView},
                        {&y0.hostView, &y1.hostView});
  for (int out = 0; out < 2; ++out) {
    Pair &want = out == 0 ? y0 : y1;
    TensorView got = want.hostView;
    std::vector<uint8_t> &bytes = out == 0 ? eager0 : eager1;
    got.data = bytes.data();
    std::vector<float> gv(size_t(got.numel())), wv(gv.size());
    loadF32(got, gv.data());
    loadF32(want.hostView, wv.data());
    for (size_t i = 0; i < gv.size(); ++i)
      ASSERT_NEAR(gv[i], wv[i], ulp(wv[i], got.dtype) + 1e-5f)
          << "output " << out << " element " << i;
  }

  // Captured into a graph and replayed: the same bytes.
  cudaOk(cudaMemset(y0.device, 0xff, y0.host.size()), "poison");
  cudaOk(cudaMemset(y1.device, 0xff, y1.host.size()), "poison");
  cudaGraph_t graph;
  cudaOk(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  kernels.launch(ctx, 0, {&x.deviceView, &b.deviceView, &g.deviceView},
                 {&y0.deviceView, &y1.deviceView});
  cudaOk(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphExec_t exec;
  cudaOk(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  cudaOk(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  cudaOk(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  EXPECT_EQ(y0.download(), eager0);
  EXPECT_EQ(y1.download(), eager1);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

/// The fixture's kernel as a plan for sm_90 carries it: its program and its PTX.
GeneratedKernelInfo fixtureKernel() {
  GeneratedKernelInfo info;
  info.name = "fused_elementwise_0";
  info.program = fixtureProgram();
  info.ptx = readFixture();
  info.arch = "sm_90";
  return info;
}

TEST(GeneratedKernelsTest, FixturePtxMatchesTheInterpreter) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU here";
  expectMatchesCpu(fixtureKernel());
}

// The kernel's vector loop needs every buffer 16-byte aligned; one output 2-byte aligned sends
// the whole launch through its scalar loop, which must give the same values.
TEST(GeneratedKernelsTest, FixturePtxTakesTheScalarLoopOnUnalignedBuffers) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU here";
  expectMatchesCpu(fixtureKernel(), /*offset=*/1);
}

// A plan compiled for the CPU has no PTX: its programs run on the device interpreter.
TEST(GeneratedKernelsTest, DeviceInterpreterMatchesTheCpu) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU here";
  GeneratedKernelInfo info;
  info.name = "fused_elementwise_0";
  info.program = fixtureProgram();
  expectMatchesCpu(info);
}

TEST(GeneratedKernelsTest, RejectedPtxIsNamed) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU here";
  GeneratedKernelInfo info;
  info.name = "broken";
  info.program = fixtureProgram();
  info.ptx = ".version 7.8\n.target sm_90\n.address_size 64\nthis is not ptx\n";
  info.arch = "sm_90";
  try {
    cuda::GeneratedKernels kernels({info});
    FAIL() << "malformed PTX loaded";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("rejects the PTX of generated kernel 'broken'"),
              std::string::npos)
        << e.what();
  }
}

} // namespace
} // namespace bonsai::rt

#endif // BONSAI_HAVE_CUDA
