//===- HostOptimizerTest.cpp - The host optimizer step against the GPU's formula ===//
//
// host::adamwStep and host::sgdStep against scalar references written here from
// runtime/cuda/Optimizer.cu's adamwElements, sgdElements and adamwScalars, compared bit for bit
// (a NaN only against a NaN: payloads are not part of the contract). Each fp32 operation of the
// references is done in fp64 and rounded to fp32, which is the correctly rounded fp32 result
// (fp64 has more than 2 * 24 + 2 bits), so the references need neither -ffp-contract=off nor
// a particular vector width. Sizes are odd (not multiples of any vector width) and span
// several of the step's chunks; one tensor starts 4 bytes off a 64-byte boundary; every dtype
// pair of gradient and parameter, with and without masters; weight decay, active clipping and
// several steps with a changing learning rate; infinite gradients (a NaN parameter must stay
// NaN in bf16, not round to infinity); subnormal moments under a caller that set FTZ/DAZ; the
// same bits on one thread and on several. Bad operands: an error naming the cause, with
// nothing written.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/HostOptimizer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

using namespace bonsai::rt;
namespace host = bonsai::rt::host;

namespace {

using Shape = std::vector<int64_t>;

int64_t numelOf(const Shape &s) {
  int64_t n = 1;
  for (int64_t d : s)
    n *= d;
  return n;
}

/// A host tensor `offset` bytes into 64-byte-aligned storage of its dtype.
struct Buf {
  Buf(DType dtype, Shape shape, size_t offset = 0)
      : dtype(dtype), shape(std::move(shape)), offset(offset),
        storage((size_t(numelOf(this->shape)) * dtypeSize(dtype) + offset + 64) / 8 + 1) {}
  // A copy's storage could sit otherwise against a 64-byte boundary, and its elements then at
  // other bytes: copies are made with clone(); a move keeps the storage.
  Buf(const Buf &) = delete;
  Buf &operator=(const Buf &) = delete;
  Buf(Buf &&) = default;
  Buf &operator=(Buf &&) = default;

  void *data() const {
    auto base = reinterpret_cast<uintptr_t>(storage.data());
    return reinterpret_cast<void *>((base + 63) / 64 * 64 + offset);
  }
  TensorView view() const { return TensorView{data(), dtype, shape}; }
  int64_t numel() const { return numelOf(shape); }
  float get(int64_t i) const {
    float f;
    loadF32(TensorView{static_cast<char *>(data()) + i * dtypeSize(dtype), dtype, {1}}, &f);
    return f;
  }
  void set(int64_t i, float f) const {
    storeF32(&f, TensorView{static_cast<char *>(data()) + i * dtypeSize(dtype), dtype, {1}});
  }
  std::vector<uint8_t> bytes() const {
    auto p = static_cast<const uint8_t *>(data());
    return std::vector<uint8_t>(p, p + numel() * int64_t(dtypeSize(dtype)));
  }
  Buf clone() const {
    Buf b(dtype, shape, offset);
    std::memcpy(b.data(), data(), size_t(numel()) * dtypeSize(dtype));
    return b;
  }

  DType dtype;
  Shape shape;
  size_t offset;
  std::vector<uint64_t> storage;
};

Buf random(std::mt19937 &rng, DType dtype, const Shape &shape, float lo, float hi,
           size_t offset = 0) {
  Buf b(dtype, shape, offset);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < b.numel(); ++i)
    b.set(i, dist(rng));
  return b;
}

Buf scalar(DType dtype, double value) {
  Buf b(dtype, {});
  if (dtype == DType::I64) {
    int64_t v = int64_t(value);
    std::memcpy(b.data(), &v, 8);
  } else {
    b.set(0, float(value));
  }
  return b;
}

bool isNan16(DType d, uint16_t h) {
  return d == DType::BF16 ? (h & 0x7fff) > 0x7f80 : (h & 0x7fff) > 0x7c00;
}

