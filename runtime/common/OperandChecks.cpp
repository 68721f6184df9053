//===- OperandChecks.cpp - The operand checks both backends' kernels share ===//
//
// One implementation of the checks of OperandChecks.h for the CPU and the CUDA kernels.
//
//===----------------------------------------------------------------------===//

#include "OperandChecks.h"

#include <algorithm>
#include <cstdint>

namespace bonsai::rt::checks {

void fail(const char *backend, const char *kernel, const std::string &message) {
  throw Error(std::string(backend) + " " + kernel + ": " + message);
}

void checkView(const char *backend, const char *kernel, const char *operand, const TensorView &t) {
  for (int64_t d : t.shape)
    if (d < 0)
      fail(backend, kernel,
           std::string(operand) + " has a negative dimension in shape " + formatShape(t.shape));
  if (!t.data && t.numel() != 0)
    fail(backend, kernel,
         std::string(operand) + " of shape " + formatShape(t.shape) + " has no data");
}

void checkFloat(const char *backend, const char *kernel, const char *operand, const TensorView &t) {
  checkView(backend, kernel, operand, t);
  if (!isComputeFloat(t.dtype))
    fail(backend, kernel,
         std::string(operand) + " must be f32, f16 or bf16, not " + dtypeName(t.dtype));
}

void checkIndex(const char *backend, const char *kernel, const char *operand, const TensorView &t) {
  checkView(backend, kernel, operand, t);
  if (t.dtype != DType::I32 && t.dtype != DType::I64)
    fail(backend, kernel, std::string(operand) + " must be i32 or i64, not " + dtypeName(t.dtype));
}

void checkShape(const char *backend, const char *kernel, const char *operand, const TensorView &a,
                const std::vector<int64_t> &expected, const std::string &context) {
  if (a.shape != expected)
    fail(backend, kernel,
         std::string(operand) + " shape " + formatShape(a.shape) + " should be " +
             formatShape(expected) + " " + context);
}

void checkSameShape(const char *backend, const char *kernel, const char *nameA,
                    const TensorView &a, const char *nameB, const TensorView &b) {
  if (a.shape != b.shape)
    fail(backend, kernel,
         std::string(nameA) + " shape " + formatShape(a.shape) + " does not match " + nameB +
             " shape " + formatShape(b.shape));
}

int64_t normalizeAxis(const char *backend, const char *kernel, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank)
    fail(backend, kernel,
         "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

int64_t checkConcat(const char *backend, const char *kernel, const std::vector<TensorView> &xs,
                    int64_t axis, const TensorView &y) {
  checkView(backend, kernel, "y", y);
  if (xs.empty())
    fail(backend, kernel, "needs at least one input");
  int64_t rank = y.rank();
  int64_t a = normalizeAxis(backend, kernel, axis, rank);
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const TensorView &x = xs[i];
    std::string name = "x" + std::to_string(i + 1);
    checkView(backend, kernel, name.c_str(), x);
    bool valid = x.rank() == rank && x.dtype == y.dtype;
    for (int64_t d = 0; valid && d < rank; ++d)
      valid = d == a || x.shape[size_t(d)] == y.shape[size_t(d)];
    if (!valid)
      fail(backend, kernel,
           name + " " + formatShape(x.shape) + " " + dtypeName(x.dtype) + " differs from y " +
               formatShape(y.shape) + " " + dtypeName(y.dtype) + " outside axis " +
               std::to_string(a));
    total += x.dim(a);
  }
  if (total != y.dim(a))
    fail(backend, kernel,
         "the inputs' sizes along axis " + std::to_string(a) + " sum to " + std::to_string(total) +
             ", but y shape is " + formatShape(y.shape));
  return a;
}

bool overlaps(const TensorView &a, const TensorView &b) {
  auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  size_t an = a.bytes(), bn = b.bytes();
  return an && bn && a0 < b0 + bn && b0 < a0 + an;
}

namespace {

/// The product of every dimension but the last.
int64_t leadingRows(const TensorView &t) {
  int64_t rows = 1;
  for (int64_t i = 0; i + 1 < t.rank(); ++i)
    rows *= t.shape[size_t(i)];
  return rows;
}

/// `t`'s shape with its last dimension replaced by `last`.
std::vector<int64_t> withLast(const TensorView &t, int64_t last) {
  std::vector<int64_t> shape(t.shape.begin(), t.shape.end() - 1);
  shape.push_back(last);
  return shape;
}

} // namespace

LinearSizes checkLinear(const char *b, const char *k, const TensorView &x, const TensorView &w,
                        const TensorView *bias, const TensorView &y) {
  checkFloat(b, k, "x", x);
  checkFloat(b, k, "w", w);
  checkFloat(b, k, "y", y);
  if (x.rank() < 1)
    fail(b, k, "x must have at least one dimension, got shape " + formatShape(x.shape));
  if (w.rank() != 2 || w.dim(1) != x.dim(-1))
    fail(b, k,
         "w shape " + formatShape(w.shape) + " should be [out, " + std::to_string(x.dim(-1)) +
             "] for x shape " + formatShape(x.shape));
  const int64_t out = w.dim(0);
  if (bias) {
    checkFloat(b, k, "bias", *bias);
    checkShape(b, k, "bias", *bias, {out}, "for w shape " + formatShape(w.shape));
  }
  checkShape(b, k, "y", y, withLast(x, out),
             "for x shape " + formatShape(x.shape) + " and w shape " + formatShape(w.shape));
  return {leadingRows(x), out, x.dim(-1)};
}

LinearSizes checkLinearGradInput(const char *b, const char *k, const TensorView &dy,
                                 const TensorView &w, const TensorView &dx) {
  checkFloat(b, k, "dy", dy);
  checkFloat(b, k, "w", w);
  checkFloat(b, k, "dx", dx);
  if (dy.rank() < 1)
    fail(b, k, "dy must have at least one dimension, got shape " + formatShape(dy.shape));
  if (w.rank() != 2 || w.dim(0) != dy.dim(-1))
    fail(b, k,
         "w shape " + formatShape(w.shape) + " should be [" + std::to_string(dy.dim(-1)) +
             ", in] for dy shape " + formatShape(dy.shape));
  const int64_t in = w.dim(1);
  checkShape(b, k, "dx", dx, withLast(dy, in),
             "for dy shape " + formatShape(dy.shape) + " and w shape " + formatShape(w.shape));
  return {leadingRows(dy), w.dim(0), in};
}

LinearSizes checkLinearGradWeight(const char *b, const char *k, const TensorView &dy,
                                  const TensorView &x, const TensorView &dw, const char *dwName) {
  checkFloat(b, k, "dy", dy);
  checkFloat(b, k, "x", x);
  checkFloat(b, k, dwName, dw);
  if (dy.rank() < 1 || x.rank() != dy.rank() ||
      !std::equal(dy.shape.begin(), dy.shape.end() - 1, x.shape.begin()))
    fail(b, k,
         "x shape " + formatShape(x.shape) + " and dy shape " + formatShape(dy.shape) +
             " are not [..., in] and [..., out] with the same leading dimensions");
  const int64_t out = dy.dim(-1), in = x.dim(-1);
  checkShape(b, k, dwName, dw, {out, in},
             "for dy shape " + formatShape(dy.shape) + " and x shape " + formatShape(x.shape));
  return {leadingRows(dy), out, in};
}

int64_t checkPackedQkv(const char *b, const char *k, const char *operand, const TensorView &qkv,
                       const TensorView &o) {
  if (o.rank() != 4)
    fail(b, k, "o shape " + formatShape(o.shape) + " is not [batch, seq, heads, head_dim]");
  const int64_t heads = o.dim(2);
  checkFloat(b, k, operand, qkv);
  if (qkv.rank() != 4)
    fail(b, k,
         std::string(operand) + " shape " + formatShape(qkv.shape) +
             " is not [batch, seq, heads + 2 kv_heads, head_dim]");
  const int64_t kvPair = qkv.dim(2) - heads;
  if (heads <= 0 || kvPair <= 0 || kvPair % 2 != 0 || heads % (kvPair / 2) != 0)
    fail(b, k,
         std::string(operand) + " shape " + formatShape(qkv.shape) + " does not hold " +
             std::to_string(heads) +
             " query heads and then two equal numbers of key/value heads that divide them");
  return kvPair / 2;
}

int64_t checkNorm(const char *b, const char *k, const TensorView &x, const TensorView &w,
                  const TensorView *bias, const TensorView &y) {
  checkFloat(b, k, "x", x);
  checkFloat(b, k, "weight", w);
  checkFloat(b, k, "y", y);
  if (x.rank() < 1)
    fail(b, k, "x must have at least one dimension, got shape " + formatShape(x.shape));
  int64_t d = x.dim(-1);
  checkShape(b, k, "weight", w, {d}, "for x shape " + formatShape(x.shape));
  if (bias) {
    checkFloat(b, k, "bias", *bias);
    checkShape(b, k, "bias", *bias, {d}, "for x shape " + formatShape(x.shape));
  }
  checkSameShape(b, k, "y", y, "x", x);
  return d;
}

int64_t checkNormGrad(const char *b, const char *k, const TensorView &dy, const TensorView &x,
                      const TensorView &w, const TensorView &dx) {
  checkFloat(b, k, "dy", dy);
  checkFloat(b, k, "x", x);
  checkFloat(b, k, "weight", w);
  checkFloat(b, k, "dx", dx);
  if (x.rank() < 1)
    fail(b, k, "x must have at least one dimension, got shape " + formatShape(x.shape));
  checkSameShape(b, k, "dy", dy, "x", x);
  int64_t d = x.dim(-1);
  checkShape(b, k, "weight", w, {d}, "for x shape " + formatShape(x.shape));
  checkSameShape(b, k, "dx", dx, "x", x);
  return d;
}

int64_t checkDoraGrad(const char *b, const char *k, const TensorView &dy, const TensorView &y,
                      const TensorView &scale, const TensorView &magnitude, const TensorView &dx,
                      const TensorView &dmagnitude) {
  checkFloat(b, k, "dy", dy);
  checkFloat(b, k, "y", y);
  checkFloat(b, k, "scale", scale);
  checkFloat(b, k, "magnitude", magnitude);
  checkFloat(b, k, "dx", dx);
  checkFloat(b, k, "dmagnitude", dmagnitude);
  if (dy.rank() < 1)
    fail(b, k, "dy must have at least one dimension, got shape " + formatShape(dy.shape));
  checkSameShape(b, k, "y", y, "dy", dy);
  checkSameShape(b, k, "dx", dx, "dy", dy);
  int64_t d = dy.dim(-1);
  std::string context = "for dy shape " + formatShape(dy.shape);
  checkShape(b, k, "scale", scale, {d}, context);
  checkShape(b, k, "magnitude", magnitude, {d}, context);
  checkShape(b, k, "dmagnitude", dmagnitude, {d}, context);
  for (auto [name, t] :
       {std::pair("y", &y), std::pair("scale", &scale), std::pair("magnitude", &magnitude),
        std::pair("dx", &dx), std::pair("dmagnitude", &dmagnitude)})
    if (t->dtype != dy.dtype)
      fail(b, k,
           std::string(name) + " dtype " + dtypeName(t->dtype) + " differs from dy's " +
               dtypeName(dy.dtype));
  return d;
}

void checkStep(const char *b, const char *k, const TensorView &step) {
  checkView(b, k, "step", step);
  if (step.dtype != DType::I64)
    fail(b, k, std::string("step must be i64, not ") + dtypeName(step.dtype));
  if (step.numel() != 1)
    fail(b, k, "step shape " + formatShape(step.shape) + " is not a scalar");
}

void checkF32(const char *b, const char *k, const char *operand, const TensorView &t,
              const std::vector<int64_t> &shape) {
  checkView(b, k, operand, t);
  if (t.dtype != DType::F32)
    fail(b, k, std::string(operand) + " must be f32, not " + dtypeName(t.dtype));
  if (t.shape != shape)
    fail(b, k,
         std::string(operand) + " shape " + formatShape(t.shape) + " should be " +
             formatShape(shape));
}

std::pair<int64_t, int64_t> checkGaloreSide(const char *b, const char *k, const char *operand,
                                            const TensorView &t, bool left) {
  checkFloat(b, k, operand, t);
  if (t.shape.size() != 2)
    fail(b, k, std::string(operand) + " shape " + formatShape(t.shape) + " is not 2-D");
  int64_t m = t.shape[0], n = t.shape[1];
  if ((left && m > n) || (!left && m < n))
    fail(b, k,
         std::string("the ") + (left ? "left" : "right") + " side of " + formatShape(t.shape) +
             " is not its smaller side");
  return {m, n};
}

} // namespace bonsai::rt::checks
