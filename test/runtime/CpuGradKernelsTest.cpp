//===- CpuGradKernelsTest.cpp - Gradient checks of the CPU backward kernels ===//
//
// Every backward kernel of CpuKernels.h against central finite differences of its forward op.
// The forward op is differentiated through a naive fp64 reference written here, which is first
// checked against the forward kernel on the same inputs, so the differences are those of the
// kernel's semantics without fp32 noise: with h = 1e-5 in fp64 the truncation error (h^2/6 |f'''|)
// and the cancellation error (1e-16 |L| / h) are both below 1e-8 on these tiny shapes. The kernel
// computes in fp32 with fp64 reductions and rounds each gradient to f32, so its error is a few
// 1e-7 relative, at most about 1e-5 absolute for the fp32 GEMM sums here; the tolerance,
// 1e-5 + 1e-4 |expected|, is far below any wrong term (a missing eps, a wrong GQA group, an
// unscaled or unmasked score all move gradients by 1e-3 or more). Inputs are fresh random values
// from fixed seeds (never zeros), every output is poisoned with NaN before each call, and every
// output element is checked. Larger shapes run on several threads and are compared with
// single-piece calls or fp64 references; bf16 outputs must be the f32 results rounded once.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"

#include <gtest/gtest.h>

#include <algorithm>
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
using Vec = std::vector<double>;

int64_t numelOf(const Shape &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
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
  void set(const Vec &values) {
    ASSERT_EQ(values.size(), size_t(numel()));
    for (size_t i = 0; i < values.size(); ++i) {
      uint8_t *p = &storage[i * dtypeSize(dtype)];
      if (dtype == DType::F32) {
        float f = float(values[i]);
        std::memcpy(p, &f, 4);
      } else if (dtype == DType::F16) {
        uint16_t h = f32ToF16(float(values[i]));
        std::memcpy(p, &h, 2);
      } else if (dtype == DType::BF16) {
        uint16_t h = f32ToBf16(float(values[i]));
        std::memcpy(p, &h, 2);
      } else if (dtype == DType::I32) {
        int32_t v = int32_t(values[i]);
        std::memcpy(p, &v, 4);
      } else {
        int64_t v = int64_t(values[i]);
        std::memcpy(p, &v, 8);
      }
    }
  }

  /// The stored values, decoded exactly (through the runtime's own exact conversions).
  Vec get() const {
    Vec values(static_cast<size_t>(numel()));
    if (dtype == DType::I32 || dtype == DType::I64) {
      for (size_t i = 0; i < values.size(); ++i)
        values[i] = double(loadIndex(view(), int64_t(i)));
      return values;
    }
    std::vector<float> f(values.size());
    loadF32(view(), f.data());
    for (size_t i = 0; i < values.size(); ++i)
      values[i] = f[i];
    return values;
  }

  /// Fills every element with NaN, so unwritten elements show.
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

Buf withValues(DType dtype, Shape shape, const Vec &values) {
  Buf b(dtype, std::move(shape));
  b.set(values);
  return b;
}

/// A tensor of uniform random values in [lo, hi), none of them near zero.
Buf randomBuf(std::mt19937 &rng, DType dtype, Shape shape, double lo = -1.0, double hi = 1.0) {
  Buf b(dtype, std::move(shape));
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec values(static_cast<size_t>(b.numel()));
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

/// The same values in another dtype (exact when they are representable in it).
Buf converted(const Buf &b, DType dtype) { return withValues(dtype, b.shape, b.get()); }

double dot(const Vec &a, const Vec &b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    s += a[i] * b[i];
  return s;
}

/// d<dy, f(x)>/dx_i for every i by central differences in fp64.
Vec numericGrad(const std::function<Vec(const Vec &)> &f, const Vec &x, const Vec &dy,
                double h = 1e-5) {
  Vec grad(x.size()), xp = x;
  for (size_t i = 0; i < x.size(); ++i) {
    xp[i] = x[i] + h;
    double plus = dot(dy, f(xp));
    xp[i] = x[i] - h;
    double minus = dot(dy, f(xp));
    xp[i] = x[i];
    grad[i] = (plus - minus) / (2.0 * h);
  }
  return grad;
}

/// Allowed error: abs + rel * |expected|.
struct Tol {
  double abs, rel;
};
/// Kernel gradients against finite differences (see the file comment).
constexpr Tol kGradTol{1e-5, 1e-4};
/// The fp64 references against the forward kernels' f32 outputs.
constexpr Tol kForwardTol{1e-6, 1e-5};

std::string indexString(int64_t flat, const Shape &shape) {
  std::string s;
  for (size_t i = shape.size(); i-- > 0;) {
    s = std::to_string(flat % shape[i]) + (s.empty() ? "" : ", ") + s;
    flat /= shape[i];
  }
  return "[" + s + "]";
}

/// Compares every element of `got` with `expected`; reports the first few mismatches.
void expectNear(const Buf &got, const Vec &expected, Tol tol, const std::string &what) {
  Vec values = got.get();
  ASSERT_EQ(values.size(), expected.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] == expected[i])
      continue; // infinities included
    double err = std::fabs(values[i] - expected[i]);
    if (!(err <= tol.abs + tol.rel * std::fabs(expected[i])) && ++failures <= 8)
      ADD_FAILURE() << what << " element " << indexString(int64_t(i), got.shape) << ": got "
                    << values[i] << ", expected " << expected[i] << " (error " << err << ")";
  }
  EXPECT_EQ(failures, 0) << what << ": mismatches of " << values.size() << " elements";
}

/// Every stored byte of `got` equals that of `expected`.
void expectBitExact(const Buf &got, const Buf &expected, const std::string &what) {
  ASSERT_EQ(got.storage.size(), expected.storage.size()) << what;
  ASSERT_EQ(got.dtype, expected.dtype) << what;
  size_t size = dtypeSize(got.dtype);
  int failures = 0;
  for (size_t i = 0; i < got.storage.size(); i += size)
    if (std::memcmp(&got.storage[i], &expected.storage[i], size) != 0 && ++failures <= 8)
      ADD_FAILURE() << what << " element " << indexString(int64_t(i / size), got.shape)
                    << " differs";
  EXPECT_EQ(failures, 0) << what;
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

void expectAllNaN(const Buf &b, const std::string &what) {
  for (double v : b.get())
    EXPECT_TRUE(std::isnan(v)) << what << " was written";
}

//===----------------------------------------------------------------------===//
// fp64 references of the forward ops
//===----------------------------------------------------------------------===//

/// out[p, :] = table[ids[p], :].
Vec embeddingRef(const Vec &table, const Vec &ids, int64_t hidden) {
  Vec out;
  for (double id : ids)
    for (int64_t e = 0; e < hidden; ++e)
      out.push_back(table[size_t(int64_t(id) * hidden + e)]);
  return out;
}

/// y[r, n] = sum_k x[r, k] w[n, k].
Vec linearRef(const Vec &x, const Vec &w, int64_t rows, int64_t in, int64_t out) {
  Vec y(size_t(rows * out), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t n = 0; n < out; ++n)
      for (int64_t k = 0; k < in; ++k)
        y[size_t(r * out + n)] += x[size_t(r * in + k)] * w[size_t(n * in + k)];
  return y;
}

/// lhs + rhs with rhs broadcast over lhs's trailing dimensions.
Vec broadcastAddRef(const Vec &lhs, const Shape &lhsShape, const Vec &rhs, const Shape &rhsShape) {
  Vec out(lhs.size());
  size_t lr = lhsShape.size(), rr = rhsShape.size();
  for (size_t flat = 0; flat < lhs.size(); ++flat) {
    std::vector<int64_t> index(lr);
    for (size_t d = lr, f = flat; d-- > 0;) {
      index[d] = int64_t(f % size_t(lhsShape[d]));
      f /= size_t(lhsShape[d]);
    }
    int64_t ri = 0;
    for (size_t d = 0; d < rr; ++d)
      ri = ri * rhsShape[d] + (rhsShape[d] == 1 ? 0 : index[lr - rr + d]);
    out[flat] = lhs[flat] + rhs[size_t(ri)];
  }
  return out;
}

Vec rmsNormRef(const Vec &x, const Vec &w, int64_t d, double eps) {
  Vec y(x.size());
  for (size_t r = 0; r < x.size() / size_t(d); ++r) {
    double ms = 0;
    for (int64_t i = 0; i < d; ++i)
      ms += x[r * d + i] * x[r * d + i] / double(d);
    for (int64_t i = 0; i < d; ++i)
      y[r * d + i] = x[r * d + i] / std::sqrt(ms + eps) * w[size_t(i)];
  }
  return y;
}

Vec layerNormRef(const Vec &x, const Vec &w, const Vec &b, int64_t d, double eps) {
  Vec y(x.size());
  for (size_t r = 0; r < x.size() / size_t(d); ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < d; ++i)
      mean += x[r * d + i] / double(d);
    for (int64_t i = 0; i < d; ++i)
      var += (x[r * d + i] - mean) * (x[r * d + i] - mean) / double(d);
    for (int64_t i = 0; i < d; ++i)
      y[r * d + i] = (x[r * d + i] - mean) / std::sqrt(var + eps) * w[size_t(i)] + b[size_t(i)];
  }
  return y;
}

/// Hugging Face rotate-half rope of x [B, S, H, D].
Vec ropeRef(const Vec &x, const Shape &shape, double theta) {
  int64_t seq = shape[1], heads = shape[2], d = shape[3], half = d / 2;
  Vec y(x.size());
  for (size_t t = 0; t < x.size() / size_t(heads * d); ++t) {
    int64_t s = int64_t(t) % seq;
    for (int64_t h = 0; h < heads; ++h) {
      size_t base = (t * heads + h) * d;
      for (int64_t i = 0; i < half; ++i) {
        double angle = double(s) * std::pow(theta, -2.0 * double(i) / double(d));
        double lo = x[base + i], hi = x[base + i + half];
        y[base + i] = lo * std::cos(angle) - hi * std::sin(angle);
        y[base + i + half] = hi * std::cos(angle) + lo * std::sin(angle);
      }
    }
  }
  return y;
}

