//===- CpuKernelsTest.cpp - Tests of the CPU reference kernels ------------===//
//
// Every kernel of CpuKernels.h against a naive fp64 reference written here with plain loops, on
// fresh random inputs from a fixed seed (never zeros), with outputs poisoned with NaN beforehand so
// that an element left unwritten fails. Every output element is compared, with tolerances that
// fit the output dtype: inputs are rounded to their storage dtype first and the reference reads
// the rounded values, so only the kernel's own arithmetic and its final rounding are measured.
// Also: ragged shapes, broadcasting, GQA ratios, causal masks, threading, in-place outputs, and
// the errors thrown for out-of-range ids and labels and for shape disagreements.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

using namespace bonsai::rt;
namespace cpu = bonsai::rt::cpu;

namespace {

using Shape = std::vector<int64_t>;

int64_t numelOf(const Shape &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

/// The value of IEEE half bits by the textbook formula.
double f16Value(uint16_t h) {
  int sign = h & 0x8000 ? -1 : 1;
  int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  if (exponent == 0x1f)
    return mantissa ? std::numeric_limits<double>::quiet_NaN()
                    : sign * std::numeric_limits<double>::infinity();
  if (exponent == 0)
    return sign * std::ldexp(double(mantissa), -24);
  return sign * std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
}

/// An owning tensor for tests: storage, dtype and shape, with exact encode and decode.
class Buf {
public:
  Buf(DType dtype, Shape shape)
      : dtype(dtype), shape(std::move(shape)),
        storage(size_t(numelOf(this->shape)) * dtypeSize(dtype)) {}

  TensorView view() const {
    return TensorView{const_cast<uint8_t *>(storage.data()), dtype, shape};
  }
  int64_t numel() const { return numelOf(shape); }

  /// Stores `values`, each rounded to the dtype (to nearest even).
  void set(const std::vector<double> &values) {
    for (size_t i = 0; i < values.size(); ++i) {
      uint8_t *p = &storage[i * dtypeSize(dtype)];
      switch (dtype) {
      case DType::F32: {
        float f = float(values[i]);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::F16: {
        uint16_t h = f32ToF16(float(values[i]));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::BF16: {
        uint16_t h = f32ToBf16(float(values[i]));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::I32: {
        int32_t v = int32_t(values[i]);
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::I64: {
        int64_t v = int64_t(values[i]);
        std::memcpy(p, &v, 8);
        break;
      }
      default:
        ADD_FAILURE() << "Buf::set: unsupported dtype";
      }
    }
  }

  /// The stored values, decoded exactly.
  std::vector<double> get() const {
    std::vector<double> values(static_cast<size_t>(numel()));
    for (size_t i = 0; i < values.size(); ++i) {
      const uint8_t *p = &storage[i * dtypeSize(dtype)];
      switch (dtype) {
      case DType::F32: {
        float f;
        std::memcpy(&f, p, 4);
        values[i] = f;
        break;
      }
      case DType::F16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        values[i] = f16Value(h);
        break;
      }
      case DType::BF16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        values[i] = double(bf16ToF32(h));
        break;
      }
      case DType::I32: {
        int32_t v;
        std::memcpy(&v, p, 4);
        values[i] = v;
        break;
      }
      case DType::I64: {
        int64_t v;
        std::memcpy(&v, p, 8);
        values[i] = double(v);
        break;
      }
      default:
        ADD_FAILURE() << "Buf::get: unsupported dtype";
      }
    }
    return values;
  }

  /// Fills every element with NaN (or, for integers, a pattern), so unwritten elements show.
  void poison() {
    for (size_t i = 0; i < size_t(numel()); ++i) {
      uint8_t *p = &storage[i * dtypeSize(dtype)];
      if (dtype == DType::F32) {
        uint32_t nan = 0x7fc00000u;
        std::memcpy(p, &nan, 4);
      } else if (dtype == DType::F16) {
        uint16_t nan = 0x7e00u;
        std::memcpy(p, &nan, 2);
      } else if (dtype == DType::BF16) {
        uint16_t nan = 0x7fc0u;
        std::memcpy(p, &nan, 2);
      } else {
        std::memset(p, 0xa5, dtypeSize(dtype));
      }
    }
  }

  DType dtype;
  Shape shape;
  std::vector<uint8_t> storage;
};

/// A tensor of uniform random values in [lo, hi), none of them zero.
Buf randomBuf(std::mt19937 &rng, DType dtype, Shape shape, double lo = -1.0, double hi = 1.0) {
  Buf b(dtype, std::move(shape));
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> values(static_cast<size_t>(b.numel()));
  for (double &v : values) {
    do
      v = dist(rng);
    while (std::fabs(v) < 1e-3 * (hi - lo));
  }
  b.set(values);
  return b;
}

Buf poisoned(DType dtype, Shape shape) {
  Buf b(dtype, std::move(shape));
  b.poison();
  return b;
}

/// Allowed error: abs + rel * |ref| + compute * scale[i], where `scale` (when given) is the
/// sum of the magnitudes of the terms an fp32 accumulation added up.
struct Tol {
  double rel, abs, compute = 0.0;
};

/// Tolerances for results computed in fp64 (or exactly rounded fp32) and rounded into `dtype`:
/// half an ulp relative is at most 2^-24 for f32, 2^-11 (4.88e-4) for f16 and 2^-8 (3.91e-3)
/// for bf16, plus at most 2^-24 from rounding through fp32 first. f32 gets a wide margin (1e-5);
/// f16 and bf16 a tight one, so that a truncating or double-rounding store still fails.
Tol tolFor(DType dtype) {
  switch (dtype) {
  case DType::F16:
    return {5e-4, 1e-7};
  case DType::BF16:
    return {4e-3, 1e-7};
  default:
    return {1e-5, 1e-7};
  }
}

/// Same with the error of an fp32 GEMM accumulation over sum|a_k b_k| added.
Tol gemmTolFor(DType dtype) {
  Tol t = tolFor(dtype);
  t.compute = 1e-5;
  return t;
}

std::string indexString(int64_t flat, const Shape &shape) {
  std::string s;
  for (size_t i = shape.size(); i-- > 0;) {
    s = std::to_string(flat % shape[i]) + (s.empty() ? "" : ", ") + s;
    flat /= shape[i];
  }
  return "[" + s + "]";
}

/// Compares every element of `out` with `ref`; reports the first few mismatches.
void expectAllNear(const Buf &out, const std::vector<double> &ref, Tol tol,
                   const std::vector<double> &scale = {}) {
  std::vector<double> got = out.get();
  ASSERT_EQ(got.size(), ref.size());
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double allowed =
        tol.abs + tol.rel * std::fabs(ref[i]) + (scale.empty() ? 0.0 : tol.compute * scale[i]);
    double err = std::fabs(got[i] - ref[i]);
    if (!(err <= allowed) && ++failures <= 8)
      ADD_FAILURE() << "element " << indexString(int64_t(i), out.shape) << ": got " << got[i]
                    << ", expected " << ref[i] << " (error " << err << " > " << allowed << ")";
  }
  EXPECT_EQ(failures, 0) << "of " << got.size() << " elements";
}

/// Every stored byte of `out` equals that of `ref`.
void expectBitExact(const Buf &out, const Buf &ref) {
  ASSERT_EQ(out.storage.size(), ref.storage.size());
  size_t size = dtypeSize(out.dtype);
  int failures = 0;
  for (size_t i = 0; i < out.storage.size(); i += size)
    if (std::memcmp(&out.storage[i], &ref.storage[i], size) != 0 && ++failures <= 8)
      ADD_FAILURE() << "element " << indexString(int64_t(i / size), out.shape) << " differs";
  EXPECT_EQ(failures, 0);
}

/// Runs fn, expecting an rt::Error whose message contains every one of `parts`.
void expectError(const std::function<void()> &fn, const std::vector<std::string> &parts) {
  try {
    fn();
  } catch (const Error &e) {
    std::string message = e.what();
    for (const std::string &part : parts)
      EXPECT_NE(message.find(part), std::string::npos)
          << "message \"" << message << "\" does not mention \"" << part << "\"";
    return;
  } catch (const std::exception &e) {
    ADD_FAILURE() << "threw a non-rt::Error: " << e.what();
    return;
  }
  ADD_FAILURE() << "no rt::Error thrown";
}

const DType kFloatDTypes[] = {DType::F32, DType::F16, DType::BF16};

} // namespace

// -----------------------------------------------------------------------------
// embedding
// -----------------------------------------------------------------------------

TEST(CpuKernelsTest, EmbeddingGathersRows) {
  std::mt19937 rng(101);
  for (DType dtype : kFloatDTypes) {
    for (DType idType : {DType::I32, DType::I64}) {
      SCOPED_TRACE(std::string(dtypeName(dtype)) + " ids " + dtypeName(idType));
      const int64_t vocab = 11, hidden = 7;
      Buf table = randomBuf(rng, dtype, {vocab, hidden});
      Buf ids(idType, {3, 5});
      std::vector<double> idValues(15);
      std::uniform_int_distribution<int> pick(0, vocab - 1);
      for (double &v : idValues)
        v = pick(rng);
      idValues[0] = 0;
      idValues[14] = vocab - 1;
      ids.set(idValues);
      Buf out = poisoned(dtype, {3, 5, hidden});
      cpu::embedding(table.view(), ids.view(), out.view());
      std::vector<double> t = table.get(), ref(static_cast<size_t>(out.numel()));
      for (int64_t i = 0; i < 15; ++i)
        for (int64_t d = 0; d < hidden; ++d)
          ref[size_t(i * hidden + d)] = t[size_t(int64_t(idValues[size_t(i)]) * hidden + d)];
      expectAllNear(out, ref, {0.0, 0.0});
    }
  }
}

TEST(CpuKernelsTest, EmbeddingConvertsToAnotherOutputDType) {
  std::mt19937 rng(102);
  Buf table = randomBuf(rng, DType::F32, {6, 5});
  Buf ids(DType::I64, {4});
  ids.set({5, 0, 3, 3});
  Buf out = poisoned(DType::BF16, {4, 5});
  cpu::embedding(table.view(), ids.view(), out.view());
  std::vector<double> t = table.get(), ref;
  for (int64_t id : {5, 0, 3, 3})
    for (int64_t d = 0; d < 5; ++d)
      ref.push_back(t[size_t(id * 5 + d)]);
  expectAllNear(out, ref, tolFor(DType::BF16));
}

TEST(CpuKernelsTest, EmbeddingRejectsOutOfRangeIds) {
  std::mt19937 rng(103);
  Buf table = randomBuf(rng, DType::F32, {11, 4});
  for (int64_t bad : {int64_t(11), int64_t(-1), int64_t(1) << 40}) {
    SCOPED_TRACE(bad);
    Buf ids(DType::I64, {2, 3});
    ids.set({1, 2, 3, 4, double(bad), 5});
    Buf out = poisoned(DType::F32, {2, 3, 4});
    expectError([&] { cpu::embedding(table.view(), ids.view(), out.view()); },
                {"embedding", std::to_string(bad), "[1, 1]", "[0, 11)"});
    // Ids are all checked before any row is written.
    for (double v : out.get())
      EXPECT_TRUE(std::isnan(v));
  }
  Buf ids(DType::I32, {2, 3});
  ids.set({1, 2, 3, 4, 5, 6});
  Buf wrong = poisoned(DType::F32, {2, 3, 5});
  expectError([&] { cpu::embedding(table.view(), ids.view(), wrong.view()); },
              {"embedding", "[2, 3, 5]", "[2, 3, 4]"});
  Buf floatIds = randomBuf(rng, DType::F32, {2, 3});
  Buf out = poisoned(DType::F32, {2, 3, 4});
  expectError([&] { cpu::embedding(table.view(), floatIds.view(), out.view()); },
              {"embedding", "ids", "f32"});
}

// -----------------------------------------------------------------------------
// linear and matmul
// -----------------------------------------------------------------------------

namespace {

void checkLinear(std::mt19937 &rng, DType dtype, Shape xShape, int64_t out, bool withBias) {
  int64_t in = xShape.back(), rows = numelOf(xShape) / in;
  Buf x = randomBuf(rng, dtype, xShape);
  Buf w = randomBuf(rng, dtype, {out, in});
  Buf b = randomBuf(rng, dtype, {out});
  Shape yShape = xShape;
  yShape.back() = out;
  Buf y = poisoned(dtype, yShape);
  TensorView bView = b.view();
  cpu::linear(x.view(), w.view(), withBias ? &bView : nullptr, y.view());
  std::vector<double> xv = x.get(), wv = w.get(), bv = b.get();
  std::vector<double> ref(static_cast<size_t>(rows * out)), scale(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t n = 0; n < out; ++n) {
      double sum = withBias ? bv[size_t(n)] : 0.0, mag = std::fabs(sum);
      for (int64_t k = 0; k < in; ++k) {
        sum += xv[size_t(r * in + k)] * wv[size_t(n * in + k)];
        mag += std::fabs(xv[size_t(r * in + k)] * wv[size_t(n * in + k)]);
      }
      ref[size_t(r * out + n)] = sum;
      scale[size_t(r * out + n)] = mag;
    }
  expectAllNear(y, ref, gemmTolFor(dtype), scale);
}

} // namespace

TEST(CpuKernelsTest, LinearWithAndWithoutBias) {
  std::mt19937 rng(201);
  for (DType dtype : kFloatDTypes) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE(std::string(dtypeName(dtype)) + (bias ? " bias" : " no bias"));
      checkLinear(rng, dtype, {3, 5, 7}, 9, bias);
      checkLinear(rng, dtype, {1, 13}, 1, bias);
      checkLinear(rng, dtype, {2, 3, 5, 11}, 6, bias);
    }
  }
}