/// Every element of `got` has the bits of `want`'s, or both are NaN.
void expectSameBits(const std::string &what, const Buf &got, const Buf &want) {
  ASSERT_EQ(got.dtype, want.dtype) << what;
  ASSERT_EQ(got.numel(), want.numel()) << what;
  int64_t bad = 0;
  std::string first;
  for (int64_t i = 0; i < got.numel(); ++i) {
    bool same;
    uint32_t a = 0, b = 0;
    size_t size = dtypeSize(got.dtype);
    std::memcpy(&a, static_cast<char *>(got.data()) + i * size, size);
    std::memcpy(&b, static_cast<char *>(want.data()) + i * size, size);
    if (got.dtype == DType::F32)
      same = a == b || (std::isnan(got.get(i)) && std::isnan(want.get(i)));
    else
      same = a == b || (isNan16(got.dtype, uint16_t(a)) && isNan16(got.dtype, uint16_t(b)));
    if (!same && bad++ < 5)
      first += "\n  [" + std::to_string(i) + "] got " + std::to_string(got.get(i)) + " (0x" +
               std::to_string(a) + ") want " + std::to_string(want.get(i)) + " (0x" +
               std::to_string(b) + ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.numel() << " elements differ" << first;
}

// fp32 operations, each correctly rounded (see the file comment).
float mul(float a, float b) { return float(double(a) * double(b)); }
float add(float a, float b) { return float(double(a) + double(b)); }
float sub(float a, float b) { return float(double(a) - double(b)); }
float div(float a, float b) { return float(double(a) / double(b)); }
float sqrtRounded(float a) { return float(std::sqrt(double(a))); }

/// What an element stored in `d` reads back as (round to nearest even).
float roundTo(DType d, float x) {
  if (d == DType::BF16)
    return bf16ToF32(f32ToBf16(x));
  if (d == DType::F16)
    return f16ToF32(f32ToF16(x));
  return x;
}

/// One parameter's operands.
struct Param {
  Buf grad, param, m, v, master;
  bool hasMaster;
};

std::vector<Param> makeParams(std::mt19937 &rng, const std::vector<Shape> &shapes, DType gt,
                              DType pt, bool masters) {
  std::vector<Param> ps;
  for (size_t i = 0; i < shapes.size(); ++i) {
    // Tensor 1 starts 4 bytes off the 64-byte boundary: unaligned vector accesses.
    size_t off = i == 1 ? 4 : 0;
    ps.push_back(
        {random(rng, gt, shapes[i], -2.0f, 2.0f, off), random(rng, pt, shapes[i], -1.0f, 1.0f, off),
         random(rng, DType::F32, shapes[i], -0.1f, 0.1f, off),
         random(rng, DType::F32, shapes[i], 0.0f, 0.01f, off),
         random(rng, DType::F32, masters ? shapes[i] : Shape{0}, -1.0f, 1.0f, off), masters});
  }
  return ps;
}

std::vector<Param> cloneParams(const std::vector<Param> &ps) {
  std::vector<Param> out;
  for (const Param &p : ps)
    out.push_back(
        {p.grad.clone(), p.param.clone(), p.m.clone(), p.v.clone(), p.master.clone(), p.hasMaster});
  return out;
}

std::vector<TensorView> views(const std::vector<Param> &ps, Buf Param::*member) {
  std::vector<TensorView> out;
  for (const Param &p : ps)
    if (member != &Param::master || p.hasMaster)
      out.push_back((p.*member).view());
  return out;
}

/// adamwElements and adamwScalars of runtime/cuda/Optimizer.cu, element by element.
void referenceAdamw(std::vector<Param> &ps, int64_t done, float lr, float norm,
                    const cpu::AdamWHyper &h) {
  double t = double(done) + 1.0, rate = double(lr);
  double clipD = h.gradClip > 0.0 ? std::fmin(1.0, h.gradClip / (double(norm) + 1e-6)) : 1.0;
  const float clip = float(clipD), decay = float(1.0 - rate * h.weightDecay),
              stepSize = float(rate / (1.0 - std::pow(h.beta1, t))),
              bc2Sqrt = float(std::sqrt(1.0 - std::pow(h.beta2, t)));
  const float b1 = float(h.beta1), b2 = float(h.beta2), eps = float(h.eps);
  const float c1 = float(1.0 - h.beta1), c2 = float(1.0 - h.beta2);
  for (Param &p : ps)
    for (int64_t i = 0; i < p.param.numel(); ++i) {
      float gi = mul(p.grad.get(i), clip);
      float mi = add(mul(b1, p.m.get(i)), mul(c1, gi));
      float vi = add(mul(b2, p.v.get(i)), mul(mul(c2, gi), gi));
      float denom = add(div(sqrtRounded(vi), bc2Sqrt), eps);
      float x = p.hasMaster ? p.master.get(i) : p.param.get(i);
      x = sub(mul(x, decay), div(mul(stepSize, mi), denom));
      p.m.set(i, mi);
      p.v.set(i, vi);
      if (p.hasMaster)
        p.master.set(i, x);
      p.param.set(i, x);
    }
}

/// sgdElements of runtime/cuda/Optimizer.cu, element by element (the momentum buffer in m).
void referenceSgd(std::vector<Param> &ps, float lr, float norm, const cpu::SGDHyper &h) {
  const float clip =
      float(h.gradClip > 0.0 ? std::fmin(1.0, h.gradClip / (double(norm) + 1e-6)) : 1.0);
  const float wd = float(h.weightDecay), mom = float(h.momentum);
  for (Param &p : ps)
    for (int64_t i = 0; i < p.param.numel(); ++i) {
      float x = p.hasMaster ? p.master.get(i) : p.param.get(i);
      float gi = add(mul(p.grad.get(i), clip), mul(wd, x));
      float b = h.momentum != 0.0 ? add(mul(mom, p.m.get(i)), gi) : gi;
      x = sub(x, mul(lr, b));
      p.m.set(i, b);
      if (p.hasMaster)
        p.master.set(i, x);
      p.param.set(i, x);
    }
}

void expectSameParams(const std::vector<Param> &got, const std::vector<Param> &want) {
  for (size_t i = 0; i < got.size(); ++i) {
    std::string t = " " + std::to_string(i);
    expectSameBits("param" + t, got[i].param, want[i].param);
    expectSameBits("m" + t, got[i].m, want[i].m);
    expectSameBits("v" + t, got[i].v, want[i].v);
    if (got[i].hasMaster)
      expectSameBits("master" + t, got[i].master, want[i].master);
  }
}

/// Odd sizes around the step's 65536-element chunks and the vector widths, an empty tensor.
const std::vector<Shape> kShapes = {{3}, {129, 130}, {1}, {65537}, {0}, {17}, {3, 70001}};

void runAdamw(host::ThreadPool &pool, std::vector<Param> &ps, const Buf &step, const Buf &lr,
              const Buf &norm, const cpu::AdamWHyper &h) {
  host::adamwStep(pool, views(ps, &Param::grad), step.view(), lr.view(), norm.view(), h,
                  views(ps, &Param::param), views(ps, &Param::m), views(ps, &Param::v),
                  views(ps, &Param::master));
}

void runSgd(host::ThreadPool &pool, std::vector<Param> &ps, const Buf &lr, const Buf &norm,
            const cpu::SGDHyper &h) {
  host::sgdStep(pool, views(ps, &Param::grad), lr.view(), norm.view(), h, views(ps, &Param::param),
                views(ps, &Param::m), views(ps, &Param::master));
}

/// Runs fn() and expects an rt::Error whose message contains every part.
void expectError(const std::function<void()> &fn, const std::vector<std::string> &parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an error containing '" << parts.front() << "'";
  } catch (const Error &e) {
    std::string message = e.what();
    for (const std::string &part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << message << "\n  lacks: " << part;
  }
}

TEST(HostOptimizerTest, AdamWIsTheGpuFormulaBitForBit) {
  std::mt19937 rng(24);
  host::ThreadPool pool(3);
  const DType floats[] = {DType::F32, DType::F16, DType::BF16};
  for (DType gt : floats)
    for (DType pt : floats)
      for (bool masters : {false, true}) {
        SCOPED_TRACE(std::string("grad ") + dtypeName(gt) + " param " + dtypeName(pt) +
                     (masters ? " master" : ""));
        std::vector<Param> got = makeParams(rng, kShapes, gt, pt, masters);
        // Infinite gradients: the moments become infinite and the parameter NaN.
        got[5].grad.set(3, std::numeric_limits<float>::infinity());
        got[5].grad.set(4, -std::numeric_limits<float>::infinity());
        std::vector<Param> want = cloneParams(got);
        cpu::AdamWHyper h{0.9, 0.95, 1e-8, 0.1, 1.0};
        for (int64_t done = 0; done < 3; ++done) {
          float lr = 1e-3f * float(done + 1), norm = 3.5f - float(done);
          referenceAdamw(want, done, lr, norm, h);
          runAdamw(pool, got, scalar(DType::I64, double(done)), scalar(DType::F32, lr),
                   scalar(DType::F32, norm), h);
        }
        expectSameParams(got, want);
        EXPECT_TRUE(std::isnan(got[5].param.get(3)));
      }
}

// The scalars as the kernels take them: a bf16 learning rate and an f16 norm, clipping off
// and on, the step counter far along (bias corrections near 1), no weight decay.
TEST(HostOptimizerTest, AdamWScalarsOfEveryKind) {
  std::mt19937 rng(7);
  host::ThreadPool pool(2);
  for (double clipAt : {0.0, 0.5, 100.0}) {
    SCOPED_TRACE("grad_clip " + std::to_string(clipAt));
    std::vector<Param> got = makeParams(rng, {{1000}, {77}}, DType::BF16, DType::F32, false);
    std::vector<Param> want = cloneParams(got);
    cpu::AdamWHyper h{0.8, 0.999, 1e-6, 0.0, clipAt};
    Buf lr = scalar(DType::BF16, 3e-4), norm = scalar(DType::F16, 2.25);
    referenceAdamw(want, 1000, lr.get(0), norm.get(0), h);
    runAdamw(pool, got, scalar(DType::I64, 1000), lr, norm, h);
    expectSameParams(got, want);
  }
  host::AdamWScalars s = host::adamwScalars({0.9, 0.999, 1e-8, 0.1, 1.0}, 0, 1e-3f, 4.0f);
  EXPECT_EQ(s.clip, float(1.0 / (4.0 + 1e-6)));
  EXPECT_EQ(s.decay, float(1.0 - double(1e-3f) * 0.1));
  EXPECT_EQ(s.stepSize, float(double(1e-3f) / (1.0 - 0.9)));
  EXPECT_EQ(s.bc2Sqrt, float(std::sqrt(1.0 - 0.999)));
}

TEST(HostOptimizerTest, SgdIsTheGpuFormulaBitForBit) {
  std::mt19937 rng(5);
  host::ThreadPool pool(3);
  const DType floats[] = {DType::F32, DType::F16, DType::BF16};
  for (DType gt : floats)
    for (DType pt : floats)
      for (bool masters : {false, true})
        for (double momentum : {0.0, 0.9}) {
          SCOPED_TRACE(std::string("grad ") + dtypeName(gt) + " param " + dtypeName(pt) +
                       (masters ? " master" : "") + " momentum " + std::to_string(momentum));
          std::vector<Param> got = makeParams(rng, kShapes, gt, pt, masters);
          std::vector<Param> want = cloneParams(got);
          cpu::SGDHyper h{momentum, 0.01, 2.0};
          for (int s = 0; s < 3; ++s) {
            float lr = 0.05f / float(s + 1), norm = 1.0f + 2.0f * float(s);
            referenceSgd(want, lr, norm, h);
            runSgd(pool, got, scalar(DType::F32, lr), scalar(DType::F32, norm), h);
          }
          expectSameParams(got, want);
        }
}

TEST(HostOptimizerTest, SameBitsOnOneThreadAndOnMany) {
  std::mt19937 rng(11);
  std::vector<Param> one =
      makeParams(rng, {{1000003}, {4096, 33}, {5}}, DType::BF16, DType::BF16, true);
  std::vector<Param> many = cloneParams(one);
  host::ThreadPool single(1), several(7);
  ASSERT_EQ(single.size(), 1);
  ASSERT_EQ(several.size(), 7);
  cpu::AdamWHyper h{0.9, 0.95, 1e-8, 0.1, 1.0};
  for (int64_t done = 0; done < 2; ++done) {
    Buf step = scalar(DType::I64, double(done)), lr = scalar(DType::F32, 1e-3),
        norm = scalar(DType::F32, 0.5);
    runAdamw(single, one, step, lr, norm, h);
    runAdamw(several, many, step, lr, norm, h);
  }
  expectSameParams(many, one);
}

// A caller with flush-to-zero and denormals-are-zero set (as PyTorch's set_flush_denormal or
// some BLAS builds leave the thread) still gets the GPU's subnormal results: the GPU kernels
// keep subnormals.
// The flush-to-zero control word is x86-64's (MXCSR), the only architecture Bonsai builds for:
// the test exists there and nowhere else, rather than being skipped.
#if defined(__x86_64__)
TEST(HostOptimizerTest, SubnormalsSurviveACallerThatFlushesThem) {
  std::mt19937 rng(3);
  for (int threads : {1, 3}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    std::vector<Param> got = makeParams(rng, {{70001}}, DType::F32, DType::F32, false);
    // Gradients and moments in the subnormal range (below 2^-126).
    for (int64_t i = 0; i < got[0].grad.numel(); ++i) {
      got[0].grad.set(i, got[0].grad.get(i) * 1e-39f);
      got[0].m.set(i, got[0].m.get(i) * 1e-38f);
      got[0].v.set(i, 0.0f);
    }
    std::vector<Param> want = cloneParams(got);
    cpu::AdamWHyper h{0.9, 0.95, 1e-30, 0.0, 0.0};
    referenceAdamw(want, 0, 1e-3f, 1.0f, h);
    int64_t subnormal = 0;
    for (int64_t i = 0; i < want[0].m.numel(); ++i)
      subnormal += std::fpclassify(want[0].m.get(i)) == FP_SUBNORMAL;
    ASSERT_GT(subnormal, want[0].m.numel() / 2) << "the test needs subnormal moments";
    host::ThreadPool pool(threads);
    unsigned saved = _mm_getcsr();
    _mm_setcsr(saved | 0x8040); // FTZ | DAZ
    runAdamw(pool, got, scalar(DType::I64, 0), scalar(DType::F32, 1e-3), scalar(DType::F32, 1), h);
    unsigned after = _mm_getcsr();
    _mm_setcsr(saved);
    EXPECT_EQ(after, saved | 0x8040) << "the caller's SSE control word was not restored";
    expectSameParams(got, want);
  }
}
#endif

TEST(HostOptimizerTest, PicksTheWidestVectorUnit) {
  std::string isa = host::vectorIsa();
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    EXPECT_EQ(isa, "avx512");
  else if (__builtin_cpu_supports("avx2"))
    EXPECT_EQ(isa, "avx2");
  else
    EXPECT_EQ(isa, "baseline");
#else
  EXPECT_EQ(isa, "baseline");
#endif
}

// Each instruction set's loops (only the widest runs by default) give the reference's bits.
TEST(HostOptimizerTest, EveryInstructionSetGivesTheSameBits) {
  std::string widest = host::vectorIsa();
  std::mt19937 rng(9);
  host::ThreadPool pool(2);
  int ran = 0;
  for (const char *isa : {"avx512", "avx2", "baseline"}) {
    try {
      host::useVectorIsa(isa);
    } catch (const Error &e) {
      EXPECT_NE(std::string(e.what()).find("does not support"), std::string::npos) << e.what();
      continue;
    }
    ++ran;
    EXPECT_EQ(std::string(host::vectorIsa()), isa);
    for (DType t : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(isa) + " " + dtypeName(t));
      std::vector<Param> got = makeParams(rng, kShapes, t, t, t == DType::BF16);
      std::vector<Param> want = cloneParams(got);
      cpu::AdamWHyper h{0.9, 0.95, 1e-8, 0.1, 1.0};
      referenceAdamw(want, 2, 1e-3f, 2.0f, h);
      runAdamw(pool, got, scalar(DType::I64, 2), scalar(DType::F32, 1e-3), scalar(DType::F32, 2.0),
               h);
      expectSameParams(got, want);
      std::vector<Param> gotSgd = makeParams(rng, kShapes, t, t, false);
      std::vector<Param> wantSgd = cloneParams(gotSgd);
      referenceSgd(wantSgd, 0.05f, 2.0f, {0.9, 0.01, 1.0});
      runSgd(pool, gotSgd, scalar(DType::F32, 0.05), scalar(DType::F32, 2.0), {0.9, 0.01, 1.0});
      expectSameParams(gotSgd, wantSgd);
    }
  }
  EXPECT_GE(ran, 1) << "baseline x86-64 runs everywhere";
  expectError([] { host::useVectorIsa("sse9"); }, {"unknown instruction set 'sse9'"});
  host::useVectorIsa(widest);
}