/// softmax(scale q kᵀ [causal]) v; q [B, S, H, D], k and v [B, S, Hkv, D].
Vec attentionRef(const Vec &q, const Vec &k, const Vec &v, const Shape &qShape, int64_t kvHeads,
                 bool causal, double scale) {
  int64_t batch = qShape[0], seq = qShape[1], heads = qShape[2], d = qShape[3];
  int64_t group = heads / kvHeads;
  Vec o(q.size());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < seq; ++i) {
        Vec w(size_t(seq), 0.0);
        double total = 0;
        for (int64_t j = 0; j < seq; ++j) {
          if (causal && j > i)
            continue;
          double s = 0;
          for (int64_t e = 0; e < d; ++e)
            s += q[size_t(((b * seq + i) * heads + h) * d + e)] *
                 k[size_t(((b * seq + j) * kvHeads + h / group) * d + e)];
          total += w[size_t(j)] = std::exp(scale * s);
        }
        for (int64_t e = 0; e < d; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < seq; ++j)
            acc += w[size_t(j)] / total * v[size_t(((b * seq + j) * kvHeads + h / group) * d + e)];
          o[size_t(((b * seq + i) * heads + h) * d + e)] = acc;
        }
      }
  return o;
}

double siluRef(double x) { return x / (1.0 + std::exp(-x)); }
double geluRef(double x, bool tanh) {
  if (tanh)
    return 0.5 * x *
           (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}

/// softmax of x along `axis`.
Vec softmaxRef(const Vec &x, const Shape &shape, int64_t axis) {
  int64_t outer = 1, len = shape[size_t(axis)], inner = 1;
  for (int64_t i = 0; i < axis; ++i)
    outer *= shape[size_t(i)];
  for (size_t i = size_t(axis) + 1; i < shape.size(); ++i)
    inner *= shape[i];
  Vec y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < inner; ++c) {
      double total = 0;
      for (int64_t i = 0; i < len; ++i)
        total += std::exp(x[size_t((o * len + i) * inner + c)]);
      for (int64_t i = 0; i < len; ++i)
        y[size_t((o * len + i) * inner + c)] =
            std::exp(x[size_t((o * len + i) * inner + c)]) / total;
    }
  return y;
}

/// Mean over non-ignored rows of -log softmax(logits)[label].
double crossEntropyRef(const Vec &logits, const Vec &labels, int64_t vocab, int64_t ignore) {
  double total = 0;
  int count = 0;
  for (size_t r = 0; r < labels.size(); ++r) {
    if (int64_t(labels[r]) == ignore)
      continue;
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i)
      sum += std::exp(logits[r * vocab + i]);
    total += std::log(sum) - logits[r * vocab + size_t(labels[r])];
    ++count;
  }
  return total / count;
}

/// x[..., start : start + len, ...] along `axis`.
Vec sliceRef(const Vec &x, const Shape &shape, int64_t axis, int64_t start, int64_t len) {
  int64_t outer = 1, full = shape[size_t(axis)], inner = 1;
  for (int64_t i = 0; i < axis; ++i)
    outer *= shape[size_t(i)];
  for (size_t i = size_t(axis) + 1; i < shape.size(); ++i)
    inner *= shape[i];
  Vec y;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = start; i < start + len; ++i)
      for (int64_t c = 0; c < inner; ++c)
        y.push_back(x[size_t((o * full + i) * inner + c)]);
  return y;
}

} // namespace

//===----------------------------------------------------------------------===//
// fill
//===----------------------------------------------------------------------===//

TEST(CpuGradKernelsTest, FillWritesEveryElementRoundedOnce) {
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (double value : {1.0, -0.1, 3e38, -std::numeric_limits<double>::infinity()}) {
      SCOPED_TRACE(std::string(dtypeName(dtype)) + " " + std::to_string(value));
      // Past one internal chunk, so several chunks (and threads) store.
      Buf y = poisoned(dtype, {5, 20000});
      cpu::fill(value, y.view());
      Buf one = withValues(dtype, {1}, {double(float(value))});
      Vec expected(size_t(y.numel()), one.get()[0]);
      expectNear(y, expected, {0.0, 0.0}, "y");
    }
  }
  Buf ids(DType::I64, {3});
  expectError([&] { cpu::fill(1.0, ids.view()); }, {"fill", "y", "i64"});
}

//===----------------------------------------------------------------------===//
// embedding_grad
//===----------------------------------------------------------------------===//

TEST(CpuGradKernelsTest, EmbeddingGradAccumulatesRepeatedIds) {
  std::mt19937 rng(2101);
  for (DType idType : {DType::I32, DType::I64}) {
    SCOPED_TRACE(dtypeName(idType));
    const int64_t vocab = 7, hidden = 5;
    // Ids 2 and 5 repeat (three and two times), 0, 1 and 6 never occur: their rows must be 0.
    Vec idValues = {2, 5, 3, 2, 4, 5, 2, 3};
    Buf ids = withValues(idType, {2, 4}, idValues);
    Buf table = randomBuf(rng, DType::F32, {vocab, hidden});
    Buf dy = randomBuf(rng, DType::F32, {2, 4, hidden});
    Buf out = poisoned(DType::F32, {2, 4, hidden});
    cpu::embedding(table.view(), ids.view(), out.view());
    expectNear(out, embeddingRef(table.get(), idValues, hidden), kForwardTol, "embedding");

    Buf dtable = poisoned(DType::F32, {vocab, hidden});
    cpu::embeddingGrad(dy.view(), ids.view(), dtable.view());
    Vec fd = numericGrad([&](const Vec &t) { return embeddingRef(t, idValues, hidden); },
                         table.get(), dy.get());
    expectNear(dtable, fd, kGradTol, "dtable");
    Vec got = dtable.get();
    for (int64_t r : {0, 1, 6})
      for (int64_t e = 0; e < hidden; ++e)
        EXPECT_EQ(got[size_t(r * hidden + e)], 0.0) << "unused row " << r;
  }
}

TEST(CpuGradKernelsTest, EmbeddingGradLargeVocabOnThreadsSumsInPositionOrder) {
  std::mt19937 rng(2102);
  const int64_t vocab = 500, hidden = 160, n = 3000;
  Vec idValues(n);
  std::uniform_int_distribution<int> pick(0, 99); // 100 ids, about 30 positions each
  for (double &v : idValues)
    v = pick(rng) * 5;
  Buf ids = withValues(DType::I64, {n}, idValues);
  Buf dy = randomBuf(rng, DType::F32, {n, hidden});
  Buf dtable = poisoned(DType::F32, {vocab, hidden});
  cpu::embeddingGrad(dy.view(), ids.view(), dtable.view());
  // The documented order: positions in order, summed in fp64, rounded once.
  Vec g = dy.get(), sums(size_t(vocab * hidden), 0.0);
  for (int64_t p = 0; p < n; ++p)
    for (int64_t e = 0; e < hidden; ++e)
      sums[size_t(int64_t(idValues[size_t(p)]) * hidden + e)] += g[size_t(p * hidden + e)];
  Buf expected = withValues(DType::F32, {vocab, hidden}, sums);
  expectBitExact(dtable, expected, "dtable");
}

TEST(CpuGradKernelsTest, EmbeddingGradRejectsOutOfRangeIdsBeforeWriting) {
  std::mt19937 rng(2103);
  Buf dy = randomBuf(rng, DType::F32, {2, 3, 4});
  for (int64_t bad : {int64_t(11), int64_t(-1)}) {
    Buf ids = withValues(DType::I64, {2, 3}, {1, 2, 3, 4, double(bad), 5});
    Buf dtable = poisoned(DType::F32, {11, 4});
    expectError([&] { cpu::embeddingGrad(dy.view(), ids.view(), dtable.view()); },
                {"embedding_grad", std::to_string(bad), "[1, 1]", "[0, 11)"});
    expectAllNaN(dtable, "dtable");
  }
  Buf ids = withValues(DType::I64, {2, 3}, {1, 2, 3, 4, 5, 6});
  Buf dtable = poisoned(DType::F32, {11, 5});
  expectError([&] { cpu::embeddingGrad(dy.view(), ids.view(), dtable.view()); },
              {"embedding_grad", "[2, 3, 4]", "[2, 3, 5]", "[11, 5]"});
}

//===----------------------------------------------------------------------===//
// linear_grad_input and linear_grad_weight
//===----------------------------------------------------------------------===//

TEST(CpuGradKernelsTest, LinearGradsMatchFiniteDifferences) {
  std::mt19937 rng(2201);
  for (Shape xShape : {Shape{2, 3, 5}, Shape{4, 6}, Shape{1, 1}}) {
    for (int64_t out : {int64_t(4), int64_t(1), int64_t(7)}) {
      SCOPED_TRACE("x " + formatShape(xShape) + " out " + std::to_string(out));
      int64_t in = xShape.back(), rows = numelOf(xShape) / in;
      Shape yShape = xShape;
      yShape.back() = out;
      Buf x = randomBuf(rng, DType::F32, xShape), w = randomBuf(rng, DType::F32, {out, in});
      Buf dy = randomBuf(rng, DType::F32, yShape);
      Buf y = poisoned(DType::F32, yShape);
      cpu::linear(x.view(), w.view(), nullptr, y.view());
      expectNear(y, linearRef(x.get(), w.get(), rows, in, out), kForwardTol, "linear");

      Buf dx = poisoned(DType::F32, xShape), dw = poisoned(DType::F32, {out, in});
      cpu::linearGradInput(dy.view(), w.view(), dx.view());
      cpu::linearGradWeight(dy.view(), x.view(), dw.view());
      Vec xv = x.get(), wv = w.get();
      expectNear(
          dx,
          numericGrad([&](const Vec &t) { return linearRef(t, wv, rows, in, out); }, xv, dy.get()),
          kGradTol, "dx");
      expectNear(
          dw,
          numericGrad([&](const Vec &t) { return linearRef(xv, t, rows, in, out); }, wv, dy.get()),
          kGradTol, "dw");
    }
  }
}