TEST(CpuKernelsTest, LinearLargeEnoughToBlock) {
  // Past OpenBLAS's small-matrix paths: its blocked, threaded kernel.
  std::mt19937 rng(202);
  checkLinear(rng, DType::F32, {3, 67, 129}, 131, true);
  checkLinear(rng, DType::BF16, {67, 257}, 130, false);
}

TEST(CpuKernelsTest, LinearRejectsShapeDisagreements) {
  std::mt19937 rng(203);
  Buf x = randomBuf(rng, DType::F32, {3, 5, 7});
  Buf w = randomBuf(rng, DType::F32, {9, 8});
  Buf y = poisoned(DType::F32, {3, 5, 9});
  expectError([&] { cpu::linear(x.view(), w.view(), nullptr, y.view()); },
              {"linear", "[9, 8]", "[3, 5, 7]"});
  Buf w2 = randomBuf(rng, DType::F32, {9, 7});
  Buf y2 = poisoned(DType::F32, {3, 5, 8});
  expectError([&] { cpu::linear(x.view(), w2.view(), nullptr, y2.view()); },
              {"linear", "[3, 5, 8]", "[3, 5, 9]"});
  Buf b = randomBuf(rng, DType::F32, {8});
  TensorView bv = b.view();
  expectError([&] { cpu::linear(x.view(), w2.view(), &bv, y.view()); },
              {"linear", "bias", "[8]", "[9]"});
}

