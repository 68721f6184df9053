//===- Fused.cpp - The fused kernels of bonsai-fuse on the CPU -------------===//
//
// linear_cross_entropy, add_rms_norm, add_layer_norm, rms_norm_grad_add and
// layer_norm_grad_add (docs/fusion.md). Each computes what the chain of unfused kernels it
// replaces computes, with the same fp32/fp64 arithmetic and the same roundings into storage,
// so that a step is bitwise the same fused or not (the chunked LM head's dW is the one
// exception: over several chunks its fp32 sums run in another order).
//
// The residual norms are the reference: they run the unfused CPU kernels in sequence (the sum
// is stored and read back, exactly as the add and the norm would). The LM head runs the
// chunked algorithm itself, since its point is never to hold the whole batch's logits:
// per chunk of rows, the logits are an sgemm rounded into the workspace in W's dtype (as the
// linear kernel rounds them), each row's loss and gradient come from one fp64 softmax (the
// arithmetic of cross_entropy and cross_entropy_grad), and the two gradient GEMMs read the
// rounded gradient back.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/Fusion.h"

#include "KernelUtil.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

namespace bonsai::rt::cpu {

using namespace detail;

namespace {

/// A view of `count` elements of `dtype` at element offset `offset` of f32 storage `base`
/// reinterpreted (the workspace holds data of W's dtype in f32 slots).
TensorView workspaceView(const TensorView &workspace, int64_t offset, DType dtype,
                         std::vector<int64_t> shape) {
  TensorView v;
  v.data = static_cast<float *>(workspace.data) + offset;
  v.dtype = dtype;
  v.shape = std::move(shape);
  return v;
}

} // namespace

void linearCrossEntropy(const TensorView &x, const TensorView &w, const TensorView &labels,
                        const TensorView &dloss, int64_t ignoreIndex, int64_t chunkRows,
                        const TensorView &loss, const TensorView &dx, const TensorView &workspace,
                        const TensorView *dw) {
  const char *k = "linear_cross_entropy";
  checkFloat(k, "x", x);
  checkFloat(k, "w", w);
  checkIndex(k, "labels", labels);
  checkFloat(k, "dloss", dloss);
  checkFloat(k, "loss", loss);
  checkFloat(k, "dx", dx);
  checkFloat(k, "workspace", workspace);
  if (x.rank() < 1 || w.rank() != 2 || w.dim(1) != x.dim(-1) || w.dtype != x.dtype)
    fail(k, "w shape " + formatShape(w.shape) + " should be [vocab, " +
                std::to_string(x.rank() ? x.dim(-1) : 0) + "] of x's dtype for x shape " +
                formatShape(x.shape));
  checkShape(k, "labels", labels, std::vector<int64_t>(x.shape.begin(), x.shape.end() - 1),
             "for x shape " + formatShape(x.shape));
  checkSameShape(k, "dx", dx, "x", x);
  if (dloss.numel() != 1 || loss.numel() != 1)
    fail(k, "dloss and loss must be scalars, got " + formatShape(dloss.shape) + " and " +
                formatShape(loss.shape));
  if (dw) {
    checkFloat(k, "dw", *dw);
    checkSameShape(k, "dw", *dw, "w", w);
  }
  if (chunkRows <= 0)
    fail(k, "chunk_rows must be positive, got " + std::to_string(chunkRows));
  const int64_t vocab = w.dim(0), hidden = w.dim(1), rows = labels.numel();
  const int64_t elementBytes = int64_t(dtypeSize(x.dtype));
  LinearCrossEntropyWorkspace layout =
      linearCrossEntropyWorkspace(rows, vocab, hidden, chunkRows, elementBytes, dw != nullptr);
  if (workspace.dtype != DType::F32 || workspace.numel() != layout.total)
    fail(k, "workspace must be " + std::to_string(layout.total) + " f32 elements, got " +
                formatShape(workspace.shape) + " " + dtypeName(workspace.dtype));

  // The count of labels is taken over the whole batch before any chunk (the mean's
  // denominator); every label is checked before anything is written.
  std::vector<int64_t> label(static_cast<size_t>(rows));
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t l = label[size_t(r)] = loadIndex(labels, r);
    if (l == ignoreIndex)
      continue;
    if (l < 0 || l >= vocab)
      fail(k, "label " + std::to_string(l) + " at labels" + formatIndex(r, labels.shape) +
                  " is outside [0, " + std::to_string(vocab) + ") and is not ignore_index " +
                  std::to_string(ignoreIndex));
    ++count;
  }
  float dl;
  loadF32(dloss, &dl);
  // As cross_entropy_grad: with every label ignored the gradient is 0, not NaN.
  const double scale = count ? double(dl) / double(count) : 0.0;