TEST(CpuGradKernelsTest, LinearGradsLargeEnoughToBlock) {
  // Past OpenBLAS's small-matrix paths, into its blocked and threaded kernels; finite differences
  // would take too long, so the reference is the fp64 matrix product with an fp32-accumulation
  // allowance of 1e-5 * sum |terms| (as the forward GEMM tests).
  std::mt19937 rng(2202);
  const int64_t rows = 3 * 67, in = 129, out = 131;
  Buf x = randomBuf(rng, DType::F32, {3, 67, in}), w = randomBuf(rng, DType::F32, {out, in});
  Buf dy = randomBuf(rng, DType::F32, {3, 67, out});
  Buf dx = poisoned(DType::F32, {3, 67, in}), dw = poisoned(DType::F32, {out, in});
  cpu::linearGradInput(dy.view(), w.view(), dx.view());
  cpu::linearGradWeight(dy.view(), x.view(), dw.view());
  Vec xv = x.get(), wv = w.get(), g = dy.get();
  auto check = [](const Buf &got, const Vec &ref, const Vec &mag, const char *what) {
    Vec values = got.get();
    int failures = 0;
    for (size_t i = 0; i < values.size(); ++i)
      if (!(std::fabs(values[i] - ref[i]) <= 1e-6 + 1e-5 * mag[i]) && ++failures <= 8)
        ADD_FAILURE() << what << "[" << i << "]: got " << values[i] << ", expected " << ref[i];
    EXPECT_EQ(failures, 0) << what;
  };
  Vec refX(size_t(rows * in), 0.0), magX(refX.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < in; ++k)
      for (int64_t n = 0; n < out; ++n) {
        double t = g[size_t(r * out + n)] * wv[size_t(n * in + k)];
        refX[size_t(r * in + k)] += t;
        magX[size_t(r * in + k)] += std::fabs(t);
      }
  check(dx, refX, magX, "dx");
  Vec refW(size_t(out * in), 0.0), magW(refW.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t n = 0; n < out; ++n)
      for (int64_t k = 0; k < in; ++k) {
        double t = g[size_t(r * out + n)] * xv[size_t(r * in + k)];
        refW[size_t(n * in + k)] += t;
        magW[size_t(n * in + k)] += std::fabs(t);
      }
  check(dw, refW, magW, "dw");
}

TEST(CpuGradKernelsTest, LinearGradsRejectShapeDisagreements) {
  std::mt19937 rng(2203);
  Buf dy = randomBuf(rng, DType::F32, {3, 5, 9});
  Buf w = randomBuf(rng, DType::F32, {8, 7});
  Buf dx = poisoned(DType::F32, {3, 5, 7});
  expectError([&] { cpu::linearGradInput(dy.view(), w.view(), dx.view()); },
              {"linear_grad_input", "[8, 7]", "[3, 5, 9]"});
  Buf w2 = randomBuf(rng, DType::F32, {9, 7});
  Buf dx2 = poisoned(DType::F32, {3, 5, 6});
  expectError([&] { cpu::linearGradInput(dy.view(), w2.view(), dx2.view()); },
              {"linear_grad_input", "[3, 5, 6]", "[3, 5, 7]"});
  Buf x = randomBuf(rng, DType::F32, {3, 4, 7});
  Buf dw = poisoned(DType::F32, {9, 7});
  expectError([&] { cpu::linearGradWeight(dy.view(), x.view(), dw.view()); },
              {"linear_grad_weight", "[3, 4, 7]", "[3, 5, 9]"});
  Buf x2 = randomBuf(rng, DType::F32, {3, 5, 7});
  Buf dw2 = poisoned(DType::F32, {7, 9});
  expectError([&] { cpu::linearGradWeight(dy.view(), x2.view(), dw2.view()); },
              {"linear_grad_weight", "[7, 9]", "[9, 7]"});
}

//===----------------------------------------------------------------------===//
// reduce_to
//===----------------------------------------------------------------------===//

TEST(CpuGradKernelsTest, ReduceToIsTheGradientOfBroadcastAdd) {
  std::mt19937 rng(2301);
  const Shape lhsShape = {3, 5, 4};
  for (Shape rhsShape : {Shape{4}, Shape{1, 4}, Shape{5, 4}, Shape{5, 1}, Shape{}, Shape{1},
                         Shape{3, 1, 4}, Shape{1, 5, 1}, Shape{3, 5, 4}}) {
    SCOPED_TRACE("rhs " + formatShape(rhsShape));
    Buf lhs = randomBuf(rng, DType::F32, lhsShape), rhs = randomBuf(rng, DType::F32, rhsShape);
    Buf out = poisoned(DType::F32, lhsShape);
    cpu::add(lhs.view(), rhs.view(), out.view());
    Vec lv = lhs.get();
    expectNear(out, broadcastAddRef(lv, lhsShape, rhs.get(), rhsShape), kForwardTol, "add");

    Buf dy = randomBuf(rng, DType::F32, lhsShape);
    Buf drhs = poisoned(DType::F32, rhsShape);
    cpu::reduceTo(dy.view(), drhs.view());
    Vec fd = numericGrad([&](const Vec &r) { return broadcastAddRef(lv, lhsShape, r, rhsShape); },
                         rhs.get(), dy.get());
    expectNear(drhs, fd, kGradTol, "drhs");
  }
}

TEST(CpuGradKernelsTest, ReduceToLargeOnThreadsSumsInIndexOrder) {
  std::mt19937 rng(2302);
  const Shape xShape = {64, 50, 40};
  Buf x = randomBuf(rng, DType::F32, xShape);
  Vec xv = x.get();
  for (Shape yShape : {Shape{40}, Shape{50, 1}, Shape{64, 1, 40}, Shape{50, 40}}) {
    SCOPED_TRACE("y " + formatShape(yShape));
    Buf y = poisoned(DType::F32, yShape);
    cpu::reduceTo(x.view(), y.view());
    // The documented order: x's elements in row-major order, summed in fp64, rounded once.
    Vec sums(size_t(numelOf(yShape)), 0.0);
    size_t lead = xShape.size() - yShape.size();
    for (size_t flat = 0; flat < xv.size(); ++flat) {
      size_t f = flat, yi = 0, stride = 1;
      for (size_t d = xShape.size(); d-- > 0;) {
        size_t index = f % size_t(xShape[d]);
        f /= size_t(xShape[d]);
        if (d >= lead) {
          size_t yd = size_t(yShape[d - lead]);
          yi += (yd == 1 ? 0 : index) * stride;
          stride *= yd;
        }
      }
      sums[yi] += xv[flat];
    }
    expectBitExact(y, withValues(DType::F32, yShape, sums), "y");
  }
}

TEST(CpuGradKernelsTest, ReduceToRejectsShapesThatDoNotBroadcast) {
  std::mt19937 rng(2303);
  Buf x = randomBuf(rng, DType::F32, {3, 5, 4});
  for (Shape bad : {Shape{3}, Shape{2, 4}, Shape{1, 3, 5, 4}}) {
    Buf y = poisoned(DType::F32, bad);
    expectError([&] { cpu::reduceTo(x.view(), y.view()); },
                {"reduce_to", formatShape(bad), "[3, 5, 4]"});
    expectAllNaN(y, "y");
  }
}

//===----------------------------------------------------------------------===//
// rms_norm_grad and layer_norm_grad
//===----------------------------------------------------------------------===//

TEST(CpuGradKernelsTest, RmsNormGradMatchesFiniteDifferences) {
  std::mt19937 rng(2401);
  // A large eps makes its place in the formula visible; a small one is the usual case.
  for (double eps : {0.3, 1e-6}) {
    for (Shape shape : {Shape{2, 3, 8}, Shape{5, 1}, Shape{7}}) {
      SCOPED_TRACE("eps " + std::to_string(eps) + " x " + formatShape(shape));
      int64_t d = shape.back();
      Buf x = randomBuf(rng, DType::F32, shape), w = randomBuf(rng, DType::F32, {d}, 0.5, 1.5);
      Buf dy = randomBuf(rng, DType::F32, shape);
      Buf y = poisoned(DType::F32, shape);
      cpu::rmsNorm(x.view(), w.view(), eps, y.view());
      Vec xv = x.get(), wv = w.get();
      expectNear(y, rmsNormRef(xv, wv, d, eps), kForwardTol, "rms_norm");

      Buf dx = poisoned(DType::F32, shape), dw = poisoned(DType::F32, {d});
      cpu::rmsNormGrad(dy.view(), x.view(), w.view(), eps, dx.view(), dw.view());
      expectNear(dx,
                 numericGrad([&](const Vec &t) { return rmsNormRef(t, wv, d, eps); }, xv, dy.get()),
                 kGradTol, "dx");
      expectNear(dw,
                 numericGrad([&](const Vec &t) { return rmsNormRef(xv, t, d, eps); }, wv, dy.get()),
                 kGradTol, "dw");
    }
  }
}

