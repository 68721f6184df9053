//===- CudaHostOptimizerTest.cpp - The host optimizer step against the GPU's ===//
//
// The contract of host::adamwStep and host::sgdStep: bit for bit what the CUDA kernels a plan
// runs (cuda::multiTensorAdamwUpdate, cuda::multiTensorSgdUpdate) write on the same inputs, so
// that moving a plan's update to the host changes no number. Three steps each, the step counter
// and the learning rate on the device as a plan keeps them (step_increment between steps),
// every gradient / parameter dtype pair the CUDA kernels take, with and without f32 masters,
// weight decay and active clipping, sizes around both sides' chunks and vector widths, one
// tensor off 16-byte alignment (the GPU's scalar path). Inputs are finite; a NaN result's
// payload is outside the contract (HostOptimizer.h). Built only with the CUDA backend; every
// test skips without a GPU.
//
//===----------------------------------------------------------------------===//

#ifdef BONSAI_HAVE_CUDA

#include "CudaTestUtil.h"
#include "bonsai/runtime/CudaKernels.h"
#include "bonsai/runtime/HostOptimizer.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace bonsai::rt;
namespace cpu = bonsai::rt::cpu;
namespace cuda = bonsai::rt::cuda;
using bonsai::test::haveGpu;
using bonsai::test::numelOf;
namespace host = bonsai::rt::host;

namespace {

using Shape = std::vector<int64_t>;

void cudaOk(cudaError_t status, const char *call) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorString(status));
}

/// A tensor on the host and its device copy, the device one `offset` bytes past a 256-byte
/// boundary.
struct Twin {
  Twin(DType dtype, Shape shape, size_t offset)
      : dtype(dtype), shape(std::move(shape)), offset(offset),
        host(size_t(numelOf(this->shape)) * dtypeSize(dtype)) {
    cudaOk(cudaMalloc(&base, host.size() + offset + 1), "cudaMalloc");
  }
  ~Twin() {
    if (base)
      cudaFree(base);
  }
  Twin(const Twin &) = delete;
  Twin(Twin &&o) noexcept
      : dtype(o.dtype), shape(std::move(o.shape)), offset(o.offset), host(std::move(o.host)),
        base(o.base) {
    o.base = nullptr;
  }

