//===- FusedElementwiseTest.cpp - The elementwise program interpreter -----===//
//
// cpu::fusedElementwise against the unfused CPU kernels on fresh random data: a chain of
// adds and muls (with broadcasts, through bf16) matches bit for bit, since both round each
// f32 sum and product once and store to the same dtype; silu, gelu and the gradients, which
// the unfused kernels compute in f64 and the program in f32, agree within a few f32 ulp
// (relative 1e-5, absolute 1e-6). Also: an output in place of a full-size input, and a
// program with several outputs.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace bonsai::rt {
namespace {

using Op = ElementwiseOpcode;

/// A tensor with owned storage.
struct Buffer {
  std::vector<uint8_t> bytes;
  TensorView view;

  Buffer(DType dtype, std::vector<int64_t> shape) {
    view.dtype = dtype;
    view.shape = std::move(shape);
    bytes.resize(size_t(view.numel()) * dtypeSize(dtype));
    view.data = bytes.data();
  }
  std::vector<float> floats() const {
    std::vector<float> out(size_t(view.numel()));
    loadF32(view, out.data());
    return out;
  }
};

Buffer random(DType dtype, std::vector<int64_t> shape, uint32_t seed, float scale = 3.0f) {
  Buffer b(dtype, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> values(size_t(b.view.numel()));
  for (float &v : values)
    v = dist(rng);
  storeF32(values.data(), b.view);
  return b;
}

void expectBitwise(const Buffer &got, const Buffer &want) {
  ASSERT_EQ(got.bytes.size(), want.bytes.size());
  for (size_t i = 0; i < got.bytes.size(); ++i)
    ASSERT_EQ(got.bytes[i], want.bytes[i]) << "byte " << i;
}

void expectClose(const Buffer &got, const Buffer &want, float rel, float abs) {
  std::vector<float> g = got.floats(), w = want.floats();
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], w[i], abs + rel * std::fabs(w[i])) << "element " << i;
}

TEST(FusedElementwiseTest, AddMulChainMatchesTheUnfusedKernelsBitwise) {
  // y = bf16(bf16(x * s) + r) + b: LoRA's scale, the residual, a bias.
  Buffer x = random(DType::BF16, {3, 50, 64}, 1), s = random(DType::BF16, {1}, 2),
         r = random(DType::BF16, {3, 50, 64}, 3), b = random(DType::BF16, {64}, 4);
  ElementwiseProgramInfo p;
  p.inputs = {DType::BF16, DType::BF16, DType::BF16, DType::BF16};
  p.instructions = {{Op::Extend, DType::F32, 0, 0, 0},    {Op::Extend, DType::F32, 1, 0, 0},
                    {Op::Mul, DType::F32, 4, 5, 0},       {Op::Truncate, DType::BF16, 6, 0, 0},
                    {Op::Extend, DType::F32, 7, 0, 0},    {Op::Extend, DType::F32, 2, 0, 0},
                    {Op::Add, DType::F32, 8, 9, 0},       {Op::Truncate, DType::BF16, 10, 0, 0},
                    {Op::Extend, DType::F32, 11, 0, 0},   {Op::Extend, DType::F32, 3, 0, 0},
                    {Op::Add, DType::F32, 12, 13, 0},     {Op::Truncate, DType::BF16, 14, 0, 0}};
  p.outputs = {15, 7};
  Buffer fused(DType::BF16, {3, 50, 64}), scaled(DType::BF16, {3, 50, 64});
  cpu::fusedElementwise(p, {&x.view, &s.view, &r.view, &b.view}, {&fused.view, &scaled.view});

  Buffer t0(DType::BF16, {3, 50, 64}), t1(DType::BF16, {3, 50, 64}), want(DType::BF16, {3, 50, 64});
  cpu::mul(x.view, s.view, t0.view);
  cpu::add(t0.view, r.view, t1.view);
  cpu::add(t1.view, b.view, want.view);
  expectBitwise(fused, want);
  expectBitwise(scaled, t0);
}