TEST(HostOptimizerTest, ThreadPoolRunsEveryWorkerOnceAndRethrows) {
  host::ThreadPool pool(4);
  for (int rep = 0; rep < 100; ++rep) {
    std::vector<std::atomic<int>> calls(4);
    pool.run([&](int w) { calls[size_t(w)]++; });
    for (int w = 0; w < 4; ++w)
      ASSERT_EQ(calls[size_t(w)].load(), 1) << "worker " << w << " run " << rep;
  }
  // The lowest worker's error, whichever threw first; the pool stays usable.
  try {
    pool.run([&](int w) {
      if (w >= 2)
        throw Error("worker " + std::to_string(w));
    });
    ADD_FAILURE() << "expected an error";
  } catch (const Error &e) {
    EXPECT_EQ(std::string(e.what()), "worker 2");
  }
  std::atomic<int> total{0};
  pool.run([&](int w) { total += w; });
  EXPECT_EQ(total.load(), 0 + 1 + 2 + 3);
}

TEST(HostOptimizerTest, BadOperandsAreErrorsNamingTheCause) {
  std::mt19937 rng(1);
  host::ThreadPool pool(2);
  std::vector<Param> ps = makeParams(rng, {{10}, {20}}, DType::F32, DType::F32, false);
  Buf before = ps[0].param.clone();
  Buf step = scalar(DType::I64, 0), lr = scalar(DType::F32, 1e-3), norm = scalar(DType::F32, 1);
  cpu::AdamWHyper h;
  auto g = views(ps, &Param::grad), p = views(ps, &Param::param), m = views(ps, &Param::m),
       v = views(ps, &Param::v);
  auto adamw = [&](std::vector<TensorView> g2, std::vector<TensorView> p2,
                   std::vector<TensorView> m2, std::vector<TensorView> v2,
                   std::vector<TensorView> masters, const Buf &s, const cpu::AdamWHyper &hy) {
    return [=, &pool, &lr, &norm, &s]() {
      host::adamwStep(pool, g2, s.view(), lr.view(), norm.view(), hy, p2, m2, v2, masters);
    };
  };
  expectError(adamw(g, {p[0]}, m, v, {}, step, h),
              {"host adamw_step: ", "2 gradients but 1 params"});
  expectError(adamw(g, p, m, v, {m[0]}, step, h), {"2 gradients but 1 masters"});
  expectError(adamw({}, {}, {}, {}, {}, step, h), {"needs at least one gradient"});
  auto shortGrad = g;
  shortGrad[1].shape = {19};
  expectError(adamw(shortGrad, p, m, v, {}, step, h), {"grad[1]", "[19]", "param[1]", "[20]"});
  Buf ints(DType::I32, {20});
  auto intParam = p;
  intParam[1] = ints.view();
  expectError(adamw(g, intParam, m, v, {}, step, h),
              {"param[1] must be f32, f16 or bf16, not i32"});
  Buf bf16State(DType::BF16, {20});
  auto bf16V = v;
  bf16V[1] = bf16State.view();
  expectError(adamw(g, p, m, bf16V, {}, step, h), {"v[1] must be f32, not bf16"});
  auto aliased = v;
  aliased[1] = m[1];
  expectError(adamw(g, p, m, aliased, {}, step, h), {"m[1] and v[1] overlap"});
  auto gradIsParam = g;
  gradIsParam[0] = p[0];
  expectError(adamw(gradIsParam, p, m, v, {}, step, h), {"overlap"});
  expectError(adamw(g, p, m, v, {}, scalar(DType::I64, -1), h), {"step -1 is negative"});
  expectError(adamw(g, p, m, v, {}, scalar(DType::F32, 0), h), {"step must be i64, not f32"});
  expectError(adamw(g, p, m, v, {}, step, cpu::AdamWHyper{1.0, 0.999, 1e-8, 0, 0}),
              {"betas (1.000000, 0.999000) are not in [0, 1)"});
  Buf vectorLr(DType::F32, {2});
  expectError(
      [&] { host::adamwStep(pool, g, step.view(), vectorLr.view(), norm.view(), h, p, m, v, {}); },
      {"lr shape [2] is not a scalar"});
  expectError(
      [&] { host::sgdStep(pool, g, lr.view(), norm.view(), cpu::SGDHyper{}, p, {m[0]}, {}); },
      {"host sgd_step: ", "2 gradients but 1 momentum"});
  // Every check runs before any write.
  expectSameBits("param 0 after the errors", ps[0].param, before);
}

} // namespace