  void *device() const { return static_cast<char *>(base) + offset; }
  TensorView hostView() { return TensorView{host.data(), dtype, shape}; }
  TensorView deviceView() const { return TensorView{device(), dtype, shape}; }
  void upload() {
    cudaOk(cudaMemcpy(device(), host.data(), host.size(), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> out(host.size());
    cudaOk(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cudaOk(cudaMemcpy(out.data(), device(), out.size(), cudaMemcpyDeviceToHost), "download");
    return out;
  }

  DType dtype;
  Shape shape;
  size_t offset;
  std::vector<uint8_t> host;
  void *base = nullptr;
};

Twin randomTwin(std::mt19937 &rng, DType dtype, const Shape &shape, float lo, float hi,
                size_t offset) {
  Twin t(dtype, shape, offset);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> values(size_t(numelOf(shape)));
  for (float &v : values)
    v = dist(rng);
  storeF32(values.data(), t.hostView());
  t.upload();
  return t;
}

/// Host bytes equal device bytes, element by element (the first few differences shown).
void expectSameBits(const std::string &what, const Twin &t) {
  std::vector<uint8_t> dev = t.download();
  size_t size = dtypeSize(t.dtype);
  int64_t bad = 0;
  std::string first;
  for (size_t i = 0; i < dev.size() / size; ++i)
    if (std::memcmp(&dev[i * size], &t.host[i * size], size) != 0 && bad++ < 5) {
      float h, d;
      loadF32(TensorView{const_cast<uint8_t *>(&t.host[i * size]), t.dtype, {1}}, &h);
      loadF32(TensorView{&dev[i * size], t.dtype, {1}}, &d);
      first +=
          "\n  [" + std::to_string(i) + "] host " + std::to_string(h) + " gpu " + std::to_string(d);
    }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << dev.size() / size << " elements differ"
                    << first;
}

struct Set {
  std::vector<Twin> grad, param, m, v, master;
};

std::vector<TensorView> hostViews(std::vector<Twin> &ts) {
  std::vector<TensorView> out;
  for (Twin &t : ts)
    out.push_back(t.hostView());
  return out;
}

std::vector<TensorView> deviceViews(const std::vector<Twin> &ts) {
  std::vector<TensorView> out;
  for (const Twin &t : ts)
    out.push_back(t.deviceView());
  return out;
}

/// Sizes around the CUDA kernels' 8192-element chunks and the host's 65536, odd sizes.
const std::vector<Shape> kShapes = {{3}, {8193}, {129, 130}, {1}, {65537}, {3, 70001}, {17}};

Set makeSet(std::mt19937 &rng, DType gt, DType pt, bool masters) {
  Set s;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    size_t off = i == 2 ? 4 : 0; // breaks 16-byte alignment: the GPU's scalar path
    s.grad.push_back(randomTwin(rng, gt, kShapes[i], -2.0f, 2.0f, off));
    s.param.push_back(randomTwin(rng, pt, kShapes[i], -1.0f, 1.0f, off));
    s.m.push_back(randomTwin(rng, DType::F32, kShapes[i], -0.1f, 0.1f, off));
    s.v.push_back(randomTwin(rng, DType::F32, kShapes[i], 0.0f, 0.01f, off));
    if (masters)
      s.master.push_back(randomTwin(rng, DType::F32, kShapes[i], -1.0f, 1.0f, off));
  }
  return s;
}

void expectSameSet(Set &s, bool adamw) {
  for (size_t i = 0; i < s.param.size(); ++i) {
    std::string t = " " + std::to_string(i);
    expectSameBits("param" + t, s.param[i]);
    expectSameBits((adamw ? "m" : "momentum") + t, s.m[i]);
    if (adamw)
      expectSameBits("v" + t, s.v[i]);
    if (!s.master.empty())
      expectSameBits("master" + t, s.master[i]);
  }
}

class CudaHostOptimizerTest : public ::testing::Test {
protected:
  void SetUp() override {
    if (!haveGpu())
      GTEST_SKIP() << "no GPU here";
    cudaOk(cudaStreamCreate(&stream_), "cudaStreamCreate");
    ctx.stream = stream_;
  }
  void TearDown() override {
    if (stream_)
      cudaStreamDestroy(stream_);
  }

  cuda::Context ctx;
  std::mt19937 rng{2024};
  host::ThreadPool pool{4};

private:
  cudaStream_t stream_ = nullptr;
};

TEST_F(CudaHostOptimizerTest, AdamWIsTheGpuKernelBitForBit) {
  const DType floats[] = {DType::F32, DType::F16, DType::BF16};
  for (DType gt : floats)
    for (DType pt : floats)
      for (bool masters : {false, true}) {
        SCOPED_TRACE(std::string("grad ") + dtypeName(gt) + " param " + dtypeName(pt) +
                     (masters ? " master" : ""));
        Set s = makeSet(rng, gt, pt, masters);
        Twin step(DType::I64, {}, 0), lr(DType::F32, {}, 0), norm(DType::F32, {}, 0);
        int64_t done = 5;
        std::memcpy(step.host.data(), &done, 8);
        step.upload();
        cpu::AdamWHyper h{0.9, 0.95, 1e-8, 0.1, 1.0};
        for (int k = 0; k < 3; ++k) {
          float rate = 3e-4f * float(k + 1), n = 0.5f + 2.0f * float(k); // clips, then not
          std::memcpy(lr.host.data(), &rate, 4);
          std::memcpy(norm.host.data(), &n, 4);
          lr.upload();
          norm.upload();
          cuda::multiTensorAdamwUpdate(ctx, deviceViews(s.grad), step.deviceView(), lr.deviceView(),
                                       norm.deviceView(), h, deviceViews(s.param), deviceViews(s.m),
                                       deviceViews(s.v), deviceViews(s.master));
          cuda::stepIncrement(ctx, step.deviceView());
          host::adamwStep(pool, hostViews(s.grad), step.hostView(), lr.hostView(), norm.hostView(),
                          h, hostViews(s.param), hostViews(s.m), hostViews(s.v),
                          hostViews(s.master));
          ++done;
          std::memcpy(step.host.data(), &done, 8);
        }
        expectSameBits("step", step);
        expectSameSet(s, true);
      }
}

TEST_F(CudaHostOptimizerTest, SgdIsTheGpuKernelBitForBit) {
  const DType floats[] = {DType::F32, DType::F16, DType::BF16};
  for (DType gt : floats)
    for (DType pt : floats)
      for (bool masters : {false, true})
        for (double momentum : {0.0, 0.9}) {
          SCOPED_TRACE(std::string("grad ") + dtypeName(gt) + " param " + dtypeName(pt) +
                       (masters ? " master" : "") + " momentum " + std::to_string(momentum));
          Set s = makeSet(rng, gt, pt, masters);
          // A bf16 learning rate: the kernels read scalars of any float dtype.
          Twin lr(DType::BF16, {}, 0), norm(DType::F32, {}, 0);
          cpu::SGDHyper h{momentum, 0.01, 2.0};
          for (int k = 0; k < 3; ++k) {
            float rate = 0.05f / float(k + 1), n = 1.0f + 2.0f * float(k);
            storeF32(&rate, lr.hostView());
            std::memcpy(norm.host.data(), &n, 4);
            lr.upload();
            norm.upload();
            cuda::multiTensorSgdUpdate(ctx, deviceViews(s.grad), lr.deviceView(), norm.deviceView(),
                                       h, deviceViews(s.param), deviceViews(s.m),
                                       deviceViews(s.master));
            host::sgdStep(pool, hostViews(s.grad), lr.hostView(), norm.hostView(), h,
                          hostViews(s.param), hostViews(s.m), hostViews(s.master));
          }
          expectSameSet(s, false);
        }
}

} // namespace

#endif // BONSAI_HAVE_CUDA
