//===- Fp8Linear.cpp - FP8 GEMMs and delayed scaling on the CPU -----------===//
//
// The CPU reference of plan kinds Fp8Linear .. Fp8LinearBackwardFromInputCast (docs/fp8.md, "FP8
// training: ops, state and kernels"): each GEMM operand is cast to E4M3FN (activations, weights) or
// E5M2 (output gradients) with the scale of its row of the FP8 state, or with a scale from its own
// amax under current scaling or before the first update, exactly as fp8::castScaled casts; the
// codes go to the workspace (in the operand's own row-major layout: the CPU needs no transposed
// casts), the cast statistics to the stats output, and the GEMM multiplies the decoded values, sums
// them in f32 in k order and multiplies by 1 / (scaleA · scaleB), as fp8::gemm does, bit for bit.
// Casts run in parallel chunks and the GEMM in parallel rows: each count and each output
// element is computed the same way whatever the split, so results do not depend on threads.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"

#include "bonsai/runtime/Fp8.h"

#include "KernelUtil.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace bonsai::rt::cpu {

using namespace detail;

namespace {

/// Elements per chunk of a parallel cast.
constexpr int64_t kCastChunk = int64_t(1) << 16;

/// The columns of an FP8 state after checking that it is f32 [3, 4 + H], H >= 1.
int64_t stateColumns(const char *k, const TensorView &state) {
  checkView(k, "state", state);
  if (state.dtype != DType::F32 || state.rank() != 2 || state.dim(0) != 3 ||
      state.dim(1) <= fp8::kStateColumns)
    fail(k, "state must be an f32 [3, 4 + H] FP8 scaling state with H >= 1, got " +
                formatShape(state.shape) + " " + dtypeName(state.dtype));
  return state.dim(1);
}

void checkStats(const char *k, const char *name, const TensorView &stats) {
  checkView(k, name, stats);
  if (stats.dtype != DType::F32 || stats.shape != std::vector<int64_t>{2, fp8::kStatsColumns})
    fail(k, std::string(name) + " must be f32 [2, 4], got " + formatShape(stats.shape) + " " +
                dtypeName(stats.dtype));
}

/// The workspace's bytes after checking that they hold the codes of both casts.
uint8_t *workspaceBytes(const char *k, const TensorView &workspace, int64_t aElements,
                        int64_t bElements) {
  checkView(k, "workspace", workspace);
  int64_t need = fp8::gemmWorkspaceBytes(aElements, bElements);
  if (workspace.dtype != DType::F32 || workspace.numel() * 4 < need)
    fail(k, "workspace must be f32 of at least " + std::to_string(need / 4) +
                " elements for casts of " + std::to_string(aElements) + " and " +
                std::to_string(bElements) + " elements, got " + formatShape(workspace.shape) +
                " " + dtypeName(workspace.dtype));
  return static_cast<uint8_t *>(workspace.data);
}

/// Where the second operand's codes start in a workspace: the first's rounded up to 256 bytes.
int64_t secondCodesOffset(int64_t aElements) { return (aElements + 255) / 256 * 256; }

/// Casts `t` to `format` into `codes` with the scale of row `row` of `state` (a row without a
/// positive finite scale, and every row under current scaling, takes fp8::currentScale of the
/// tensor's amax) and writes the cast's statistics to `statsRow`; returns the scale.
float castOperand(const TensorView &t, const TensorView &state, fp8::StateRow row,
                  fp8::Format format, bool current, int margin, uint8_t *codes,
                  float *statsRow) {
  std::vector<float> scratch;
  const float *x = loadFloats(t, scratch);
  const int64_t n = t.numel();
  const int64_t chunks = (n + kCastChunk - 1) / kCastChunk;
  float scale = static_cast<const float *>(state.data)[row * state.dim(1) + fp8::ScaleColumn];
  if (current || !(scale > 0.0f) || !std::isfinite(scale)) {
    std::vector<float> amaxes(static_cast<size_t>(chunks), 0.0f);
    parallelFor(chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        float amax = 0.0f;
        for (int64_t i = c * kCastChunk, e = std::min(n, i + kCastChunk); i < e; ++i)
          if (!std::isnan(x[i]))
            amax = std::max(amax, std::fabs(x[i]));
        amaxes[size_t(c)] = amax;
      }
    });
    float amax = 0.0f;
    for (float a : amaxes)
      amax = std::max(amax, a);
    scale = fp8::currentScale(amax, format, margin);
  }
  std::vector<fp8::CastStats> parts(static_cast<size_t>(chunks));
  parallelFor(chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      int64_t first = c * kCastChunk, count = std::min(kCastChunk, n - first);
      parts[size_t(c)] = fp8::castScaled(x + first, count, scale, format, codes + first);
    }
  });
  fp8::CastStats total;
  for (const fp8::CastStats &p : parts) {
    total.underflows += p.underflows;
    total.saturations += p.saturations;
    total.amax = std::max(total.amax, p.amax);
  }
  statsRow[fp8::StatsAmax] = total.amax;
  statsRow[fp8::StatsUnderflow] = n ? float(double(total.underflows) / double(n)) : 0.0f;
  statsRow[fp8::StatsSaturation] = n ? float(double(total.saturations) / double(n)) : 0.0f;
  statsRow[fp8::StatsScale] = scale;
  return scale;
}