TEST(FusedElementwiseTest, ActivationsMatchTheUnfusedKernels) {
  // silu(x) then gelu_tanh, both f32; silu's program is x / (1 + exp(-x)).
  Buffer x = random(DType::F32, {7, 333}, 5);
  ElementwiseProgramInfo p;
  p.inputs = {DType::F32};
  p.instructions = {{Op::Neg, DType::F32, 0, 0, 0},      {Op::Exp, DType::F32, 1, 0, 0},
                    {Op::Constant, DType::F32, 0, 0, 1}, {Op::Add, DType::F32, 3, 2, 0},
                    {Op::Div, DType::F32, 0, 4, 0}};
  p.outputs = {5};
  Buffer fused(DType::F32, {7, 333}), want(DType::F32, {7, 333});
  cpu::fusedElementwise(p, {&x.view}, {&fused.view});
  cpu::silu(x.view, want.view);
  expectClose(fused, want, 1e-5f, 1e-6f);

  // gelu exact: 0.5 x (1 + erf(x / sqrt 2)); tanh(x) alone against std::tanh in f64.
  ElementwiseProgramInfo g;
  g.inputs = {DType::F32};
  g.instructions = {{Op::Constant, DType::F32, 0, 0, 1.41421356f},
                    {Op::Div, DType::F32, 0, 1, 0},
                    {Op::Erf, DType::F32, 2, 0, 0},
                    {Op::Constant, DType::F32, 0, 0, 1},
                    {Op::Add, DType::F32, 4, 3, 0},
                    {Op::Constant, DType::F32, 0, 0, 0.5f},
                    {Op::Mul, DType::F32, 6, 0, 0},
                    {Op::Mul, DType::F32, 7, 5, 0},
                    {Op::Tanh, DType::F32, 0, 0, 0},
                    {Op::Sub, DType::F32, 0, 9, 0}};
  g.outputs = {8, 10};
  Buffer gelu(DType::F32, {7, 333}), diff(DType::F32, {7, 333});
  cpu::fusedElementwise(g, {&x.view}, {&gelu.view, &diff.view});
  cpu::gelu(x.view, /*tanh=*/false, want.view);
  expectClose(gelu, want, 1e-5f, 1e-6f);
  std::vector<float> xs = x.floats(), d = diff.floats();
  for (size_t i = 0; i < xs.size(); ++i)
    ASSERT_NEAR(d[i], float(double(xs[i]) - std::tanh(double(xs[i]))), 1e-6f) << i;
}

TEST(FusedElementwiseTest, InPlaceAndF16) {
  // x = f16(x * x + 1), in place.
  Buffer x = random(DType::F16, {1000}, 6);
  std::vector<float> before = x.floats();
  ElementwiseProgramInfo p;
  p.inputs = {DType::F16};
  p.instructions = {{Op::Extend, DType::F32, 0, 0, 0},
                    {Op::Mul, DType::F32, 1, 1, 0},
                    {Op::Constant, DType::F32, 0, 0, 1},
                    {Op::Add, DType::F32, 2, 3, 0},
                    {Op::Truncate, DType::F16, 4, 0, 0}};
  p.outputs = {5};
  cpu::fusedElementwise(p, {&x.view}, {&x.view});
  std::vector<float> after = x.floats();
  for (size_t i = 0; i < before.size(); ++i)
    ASSERT_EQ(after[i], f16ToF32(f32ToF16(before[i] * before[i] + 1.0f))) << i;
}

TEST(FusedElementwiseTest, ShapeErrorsAreNamed) {
  Buffer x(DType::F32, {10}), y(DType::F32, {3}), out(DType::F32, {10});
  ElementwiseProgramInfo p;
  p.inputs = {DType::F32, DType::F32};
  p.instructions = {{Op::Add, DType::F32, 0, 1, 0}};
  p.outputs = {2};
  try {
    cpu::fusedElementwise(p, {&x.view, &y.view}, {&out.view});
    FAIL() << "an input of 3 elements was broadcast over 10";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("input 1 has 3 elements, which do not divide the "
                                         "outputs' 10"),
              std::string::npos)
        << e.what();
  }
}

} // namespace
} // namespace bonsai::rt