TEST(CpuGradKernelsTest, LayerNormGradMatchesFiniteDifferences) {
  std::mt19937 rng(2402);
  for (double eps : {0.3, 1e-5}) {
    for (Shape shape : {Shape{2, 3, 8}, Shape{4, 2}, Shape{9}}) {
      SCOPED_TRACE("eps " + std::to_string(eps) + " x " + formatShape(shape));
      int64_t d = shape.back();
      // Rows with a non-zero mean, so that subtracting it matters.
      Buf x = randomBuf(rng, DType::F32, shape, -0.5, 1.5);
      Buf w = randomBuf(rng, DType::F32, {d}, 0.5, 1.5), b = randomBuf(rng, DType::F32, {d});
      Buf dy = randomBuf(rng, DType::F32, shape);
      Buf y = poisoned(DType::F32, shape);
      cpu::layerNorm(x.view(), w.view(), b.view(), eps, y.view());
      Vec xv = x.get(), wv = w.get(), bv = b.get();
      expectNear(y, layerNormRef(xv, wv, bv, d, eps), kForwardTol, "layer_norm");

      Buf dx = poisoned(DType::F32, shape), dw = poisoned(DType::F32, {d});
      Buf db = poisoned(DType::F32, {d});
      cpu::layerNormGrad(dy.view(), x.view(), w.view(), eps, dx.view(), dw.view(), db.view());
      Vec g = dy.get();
      expectNear(dx,
                 numericGrad([&](const Vec &t) { return layerNormRef(t, wv, bv, d, eps); }, xv, g),
                 kGradTol, "dx");
      expectNear(dw,
                 numericGrad([&](const Vec &t) { return layerNormRef(xv, t, bv, d, eps); }, wv, g),
                 kGradTol, "dw");
      expectNear(db,
                 numericGrad([&](const Vec &t) { return layerNormRef(xv, wv, t, d, eps); }, bv, g),
                 kGradTol, "db");
    }
  }
}

TEST(CpuGradKernelsTest, NormGradsLargeOnThreads) {
  // Enough rows that dx's rows and dw's columns are split over threads. Each row of dx must equal
  // that of a one-row call bit for bit (rows are independent); dw and db are checked against
  // finite differences over all 1024 rows.
  std::mt19937 rng(2403);
  const int64_t rows = 1024, d = 96;
  const double eps = 1e-5;
  Buf x = randomBuf(rng, DType::F32, {rows, d}, -2, 2);
  Buf w = randomBuf(rng, DType::F32, {d}, 0.5, 1.5), b = randomBuf(rng, DType::F32, {d});
  Buf dy = randomBuf(rng, DType::F32, {rows, d});
  Vec xv = x.get(), wv = w.get(), bv = b.get(), g = dy.get();
  for (bool layer : {false, true}) {
    SCOPED_TRACE(layer ? "layer_norm_grad" : "rms_norm_grad");
    Buf dx = poisoned(DType::F32, {rows, d}), dw = poisoned(DType::F32, {d});
    Buf db = poisoned(DType::F32, {d});
    if (layer)
      cpu::layerNormGrad(dy.view(), x.view(), w.view(), eps, dx.view(), dw.view(), db.view());
    else
      cpu::rmsNormGrad(dy.view(), x.view(), w.view(), eps, dx.view(), dw.view());
    Buf rowDx = poisoned(DType::F32, {1, d}), rowDw = poisoned(DType::F32, {d});
    Buf rowDb = poisoned(DType::F32, {d});
    Buf expectedDx(DType::F32, {rows, d});
    for (int64_t r = 0; r < rows; ++r) {
      TensorView xr{x.storage.data() + r * d * 4, DType::F32, {1, d}};
      TensorView gr{dy.storage.data() + r * d * 4, DType::F32, {1, d}};
      if (layer)
        cpu::layerNormGrad(gr, xr, w.view(), eps, rowDx.view(), rowDw.view(), rowDb.view());
      else
        cpu::rmsNormGrad(gr, xr, w.view(), eps, rowDx.view(), rowDw.view());
      std::memcpy(expectedDx.storage.data() + r * d * 4, rowDx.storage.data(), size_t(d) * 4);
    }
    expectBitExact(dx, expectedDx, "dx");
    auto f = [&](const Vec &wt, const Vec &bt) {
      return layer ? layerNormRef(xv, wt, bt, d, eps) : rmsNormRef(xv, wt, d, eps);
    };
    expectNear(dw, numericGrad([&](const Vec &t) { return f(t, bv); }, wv, g), kGradTol, "dw");
    if (layer)
      expectNear(db, numericGrad([&](const Vec &t) { return f(wv, t); }, bv, g), kGradTol, "db");
  }
}

TEST(CpuGradKernelsTest, NormGradsRejectShapeDisagreements) {
  std::mt19937 rng(2404);
  Buf x = randomBuf(rng, DType::F32, {3, 8}), w = randomBuf(rng, DType::F32, {8});
  Buf dy = randomBuf(rng, DType::F32, {3, 8});
  Buf dyBad = randomBuf(rng, DType::F32, {3, 7}), wBad = randomBuf(rng, DType::F32, {7});
  Buf dx = poisoned(DType::F32, {3, 8}), dw = poisoned(DType::F32, {8});
  Buf db = poisoned(DType::F32, {8}), dwBad = poisoned(DType::F32, {9});
  expectError(
      [&] { cpu::rmsNormGrad(dyBad.view(), x.view(), w.view(), 1e-5, dx.view(), dw.view()); },
      {"rms_norm_grad", "[3, 7]", "[3, 8]"});
  expectError(
      [&] { cpu::rmsNormGrad(dy.view(), x.view(), wBad.view(), 1e-5, dx.view(), dw.view()); },
      {"rms_norm_grad", "[7]", "[8]", "[3, 8]"});
  expectError(
      [&] { cpu::rmsNormGrad(dy.view(), x.view(), w.view(), 1e-5, dx.view(), dwBad.view()); },
      {"rms_norm_grad", "dw", "[9]", "[8]"});
  expectError(
      [&] {
        cpu::layerNormGrad(dy.view(), x.view(), w.view(), 1e-5, dx.view(), dw.view(), dwBad.view());
      },
      {"layer_norm_grad", "db", "[9]", "[8]"});
  expectAllNaN(dx, "dx");
  expectAllNaN(dw, "dw");
  expectAllNaN(db, "db");
}

//===----------------------------------------------------------------------===//
// rope_grad
//===----------------------------------------------------------------------===//

TEST(CpuGradKernelsTest, RopeGradMatchesFiniteDifferences) {
  std::mt19937 rng(2501);
  // theta = 10 makes even the slowest pair turn by whole radians over a few positions.
  for (double theta : {10000.0, 10.0}) {
    SCOPED_TRACE("theta " + std::to_string(theta));
    const Shape shape = {2, 7, 3, 8};
    Buf x = randomBuf(rng, DType::F32, shape), dy = randomBuf(rng, DType::F32, shape);
    Buf y = poisoned(DType::F32, shape);
    cpu::rope(x.view(), theta, y.view());
    expectNear(y, ropeRef(x.get(), shape, theta), kForwardTol, "rope");
    Buf dx = poisoned(DType::F32, shape);
    cpu::ropeGrad(dy.view(), theta, dx.view());
    expectNear(
        dx, numericGrad([&](const Vec &t) { return ropeRef(t, shape, theta); }, x.get(), dy.get()),
        kGradTol, "dx");
  }
}

TEST(CpuGradKernelsTest, RopeGradInvertsRope) {
  // An orthogonal map's adjoint is its inverse: ropeGrad(rope(x)) = x up to two f32 roundings.
  std::mt19937 rng(2502);
  const Shape shape = {2, 33, 4, 16};
  Buf x = randomBuf(rng, DType::F32, shape), y = poisoned(DType::F32, shape);
  cpu::rope(x.view(), 10000.0, y.view());
  Buf back = poisoned(DType::F32, shape);
  cpu::ropeGrad(y.view(), 10000.0, back.view());
  expectNear(back, x.get(), {1e-6, 1e-6}, "ropeGrad(rope(x))");
  // In place as well.
  cpu::ropeGrad(y.view(), 10000.0, y.view());
  expectNear(y, x.get(), {1e-6, 1e-6}, "in place");
  Buf bad = poisoned(DType::F32, {2, 33, 4, 8});
  expectError([&] { cpu::ropeGrad(x.view(), 10000.0, bad.view()); },
              {"rope_grad", "[2, 33, 4, 8]", "[2, 33, 4, 16]"});
}

//===----------------------------------------------------------------------===//
// attention_grad
//===----------------------------------------------------------------------===//

namespace {

struct AttentionCase {
  Buf q, k, v, dout, o;
  Shape qShape, kShape;
  bool causal;
  double scale;
};

AttentionCase makeAttention(std::mt19937 &rng, Shape qShape, int64_t kvHeads, bool causal,
                            double scale) {
  Shape kShape = qShape;
  kShape[2] = kvHeads;
  // Scores of a few units, so the softmax is far from uniform.
  AttentionCase c{randomBuf(rng, DType::F32, qShape, -2, 2),
                  randomBuf(rng, DType::F32, kShape, -2, 2),
                  randomBuf(rng, DType::F32, kShape),
                  randomBuf(rng, DType::F32, qShape),
                  poisoned(DType::F32, qShape),
                  qShape,
                  kShape,
                  causal,
                  scale};
  cpu::attention(c.q.view(), c.k.view(), c.v.view(), causal, scale, c.o.view());
  return c;
}

} // namespace

class AttentionGradTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(AttentionGradTest, MatchesFiniteDifferences) {
  auto [kvHeads, causal] = GetParam();
  std::mt19937 rng(2601 + kvHeads * 10 + (causal ? 1 : 0));
  const int64_t heads = 4;
  AttentionCase c = makeAttention(rng, {2, 5, heads, 3}, kvHeads, causal, 0.61);
  Vec qv = c.q.get(), kv = c.k.get(), vv = c.v.get(), g = c.dout.get();
  auto f = [&](const Vec &q, const Vec &k, const Vec &v) {
    return attentionRef(q, k, v, c.qShape, kvHeads, causal, c.scale);
  };
  expectNear(c.o, f(qv, kv, vv), kForwardTol, "attention");