/// The values of `count` codes, optionally transposed from [rows, count / rows] to
/// [count / rows, rows].
std::vector<float> decodeCodes(const uint8_t *codes, int64_t count, fp8::Format format,
                               int64_t rows = 0) {
  float table[256];
  for (int code = 0; code < 256; ++code)
    table[code] = fp8::decode(uint8_t(code), format);
  std::vector<float> values(static_cast<size_t>(count));
  if (rows == 0) {
    for (int64_t i = 0; i < count; ++i)
      values[size_t(i)] = table[codes[i]];
    return values;
  }
  int64_t cols = count / rows;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      values[size_t(c * rows + r)] = table[codes[r * cols + c]];
  return values;
}

/// c [m, n] = (Σ_p a[i, p] · b[j, p]) · 1 / (scaleA · scaleB) (+ bias[j]), a [m, k] and b
/// [n, k] decoded FP8 values: every product is exact in f32, the sum is in f32 in p order, as
/// fp8::gemm computes it; rounded once into `out`.
void scaledGemm(const std::vector<float> &a, float scaleA,
                const std::vector<float> &b, float scaleB, int64_t m, int64_t n, int64_t kk,
                const TensorView *bias, const TensorView &out,
                std::initializer_list<const TensorView *> inputs) {
  std::vector<float> biasScratch, outScratch;
  const float *biasValues = bias ? loadFloats(*bias, biasScratch) : nullptr;
  float *c = resultBuffer(out, inputs, outScratch);
  const float descale = float(1.0 / (double(scaleA) * double(scaleB)));
  parallelFor(m, std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, n * kk)),
              [&](int64_t begin, int64_t end) {
                for (int64_t i = begin; i < end; ++i) {
                  const float *row = a.data() + i * kk;
                  for (int64_t j = 0; j < n; ++j) {
                    const float *col = b.data() + j * kk;
                    float sum = 0.0f;
                    for (int64_t p = 0; p < kk; ++p)
                      sum += row[p] * col[p];
                    float value = sum * descale;
                    c[i * n + j] = biasValues ? value + biasValues[j] : value;
                  }
                }
              });
  if (c != out.data)
    storeF32(c, out);
}

} // namespace