TEST(CpuKernelsTest, MatmulBatched) {
  std::mt19937 rng(204);
  for (DType dtype : kFloatDTypes) {
    for (Shape batch : {Shape{}, Shape{3}, Shape{2, 3}}) {
      SCOPED_TRACE(std::string(dtypeName(dtype)) + " batch rank " + std::to_string(batch.size()));
      const int64_t m = 5, k = 7, n = 4;
      Shape aShape = batch, bShape = batch, cShape = batch;
      aShape.insert(aShape.end(), {m, k});
      bShape.insert(bShape.end(), {k, n});
      cShape.insert(cShape.end(), {m, n});
      Buf a = randomBuf(rng, dtype, aShape), b = randomBuf(rng, dtype, bShape);
      Buf c = poisoned(dtype, cShape);
      cpu::matmul(a.view(), b.view(), c.view());
      std::vector<double> av = a.get(), bv = b.get();
      int64_t batches = numelOf(batch);
      std::vector<double> ref, scale;
      for (int64_t t = 0; t < batches; ++t)
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double sum = 0, mag = 0;
            for (int64_t e = 0; e < k; ++e) {
              double p = av[size_t((t * m + i) * k + e)] * bv[size_t((t * k + e) * n + j)];
              sum += p;
              mag += std::fabs(p);
            }
            ref.push_back(sum);
            scale.push_back(mag);
          }
      expectAllNear(c, ref, gemmTolFor(dtype), scale);
    }
  }
}

TEST(CpuKernelsTest, MatmulRejectsShapeDisagreements) {
  std::mt19937 rng(205);
  Buf a = randomBuf(rng, DType::F32, {2, 5, 7});
  Buf b = randomBuf(rng, DType::F32, {3, 7, 4});
  Buf c = poisoned(DType::F32, {2, 5, 4});
  expectError([&] { cpu::matmul(a.view(), b.view(), c.view()); },
              {"matmul", "[2, 5, 7]", "[3, 7, 4]"});
  Buf b2 = randomBuf(rng, DType::F32, {2, 6, 4});
  expectError([&] { cpu::matmul(a.view(), b2.view(), c.view()); },
              {"matmul", "[2, 5, 7]", "[2, 6, 4]"});
  Buf b3 = randomBuf(rng, DType::F32, {2, 7, 4});
  Buf c3 = poisoned(DType::F32, {2, 4, 5});
  expectError([&] { cpu::matmul(a.view(), b3.view(), c3.view()); },
              {"matmul", "[2, 4, 5]", "[2, 5, 4]"});
}

// -----------------------------------------------------------------------------
// add and mul
// -----------------------------------------------------------------------------

namespace {

/// out[i] = op(lhs[i], rhs[broadcast index of i]), the rhs index built from lhs's multi-index.
std::vector<double> broadcastRef(const Buf &lhs, const Buf &rhs, bool isAdd) {
  std::vector<double> l = lhs.get(), r = rhs.get(), ref(l.size());
  size_t lr = lhs.shape.size(), rr = rhs.shape.size();
  for (int64_t flat = 0; flat < int64_t(l.size()); ++flat) {
    std::vector<int64_t> index(lr);
    for (size_t d = lr, f = size_t(flat); d-- > 0;) {
      index[d] = int64_t(f % size_t(lhs.shape[d]));
      f /= size_t(lhs.shape[d]);
    }
    int64_t ri = 0;
    for (size_t d = 0; d < rr; ++d)
      ri = ri * rhs.shape[d] + (rhs.shape[d] == 1 ? 0 : index[lr - rr + d]);
    ref[size_t(flat)] = isAdd ? l[size_t(flat)] + r[size_t(ri)] : l[size_t(flat)] * r[size_t(ri)];
  }
  return ref;
}

} // namespace

TEST(CpuKernelsTest, AddAndMulBroadcastTrailingDimensions) {
  std::mt19937 rng(301);
  const Shape lhsShape = {3, 5, 7};
  const Shape rhsShapes[] = {{7},       {1, 7}, {5, 7}, {3, 5, 7}, {5, 1},   {1, 1, 7},
                             {3, 1, 7}, {1},    {},     {3, 5, 1}, {1, 5, 1}};
  for (DType dtype : kFloatDTypes) {
    for (const Shape &rhsShape : rhsShapes) {
      for (bool isAdd : {true, false}) {
        SCOPED_TRACE(std::string(isAdd ? "add " : "mul ") + dtypeName(dtype) + " rhs " +
                     formatShape(rhsShape));
        Buf lhs = randomBuf(rng, dtype, lhsShape, -4, 4);
        Buf rhs = randomBuf(rng, dtype, rhsShape, -4, 4);
        Buf out = poisoned(dtype, lhsShape);
        if (isAdd)
          cpu::add(lhs.view(), rhs.view(), out.view());
        else
          cpu::mul(lhs.view(), rhs.view(), out.view());
        // fp32 sums and products of exact inputs are correctly rounded: the error is relative to
        // the result even when a sum cancels.
        expectAllNear(out, broadcastRef(lhs, rhs, isAdd), tolFor(dtype));
      }
    }
  }
}

TEST(CpuKernelsTest, AddMixedDTypesAndInPlace) {
  std::mt19937 rng(302);
  Buf lhs = randomBuf(rng, DType::BF16, {4, 6});
  Buf rhs = randomBuf(rng, DType::F32, {6});
  std::vector<double> ref = broadcastRef(lhs, rhs, true);
  Buf out = poisoned(DType::F32, {4, 6});
  cpu::add(lhs.view(), rhs.view(), out.view());
  expectAllNear(out, ref, tolFor(DType::F32));
  // out aliasing lhs (an in-place update).
  cpu::add(lhs.view(), rhs.view(), lhs.view());
  expectAllNear(lhs, ref, tolFor(DType::BF16));
}

