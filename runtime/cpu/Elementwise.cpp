//===- Elementwise.cpp - add, mul, silu, gelu and swiglu on the CPU -------===//
//
// Elementwise kernels. Tensors are processed in fixed chunks of elements, each converted to fp32
// (loadF32), computed and rounded once (storeF32); chunks are independent, so they run on several
// threads with a result that does not depend on the split, and an output may be one of the inputs
// (in place). add and mul broadcast `rhs` over `lhs`'s trailing dimensions (each equal or 1).
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"

#include "KernelUtil.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace bonsai::rt::cpu {

using namespace detail;

namespace {

/// Elements per chunk: large enough to amortise the conversions, small enough for the cache.
constexpr int64_t kChunk = 16384;
/// Chunks per thread below which threading costs more than it saves.
constexpr int64_t kChunkGrain = 4;

/// Runs fn(offset, count) over `n` elements in chunks, on several threads.
template <typename F> void forChunks(int64_t n, F fn) {
  int64_t chunks = (n + kChunk - 1) / kChunk;
  parallelFor(chunks, kChunkGrain, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int64_t offset = c * kChunk;
      fn(offset, std::min(kChunk, n - offset));
    }
  });
}

template <typename F>
void unary(const char *kernel, const TensorView &x, const TensorView &y, F f) {
  checkFloat(kernel, "x", x);
  checkFloat(kernel, "y", y);
  checkSameShape(kernel, "y", y, "x", x);
  forChunks(x.numel(), [&](int64_t offset, int64_t count) {
    std::vector<float> v(static_cast<size_t>(count));
    loadF32(subView(x, offset, count), v.data());
    for (float &e : v)
      e = float(f(double(e)));
    storeF32(v.data(), subView(y, offset, count));
  });
}

/// Where element `i` of lhs finds its rhs element under trailing broadcasting: lhs's last
/// rhs.rank() dimensions are walked like an odometer, rhs dimensions of 1 having stride 0.
class BroadcastCursor {
public:
  BroadcastCursor(const std::vector<int64_t> &lhsShape, const std::vector<int64_t> &rhsShape)
      : dims(lhsShape.end() - int64_t(rhsShape.size()), lhsShape.end()), strides(rhsShape.size()),
        index(rhsShape.size()) {
    int64_t stride = 1;
    for (size_t d = rhsShape.size(); d-- > 0;) {
      strides[d] = rhsShape[d] == 1 ? 0 : stride;
      stride *= rhsShape[d];
    }
  }

  /// Positions the cursor at lhs element `flat`.
  void seek(int64_t flat) {
    offset = 0;
    for (size_t d = dims.size(); d-- > 0;) {
      index[d] = flat % dims[d];
      flat /= dims[d];
      offset += index[d] * strides[d];
    }
  }

  /// The rhs element of the current lhs element.
  int64_t rhsOffset() const { return offset; }

  void next() {
    for (size_t d = dims.size(); d-- > 0;) {
      offset += strides[d];
      if (++index[d] < dims[d])
        return;
      offset -= index[d] * strides[d];
      index[d] = 0;
    }
  }

private:
  std::vector<int64_t> dims, strides, index;
  int64_t offset = 0;
};

template <typename F>
void binary(const char *kernel, const TensorView &lhs, const TensorView &rhs, const TensorView &out,
            F f) {
  checkFloat(kernel, "lhs", lhs);
  checkFloat(kernel, "rhs", rhs);
  checkFloat(kernel, "out", out);
  bool broadcastable = rhs.rank() <= lhs.rank();
  for (int64_t d = 0; broadcastable && d < rhs.rank(); ++d) {
    int64_t r = rhs.shape[size_t(d)], l = lhs.shape[size_t(lhs.rank() - rhs.rank() + d)];
    broadcastable = r == l || r == 1;
  }
  if (!broadcastable)
    fail(kernel, "rhs shape " + formatShape(rhs.shape) +
                     " does not broadcast over the trailing dimensions of lhs shape " +
                     formatShape(lhs.shape));
  checkSameShape(kernel, "out", out, "lhs", lhs);
  // rhs is usually small (a bias, position embeddings); converting it once is cheap.
  std::vector<float> rs;
  const float *rp = loadFloats(rhs, rs);
  forChunks(lhs.numel(), [&](int64_t offset, int64_t count) {
    std::vector<float> v(static_cast<size_t>(count));
    loadF32(subView(lhs, offset, count), v.data());
    BroadcastCursor cursor(lhs.shape, rhs.shape);
    cursor.seek(offset);
    for (float &e : v) {
      e = f(e, rp[cursor.rhsOffset()]);
      cursor.next();
    }
    storeF32(v.data(), subView(out, offset, count));
  });
}

double siluScalar(double x) { return x / (1.0 + std::exp(-x)); }

} // namespace

// fp32 sums and products of two floats are correctly rounded, as an fp64 computation rounded
// once to fp32 would be.
void add(const TensorView &lhs, const TensorView &rhs, const TensorView &out) {
  binary("add", lhs, rhs, out, [](float a, float b) { return a + b; });
}

void mul(const TensorView &lhs, const TensorView &rhs, const TensorView &out) {
  binary("mul", lhs, rhs, out, [](float a, float b) { return a * b; });
}

void silu(const TensorView &x, const TensorView &y) { unary("silu", x, y, siluScalar); }

void gelu(const TensorView &x, bool tanh, const TensorView &y) {
  if (tanh) {
    // GPT-2's gelu_new (PyTorch's approximate="tanh").
    const double c = std::sqrt(2.0 / 3.14159265358979323846);
    unary("gelu", x, y,
          [c](double v) { return 0.5 * v * (1.0 + std::tanh(c * (v + 0.044715 * v * v * v))); });
  } else {
    unary("gelu", x, y, [](double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); });
  }
}

void swiglu(const TensorView &gate, const TensorView &up, const TensorView &y) {
  const char *k = "swiglu";
  checkFloat(k, "gate", gate);
  checkFloat(k, "up", up);
  checkFloat(k, "y", y);
  checkSameShape(k, "up", up, "gate", gate);
  checkSameShape(k, "y", y, "gate", gate);
  forChunks(gate.numel(), [&](int64_t offset, int64_t count) {
    std::vector<float> g(static_cast<size_t>(count)), u(static_cast<size_t>(count));
    loadF32(subView(gate, offset, count), g.data());
    loadF32(subView(up, offset, count), u.data());
    for (size_t i = 0; i < g.size(); ++i)
      g[i] = float(siluScalar(double(g[i])) * double(u[i]));
    storeF32(g.data(), subView(y, offset, count));
  });
}

} // namespace bonsai::rt::cpu