void fp8Linear(const TensorView &x, const TensorView &w, const TensorView &state,
               const TensorView *bias, bool current, int margin, const TensorView &y,
               const TensorView &stats, const TensorView &workspace) {
  const char *k = "fp8_linear";
  const auto [m, n, kk] = checkLinear(k, x, w, bias, y);
  stateColumns(k, state);
  checkStats(k, "stats", stats);
  uint8_t *codes = workspaceBytes(k, workspace, x.numel(), w.numel());
  uint8_t *wCodes = codes + secondCodesOffset(x.numel());
  float *s = static_cast<float *>(stats.data);
  float xScale = castOperand(x, state, fp8::InputRow, fp8::Format::E4M3FN, current, margin,
                             codes, s);
  float wScale = castOperand(w, state, fp8::WeightRow, fp8::Format::E4M3FN, current, margin,
                             wCodes, s + fp8::kStatsColumns);
  scaledGemm(decodeCodes(codes, x.numel(), fp8::Format::E4M3FN), xScale,
             decodeCodes(wCodes, w.numel(), fp8::Format::E4M3FN), wScale, m, n, kk, bias, y,
             {&x, &w, &state, bias});
}

void fp8LinearGradInput(const TensorView &dy, const TensorView &w, const TensorView &state,
                        bool current, int margin, const TensorView &dx, const TensorView &stats,
                        const TensorView &workspace) {
  const char *k = "fp8_linear_grad_input";
  const auto [m, n, kk] = checkLinearGradInput(k, dy, w, dx);
  stateColumns(k, state);
  checkStats(k, "stats", stats);
  uint8_t *codes = workspaceBytes(k, workspace, dy.numel(), w.numel());
  uint8_t *wCodes = codes + secondCodesOffset(dy.numel());
  float *s = static_cast<float *>(stats.data);
  float dyScale = castOperand(dy, state, fp8::OutputGradRow, fp8::Format::E5M2, current, margin,
                              codes, s);
  float wScale = castOperand(w, state, fp8::WeightRow, fp8::Format::E4M3FN, current, margin,
                             wCodes, s + fp8::kStatsColumns);
  // dx [m, k] = dy [m, n] · w [n, k]: the sum runs over n, so w is read as wᵀ [k, n].
  scaledGemm(decodeCodes(codes, dy.numel(), fp8::Format::E5M2), dyScale,
             decodeCodes(wCodes, w.numel(), fp8::Format::E4M3FN, /*rows=*/n), wScale, m, kk, n,
             nullptr, dx, {&dy, &w, &state});
}

void fp8LinearGradWeight(const TensorView &dy, const TensorView &x, const TensorView &state,
                         bool current, int margin, const TensorView &dw, const TensorView &stats,
                         const TensorView &workspace) {
  const char *k = "fp8_linear_grad_weight";
  const auto [m, n, kk] = checkLinearGradWeight(k, dy, x, dw);
  stateColumns(k, state);
  checkStats(k, "stats", stats);
  uint8_t *codes = workspaceBytes(k, workspace, dy.numel(), x.numel());
  uint8_t *xCodes = codes + secondCodesOffset(dy.numel());
  float *s = static_cast<float *>(stats.data);
  float dyScale = castOperand(dy, state, fp8::OutputGradRow, fp8::Format::E5M2, current, margin,
                              codes, s);
  float xScale = castOperand(x, state, fp8::InputRow, fp8::Format::E4M3FN, current, margin,
                             xCodes, s + fp8::kStatsColumns);
  // dw [n, k] = dyᵀ [n, m] · x [m, k]: the sum runs over m, so both are read transposed.
  scaledGemm(decodeCodes(codes, dy.numel(), fp8::Format::E5M2, /*rows=*/m), dyScale,
             decodeCodes(xCodes, x.numel(), fp8::Format::E4M3FN, /*rows=*/m), xScale, n, kk, m,
             nullptr, dw, {&dy, &x, &state});
}

