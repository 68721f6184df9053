//===- KernelUtil.cpp - Checks, sub-views and threading of the CPU kernels ===//
//
// Implements the private helpers of KernelUtil.h: operand validation with messages that name the
// kernel, the operands and their shapes; element sub-views; and parallelFor, which splits
// independent items over std::thread so that results never depend on the number of threads.
//
//===----------------------------------------------------------------------===//

#include "KernelUtil.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <thread>

namespace bonsai::rt::cpu::detail {

void fail(const char *kernel, const std::string &message) {
  throw Error(std::string("cpu ") + kernel + ": " + message);
}

void checkView(const char *kernel, const char *operand, const TensorView &t) {
  for (int64_t d : t.shape)
    if (d < 0)
      fail(kernel,
           std::string(operand) + " has a negative dimension in shape " + formatShape(t.shape));
  if (!t.data && t.numel() != 0)
    fail(kernel, std::string(operand) + " of shape " + formatShape(t.shape) + " has no data");
}

void checkFloat(const char *kernel, const char *operand, const TensorView &t) {
  checkView(kernel, operand, t);
  if (!isComputeFloat(t.dtype))
    fail(kernel, std::string(operand) + " must be f32, f16 or bf16, not " + dtypeName(t.dtype));
}

void checkIndex(const char *kernel, const char *operand, const TensorView &t) {
  checkView(kernel, operand, t);
  if (t.dtype != DType::I32 && t.dtype != DType::I64)
    fail(kernel, std::string(operand) + " must be i32 or i64, not " + dtypeName(t.dtype));
}

void checkShape(const char *kernel, const char *operand, const TensorView &a,
                const std::vector<int64_t> &expected, const std::string &context) {
  if (a.shape != expected)
    fail(kernel, std::string(operand) + " shape " + formatShape(a.shape) + " should be " +
                     formatShape(expected) + " " + context);
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

LinearSizes checkLinear(const char *k, const TensorView &x, const TensorView &w,
                        const TensorView *bias, const TensorView &y) {
  checkFloat(k, "x", x);
  checkFloat(k, "w", w);
  checkFloat(k, "y", y);
  if (x.rank() < 1)
    fail(k, "x must have at least one dimension, got shape " + formatShape(x.shape));
  if (w.rank() != 2 || w.dim(1) != x.dim(-1))
    fail(k, "w shape " + formatShape(w.shape) + " should be [out, " + std::to_string(x.dim(-1)) +
                "] for x shape " + formatShape(x.shape));
  const int64_t out = w.dim(0);
  if (bias) {
    checkFloat(k, "bias", *bias);
    checkShape(k, "bias", *bias, {out}, "for w shape " + formatShape(w.shape));
  }
  checkShape(k, "y", y, withLast(x, out),
             "for x shape " + formatShape(x.shape) + " and w shape " + formatShape(w.shape));
  return {leadingRows(x), out, x.dim(-1)};
}

LinearSizes checkLinearGradInput(const char *k, const TensorView &dy, const TensorView &w,
                                 const TensorView &dx) {
  checkFloat(k, "dy", dy);
  checkFloat(k, "w", w);
  checkFloat(k, "dx", dx);
  if (dy.rank() < 1)
    fail(k, "dy must have at least one dimension, got shape " + formatShape(dy.shape));
  if (w.rank() != 2 || w.dim(0) != dy.dim(-1))
    fail(k, "w shape " + formatShape(w.shape) + " should be [" + std::to_string(dy.dim(-1)) +
                ", in] for dy shape " + formatShape(dy.shape));
  const int64_t in = w.dim(1);
  checkShape(k, "dx", dx, withLast(dy, in),
             "for dy shape " + formatShape(dy.shape) + " and w shape " + formatShape(w.shape));
  return {leadingRows(dy), w.dim(0), in};
}

LinearSizes checkLinearGradWeight(const char *k, const TensorView &dy, const TensorView &x,
                                  const TensorView &dw, const char *dwName) {
  checkFloat(k, "dy", dy);
  checkFloat(k, "x", x);
  checkFloat(k, dwName, dw);
  if (dy.rank() < 1 || x.rank() != dy.rank() ||
      !std::equal(dy.shape.begin(), dy.shape.end() - 1, x.shape.begin()))
    fail(k, "x shape " + formatShape(x.shape) + " and dy shape " + formatShape(dy.shape) +
                " are not [..., in] and [..., out] with the same leading dimensions");
  const int64_t out = dy.dim(-1), in = x.dim(-1);
  checkShape(k, dwName, dw, {out, in},
             "for dy shape " + formatShape(dy.shape) + " and x shape " + formatShape(x.shape));
  return {leadingRows(dy), out, in};
}

void checkSameShape(const char *kernel, const char *nameA, const TensorView &a, const char *nameB,
                    const TensorView &b) {
  if (a.shape != b.shape)
    fail(kernel, std::string(nameA) + " shape " + formatShape(a.shape) + " does not match " +
                     nameB + " shape " + formatShape(b.shape));
}

int64_t normalizeAxis(const char *kernel, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank)
    fail(kernel,
         "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

TensorView subView(const TensorView &t, int64_t offset, int64_t count) {
  TensorView v;
  v.data = static_cast<char *>(t.data) + size_t(offset) * dtypeSize(t.dtype);
  v.dtype = t.dtype;
  v.shape = {count};
  return v;
}

const float *loadFloats(const TensorView &t, std::vector<float> &scratch) {
  if (t.dtype == DType::F32)
    return static_cast<const float *>(t.data);
  scratch.resize(size_t(t.numel()));
  loadF32(t, scratch.data());
  return scratch.data();
}

float *resultBuffer(const TensorView &out, std::initializer_list<const TensorView *> inputs,
                    std::vector<float> &scratch) {
  bool direct = out.dtype == DType::F32;
  for (const TensorView *in : inputs)
    if (in && overlaps(out, *in))
      direct = false;
  if (direct)
    return static_cast<float *>(out.data);
  scratch.resize(size_t(out.numel()));
  return scratch.data();
}

bool overlaps(const TensorView &a, const TensorView &b) {
  auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  size_t an = a.bytes(), bn = b.bytes();
  return an && bn && a0 < b0 + bn && b0 < a0 + an;
}

std::string formatIndex(int64_t flat, const std::vector<int64_t> &shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    index[i] = shape[i] ? flat % shape[i] : 0;
    flat = shape[i] ? flat / shape[i] : 0;
  }
  return formatShape(index);
}

void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)> &fn) {
  if (n <= 0)
    return;
  int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  int64_t threads = std::min<int64_t>(hw, std::max<int64_t>(1, n / std::max<int64_t>(1, grain)));
  if (threads == 1) {
    fn(0, n);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  pool.reserve(size_t(threads - 1));
  auto run = [&](int64_t t) {
    try {
      fn(n * t / threads, n * (t + 1) / threads);
    } catch (...) {
      errors[size_t(t)] = std::current_exception();
    }
  };
  for (int64_t t = 1; t < threads; ++t)
    pool.emplace_back(run, t);
  run(0);
  for (std::thread &th : pool)
    th.join();
  // The first chunk's error, so which error surfaces does not depend on timing.
  for (std::exception_ptr &e : errors)
    if (e)
      std::rethrow_exception(e);
}

double loadScalar(const char *kernel, const char *operand, const TensorView &t) {
  checkFloat(kernel, operand, t);
  if (t.numel() != 1)
    fail(kernel, std::string(operand) + " shape " + formatShape(t.shape) + " is not a scalar");
  float value;
  loadF32(t, &value);
  return double(value);
}

int64_t loadStep(const char *kernel, const TensorView &step) {
  checkView(kernel, "step", step);
  if (step.dtype != DType::I64)
    fail(kernel, std::string("step must be i64, not ") + dtypeName(step.dtype));
  if (step.numel() != 1)
    fail(kernel, "step shape " + formatShape(step.shape) + " is not a scalar");
  int64_t value;
  std::memcpy(&value, step.data, sizeof value);
  if (value < 0)
    fail(kernel, "step " + std::to_string(value) + " is negative");
  return value;
}

} // namespace bonsai::rt::cpu::detail