TEST(CpuKernelsTest, AddRejectsNonBroadcastableShapes) {
  std::mt19937 rng(303);
  Buf lhs = randomBuf(rng, DType::F32, {3, 5, 7});
  Buf out = poisoned(DType::F32, {3, 5, 7});
  for (Shape bad : {Shape{6}, Shape{2, 7}, Shape{5, 3}, Shape{2, 3, 5, 7}}) {
    Buf rhs = randomBuf(rng, DType::F32, bad);
    expectError([&] { cpu::add(lhs.view(), rhs.view(), out.view()); },
                {"add", formatShape(bad), "[3, 5, 7]"});
    expectError([&] { cpu::mul(lhs.view(), rhs.view(), out.view()); },
                {"mul", formatShape(bad), "[3, 5, 7]"});
  }
  Buf rhs = randomBuf(rng, DType::F32, {7});
  Buf wrongOut = poisoned(DType::F32, {3, 5, 6});
  expectError([&] { cpu::add(lhs.view(), rhs.view(), wrongOut.view()); },
              {"add", "[3, 5, 6]", "[3, 5, 7]"});
}

// -----------------------------------------------------------------------------
// rms_norm and layer_norm
// -----------------------------------------------------------------------------

TEST(CpuKernelsTest, RmsNorm) {
  std::mt19937 rng(401);
  for (DType dtype : kFloatDTypes) {
    for (Shape shape : {Shape{3, 5, 37}, Shape{7, 1}, Shape{2, 64}}) {
      SCOPED_TRACE(std::string(dtypeName(dtype)) + " " + formatShape(shape));
      const double eps = 1e-5;
      Buf x = randomBuf(rng, dtype, shape, -3, 3);
      Buf w = randomBuf(rng, dtype, {shape.back()}, 0.5, 1.5);
      Buf y = poisoned(dtype, shape);
      cpu::rmsNorm(x.view(), w.view(), eps, y.view());
      std::vector<double> xv = x.get(), wv = w.get(), ref(xv.size());
      int64_t d = shape.back();
      for (size_t r = 0; r < xv.size() / size_t(d); ++r) {
        double ms = 0;
        for (int64_t i = 0; i < d; ++i)
          ms += xv[r * d + i] * xv[r * d + i];
        ms /= double(d);
        for (int64_t i = 0; i < d; ++i)
          ref[r * d + i] = xv[r * d + i] / std::sqrt(ms + eps) * wv[size_t(i)];
      }
      expectAllNear(y, ref, tolFor(dtype));
    }
  }
}

TEST(CpuKernelsTest, LayerNormBiasedVariance) {
  std::mt19937 rng(402);
  for (DType dtype : kFloatDTypes) {
    for (Shape shape : {Shape{3, 5, 37}, Shape{4, 2}, Shape{1, 3, 96}}) {
      SCOPED_TRACE(std::string(dtypeName(dtype)) + " " + formatShape(shape));
      const double eps = 1e-5;
      // An offset mean, so the variance is not the mean square.
      Buf x = randomBuf(rng, dtype, shape, 2, 5);
      Buf w = randomBuf(rng, dtype, {shape.back()}, 0.5, 1.5);
      Buf b = randomBuf(rng, dtype, {shape.back()}, -1, 1);
      Buf y = poisoned(dtype, shape);
      cpu::layerNorm(x.view(), w.view(), b.view(), eps, y.view());
      std::vector<double> xv = x.get(), wv = w.get(), bv = b.get(), ref(xv.size());
      int64_t d = shape.back();
      for (size_t r = 0; r < xv.size() / size_t(d); ++r) {
        double mean = 0, var = 0;
        for (int64_t i = 0; i < d; ++i)
          mean += xv[r * d + i];
        mean /= double(d);
        for (int64_t i = 0; i < d; ++i)
          var += (xv[r * d + i] - mean) * (xv[r * d + i] - mean);
        var /= double(d);
        for (int64_t i = 0; i < d; ++i)
          ref[r * d + i] =
              (xv[r * d + i] - mean) / std::sqrt(var + eps) * wv[size_t(i)] + bv[size_t(i)];
      }
      expectAllNear(y, ref, tolFor(dtype));
    }
  }
}

TEST(CpuKernelsTest, NormsRejectShapeDisagreements) {
  std::mt19937 rng(403);
  Buf x = randomBuf(rng, DType::F32, {3, 8});
  Buf w = randomBuf(rng, DType::F32, {7});
  Buf b = randomBuf(rng, DType::F32, {8});
  Buf y = poisoned(DType::F32, {3, 8});
  expectError([&] { cpu::rmsNorm(x.view(), w.view(), 1e-5, y.view()); },
              {"rms_norm", "[7]", "[3, 8]"});
  expectError([&] { cpu::layerNorm(x.view(), b.view(), w.view(), 1e-5, y.view()); },
              {"layer_norm", "[7]", "[3, 8]"});
  Buf y2 = poisoned(DType::F32, {8, 3});
  expectError([&] { cpu::rmsNorm(x.view(), b.view(), 1e-5, y2.view()); },
              {"rms_norm", "[8, 3]", "[3, 8]"});
}

// -----------------------------------------------------------------------------
// rope
// -----------------------------------------------------------------------------

TEST(CpuKernelsTest, RopeRotateHalf) {
  std::mt19937 rng(501);
  for (DType dtype : kFloatDTypes) {
    for (double theta : {10000.0, 500000.0}) {
      for (Shape shape : {Shape{2, 7, 3, 10}, Shape{1, 33, 2, 64}}) {
        SCOPED_TRACE(std::string(dtypeName(dtype)) + " theta " + std::to_string(theta) + " " +
                     formatShape(shape));
        Buf x = randomBuf(rng, dtype, shape);
        Buf y = poisoned(dtype, shape);
        cpu::rope(x.view(), theta, y.view());
        int64_t batch = shape[0], seq = shape[1], heads = shape[2], d = shape[3], half = d / 2;
        std::vector<double> xv = x.get(), ref(xv.size());
        for (int64_t b = 0; b < batch; ++b)
          for (int64_t s = 0; s < seq; ++s)
            for (int64_t h = 0; h < heads; ++h)
              for (int64_t i = 0; i < half; ++i) {
                size_t base = size_t(((b * seq + s) * heads + h) * d);
                double angle = double(s) / std::pow(theta, double(2 * i) / double(d));
                double lo = xv[base + i], hi = xv[base + i + half];
                ref[base + i] = lo * std::cos(angle) - hi * std::sin(angle);
                ref[base + i + half] = hi * std::cos(angle) + lo * std::sin(angle);
              }
        expectAllNear(y, ref, tolFor(dtype));
      }
    }
  }
}

TEST(CpuKernelsTest, RopeRejectsBadShapes) {
  std::mt19937 rng(502);
  Buf odd = randomBuf(rng, DType::F32, {1, 4, 2, 5});
  Buf y = poisoned(DType::F32, {1, 4, 2, 5});
  expectError([&] { cpu::rope(odd.view(), 10000.0, y.view()); }, {"rope", "[1, 4, 2, 5]"});
  Buf x = randomBuf(rng, DType::F32, {1, 4, 2, 6});
  Buf y2 = poisoned(DType::F32, {1, 4, 3, 6});
  expectError([&] { cpu::rope(x.view(), 10000.0, y2.view()); },
              {"rope", "[1, 4, 3, 6]", "[1, 4, 2, 6]"});
}

// -----------------------------------------------------------------------------
// attention
// -----------------------------------------------------------------------------