void fp8LinearGradWeightAccumulate(const TensorView &dy, const TensorView &x,
                                   const TensorView &state, bool current, int margin,
                                   const TensorView &stats, const TensorView &workspace,
                                   const TensorView &acc) {
  const char *k = "fp8_linear_grad_weight_accumulate";
  if (acc.dtype != DType::F32)
    fail(k, std::string("acc must be f32 (FP8 GEMMs add into f32 accumulators only), got ") +
                dtypeName(acc.dtype));
  checkLinearGradWeight(k, dy, x, acc, "acc");
  // The product in f32, then one f32 addition per element: the same arithmetic as
  // fp8_linear_grad_weight into an f32 tensor followed by accumulate.
  std::vector<float> product(size_t(acc.numel()));
  TensorView dw{product.data(), DType::F32, acc.shape};
  fp8LinearGradWeight(dy, x, state, current, margin, dw, stats, workspace);
  accumulate(dw, acc);
}

void fp8LinearBackward(const TensorView &dy, const TensorView &w, const TensorView &x,
                       const TensorView &state, bool current, int margin, const TensorView &dx,
                       const TensorView &inputGradStats, const TensorView &weightGradStats,
                       const TensorView &workspace, const TensorView &acc) {
  const char *k = "fp8_linear_backward";
  checkFloat(k, "dy", dy);
  checkFloat(k, "w", w);
  checkFloat(k, "x", x);
  if (x.dtype != dy.dtype)
    fail(k, std::string("x must have dy's dtype ") + dtypeName(dy.dtype) + ", got " +
                dtypeName(x.dtype));
  // The two GEMMs' workspaces, one after the other (fp8::gemmWorkspaceBytes each).
  const int64_t first = fp8::gemmWorkspaceBytes(dy.numel(), w.numel());
  const int64_t need = first + fp8::gemmWorkspaceBytes(dy.numel(), x.numel());
  checkView(k, "workspace", workspace);
  if (workspace.dtype != DType::F32 || workspace.numel() * 4 < need)
    fail(k, "workspace must be f32 of at least " + std::to_string(need / 4) +
                " elements (the workspaces of the input and weight gradients' GEMMs), got " +
                formatShape(workspace.shape) + " " + dtypeName(workspace.dtype));
  // The casts of the fused kernel are those of the two GEMMs apart (the same dy, state and
  // scale), so on the CPU it is the pair, bit for bit.
  // The weight gradient's workspace ends where the workspace does, so that its x codes are at
  // a place fp8LinearBackwardSharedInput finds from the end (they are in the exact-size
  // workspaces the compiler makes: the first part's end).
  TensorView inputWorkspace{workspace.data, DType::F32, {first / 4}};
  const int64_t second = fp8::gemmWorkspaceBytes(dy.numel(), x.numel()) / 4;
  TensorView weightWorkspace{
      static_cast<float *>(workspace.data) + workspace.numel() - second, DType::F32, {second}};
  fp8LinearGradInput(dy, w, state, current, margin, dx, inputGradStats, inputWorkspace);
  fp8LinearGradWeightAccumulate(dy, x, state, current, margin, weightGradStats, weightWorkspace,
                                acc);
}

/// The codes of `elements` input elements that another kernel's cast left in `inputCast` at
/// byte `offset` (from the start when `offset` >= 0, else from the end), after checking that
/// the workspace holds them and `minBytes`, and that `inputStats` are f32 [2, 4].
static const uint8_t *sharedCodes(const char *k, const TensorView &inputCast,
                                  const TensorView &inputStats, int64_t elements, int64_t minBytes,
                                  int64_t offset) {
  checkView(k, "input_cast", inputCast);
  if (inputCast.dtype != DType::F32 || inputCast.rank() != 1 || inputCast.numel() * 4 < minBytes)
    fail(k, "input_cast must be the f32 workspace of the kernel that cast the input, of at "
            "least " +
                std::to_string(minBytes / 4) + " elements for the codes of " +
                std::to_string(elements) + " elements, got " + formatShape(inputCast.shape) + " " +
                dtypeName(inputCast.dtype));
  checkStats(k, "input_stats", inputStats);
  const auto *base = static_cast<const uint8_t *>(inputCast.data);
  return offset >= 0 ? base + offset : base + inputCast.numel() * 4 + offset;
}