  Buf dq = poisoned(DType::F32, c.qShape), dk = poisoned(DType::F32, c.kShape);
  Buf dv = poisoned(DType::F32, c.kShape);
  cpu::attentionGrad(c.dout.view(), c.q.view(), c.k.view(), c.v.view(), c.o.view(), causal, c.scale,
                     dq.view(), dk.view(), dv.view());
  expectNear(dq, numericGrad([&](const Vec &t) { return f(t, kv, vv); }, qv, g), kGradTol, "dq");
  expectNear(dk, numericGrad([&](const Vec &t) { return f(qv, t, vv); }, kv, g), kGradTol, "dk");
  expectNear(dv, numericGrad([&](const Vec &t) { return f(qv, kv, t); }, vv, g), kGradTol, "dv");
}

INSTANTIATE_TEST_SUITE_P(CpuGradKernelsTest, AttentionGradTest,
                         ::testing::Combine(::testing::Values(4, 2, 1), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<AttentionGradTest::ParamType> &info) {
                           // GQA ratio heads / kv_heads = 4 / kv_heads: 1, 2, 4.
                           return "Gqa" + std::to_string(4 / std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "Causal" : "Full");
                         });

TEST(CpuGradKernelsTest, AttentionGradLargeOnThreadsMatchesPerBatchCalls) {
  // Many (batch, kv head) work items over threads: the result must be the same bits as calls on
  // one batch at a time, and a sample of coordinates must match finite differences.
  std::mt19937 rng(2602);
  const Shape qShape = {3, 24, 8, 16};
  const int64_t kvHeads = 2;
  AttentionCase c = makeAttention(rng, qShape, kvHeads, true, 0.25);
  Buf dq = poisoned(DType::F32, c.qShape), dk = poisoned(DType::F32, c.kShape);
  Buf dv = poisoned(DType::F32, c.kShape);
  cpu::attentionGrad(c.dout.view(), c.q.view(), c.k.view(), c.v.view(), c.o.view(), true, c.scale,
                     dq.view(), dk.view(), dv.view());
  Buf eq(DType::F32, c.qShape), ek(DType::F32, c.kShape), ev(DType::F32, c.kShape);
  int64_t qRow = numelOf(qShape) / 3, kRow = numelOf(c.kShape) / 3;
  auto part = [](const Buf &b, int64_t row, int64_t i) {
    Shape s = b.shape;
    s[0] = 1;
    return TensorView{const_cast<uint8_t *>(b.storage.data()) + i * row * 4, DType::F32, s};
  };
  for (int64_t b = 0; b < 3; ++b)
    cpu::attentionGrad(part(c.dout, qRow, b), part(c.q, qRow, b), part(c.k, kRow, b),
                       part(c.v, kRow, b), part(c.o, qRow, b), true, c.scale, part(eq, qRow, b),
                       part(ek, kRow, b), part(ev, kRow, b));
  expectBitExact(dq, eq, "dq");
  expectBitExact(dk, ek, "dk");
  expectBitExact(dv, ev, "dv");

  Vec qv = c.q.get(), kv = c.k.get(), vv = c.v.get(), g = c.dout.get();
  auto loss = [&](const Vec &q, const Vec &k, const Vec &v) {
    return dot(g, attentionRef(q, k, v, qShape, kvHeads, true, c.scale));
  };
  std::uniform_int_distribution<size_t> pickQ(0, qv.size() - 1), pickK(0, kv.size() - 1);
  Vec gotQ = dq.get(), gotK = dk.get(), gotV = dv.get();
  const double h = 1e-5;
  for (int sample = 0; sample < 12; ++sample) {
    size_t i = pickQ(rng), j = pickK(rng);
    Vec a = qv, b = qv;
    a[i] += h;
    b[i] -= h;
    double fq = (loss(a, kv, vv) - loss(b, kv, vv)) / (2 * h);
    EXPECT_NEAR(gotQ[i], fq, kGradTol.abs + kGradTol.rel * std::fabs(fq)) << "dq[" << i << "]";
    a = kv;
    b = kv;
    a[j] += h;
    b[j] -= h;
    double fk = (loss(qv, a, vv) - loss(qv, b, vv)) / (2 * h);
    EXPECT_NEAR(gotK[j], fk, kGradTol.abs + kGradTol.rel * std::fabs(fk)) << "dk[" << j << "]";
    a = vv;
    b = vv;
    a[j] += h;
    b[j] -= h;
    double fv = (loss(qv, kv, a) - loss(qv, kv, b)) / (2 * h);
    EXPECT_NEAR(gotV[j], fv, kGradTol.abs + kGradTol.rel * std::fabs(fv)) << "dv[" << j << "]";
  }
}

class FlashAttentionGradTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(FlashAttentionGradTest, MatchesAttentionAndFiniteDifferences) {
  // flash_attention is attention plus each row's log-sum-exp: the same o, bit for bit, and lse =
  // log sum_j exp(scale q_i.k_j) (fp64 reference). flash_attention_grad from that lse gives
  // attention_grad's gradients up to the rounding of lse to f32 (p changes by a relative
  // 2^-24 |lse|, well under 1e-6 here), and matches finite differences like it.
  auto [kvHeads, causal] = GetParam();
  std::mt19937 rng(2611 + kvHeads * 10 + (causal ? 1 : 0));
  const int64_t batch = 2, seq = 5, heads = 4, d = 3;
  AttentionCase c = makeAttention(rng, {batch, seq, heads, d}, kvHeads, causal, 0.61);
  const Shape lseShape = {batch, heads, seq};
  Buf o = poisoned(DType::F32, c.qShape), lse = poisoned(DType::F32, lseShape);
  cpu::flashAttention(c.q.view(), c.k.view(), c.v.view(), causal, c.scale, o.view(), lse.view());
  expectBitExact(o, c.o, "o");

  Vec qv = c.q.get(), kv = c.k.get(), lv = lse.get();
  const int64_t group = heads / kvHeads;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < seq; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < (causal ? i + 1 : seq); ++j) {
          double s = 0;
          for (int64_t e = 0; e < d; ++e)
            s += qv[size_t(((b * seq + i) * heads + h) * d + e)] *
                 kv[size_t(((b * seq + j) * kvHeads + h / group) * d + e)];
          sum += std::exp(c.scale * s);
        }
        double got = lv[size_t((b * heads + h) * seq + i)];
        EXPECT_NEAR(got, std::log(sum), 1e-6 * (1 + std::fabs(std::log(sum))))
            << "lse[" << b << ", " << h << ", " << i << "]";
      }

  Buf dq = poisoned(DType::F32, c.qShape), dk = poisoned(DType::F32, c.kShape);
  Buf dv = poisoned(DType::F32, c.kShape);
  cpu::flashAttentionGrad(c.dout.view(), c.q.view(), c.k.view(), c.v.view(), c.o.view(),
                          lse.view(), causal, c.scale, dq.view(), dk.view(), dv.view());
  Buf eq = poisoned(DType::F32, c.qShape), ek = poisoned(DType::F32, c.kShape);
  Buf ev = poisoned(DType::F32, c.kShape);
  cpu::attentionGrad(c.dout.view(), c.q.view(), c.k.view(), c.v.view(), c.o.view(), causal,
                     c.scale, eq.view(), ek.view(), ev.view());
  const Tol sameMath{1e-6, 1e-6};
  expectNear(dq, eq.get(), sameMath, "dq vs attention_grad");
  expectNear(dk, ek.get(), sameMath, "dk vs attention_grad");
  expectNear(dv, ev.get(), sameMath, "dv vs attention_grad");

  Vec vv = c.v.get(), g = c.dout.get();
  auto f = [&](const Vec &q, const Vec &k, const Vec &v) {
    return attentionRef(q, k, v, c.qShape, kvHeads, causal, c.scale);
  };
  expectNear(dq, numericGrad([&](const Vec &t) { return f(t, kv, vv); }, qv, g), kGradTol, "dq");
  expectNear(dk, numericGrad([&](const Vec &t) { return f(qv, t, vv); }, kv, g), kGradTol, "dk");
  expectNear(dv, numericGrad([&](const Vec &t) { return f(qv, kv, t); }, vv, g), kGradTol, "dv");
}

INSTANTIATE_TEST_SUITE_P(CpuGradKernelsTest, FlashAttentionGradTest,
                         ::testing::Combine(::testing::Values(4, 2, 1), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<FlashAttentionGradTest::ParamType> &info) {
                           return "Gqa" + std::to_string(4 / std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "Causal" : "Full");
                         });

TEST(CpuGradKernelsTest, FlashAttentionRejectsAMalformedLogSumExp) {
  std::mt19937 rng(2612);
  AttentionCase c = makeAttention(rng, {2, 5, 4, 3}, 2, true, 0.5);
  Buf o(DType::F32, c.qShape), dq(DType::F32, c.qShape), dk(DType::F32, c.kShape),
      dv(DType::F32, c.kShape);
  Buf seqFirst(DType::F32, {2, 5, 4}), bf16(DType::BF16, {2, 4, 5});
  expectError([&] {
    cpu::flashAttention(c.q.view(), c.k.view(), c.v.view(), true, 0.5, o.view(), seqFirst.view());
  }, {"flash_attention", "lse shape [2, 5, 4]", "[2, 4, 5]"});
  expectError([&] {
    cpu::flashAttention(c.q.view(), c.k.view(), c.v.view(), true, 0.5, o.view(), bf16.view());
  }, {"flash_attention", "lse must be f32, not bf16"});
  expectError([&] {
    cpu::flashAttentionGrad(c.dout.view(), c.q.view(), c.k.view(), c.v.view(), c.o.view(),
                            seqFirst.view(), true, 0.5, dq.view(), dk.view(), dv.view());
  }, {"flash_attention_grad", "lse shape [2, 5, 4]"});
}