namespace {

/// o[b, i, h] = sum_j softmax_j(scale q[b, i, h] . k[b, j, h / group]) v[b, j, h / group].
std::vector<double> attentionRef(const Buf &q, const Buf &k, const Buf &v, bool causal,
                                 double scale) {
  int64_t batch = q.shape[0], seq = q.shape[1], heads = q.shape[2], d = q.shape[3];
  int64_t kvHeads = k.shape[2], group = heads / kvHeads;
  std::vector<double> qv = q.get(), kv = k.get(), vv = v.get(), ref(qv.size());
  auto qAt = [&](int64_t b, int64_t s, int64_t h, int64_t e) {
    return qv[size_t(((b * seq + s) * heads + h) * d + e)];
  };
  auto kAt = [&](const std::vector<double> &t, int64_t b, int64_t s, int64_t g, int64_t e) {
    return t[size_t(((b * seq + s) * kvHeads + g) * d + e)];
  };
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < seq; ++i) {
        std::vector<double> w(size_t(seq), 0.0);
        double total = 0;
        for (int64_t j = 0; j < seq; ++j) {
          if (causal && j > i)
            continue;
          double dot = 0;
          for (int64_t e = 0; e < d; ++e)
            dot += qAt(b, i, h, e) * kAt(kv, b, j, h / group, e);
          w[size_t(j)] = std::exp(scale * dot);
          total += w[size_t(j)];
        }
        for (int64_t e = 0; e < d; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < seq; ++j)
            acc += w[size_t(j)] / total * kAt(vv, b, j, h / group, e);
          ref[size_t(((b * seq + i) * heads + h) * d + e)] = acc;
        }
      }
  return ref;
}

} // namespace

class AttentionTest : public ::testing::TestWithParam<std::tuple<int, int, bool, DType>> {};

TEST_P(AttentionTest, MatchesNaiveSoftmax) {
  auto [heads, kvHeads, causal, dtype] = GetParam();
  std::mt19937 rng(601 + heads * 10 + kvHeads + (causal ? 100 : 0) + int(dtype) * 1000);
  const int64_t batch = 2, seq = 7, d = 5;
  // Scores reach about +-10, so the softmax is far from uniform.
  Buf q = randomBuf(rng, dtype, {batch, seq, heads, d}, -2, 2);
  Buf k = randomBuf(rng, dtype, {batch, seq, kvHeads, d}, -2, 2);
  Buf v = randomBuf(rng, dtype, {batch, seq, kvHeads, d});
  Buf o = poisoned(dtype, {batch, seq, heads, d});
  const double scale = 0.37;
  cpu::attention(q.view(), k.view(), v.view(), causal, scale, o.view());
  expectAllNear(o, attentionRef(q, k, v, causal, scale), tolFor(dtype));
}

INSTANTIATE_TEST_SUITE_P(CpuKernelsTest, AttentionTest,
                         ::testing::Combine(::testing::Values(4), ::testing::Values(4, 2, 1),
                                            ::testing::Bool(),
                                            ::testing::Values(DType::F32, DType::BF16, DType::F16)),
                         [](const ::testing::TestParamInfo<AttentionTest::ParamType> &info) {
                           return "H" + std::to_string(std::get<0>(info.param)) + "Hkv" +
                                  std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "Causal" : "Full") +
                                  dtypeName(std::get<3>(info.param));
                         });

TEST(CpuKernelsTest, AttentionCausalFirstRowIsFirstValue) {
  // Query 0 sees only key 0 under the causal mask: its output is exactly value 0.
  std::mt19937 rng(602);
  Buf q = randomBuf(rng, DType::F32, {1, 5, 2, 3});
  Buf k = randomBuf(rng, DType::F32, {1, 5, 1, 3});
  Buf v = randomBuf(rng, DType::F32, {1, 5, 1, 3});
  Buf o = poisoned(DType::F32, {1, 5, 2, 3});
  cpu::attention(q.view(), k.view(), v.view(), true, 0.5, o.view());
  std::vector<double> ov = o.get(), vv = v.get();
  for (int h = 0; h < 2; ++h)
    for (int e = 0; e < 3; ++e)
      EXPECT_EQ(ov[size_t(h * 3 + e)], vv[size_t(e)]);
}

TEST(CpuKernelsTest, AttentionRejectsShapeDisagreements) {
  std::mt19937 rng(603);
  Buf q = randomBuf(rng, DType::F32, {2, 7, 4, 5});
  Buf k3 = randomBuf(rng, DType::F32, {2, 7, 3, 5});
  Buf o = poisoned(DType::F32, {2, 7, 4, 5});
  expectError([&] { cpu::attention(q.view(), k3.view(), k3.view(), false, 1.0, o.view()); },
              {"attention", "[2, 7, 3, 5]", "[2, 7, 4, 5]"});
  Buf k = randomBuf(rng, DType::F32, {2, 7, 2, 5});
  Buf vBad = randomBuf(rng, DType::F32, {2, 7, 2, 6});
  expectError([&] { cpu::attention(q.view(), k.view(), vBad.view(), false, 1.0, o.view()); },
              {"attention", "[2, 7, 2, 6]", "[2, 7, 2, 5]"});
  Buf kSeq = randomBuf(rng, DType::F32, {2, 6, 2, 5});
  expectError([&] { cpu::attention(q.view(), kSeq.view(), kSeq.view(), true, 1.0, o.view()); },
              {"attention", "[2, 6, 2, 5]"});
  Buf oBad = poisoned(DType::F32, {2, 7, 2, 5});
  expectError([&] { cpu::attention(q.view(), k.view(), k.view(), true, 1.0, oBad.view()); },
              {"attention", "[2, 7, 2, 5]", "[2, 7, 4, 5]"});
}

// -----------------------------------------------------------------------------
// silu, gelu, swiglu, softmax
// -----------------------------------------------------------------------------

TEST(CpuKernelsTest, SiluAndGelu) {
  std::mt19937 rng(701);
  const double pi = 3.14159265358979323846;
  for (DType dtype : kFloatDTypes) {
    SCOPED_TRACE(dtypeName(dtype));
    Buf x = randomBuf(rng, dtype, {3, 5, 7}, -6, 6);
    std::vector<double> xv = x.get(), silu(xv.size()), tanhRef(xv.size()), erfRef(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) {
      double v = xv[i];
      silu[i] = v / (1 + std::exp(-v));
      tanhRef[i] = 0.5 * v * (1 + std::tanh(std::sqrt(2 / pi) * (v + 0.044715 * v * v * v)));
      erfRef[i] = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    }
    Buf y = poisoned(dtype, {3, 5, 7});
    cpu::silu(x.view(), y.view());
    expectAllNear(y, silu, tolFor(dtype));
    y.poison();
    cpu::gelu(x.view(), true, y.view());
    expectAllNear(y, tanhRef, tolFor(dtype));
    y.poison();
    cpu::gelu(x.view(), false, y.view());
    expectAllNear(y, erfRef, tolFor(dtype));
  }
}

TEST(CpuKernelsTest, GeluTanhAndErfDiffer) {
  // The two variants differ by up to ~2e-4 near |x| = 2; a kernel ignoring the flag fails here.
  float xs[1] = {2.0f}, a[1], b[1];
  TensorView x{xs, DType::F32, {1}};
  cpu::gelu(x, true, TensorView{a, DType::F32, {1}});
  cpu::gelu(x, false, TensorView{b, DType::F32, {1}});
  EXPECT_NEAR(a[0], 1.9545977, 1e-6);
  EXPECT_NEAR(b[0], 1.9544997, 1e-6);
}