/// Row `row` of `inputStats` (the other kernel's statistics of its cast of the input) into
/// `statsRow`; returns the scale that cast used.
static float sharedScale(const TensorView &inputStats, int row, float *statsRow) {
  const float *from = static_cast<const float *>(inputStats.data) + row * fp8::kStatsColumns;
  std::copy(from, from + fp8::kStatsColumns, statsRow);
  return from[fp8::StatsScale];
}

void fp8LinearSharedInput(const TensorView &inputCast, const TensorView &inputStats,
                          const TensorView &w, const TensorView &state, const TensorView *bias,
                          bool current, int margin, const TensorView &y, const TensorView &stats,
                          const TensorView &workspace) {
  const char *k = "fp8_linear_shared_input";
  checkFloat(k, "w", w);
  checkFloat(k, "y", y);
  if (w.rank() != 2 || y.rank() < 1 || y.dim(y.rank() - 1) != w.dim(0))
    fail(k, "w must be [N, K] and y [..., N], got w " + formatShape(w.shape) + " and y " +
                formatShape(y.shape));
  const int64_t n = w.dim(0), kk = w.dim(1), m = n ? y.numel() / n : 0;
  if (bias && (bias->numel() != n))
    fail(k, "bias must be [" + std::to_string(n) + "], got " + formatShape(bias->shape));
  stateColumns(k, state);
  checkStats(k, "stats", stats);
  // x's codes are the first operand's of the Fp8Linear that cast it: the workspace's start.
  const uint8_t *xCodes =
      sharedCodes(k, inputCast, inputStats, m * kk, fp8::gemmWorkspaceBytes(m * kk, 0), 0);
  uint8_t *wCodes = workspaceBytes(k, workspace, 0, w.numel());
  float *s = static_cast<float *>(stats.data);
  const float xScale = sharedScale(inputStats, 0, s);
  const float wScale = castOperand(w, state, fp8::WeightRow, fp8::Format::E4M3FN, current, margin,
                                   wCodes, s + fp8::kStatsColumns);
  scaledGemm(decodeCodes(xCodes, m * kk, fp8::Format::E4M3FN), xScale,
             decodeCodes(wCodes, w.numel(), fp8::Format::E4M3FN), wScale, m, n, kk, bias, y,
             {&inputCast, &w, &state, bias});
}

/// Where a fused backward that does not cast its input finds x's codes: `codes` (row-major
/// [M, K] when `transposed` is false, [K, M] when true, in the view `source`) and row
/// `statsRow` of `inputStats`, whose scale was x's.
struct CastInput {
  const TensorView &source;
  const TensorView &inputStats;
  int statsRow;
  bool transposed;
};

/// The checks of Fp8LinearBackwardSharedInput and Fp8LinearBackwardFromInputCast before x's codes
/// are found: dx = dy · w's operands and the accumulator; returns M, N and K.
static LinearSizes checkBackwardWithoutInputCast(const char *k, const TensorView &dy,
                                                 const TensorView &w, const TensorView &state,
                                                 const TensorView &dx,
                                                 const TensorView &weightGradStats,
                                                 const TensorView &acc) {
  const LinearSizes sizes = checkLinearGradInput(k, dy, w, dx);
  const auto [m, n, kk] = sizes;
  if (acc.dtype != DType::F32 || acc.rank() != 2 || acc.dim(0) != n || acc.dim(1) != kk)
    fail(k, "acc must be f32 [" + std::to_string(n) + ", " + std::to_string(kk) +
                "] (FP8 GEMMs add into f32 accumulators only), got " + formatShape(acc.shape) +
                " " + dtypeName(acc.dtype));
  stateColumns(k, state);
  checkStats(k, "weight_grad_stats", weightGradStats);
  return sizes;
}

