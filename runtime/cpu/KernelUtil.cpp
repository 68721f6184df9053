//===- KernelUtil.cpp - Checks, sub-views and threading of the CPU kernels ===//
//
// Implements the private helpers of KernelUtil.h (its operand checks are OperandChecks.cpp's):
// element sub-views, the scalar loads, and parallelFor, which splits independent items over
// std::thread so that results never depend on the number of threads.
//
//===----------------------------------------------------------------------===//

#include "KernelUtil.h"

#include "bonsai/runtime/HostThreads.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

namespace bonsai::rt::cpu::detail {

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

std::string formatIndex(int64_t flat, const std::vector<int64_t> &shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    index[i] = shape[i] ? flat % shape[i] : 0;
    flat = shape[i] ? flat / shape[i] : 0;
  }
  return formatShape(index);
}

namespace {
/// The dot product of a[0, n) and b[0, n) in one fixed order, the same for (a, b) and (b, a).
float orderedDot(const float *a, const float *b, int64_t n) {
  float sums[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t r = 0;
  for (; r + 8 <= n; r += 8)
    for (int l = 0; l < 8; ++l)
      sums[l] += a[r + l] * b[r + l];
  float total =
      ((sums[0] + sums[1]) + (sums[2] + sums[3])) + ((sums[4] + sums[5]) + (sums[6] + sums[7]));
  for (; r < n; ++r)
    total += a[r] * b[r];
  return total;
}
} // namespace

void weightGradient(const float *a, const float *b, int64_t rows, int64_t out, int64_t in,
                    bool accumulate, float *dw) {
  // Columns as contiguous rows, so that each dot product streams two arrays.
  std::vector<float> at(size_t(out) * size_t(rows)), bt(size_t(in) * size_t(rows));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o)
      at[size_t(o * rows + r)] = a[r * out + o];
    for (int64_t i = 0; i < in; ++i)
      bt[size_t(i * rows + r)] = b[r * in + i];
  }
  parallelFor(out, std::max<int64_t>(1, kWorkGrain / std::max<int64_t>(1, in * rows)),
              [&](int64_t o0, int64_t o1) {
                for (int64_t o = o0; o < o1; ++o)
                  for (int64_t i = 0; i < in; ++i) {
                    float dot = orderedDot(at.data() + o * rows, bt.data() + i * rows, rows);
                    dw[o * in + i] = accumulate ? dw[o * in + i] + dot : dot;
                  }
              });
}

void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)> &fn) {
  if (n <= 0)
    return;
  int64_t hw = int64_t(hostThreads());
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

std::vector<int64_t> loadTokenOperand(const char *kernel, const char *name, const TensorView *t,
                                      int64_t batch, int64_t seq) {
  std::vector<int64_t> values;
  if (!t)
    return values;
  checkIndex(kernel, name, *t);
  checkShape(kernel, name, *t, {batch, seq}, "([batch, seq])");
  values.resize(size_t(batch * seq));
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = t->dtype == DType::I32 ? int64_t(static_cast<const int32_t *>(t->data)[i])
                                       : static_cast<const int64_t *>(t->data)[i];
  return values;
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
  checkStep(kernel, step);
  int64_t value;
  std::memcpy(&value, step.data, sizeof value);
  if (value < 0)
    fail(kernel, "step " + std::to_string(value) + " is negative");
  return value;
}

} // namespace bonsai::rt::cpu::detail