TEST(CpuKernelsTest, SwiGLU) {
  std::mt19937 rng(702);
  for (DType dtype : kFloatDTypes) {
    SCOPED_TRACE(dtypeName(dtype));
    Buf gate = randomBuf(rng, dtype, {3, 5, 7}, -5, 5);
    Buf up = randomBuf(rng, dtype, {3, 5, 7}, -2, 2);
    Buf y = poisoned(dtype, {3, 5, 7});
    cpu::swiglu(gate.view(), up.view(), y.view());
    std::vector<double> g = gate.get(), u = up.get(), ref(g.size());
    for (size_t i = 0; i < g.size(); ++i)
      ref[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
    expectAllNear(y, ref, tolFor(dtype));
  }
  Buf gate = randomBuf(rng, DType::F32, {3, 5});
  Buf up = randomBuf(rng, DType::F32, {5, 3});
  Buf y = poisoned(DType::F32, {3, 5});
  expectError([&] { cpu::swiglu(gate.view(), up.view(), y.view()); },
              {"swiglu", "[5, 3]", "[3, 5]"});
}

TEST(CpuKernelsTest, SoftmaxAlongEveryAxis) {
  std::mt19937 rng(703);
  const Shape shape = {3, 5, 7};
  for (DType dtype : kFloatDTypes) {
    for (int axis : {0, 1, 2, -1, -3}) {
      SCOPED_TRACE(std::string(dtypeName(dtype)) + " axis " + std::to_string(axis));
      // Up to 100: exp overflows fp32 without subtracting the maximum first.
      Buf x = randomBuf(rng, dtype, shape, -80, 100);
      Buf y = poisoned(dtype, shape);
      cpu::softmax(x.view(), axis, y.view());
      int a = axis < 0 ? axis + 3 : axis;
      std::vector<double> xv = x.get(), ref(xv.size());
      int64_t strides[3] = {35, 7, 1};
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 5; ++j)
          for (int64_t l = 0; l < 7; ++l) {
            int64_t at[3] = {i, j, l};
            double total = 0;
            for (int64_t t = 0; t < shape[size_t(a)]; ++t) {
              int64_t other[3] = {at[0], at[1], at[2]};
              other[a] = t;
              total += std::exp(xv[size_t(other[0] * 35 + other[1] * 7 + other[2])]);
            }
            size_t flat = size_t(i * strides[0] + j * strides[1] + l * strides[2]);
            ref[flat] = std::exp(xv[flat]) / total;
          }
      expectAllNear(y, ref, tolFor(dtype));
    }
  }
  Buf x = randomBuf(rng, DType::F32, shape);
  Buf y = poisoned(DType::F32, shape);
  expectError([&] { cpu::softmax(x.view(), 3, y.view()); }, {"softmax", "axis 3"});
}

// -----------------------------------------------------------------------------
// cross_entropy
// -----------------------------------------------------------------------------

namespace {

double crossEntropyRef(const Buf &logits, const std::vector<double> &labels, int64_t ignore) {
  int64_t vocab = logits.shape.back();
  std::vector<double> l = logits.get();
  double total = 0;
  int64_t count = 0;
  for (size_t r = 0; r < labels.size(); ++r) {
    if (int64_t(labels[r]) == ignore)
      continue;
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v)
      sum += std::exp(l[r * size_t(vocab) + size_t(v)]);
    total += std::log(sum) - l[r * size_t(vocab) + size_t(labels[r])];
    ++count;
  }
  return total / double(count);
}

} // namespace

TEST(CpuKernelsTest, CrossEntropyMeanOverNonIgnoredLabels) {
  std::mt19937 rng(801);
  for (DType dtype : kFloatDTypes) {
    for (DType labelType : {DType::I32, DType::I64}) {
      for (int64_t ignore : {int64_t(-100), int64_t(3)}) {
        SCOPED_TRACE(std::string(dtypeName(dtype)) + " labels " + dtypeName(labelType) +
                     " ignore " + std::to_string(ignore));
        const int64_t vocab = 11;
        Buf logits = randomBuf(rng, dtype, {3, 5, vocab}, -30, 30);
        std::vector<double> labels(15);
        std::uniform_int_distribution<int> pick(0, vocab - 1);
        for (double &l : labels)
          l = pick(rng);
        labels[2] = labels[9] = double(ignore);
        labels[4] = 0;
        labels[5] = vocab - 1;
        Buf labelBuf(labelType, {3, 5});
        labelBuf.set(labels);
        Buf loss = poisoned(DType::F32, {});
        cpu::crossEntropy(logits.view(), labelBuf.view(), ignore, loss.view());
        // The loss is an fp32 scalar: 1e-5 relative, as a NumPy reference would be compared.
        expectAllNear(loss, {crossEntropyRef(logits, labels, ignore)}, {1e-5, 0.0});
      }
    }
  }
}

TEST(CpuKernelsTest, CrossEntropyLargeVocabAndRows) {
  // Enough rows to run on several threads; the mean still sums rows in order.
  std::mt19937 rng(802);
  const int64_t rows = 96, vocab = 1000;
  Buf logits = randomBuf(rng, DType::BF16, {rows, vocab}, -8, 8);
  std::vector<double> labels(static_cast<size_t>(rows));
  std::uniform_int_distribution<int> pick(0, vocab - 1);
  for (double &l : labels)
    l = pick(rng);
  labels[7] = -100;
  Buf labelBuf(DType::I64, {rows});
  labelBuf.set(labels);
  Buf loss = poisoned(DType::F32, {1});
  cpu::crossEntropy(logits.view(), labelBuf.view(), -100, loss.view());
  expectAllNear(loss, {crossEntropyRef(logits, labels, -100)}, {1e-5, 0.0});
  Buf again = poisoned(DType::F32, {1});
  cpu::crossEntropy(logits.view(), labelBuf.view(), -100, again.view());
  expectBitExact(again, loss);
}

TEST(CpuKernelsTest, CrossEntropyAllIgnoredIsNaN) {
  std::mt19937 rng(803);
  Buf logits = randomBuf(rng, DType::F32, {4, 6});
  Buf labels(DType::I32, {4});
  labels.set({-100, -100, -100, -100});
  Buf loss(DType::F32, {});
  loss.set({1.0});
  cpu::crossEntropy(logits.view(), labels.view(), -100, loss.view());
  EXPECT_TRUE(std::isnan(loss.get()[0]));
}