/// Kinds 97 and 99 once x's codes are found: the input gradient as fp8LinearBackward computes
/// it, in the workspace's first part; the weight gradient from dy cast again (the same codes)
/// and x's codes.
static void backwardWithoutInputCast(const char *k, const TensorView &dy, const TensorView &w,
                                     const uint8_t *xCodes, const CastInput &x,
                                     const TensorView &state, bool current, int margin,
                                     const TensorView &dx, const TensorView &inputGradStats,
                                     const TensorView &weightGradStats, const TensorView &workspace,
                                     const TensorView &acc) {
  const int64_t n = w.dim(0), kk = w.dim(1), m = n ? dy.numel() / n : 0;
  const int64_t first = fp8::gemmWorkspaceBytes(dy.numel(), w.numel());
  const int64_t need = first + fp8::gemmWorkspaceBytes(dy.numel(), 0);
  checkView(k, "workspace", workspace);
  if (workspace.dtype != DType::F32 || workspace.numel() * 4 < need)
    fail(k, "workspace must be f32 of at least " + std::to_string(need / 4) +
                " elements (the casts of dy twice and of w), got " + formatShape(workspace.shape) +
                " " + dtypeName(workspace.dtype));
  TensorView inputWorkspace{workspace.data, DType::F32, {first / 4}};
  fp8LinearGradInput(dy, w, state, current, margin, dx, inputGradStats, inputWorkspace);
  uint8_t *dyCodes = static_cast<uint8_t *>(workspace.data) + first;
  float *s = static_cast<float *>(weightGradStats.data);
  const float dyScale =
      castOperand(dy, state, fp8::OutputGradRow, fp8::Format::E5M2, current, margin, dyCodes, s);
  const float xScale = sharedScale(x.inputStats, x.statsRow, s + fp8::kStatsColumns);
  std::vector<float> product(size_t(acc.numel()));
  TensorView dw{product.data(), DType::F32, acc.shape};
  // dw [n, k] = dyᵀ [n, m] · x [m, k]: the sum runs over m, both read as [., m].
  scaledGemm(decodeCodes(dyCodes, dy.numel(), fp8::Format::E5M2, /*rows=*/m), dyScale,
             decodeCodes(xCodes, m * kk, fp8::Format::E4M3FN, x.transposed ? 0 : m), xScale, n, kk,
             m, nullptr, dw, {&dy, &x.source, &state});
  accumulate(dw, acc);
}

void fp8LinearBackwardSharedInput(const TensorView &dy, const TensorView &w,
                                  const TensorView &inputCast, const TensorView &inputStats,
                                  const TensorView &state, bool current, int margin,
                                  const TensorView &dx, const TensorView &inputGradStats,
                                  const TensorView &weightGradStats, const TensorView &workspace,
                                  const TensorView &acc) {
  const char *k = "fp8_linear_backward_shared_input";
  const auto [m, n, kk] = checkBackwardWithoutInputCast(k, dy, w, state, dx, weightGradStats, acc);
  // fp8LinearBackward leaves x's codes (row-major [M, K]) just before its workspace's last
  // 256 bytes (it places the weight gradient's workspace at the end).
  const int64_t xBytes = (m * kk + 255) / 256 * 256;
  const uint8_t *xCodes = sharedCodes(
      k, inputCast, inputStats, m * kk,
      fp8::gemmWorkspaceBytes(0, 0) + fp8::gemmWorkspaceBytes(0, m * kk), -(xBytes + 256));
  backwardWithoutInputCast(k, dy, w, xCodes, {inputCast, inputStats, 1, false}, state, current,
                           margin, dx, inputGradStats, weightGradStats, workspace, acc);
}

/// Checks `inputCast`: xᵀ's codes, f8_e4m3 [kk, m] (Fp8LinearWithInputCast and
/// Fp8LinearBackwardFromInputCast).
static void checkTransposedCodes(const char *k, const TensorView &inputCast, int64_t kk,
                                 int64_t m) {
  checkView(k, "input_cast", inputCast);
  if (inputCast.dtype != DType::F8E4M3FN || inputCast.shape != std::vector<int64_t>{kk, m})
    fail(k, "input_cast must be f8_e4m3 [" + std::to_string(kk) + ", " + std::to_string(m) +
                "] (x's transposed codes), got " + formatShape(inputCast.shape) + " " +
                dtypeName(inputCast.dtype));
}