  std::vector<float> xs, ws, dxs;
  const float *xp = loadFloats(x, xs);
  const float *wp = loadFloats(w, ws);
  float *dxp = resultBuffer(dx, {&x, &w, &labels, &dloss}, dxs);
  // dW accumulates in fp32: in dw itself when it is f32, else in the workspace's accumulator.
  float *dwp = nullptr;
  if (dw)
    dwp = dw->dtype == DType::F32 ? static_cast<float *>(dw->data)
                                  : static_cast<float *>(workspace.data) + layout.accumulator;

  const int64_t chunk = std::min(rows, chunkRows);
  std::vector<float> logits(static_cast<size_t>(chunk * vocab));
  std::vector<double> nll(static_cast<size_t>(rows), 0.0);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    TensorView stored = workspaceView(workspace, layout.logits, x.dtype, {n, vocab});
    // logits = x_c wᵀ, rounded into W's dtype as the linear kernel stores them.
    gemm(k, false, true, n, vocab, hidden, 1.0f, xp + r0 * hidden, wp, 0.0f, logits.data());
    storeF32(logits.data(), stored);
    loadF32(stored, logits.data());
    int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, vocab));
    parallelFor(n, grain, [&](int64_t a, int64_t b) {
      std::vector<double> e(static_cast<size_t>(vocab));
      for (int64_t i = a; i < b; ++i) {
        float *row = logits.data() + i * vocab;
        int64_t l = label[size_t(r0 + i)];
        if (l == ignoreIndex || count == 0) {
          std::fill(row, row + vocab, 0.0f);
          continue;
        }
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t v = 0; v < vocab; ++v)
          max = std::max(max, double(row[v]));
        double sum = 0.0;
        for (int64_t v = 0; v < vocab; ++v)
          sum += e[size_t(v)] = std::exp(double(row[v]) - max);
        nll[size_t(r0 + i)] = max + std::log(sum) - double(row[l]);
        for (int64_t v = 0; v < vocab; ++v)
          row[v] = float(scale * (e[size_t(v)] / sum - (v == l ? 1.0 : 0.0)));
      }
    });
    // The gradient, rounded as cross_entropy_grad stores it, replaces the chunk's logits.
    storeF32(logits.data(), stored);
    if (x.dtype != DType::F32)
      loadF32(stored, logits.data());
    const float *g = logits.data();
    gemm(k, false, false, n, hidden, vocab, 1.0f, g, wp, 0.0f, dxp + r0 * hidden);
    if (dwp)
      // As linear_grad_weight computes it (one chunk: the same bits), the chunks added in order.
      weightGradient(g, xp + r0 * hidden, n, vocab, hidden, /*accumulate=*/r0 != 0, dwp);
  }

  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r)
    if (label[size_t(r)] != ignoreIndex)
      total += nll[size_t(r)];
  // 0/0, as PyTorch: a batch of only ignored labels has a NaN loss.
  float result = count ? float(total / double(count)) : std::numeric_limits<float>::quiet_NaN();
  if (dxp != dx.data)
    storeF32(dxp, dx);
  if (dw && dwp != dw->data)
    storeF32(dwp, *dw);
  storeF32(&result, loss);
}

void addRmsNorm(const TensorView &lhs, const TensorView &rhs, const TensorView &w, double eps,
                const TensorView &sum, const TensorView &y) {
  checkSameShape("add_rms_norm", "rhs", rhs, "lhs", lhs);
  add(lhs, rhs, sum);
  rmsNorm(sum, w, eps, y);
}

void addLayerNorm(const TensorView &lhs, const TensorView &rhs, const TensorView &w,
                  const TensorView &b, double eps, const TensorView &sum, const TensorView &y) {
  checkSameShape("add_layer_norm", "rhs", rhs, "lhs", lhs);
  add(lhs, rhs, sum);
  layerNorm(sum, w, b, eps, y);
}

void rmsNormGradAdd(const TensorView &dy, const TensorView &x, const TensorView &w,
                    const TensorView &addend, double eps, const TensorView &dx,
                    const TensorView &dw) {
  checkSameShape("rms_norm_grad_add", "addend", addend, "x", x);
  rmsNormGrad(dy, x, w, eps, dx, dw);
  // dx holds the norm's gradient rounded to its dtype, as the unfused add reads it.
  add(dx, addend, dx);
}

void layerNormGradAdd(const TensorView &dy, const TensorView &x, const TensorView &w,
                      const TensorView &addend, double eps, const TensorView &dx,
                      const TensorView &dw, const TensorView &db) {
  checkSameShape("layer_norm_grad_add", "addend", addend, "x", x);
  layerNormGrad(dy, x, w, eps, dx, dw, db);
  add(dx, addend, dx);
}

} // namespace bonsai::rt::cpu