/// The values of [B, S, heads_i, D] tensors joined along the heads, position by position.
Vec packHeads(const std::vector<Vec> &parts, const std::vector<int64_t> &heads, int64_t positions,
              int64_t d) {
  Vec packed;
  for (int64_t p = 0; p < positions; ++p)
    for (size_t i = 0; i < parts.size(); ++i)
      packed.insert(packed.end(), parts[i].begin() + p * heads[i] * d,
                    parts[i].begin() + (p + 1) * heads[i] * d);
  return packed;
}

TEST(CpuGradKernelsTest, FlashAttentionQkvIsFlashAttentionOfTheThreeHeadRanges) {
  // q (4 heads), k and v (2 each) packed per position in qkv [2, 5, 8, 3]: the packed kernels
  // give flash_attention's o and lse and flash_attention_grad's gradients, bit for bit.
  for (bool causal : {true, false}) {
    std::mt19937 rng(2615 + (causal ? 1 : 0));
    const int64_t batch = 2, seq = 5, heads = 4, kvHeads = 2, d = 3, positions = batch * seq;
    AttentionCase c = makeAttention(rng, {batch, seq, heads, d}, kvHeads, causal, 0.61);
    const Shape lseShape = {batch, heads, seq}, qkvShape = {batch, seq, heads + 2 * kvHeads, d};
    Buf qkv(DType::F32, qkvShape);
    qkv.set(packHeads({c.q.get(), c.k.get(), c.v.get()}, {heads, kvHeads, kvHeads}, positions, d));

    Buf o = poisoned(DType::F32, c.qShape), lse = poisoned(DType::F32, lseShape);
    Buf po = poisoned(DType::F32, c.qShape), plse = poisoned(DType::F32, lseShape);
    cpu::flashAttention(c.q.view(), c.k.view(), c.v.view(), causal, c.scale, o.view(), lse.view());
    cpu::flashAttentionQkv(qkv.view(), causal, c.scale, po.view(), plse.view());
    expectBitExact(po, o, "o");
    expectBitExact(plse, lse, "lse");

    Buf dq = poisoned(DType::F32, c.qShape), dk = poisoned(DType::F32, c.kShape);
    Buf dv = poisoned(DType::F32, c.kShape), dqkv = poisoned(DType::F32, qkvShape);
    cpu::flashAttentionGrad(c.dout.view(), c.q.view(), c.k.view(), c.v.view(), c.o.view(),
                            lse.view(), causal, c.scale, dq.view(), dk.view(), dv.view());
    cpu::flashAttentionQkvGrad(c.dout.view(), qkv.view(), c.o.view(), lse.view(), causal, c.scale,
                               dqkv.view());
    Buf expected(DType::F32, qkvShape);
    expected.set(
        packHeads({dq.get(), dk.get(), dv.get()}, {heads, kvHeads, kvHeads}, positions, d));
    expectBitExact(dqkv, expected, causal ? "dqkv (causal)" : "dqkv");
  }
}

TEST(CpuGradKernelsTest, FlashAttentionQkvRejectsAWidthThatDoesNotPackTheHeads) {
  // 4 query heads: the packed width must be 4 + 2 KV with KV dividing 4.
  Buf qkv(DType::F32, {1, 2, 7, 3}), o(DType::F32, {1, 2, 4, 3}), lse(DType::F32, {1, 4, 2});
  Buf bad(DType::F32, {1, 2, 8, 2});
  expectError([&] { cpu::flashAttentionQkv(qkv.view(), true, 0.5, o.view(), lse.view()); },
              {"flash_attention_qkv", "qkv shape [1, 2, 7, 3] does not hold 4 query heads"});
  Buf qkv8(DType::F32, {1, 2, 8, 3});
  expectError(
      [&] {
        cpu::flashAttentionQkvGrad(o.view(), qkv8.view(), o.view(), lse.view(), true, 0.5,
                                   bad.view());
      },
      {"flash_attention_qkv_grad", "dqkv"});
}

TEST(CpuGradKernelsTest, AttentionGradSaturatedSoftmaxStaysFinite) {
  // Scores in the thousands (exp overflows fp64 without the max subtracted) with query i's own
  // key ahead of every other by at least 1500: the softmax is exactly one-hot on j = i, so
  // o_i = v_i, dS = 0 (dq = dk = 0), and dv_j sums dO over the query heads that read key j.
  std::mt19937 rng(2604);
  const int64_t batch = 2, seq = 4, heads = 4, kvHeads = 2, d = 4, group = heads / kvHeads;
  std::uniform_real_distribution<double> noise(-0.5, 0.5);
  Vec qv(size_t(batch * seq * heads * d)), kv(size_t(batch * seq * kvHeads * d), 0.0);
  for (size_t i = 0; i < qv.size(); ++i) {
    int64_t e = int64_t(i) % d, s = int64_t(i) / (heads * d) % seq;
    qv[i] = e == s ? 2.0 + noise(rng) : noise(rng);
  }
  for (size_t i = 0; i < kv.size(); ++i)
    kv[i] = int64_t(i) % d == int64_t(i) / (kvHeads * d) % seq ? 1.0 : 0.0;
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    Buf q = withValues(DType::F32, {batch, seq, heads, d}, qv);
    Buf k = withValues(DType::F32, {batch, seq, kvHeads, d}, kv);
    Buf v = randomBuf(rng, DType::F32, {batch, seq, kvHeads, d});
    Buf dout = randomBuf(rng, DType::F32, {batch, seq, heads, d});
    Buf o = poisoned(DType::F32, {batch, seq, heads, d});
    cpu::attention(q.view(), k.view(), v.view(), causal, 1000.0, o.view());
    Buf dq = poisoned(DType::F32, q.shape), dk = poisoned(DType::F32, k.shape);
    Buf dv = poisoned(DType::F32, k.shape);
    cpu::attentionGrad(dout.view(), q.view(), k.view(), v.view(), o.view(), causal, 1000.0,
                       dq.view(), dk.view(), dv.view());
    Vec g = dout.get(), expectedDv(kv.size(), 0.0);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t s = 0; s < seq; ++s)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t e = 0; e < d; ++e)
            expectedDv[size_t(((b * seq + s) * kvHeads + h / group) * d + e)] +=
                g[size_t(((b * seq + s) * heads + h) * d + e)];
    expectNear(dq, Vec(qv.size(), 0.0), {1e-6, 0.0}, "dq");
    expectNear(dk, Vec(kv.size(), 0.0), {1e-6, 0.0}, "dk");
    expectNear(dv, expectedDv, {1e-6, 1e-6}, "dv");
  }
}

TEST(CpuGradKernelsTest, AttentionGradRejectsShapeDisagreements) {
  std::mt19937 rng(2603);
  Buf q = randomBuf(rng, DType::F32, {1, 4, 4, 8}), k = randomBuf(rng, DType::F32, {1, 4, 2, 8});
  Buf v = randomBuf(rng, DType::F32, {1, 4, 2, 8}), o = randomBuf(rng, DType::F32, {1, 4, 4, 8});
  Buf dq = poisoned(DType::F32, {1, 4, 4, 8}), dk = poisoned(DType::F32, {1, 4, 2, 8});
  Buf dv = poisoned(DType::F32, {1, 4, 2, 8});
  Buf k3 = randomBuf(rng, DType::F32, {1, 4, 3, 8});
  expectError(
      [&] {
        cpu::attentionGrad(o.view(), q.view(), k3.view(), v.view(), o.view(), false, 1.0, dq.view(),
                           dk.view(), dv.view());
      },
      {"attention_grad", "[1, 4, 3, 8]", "[1, 4, 4, 8]"});
  Buf dkBad = poisoned(DType::F32, {1, 4, 4, 8});
  expectError(
      [&] {
        cpu::attentionGrad(o.view(), q.view(), k.view(), v.view(), o.view(), false, 1.0, dq.view(),
                           dkBad.view(), dv.view());
      },
      {"attention_grad", "dk", "[1, 4, 4, 8]", "[1, 4, 2, 8]"});
  Buf doutBad = randomBuf(rng, DType::F32, {1, 4, 4, 7});
  expectError(
      [&] {
        cpu::attentionGrad(doutBad.view(), q.view(), k.view(), v.view(), o.view(), false, 1.0,
                           dq.view(), dk.view(), dv.view());
      },
      {"attention_grad", "dout", "[1, 4, 4, 7]", "[1, 4, 4, 8]"});
  expectAllNaN(dq, "dq");
  expectAllNaN(dk, "dk");
  expectAllNaN(dv, "dv");
}

//===----------------------------------------------------------------------===//
// silu_grad, gelu_grad, swiglu_grad, softmax_grad
//===----------------------------------------------------------------------===//