void fp8LinearWithInputCast(const TensorView &x, const TensorView &w, const TensorView &state,
                            const TensorView *bias, bool current, int margin, const TensorView &y,
                            const TensorView &stats, const TensorView &inputCast,
                            const TensorView &workspace) {
  const char *k = "fp8_linear_with_input_cast";
  const int64_t kk = w.rank() == 2 ? w.dim(1) : 0, m = kk ? x.numel() / kk : 0;
  checkTransposedCodes(k, inputCast, kk, m);
  fp8Linear(x, w, state, bias, current, margin, y, stats, workspace);
  // x's plain codes are the workspace's first; their transpose is what fp8LinearBackward's
  // cast of x with the same scale writes.
  const auto *plain = static_cast<const uint8_t *>(workspace.data);
  auto *codes = static_cast<uint8_t *>(inputCast.data);
  parallelFor(kk, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      for (int64_t r = 0; r < m; ++r)
        codes[c * m + r] = plain[r * kk + c];
  });
}

void fp8LinearBackwardFromInputCast(const TensorView &dy, const TensorView &w,
                                    const TensorView &inputCast, const TensorView &inputStats,
                                    const TensorView &state, bool current, int margin,
                                    const TensorView &dx, const TensorView &inputGradStats,
                                    const TensorView &weightGradStats, const TensorView &workspace,
                                    const TensorView &acc) {
  const char *k = "fp8_linear_backward_from_input_cast";
  const auto [m, n, kk] = checkBackwardWithoutInputCast(k, dy, w, state, dx, weightGradStats, acc);
  checkTransposedCodes(k, inputCast, kk, m);
  checkStats(k, "input_stats", inputStats);
  backwardWithoutInputCast(k, dy, w, static_cast<const uint8_t *>(inputCast.data),
                           {inputCast, inputStats, 0, true}, state, current, margin, dx,
                           inputGradStats, weightGradStats, workspace, acc);
}

void fp8UpdateScales(const TensorView &step, const TensorView &forwardStats,
                     const TensorView *backwardStats, int margin, const TensorView &state) {
  const char *k = "fp8_update_scales";
  const int64_t t = loadStep(k, step);
  checkStats(k, "forward_stats", forwardStats);
  if (backwardStats)
    checkStats(k, "backward_stats", *backwardStats);
  const int64_t columns = stateColumns(k, state), length = columns - fp8::kStateColumns;
  float *rows = static_cast<float *>(state.data);
  auto update = [&](fp8::StateRow row, const float *stats, fp8::Format format) {
    float *r = rows + row * columns;
    float *history = r + fp8::kStateColumns;
    fp8::recordAmax(history, length, t, stats[fp8::StatsAmax]);
    r[fp8::ScaleColumn] = fp8::delayedScale(history, length, r[fp8::ScaleColumn], format, margin);
    r[fp8::AmaxColumn] = stats[fp8::StatsAmax];
    r[fp8::UnderflowColumn] = stats[fp8::StatsUnderflow];
    r[fp8::SaturationColumn] = stats[fp8::StatsSaturation];
  };
  const float *forward = static_cast<const float *>(forwardStats.data);
  update(fp8::InputRow, forward, fp8::Format::E4M3FN);
  update(fp8::WeightRow, forward + fp8::kStatsColumns, fp8::Format::E4M3FN);
  // The backward kernels' first cast operand is the output gradient.
  if (backwardStats)
    update(fp8::OutputGradRow, static_cast<const float *>(backwardStats->data),
           fp8::Format::E5M2);
}

} // namespace bonsai::rt::cpu