TEST(CpuKernelsTest, CrossEntropyRejectsOutOfRangeLabels) {
  std::mt19937 rng(804);
  Buf logits = randomBuf(rng, DType::F32, {2, 3, 10});
  for (int64_t bad : {int64_t(10), int64_t(-1), int64_t(-101), int64_t(99999)}) {
    SCOPED_TRACE(bad);
    Buf labels(DType::I64, {2, 3});
    labels.set({1, -100, 3, 4, 5, double(bad)});
    Buf loss = poisoned(DType::F32, {});
    expectError([&] { cpu::crossEntropy(logits.view(), labels.view(), -100, loss.view()); },
                {"cross_entropy", std::to_string(bad), "[1, 2]", "[0, 10)"});
    EXPECT_TRUE(std::isnan(loss.get()[0]));
  }
  // -100 is only harmless while it is the ignore index.
  Buf labels(DType::I32, {2, 3});
  labels.set({1, -100, 3, 4, 5, 6});
  Buf loss = poisoned(DType::F32, {});
  expectError([&] { cpu::crossEntropy(logits.view(), labels.view(), 0, loss.view()); },
              {"cross_entropy", "-100", "[0, 1]"});
  Buf wrong(DType::I32, {3, 2});
  wrong.set({1, 2, 3, 4, 5, 6});
  expectError([&] { cpu::crossEntropy(logits.view(), wrong.view(), -100, loss.view()); },
              {"cross_entropy", "[3, 2]", "[2, 3, 10]"});
}

// -----------------------------------------------------------------------------
// transpose, slice, cast, copy
// -----------------------------------------------------------------------------

TEST(CpuKernelsTest, TransposeEveryPermutationKind) {
  std::mt19937 rng(901);
  const Shape shape = {2, 3, 4, 5};
  const std::vector<int64_t> perms[] = {{0, 1, 2, 3}, {3, 2, 1, 0}, {0, 2, 1, 3},
                                        {1, 0, 3, 2}, {2, 3, 0, 1}, {0, 1, 3, 2}};
  for (DType dtype : {DType::F32, DType::BF16, DType::I64, DType::I32}) {
    for (const std::vector<int64_t> &perm : perms) {
      SCOPED_TRACE(std::string(dtypeName(dtype)) + " perm " + formatShape(perm));
      Buf x(dtype, shape);
      std::vector<double> values(static_cast<size_t>(x.numel()));
      std::uniform_int_distribution<int> pick(-1000, 1000);
      for (double &v : values)
        v = dtype == DType::F32 || dtype == DType::BF16 ? pick(rng) / 7.0 : pick(rng);
      x.set(values);
      Shape yShape(4);
      for (size_t i = 0; i < 4; ++i)
        yShape[i] = shape[size_t(perm[i])];
      Buf y = poisoned(dtype, yShape), ref(dtype, yShape);
      std::vector<double> refValues(values.size());
      for (int64_t flat = 0; flat < y.numel(); ++flat) {
        int64_t yIndex[4], xIndex[4], f = flat;
        for (int d = 3; d >= 0; --d) {
          yIndex[d] = f % yShape[size_t(d)];
          f /= yShape[size_t(d)];
        }
        for (int d = 0; d < 4; ++d)
          xIndex[perm[size_t(d)]] = yIndex[d];
        refValues[size_t(flat)] =
            values[size_t(((xIndex[0] * 3 + xIndex[1]) * 4 + xIndex[2]) * 5 + xIndex[3])];
      }
      ref.set(refValues);
      cpu::transpose(x.view(), perm, y.view());
      expectBitExact(y, ref);
    }
  }
  Buf x = randomBuf(rng, DType::F32, {7, 3});
  Buf y = poisoned(DType::F32, {3, 7});
  cpu::transpose(x.view(), {1, 0}, y.view());
  std::vector<double> xv = x.get(), yv = y.get();
  for (int64_t i = 0; i < 7; ++i)
    for (int64_t j = 0; j < 3; ++j)
      EXPECT_EQ(yv[size_t(j * 7 + i)], xv[size_t(i * 3 + j)]);
  expectError([&] { cpu::transpose(x.view(), {0, 0}, y.view()); }, {"transpose", "[0, 0]"});
  expectError(
      [&] {
        cpu::transpose(x.view(), {0, 1}, y.view());
      },
      {"transpose", "[3, 7]", "[7, 3]"});
}

TEST(CpuKernelsTest, SliceAlongEveryAxis) {
  std::mt19937 rng(902);
  const Shape shape = {3, 7, 5};
  for (DType dtype : {DType::F32, DType::BF16, DType::I32}) {
    for (auto [axis, start, len] : {std::tuple<int, int64_t, int64_t>{0, 1, 2},
                                    {1, 2, 4},
                                    {2, 0, 3},
                                    {-1, 3, 2},
                                    {1, 0, 7},
                                    {-3, 2, 1}}) {
      SCOPED_TRACE(std::string(dtypeName(dtype)) + " axis " + std::to_string(axis) + " start " +
                   std::to_string(start));
      Buf x(dtype, shape);
      std::vector<double> values(static_cast<size_t>(x.numel()));
      std::uniform_int_distribution<int> pick(-1000, 1000);
      for (double &v : values)
        v = pick(rng);
      x.set(values);
      int a = axis < 0 ? axis + 3 : axis;
      Shape yShape = shape;
      yShape[size_t(a)] = len;
      Buf y = poisoned(dtype, yShape), ref(dtype, yShape);
      std::vector<double> refValues;
      for (int64_t i = 0; i < yShape[0]; ++i)
        for (int64_t j = 0; j < yShape[1]; ++j)
          for (int64_t l = 0; l < yShape[2]; ++l) {
            int64_t at[3] = {i, j, l};
            at[a] += start;
            refValues.push_back(values[size_t(at[0] * 35 + at[1] * 5 + at[2])]);
          }
      ref.set(refValues);
      cpu::slice(x.view(), axis, start, y.view());
      expectBitExact(y, ref);
    }
  }
  Buf x = randomBuf(rng, DType::F32, shape);
  Buf y = poisoned(DType::F32, {3, 4, 5});
  expectError([&] { cpu::slice(x.view(), 1, 4, y.view()); }, {"slice", "[4, 8)", "[3, 7, 5]"});
  expectError([&] { cpu::slice(x.view(), 1, -1, y.view()); }, {"slice", "[3, 7, 5]"});
  Buf y2 = poisoned(DType::F32, {3, 4, 4});
  expectError([&] { cpu::slice(x.view(), 1, 0, y2.view()); }, {"slice", "[3, 4, 4]", "[3, 7, 5]"});
}

// Concat is the inverse of slicing: the slices of y along an axis joined give y back.
TEST(CpuKernelsTest, ConcatJoinsSlicesAlongEveryAxis) {
  std::mt19937 rng(903);
  const Shape shape = {4, 6, 5};
  for (DType dtype : {DType::F32, DType::BF16, DType::I32})
    for (int axis : {0, 1, 2, -2}) {
      SCOPED_TRACE(std::string(dtypeName(dtype)) + " axis " + std::to_string(axis));
      int a = axis < 0 ? axis + 3 : axis;
      Buf y(dtype, shape);
      std::vector<double> values(static_cast<size_t>(y.numel()));
      std::uniform_int_distribution<int> pick(-1000, 1000);
      for (double &v : values)
        v = pick(rng);
      y.set(values);
      // Uneven pieces, one of them empty.
      std::vector<int64_t> sizes = {1, 0, shape[size_t(a)] - 3, 2};
      std::vector<Buf> pieces;
      std::vector<TensorView> views;
      int64_t start = 0;
      for (int64_t len : sizes) {
        Shape s = shape;
        s[size_t(a)] = len;
        pieces.push_back(poisoned(dtype, s));
        cpu::slice(y.view(), axis, start, pieces.back().view());
        start += len;
      }
      for (Buf &piece : pieces)
        views.push_back(piece.view());
      Buf joined = poisoned(dtype, shape);
      cpu::concat(views, axis, joined.view());
      expectBitExact(joined, y);
    }
  Buf a = randomBuf(rng, DType::F32, {2, 3}), b = randomBuf(rng, DType::F32, {2, 4});
  Buf y = poisoned(DType::F32, {2, 8});
  expectError(
      [&] {
        cpu::concat({a.view(), b.view()}, 1, y.view());
      },
      {"concat", "sum to 7", "[2, 8]"});
  expectError(
      [&] {
        cpu::concat({a.view(), b.view()}, 0, y.view());
      },
      {"concat", "x1 [2, 3]", "outside axis 0"});
  Buf h = randomBuf(rng, DType::BF16, {2, 5});
  expectError([&] { cpu::concat({a.view(), h.view()}, 1, y.view()); }, {"concat", "x2", "bf16"});
  expectError([&] { cpu::concat({}, 1, y.view()); }, {"concat", "at least one input"});
}