TEST(CpuGradKernelsTest, ActivationGradsMatchFiniteDifferences) {
  std::mt19937 rng(2701);
  const Shape shape = {3, 7, 5};
  // Out to +-8: the tails, where sigmoid and erf saturate, are covered too.
  Buf x = randomBuf(rng, DType::F32, shape, -8, 8), dy = randomBuf(rng, DType::F32, shape);
  Vec xv = x.get(), g = dy.get();
  auto map = [](const Vec &v, double (*f)(double, int), int mode) {
    Vec out(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      out[i] = f(v[i], mode);
    return out;
  };
  auto act = [](double v, int mode) { return mode == 0 ? siluRef(v) : geluRef(v, mode == 1); };
  for (int mode : {0, 1, 2}) {
    SCOPED_TRACE(mode == 0 ? "silu" : mode == 1 ? "gelu tanh" : "gelu erf");
    Buf y = poisoned(DType::F32, shape);
    if (mode == 0)
      cpu::silu(x.view(), y.view());
    else
      cpu::gelu(x.view(), mode == 1, y.view());
    expectNear(y, map(xv, act, mode), kForwardTol, "forward");
    Buf dx = poisoned(DType::F32, shape);
    if (mode == 0)
      cpu::siluGrad(dy.view(), x.view(), dx.view());
    else
      cpu::geluGrad(dy.view(), x.view(), mode == 1, dx.view());
    Vec fd = numericGrad([&](const Vec &t) { return map(t, act, mode); }, xv, g);
    expectNear(dx, fd, kGradTol, "dx");
    // dx may be dy itself.
    Buf inPlace = dy;
    if (mode == 0)
      cpu::siluGrad(inPlace.view(), x.view(), inPlace.view());
    else
      cpu::geluGrad(inPlace.view(), x.view(), mode == 1, inPlace.view());
    expectBitExact(inPlace, dx, "in place");
  }
}

TEST(CpuGradKernelsTest, SwigluGradMatchesFiniteDifferences) {
  std::mt19937 rng(2702);
  const Shape shape = {4, 9};
  Buf gate = randomBuf(rng, DType::F32, shape, -5, 5),
      up = randomBuf(rng, DType::F32, shape, -2, 2);
  Buf dy = randomBuf(rng, DType::F32, shape);
  Vec gv = gate.get(), uv = up.get(), g = dy.get();
  auto f = [](const Vec &a, const Vec &b) {
    Vec out(a.size());
    for (size_t i = 0; i < a.size(); ++i)
      out[i] = siluRef(a[i]) * b[i];
    return out;
  };
  Buf y = poisoned(DType::F32, shape);
  cpu::swiglu(gate.view(), up.view(), y.view());
  expectNear(y, f(gv, uv), kForwardTol, "swiglu");
  Buf dgate = poisoned(DType::F32, shape), dup = poisoned(DType::F32, shape);
  cpu::swigluGrad(dy.view(), gate.view(), up.view(), dgate.view(), dup.view());
  expectNear(dgate, numericGrad([&](const Vec &t) { return f(t, uv); }, gv, g), kGradTol, "dgate");
  expectNear(dup, numericGrad([&](const Vec &t) { return f(gv, t); }, uv, g), kGradTol, "dup");
  // Outputs in place of the inputs they replace.
  Buf gate2 = gate, up2 = up;
  cpu::swigluGrad(dy.view(), gate2.view(), up2.view(), gate2.view(), up2.view());
  expectBitExact(gate2, dgate, "dgate in place");
  expectBitExact(up2, dup, "dup in place");
}

TEST(CpuGradKernelsTest, SoftmaxGradAlongEveryAxis) {
  std::mt19937 rng(2703);
  const Shape shape = {3, 4, 5};
  for (int axis : {0, 1, 2, -1, -3}) {
    SCOPED_TRACE("axis " + std::to_string(axis));
    int64_t a = axis < 0 ? axis + 3 : axis;
    Buf x = randomBuf(rng, DType::F32, shape, -3, 3), dy = randomBuf(rng, DType::F32, shape);
    Buf y = poisoned(DType::F32, shape);
    cpu::softmax(x.view(), axis, y.view());
    Vec xv = x.get();
    expectNear(y, softmaxRef(xv, shape, a), kForwardTol, "softmax");
    Buf dx = poisoned(DType::F32, shape);
    cpu::softmaxGrad(dy.view(), y.view(), axis, dx.view());
    expectNear(dx, numericGrad([&](const Vec &t) { return softmaxRef(t, shape, a); }, xv, dy.get()),
               kGradTol, "dx");
  }
  Buf y = randomBuf(rng, DType::F32, shape), dy = randomBuf(rng, DType::F32, {3, 4, 6});
  Buf dx = poisoned(DType::F32, shape);
  expectError([&] { cpu::softmaxGrad(dy.view(), y.view(), -1, dx.view()); },
              {"softmax_grad", "[3, 4, 5]", "[3, 4, 6]"});
  expectError([&] { cpu::softmaxGrad(y.view(), y.view(), 3, dx.view()); },
              {"softmax_grad", "axis 3"});
}

//===----------------------------------------------------------------------===//
// cross_entropy_grad
//===----------------------------------------------------------------------===//

TEST(CpuGradKernelsTest, CrossEntropyGradMatchesFiniteDifferencesWithIgnoredLabels) {
  std::mt19937 rng(2801);
  const int64_t vocab = 7;
  // -100 is the default ignore index; 3 is a valid class used as the ignore index.
  for (int64_t ignore : {int64_t(-100), int64_t(3)}) {
    for (DType labelType : {DType::I32, DType::I64}) {
      SCOPED_TRACE("ignore " + std::to_string(ignore) + " " + dtypeName(labelType));
      Vec labelValues = {2, double(ignore), 6, 0, 3, double(ignore)};
      if (ignore == 3)
        labelValues[4] = 5;
      Buf labels = withValues(labelType, {2, 3}, labelValues);
      Buf logits = randomBuf(rng, DType::F32, {2, 3, vocab}, -3, 3);
      Buf loss = poisoned(DType::F32, {});
      cpu::crossEntropy(logits.view(), labels.view(), ignore, loss.view());
      Vec lv = logits.get();
      auto f = [&](const Vec &t) { return Vec{crossEntropyRef(t, labelValues, vocab, ignore)}; };
      expectNear(loss, f(lv), kForwardTol, "cross_entropy");

      const double dloss = 0.7; // not 1, so that a missing factor shows
      Buf dlossBuf = withValues(DType::F32, {}, {dloss});
      Buf dlogits = poisoned(DType::F32, {2, 3, vocab});
      cpu::crossEntropyGrad(dlossBuf.view(), logits.view(), labels.view(), ignore, dlogits.view());
      Vec fd = numericGrad(f, lv, {double(float(dloss))});
      expectNear(dlogits, fd, kGradTol, "dlogits");
      // Ignored rows are exactly zero (finite differences give zero only to rounding).
      Vec got = dlogits.get();
      for (size_t r = 0; r < labelValues.size(); ++r) {
        if (int64_t(labelValues[r]) != ignore)
          continue;
        for (int64_t i = 0; i < vocab; ++i)
          EXPECT_EQ(got[r * vocab + size_t(i)], 0.0) << "ignored row " << r;
      }
      // In place over the logits, as a memory planner may arrange.
      cpu::crossEntropyGrad(dlossBuf.view(), logits.view(), labels.view(), ignore, logits.view());
      expectBitExact(logits, dlogits, "in place");
    }
  }
}

TEST(CpuGradKernelsTest, CrossEntropyGradLargeLogitsStayFinite) {
  // Logits near 1000 overflow exp even in fp64 unless the row maximum is subtracted. The
  // gradient does not change when every logit of a row shifts by the same amount: logits of
  // k / 64 and 1000 + k / 64 (both exact in f32) must give the same gradient.
  std::mt19937 rng(2804);
  std::uniform_int_distribution<int> pick(-192, 192);
  Vec small(30), large(30);
  for (size_t i = 0; i < small.size(); ++i) {
    small[i] = pick(rng) / 64.0;
    large[i] = 1000.0 + small[i];
  }
  Buf labels = withValues(DType::I64, {3}, {4, -100, 0});
  Buf dloss = withValues(DType::F32, {}, {1.0});
  Buf a = withValues(DType::F32, {3, 10}, small), b = withValues(DType::F32, {3, 10}, large);
  Buf da = poisoned(DType::F32, {3, 10}), db = poisoned(DType::F32, {3, 10});
  cpu::crossEntropyGrad(dloss.view(), a.view(), labels.view(), -100, da.view());
  cpu::crossEntropyGrad(dloss.view(), b.view(), labels.view(), -100, db.view());
  expectNear(db, da.get(), {1e-7, 1e-6}, "shifted dlogits");
}

TEST(CpuGradKernelsTest, CrossEntropyGradAllIgnoredIsZero) {
  std::mt19937 rng(2802);
  Buf logits = randomBuf(rng, DType::F32, {4, 6});
  Buf labels = withValues(DType::I64, {4}, {-100, -100, -100, -100});
  Buf dloss = withValues(DType::F32, {1}, {1.0});
  Buf dlogits = poisoned(DType::F32, {4, 6});
  cpu::crossEntropyGrad(dloss.view(), logits.view(), labels.view(), -100, dlogits.view());
  expectNear(dlogits, Vec(24, 0.0), {0.0, 0.0}, "dlogits");
}

TEST(CpuGradKernelsTest, CrossEntropyGradRejectsBadLabelsBeforeWriting) {
  std::mt19937 rng(2803);
  Buf logits = randomBuf(rng, DType::F32, {2, 3, 5});
  Buf dloss = withValues(DType::F32, {}, {1.0});
  for (int64_t bad : {int64_t(5), int64_t(-1)}) {
    Buf labels = withValues(DType::I64, {2, 3}, {0, 1, 2, 3, double(bad), -100});
    Buf dlogits = poisoned(DType::F32, {2, 3, 5});
    expectError(
        [&] {
          cpu::crossEntropyGrad(dloss.view(), logits.view(), labels.view(), -100, dlogits.view());
        },
        {"cross_entropy_grad", "label " + std::to_string(bad), "[1, 1]", "[0, 5)"});
    expectAllNaN(dlogits, "dlogits");
  }
  Buf labels = withValues(DType::I64, {2, 3}, {0, 1, 2, 3, 4, 0});
  Buf wrong = poisoned(DType::F32, {2, 3, 6});
  expectError(
      [&] {
        cpu::crossEntropyGrad(dloss.view(), logits.view(), labels.view(), -100, wrong.view());
      },
      {"cross_entropy_grad", "[2, 3, 6]", "[2, 3, 5]"});
  Buf vectorLoss = withValues(DType::F32, {2}, {1.0, 1.0});
  Buf dlogits = poisoned(DType::F32, {2, 3, 5});
  expectError(
      [&] {
        cpu::crossEntropyGrad(vectorLoss.view(), logits.view(), labels.view(), -100,
                              dlogits.view());
      },
      {"cross_entropy_grad", "dloss", "[2]"});
}

//===----------------------------------------------------------------------===//
// slice_grad
//===----------------------------------------------------------------------===//

TEST(CpuGradKernelsTest, SliceGradZeroFillsOutsideTheSlice) {
  std::mt19937 rng(2901);
  const Shape xShape = {3, 7, 4};
  const std::vector<std::tuple<int, int64_t, int64_t>> cases = {{1, 2, 3}, {0, 1, 2}, {-1, 0, 1},
                                                                {2, 3, 1}, {1, 0, 7}, {1, 7, 0}};
  for (auto [axis, start, len] : cases) {
    SCOPED_TRACE("axis " + std::to_string(axis) + " start " + std::to_string(start) + " len " +
                 std::to_string(len));
    int64_t a = axis < 0 ? axis + 3 : axis;
    Shape yShape = xShape;
    yShape[size_t(a)] = len;
    Buf x = randomBuf(rng, DType::F32, xShape);
    if (numelOf(yShape) > 0) {
      Buf y = poisoned(DType::F32, yShape);
      cpu::slice(x.view(), axis, start, y.view());
      expectNear(y, sliceRef(x.get(), xShape, a, start, len), {0.0, 0.0}, "slice");
    }
    Buf dy = randomBuf(rng, DType::F32, yShape);
    Buf dx = poisoned(DType::F32, xShape);
    cpu::sliceGrad(dy.view(), axis, start, dx.view());
    // slice is linear: the differences are exact up to fp64 rounding.
    Vec fd = numericGrad([&](const Vec &t) { return sliceRef(t, xShape, a, start, len); }, x.get(),
                         dy.get(), 0.5);
    expectNear(dx, fd, {1e-12, 0.0}, "dx");
  }
  // bf16 moves bits.
  Buf dy = randomBuf(rng, DType::BF16, {3, 2, 4});
  Buf dx = poisoned(DType::BF16, xShape);
  cpu::sliceGrad(dy.view(), 1, 5, dx.view());
  Vec expected(size_t(numelOf(xShape)), 0.0), g = dy.get();
  for (int64_t o = 0; o < 3; ++o)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t c = 0; c < 4; ++c)
        expected[size_t((o * 7 + 5 + i) * 4 + c)] = g[size_t((o * 2 + i) * 4 + c)];
  expectNear(dx, expected, {0.0, 0.0}, "bf16 dx");
}