TEST(CpuKernelsTest, CastBetweenEveryFloatPair) {
  std::mt19937 rng(903);
  for (DType from : kFloatDTypes) {
    for (DType to : kFloatDTypes) {
      SCOPED_TRACE(std::string(dtypeName(from)) + " -> " + dtypeName(to));
      // Wide magnitudes: half overflows to infinity and underflows to subnormals here.
      Buf x(from, {3, 5, 7});
      std::vector<double> values(static_cast<size_t>(x.numel()));
      std::uniform_real_distribution<double> mant(-1, 1);
      std::uniform_int_distribution<int> exp(-30, 20);
      for (double &v : values)
        v = std::ldexp(mant(rng), exp(rng));
      x.set(values);
      Buf y = poisoned(to, x.shape), ref(to, x.shape);
      ref.set(x.get()); // one rounding from the exact source value
      cpu::cast(x.view(), y.view());
      expectBitExact(y, ref);
    }
  }
  Buf x = randomBuf(rng, DType::F32, {3, 5});
  Buf y = poisoned(DType::BF16, {5, 3});
  expectError([&] { cpu::cast(x.view(), y.view()); }, {"cast", "[5, 3]", "[3, 5]"});
  Buf i(DType::I32, {3, 5});
  expectError([&] { cpu::cast(x.view(), i.view()); }, {"cast", "i32"});
}

TEST(CpuKernelsTest, CopyBytes) {
  std::mt19937 rng(904);
  Buf x = randomBuf(rng, DType::BF16, {3, 5, 7});
  Buf y = poisoned(DType::BF16, {15, 7});
  cpu::copy(x.view(), y.view());
  EXPECT_EQ(x.storage, y.storage);
  Buf z = poisoned(DType::BF16, {3, 5, 6});
  expectError([&] { cpu::copy(x.view(), z.view()); }, {"copy", "[3, 5, 6]", "[3, 5, 7]"});
}

// -----------------------------------------------------------------------------
// Empty tensors
// -----------------------------------------------------------------------------

TEST(CpuKernelsTest, EmptyDimensions) {
  // An empty reduction: y is the bias, and c is zeros (OpenBLAS rejects k = 0 itself).
  std::mt19937 rng(951);
  Buf x(DType::F32, {2, 0}), w(DType::F32, {3, 0});
  Buf b = randomBuf(rng, DType::F32, {3});
  Buf y = poisoned(DType::F32, {2, 3});
  TensorView bv = b.view();
  cpu::linear(x.view(), w.view(), &bv, y.view());
  std::vector<double> bias = b.get(), ref;
  for (int r = 0; r < 2; ++r)
    ref.insert(ref.end(), bias.begin(), bias.end());
  expectAllNear(y, ref, {0.0, 0.0});
  Buf a(DType::BF16, {4, 0}), bm(DType::BF16, {0, 2});
  Buf c = poisoned(DType::BF16, {4, 2});
  cpu::matmul(a.view(), bm.view(), c.view());
  expectAllNear(c, std::vector<double>(8, 0.0), {0.0, 0.0});
  // No elements at all: nothing to read or write, and no null-pointer copies.
  Buf e(DType::F32, {0, 5}), f(DType::F32, {0, 5}), ids(DType::I32, {0});
  Buf row = randomBuf(rng, DType::F32, {5});
  cpu::add(e.view(), row.view(), f.view());
  cpu::softmax(e.view(), 0, f.view());
  cpu::rmsNorm(e.view(), row.view(), 1e-6, f.view());
  cpu::cast(e.view(), f.view());
  cpu::copy(e.view(), f.view());
  cpu::transpose(e.view(), {1, 0}, Buf(DType::F32, {5, 0}).view());
  cpu::embedding(randomBuf(rng, DType::F32, {3, 5}).view(), ids.view(), f.view());
  SUCCEED();
}

// -----------------------------------------------------------------------------
// Threading
// -----------------------------------------------------------------------------

TEST(CpuKernelsTest, LargeShapesRunOnThreadsAndStayDeterministic) {
  // Large enough that add, rms_norm, softmax and attention split their work over threads.
  std::mt19937 rng(1001);
  {
    Buf lhs = randomBuf(rng, DType::F32, {300, 500});
    Buf rhs = randomBuf(rng, DType::F32, {1, 500});
    Buf out = poisoned(DType::F32, {300, 500});
    cpu::add(lhs.view(), rhs.view(), out.view());
    expectAllNear(out, broadcastRef(lhs, rhs, true), tolFor(DType::F32));
  }
  {
    Buf x = randomBuf(rng, DType::BF16, {1024, 96}, -3, 3);
    Buf w = randomBuf(rng, DType::BF16, {96}, 0.5, 1.5);
    Buf y = poisoned(DType::BF16, {1024, 96});
    cpu::rmsNorm(x.view(), w.view(), 1e-6, y.view());
    std::vector<double> xv = x.get(), wv = w.get(), ref(xv.size());
    for (size_t r = 0; r < 1024; ++r) {
      double ms = 0;
      for (size_t i = 0; i < 96; ++i)
        ms += xv[r * 96 + i] * xv[r * 96 + i];
      for (size_t i = 0; i < 96; ++i)
        ref[r * 96 + i] = xv[r * 96 + i] / std::sqrt(ms / 96 + 1e-6) * wv[i];
    }
    expectAllNear(y, ref, tolFor(DType::BF16));
  }
  {
    Buf q = randomBuf(rng, DType::F32, {2, 32, 8, 16});
    Buf k = randomBuf(rng, DType::F32, {2, 32, 2, 16});
    Buf v = randomBuf(rng, DType::F32, {2, 32, 2, 16});
    Buf o = poisoned(DType::F32, {2, 32, 8, 16});
    cpu::attention(q.view(), k.view(), v.view(), true, 0.25, o.view());
    expectAllNear(o, attentionRef(q, k, v, true, 0.25), tolFor(DType::F32));
    Buf again = poisoned(DType::F32, {2, 32, 8, 16});
    cpu::attention(q.view(), k.view(), v.view(), true, 0.25, again.view());
    expectBitExact(again, o);
  }
}