TEST(CpuGradKernelsTest, SliceGradRejectsBadRanges) {
  std::mt19937 rng(2902);
  Buf dy = randomBuf(rng, DType::F32, {3, 3, 4});
  Buf dx = poisoned(DType::F32, {3, 7, 4});
  expectError([&] { cpu::sliceGrad(dy.view(), 1, 5, dx.view()); },
              {"slice_grad", "[5, 8)", "[3, 7, 4]"});
  expectError([&] { cpu::sliceGrad(dy.view(), 1, -1, dx.view()); }, {"slice_grad", "[-1, 2)"});
  expectError([&] { cpu::sliceGrad(dy.view(), 0, 0, dx.view()); },
              {"slice_grad", "[3, 3, 4]", "[3, 7, 4]", "axis 0"});
  Buf dyHalf = randomBuf(rng, DType::BF16, {3, 3, 4});
  expectError([&] { cpu::sliceGrad(dyHalf.view(), 1, 0, dx.view()); },
              {"slice_grad", "f32", "bf16"});
  expectAllNaN(dx, "dx");
}

//===----------------------------------------------------------------------===//
// Storage dtypes and empty shapes
//===----------------------------------------------------------------------===//

TEST(CpuGradKernelsTest, Bf16AndF16StorageRoundTheF32ResultOnce) {
  // With inputs whose values are representable in the narrow type, a kernel computes exactly what
  // it computes from f32 storage; its narrow output must be that f32 result rounded once.
  std::mt19937 rng(3001);
  for (DType narrow : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtypeName(narrow));
    auto run = [&](const std::vector<const Buf *> &inputs, const std::vector<Shape> &outShapes,
                   const std::function<void(const std::vector<TensorView> &,
                                            const std::vector<TensorView> &)> &kernel,
                   const char *what) {
      SCOPED_TRACE(what);
      std::vector<Buf> wide, thin, wideOut, thinOut;
      for (const Buf *in : inputs) {
        bool isFloat = in->dtype == DType::F32;
        thin.push_back(isFloat ? converted(*in, narrow) : *in);
        wide.push_back(isFloat ? converted(thin.back(), DType::F32) : *in);
      }
      for (const Shape &s : outShapes) {
        wideOut.push_back(poisoned(DType::F32, s));
        thinOut.push_back(poisoned(narrow, s));
      }
      auto views = [](const std::vector<Buf> &bufs) {
        std::vector<TensorView> v;
        for (const Buf &b : bufs)
          v.push_back(b.view());
        return v;
      };
      kernel(views(wide), views(wideOut));
      kernel(views(thin), views(thinOut));
      for (size_t i = 0; i < outShapes.size(); ++i)
        expectBitExact(thinOut[i], converted(wideOut[i], narrow), "output " + std::to_string(i));
    };
    using Views = std::vector<TensorView>;
    Buf dy = randomBuf(rng, DType::F32, {6, 10}), x = randomBuf(rng, DType::F32, {6, 10});
    Buf w = randomBuf(rng, DType::F32, {10}, 0.5, 1.5), w2 = randomBuf(rng, DType::F32, {10, 8});
    Buf u = randomBuf(rng, DType::F32, {6, 10});
    Buf dy8 = randomBuf(rng, DType::F32, {6, 8}),
        ids = withValues(DType::I32, {6}, {1, 3, 1, 0, 3, 3});
    run(
        {&dy, &x, &w}, {{6, 10}, {10}},
        [](const Views &in, const Views &out) {
          cpu::rmsNormGrad(in[0], in[1], in[2], 1e-5, out[0], out[1]);
        },
        "rms_norm_grad");
    run(
        {&dy, &x, &w}, {{6, 10}, {10}, {10}},
        [](const Views &in, const Views &out) {
          cpu::layerNormGrad(in[0], in[1], in[2], 1e-5, out[0], out[1], out[2]);
        },
        "layer_norm_grad");
    run(
        {&dy, &w2}, {{6, 8}},
        [](const Views &in, const Views &out) { cpu::linearGradInput(in[0], in[1], out[0]); },
        "linear_grad_input");
    run(
        {&dy8, &x}, {{8, 10}},
        [](const Views &in, const Views &out) { cpu::linearGradWeight(in[0], in[1], out[0]); },
        "linear_grad_weight");
    run(
        {&dy, &ids}, {{4, 10}},
        [](const Views &in, const Views &out) { cpu::embeddingGrad(in[0], in[1], out[0]); },
        "embedding_grad");
    run(
        {&dy}, {{10}}, [](const Views &in, const Views &out) { cpu::reduceTo(in[0], out[0]); },
        "reduce_to");
    run(
        {&dy, &x}, {{6, 10}},
        [](const Views &in, const Views &out) { cpu::geluGrad(in[0], in[1], false, out[0]); },
        "gelu_grad");
    run(
        {&dy, &x, &u}, {{6, 10}, {6, 10}},
        [](const Views &in, const Views &out) {
          cpu::swigluGrad(in[0], in[1], in[2], out[0], out[1]);
        },
        "swiglu_grad");
    run(
        {&dy, &x}, {{6, 10}},
        [](const Views &in, const Views &out) { cpu::softmaxGrad(in[0], in[1], 0, out[0]); },
        "softmax_grad");
  }
}

TEST(CpuGradKernelsTest, EmptyShapes) {
  // No rows: weight gradients are zeros, nothing else is read or written.
  Buf dy(DType::F32, {0, 4}), x(DType::F32, {0, 3}), dx(DType::F32, {0, 3});
  Buf dw = poisoned(DType::F32, {4, 3});
  cpu::linearGradWeight(dy.view(), x.view(), dw.view());
  expectNear(dw, Vec(12, 0.0), {0.0, 0.0}, "linear dw");
  Buf w(DType::F32, {4, 3});
  cpu::linearGradInput(dy.view(), w.view(), dx.view());
  Buf xn(DType::F32, {0, 4}), wn = withValues(DType::F32, {4}, {1, 2, 3, 4});
  Buf dxn(DType::F32, {0, 4}), dwn = poisoned(DType::F32, {4}), dbn = poisoned(DType::F32, {4});
  cpu::rmsNormGrad(dy.view(), xn.view(), wn.view(), 1e-5, dxn.view(), dwn.view());
  expectNear(dwn, Vec(4, 0.0), {0.0, 0.0}, "rms dw");
  dwn.poison();
  cpu::layerNormGrad(dy.view(), xn.view(), wn.view(), 1e-5, dxn.view(), dwn.view(), dbn.view());
  expectNear(dwn, Vec(4, 0.0), {0.0, 0.0}, "layer dw");
  expectNear(dbn, Vec(4, 0.0), {0.0, 0.0}, "layer db");
  Buf r = poisoned(DType::F32, {4});
  cpu::reduceTo(dy.view(), r.view());
  expectNear(r, Vec(4, 0.0), {0.0, 0.0}, "reduce_to");
  Buf ids(DType::I64, {0}), dtable = poisoned(DType::F32, {3, 4});
  cpu::embeddingGrad(dy.view(), ids.view(), dtable.view());
  expectNear(dtable, Vec(12, 0.0), {0.0, 0.0}, "dtable");
  Buf labels(DType::I64, {0}), dloss = withValues(DType::F32, {}, {1.0});
  cpu::crossEntropyGrad(dloss.view(), dy.view(), labels.view(), -100, dy.view());
  cpu::fill(2.0, dy.view());
  cpu::siluGrad(dy.view(), dy.view(), dy.view());
  cpu::softmaxGrad(dy.view(), dy.view(), 0, dy.view());
}
