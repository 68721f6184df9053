//===- KernelAttrs.h - A kernel's attributes, typed by attribute table ----===//
//
// One struct per attribute table of plan.fbs (NormAttrs, AdamWAttrs, ...), with the loader's
// checked values. A kernel holds the one of its kind's table (the Attrs column of
// KernelKinds.def; NoAttrs for a kind without attributes), so an attribute of another table
// cannot be read by mistake: `kernel.attrsAs<NormAttrs>().epsilon`, or in a handler or a
// contract that knows its kind, `attrs<kinds::RMSNorm>().epsilon`.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_KERNELATTRS_H
#define BONSAI_RUNTIME_KERNELATTRS_H

#include <cmath>
#include <cstdint>
#include <variant>
#include <vector>

namespace bonsai::rt {

/// A kind without attributes.
using NoAttrs = std::monostate;

/// RMSNorm, LayerNorm, their gradients and fusions.
struct NormAttrs {
  double epsilon = 0;
};
/// RoPE and its gradient: the rotary base, and Llama 3.1's "llama3" scaling of the inverse
/// frequencies when scalingFactor > 0 (bonsai.rope in docs/dialect.md).
struct RoPEAttrs {
  double theta = 0;
  double scalingFactor = 0;
  double lowFreqFactor = 0;
  double highFreqFactor = 0;
  int64_t originalMaxPositions = 0;
};

#ifdef __CUDACC__
#define BONSAI_HOST_DEVICE __host__ __device__
#else
#define BONSAI_HOST_DEVICE
#endif

/// RoPE's inverse frequency inv_freq[i], i < headDim / 2, in fp64: theta^(-2i/headDim), then
/// with `a.scalingFactor` > 0 Llama 3.1's "llama3" scaling exactly as transformers'
/// `_compute_llama3_parameters`: long wavelengths (2π / inv_freq above
/// originalMaxPositions / lowFreqFactor) divided by the factor, short ones (below
/// originalMaxPositions / highFreqFactor) kept, and the band between interpolated. The one
/// definition the CPU and CUDA kernels share.
BONSAI_HOST_DEVICE inline double ropeInverseFrequency(const RoPEAttrs &a, int64_t i,
                                                      int64_t headDim) {
  using namespace std;
  double f = pow(a.theta, -2.0 * double(i) / double(headDim));
  if (a.scalingFactor > 0) {
    const double pi = 3.14159265358979323846;
    double old = double(a.originalMaxPositions);
    double lowWavelen = old / a.lowFreqFactor, highWavelen = old / a.highFreqFactor;
    double wavelen = 2 * pi / f;
    if (wavelen > lowWavelen) {
      f = f / a.scalingFactor;
    } else if (!(wavelen < highWavelen)) {
      double smooth = (old / wavelen - a.lowFreqFactor) / (a.highFreqFactor - a.lowFreqFactor);
      f = (1 - smooth) * f / a.scalingFactor + smooth * f;
    }
  }
  return f;
}

/// ropeInverseFrequency for every i < headDim / 2.
inline std::vector<double> ropeInverseFrequencies(const RoPEAttrs &a, int64_t headDim) {
  std::vector<double> invFreq(static_cast<size_t>(headDim / 2));
  for (size_t i = 0; i < invFreq.size(); ++i)
    invFreq[i] = ropeInverseFrequency(a, int64_t(i), headDim);
  return invFreq;
}
/// Attention, flash attention and their gradients.
struct AttentionAttrs {
  bool causal = false;
  double scale = 0;
  /// > 1: q, k, v are this rank's zigzag share of a sequence split over ringRanks ranks, and
  /// the kernel attends to every rank's keys (docs/ring-attention.md).
  uint32_t ringRanks = 0;
};
/// GeLU and its gradient: the tanh approximation, or erf.
struct GeLUAttrs {
  bool tanh = false;
};
/// Softmax and its gradient.
struct AxisAttrs {
  int32_t axis = 0;
};
/// Cross-entropy and its gradient.
struct CrossEntropyAttrs {
  int64_t ignoreIndex = -100;
};
/// The fused LM head and loss: ignoreIndex as CrossEntropyAttrs, positions per chunk.
struct LinearCrossEntropyAttrs {
  int64_t ignoreIndex = -100;
  int64_t chunkRows = 0;
};
struct TransposeAttrs {
  std::vector<int64_t> permutation;
};
/// Slice and its gradient.
struct SliceAttrs {
  int32_t axis = 0;
  int64_t start = 0;
};
struct FillAttrs {
  double value = 0;
};
/// DoRA: the LoRA scale alpha / rank.
struct DoraScaleAttrs {
  double scale = 0;
};
/// The learning-rate schedule.
struct LearningRateAttrs {
  double lr = 0;
  bool cosine = false;
  int64_t warmupSteps = 0;
  int64_t totalSteps = 0;
  double minLrRatio = 0;
};
/// AdamW and its multi-tensor form.
struct AdamWAttrs {
  double beta1 = 0;
  double beta2 = 0;
  double eps = 0;
  double weightDecay = 0;
  double gradClip = 0;
};
/// SGD and its multi-tensor form.
struct SGDAttrs {
  double momentum = 0;
  double weightDecay = 0;
  double gradClip = 0;
};
/// GaLore's projector refresh (docs/galore.md).
struct GaloreRefreshAttrs {
  int64_t rank = 0;
  int64_t updateProjGap = 0;
  int64_t offset = 0;
  int64_t slot = 0;
  bool left = false;
  bool randomized = false;
  int64_t powerIterations = 0;
  int64_t seed = 0;
};
/// GaLore's projection of a gradient.
struct GaloreProjectAttrs {
  bool left = false;
  bool bf16Operands = false;
};
/// GaLore's AdamW: AdamW's hyperparameters, the factor the back-projected direction is
/// multiplied by, and the projected side.
struct GaloreAdamWAttrs : AdamWAttrs {
  double scale = 0;
  bool left = false;
};
/// FusedElementwise: the index of its kernel in LoadedPlan::generatedKernels.
struct GeneratedKernelAttrs {
  uint32_t kernel = 0;
};
/// The FP8 kinds (docs/fp8.md): scale every cast from its own amax instead of the state's
/// delayed scale; scales put the largest value 2^margin below the format's largest finite
/// one; the forward GEMMs may keep their sums in the tensor cores' accumulator.
struct Fp8Attrs {
  bool current = false;
  int32_t margin = 0;
  bool fastAccumulation = false;
};

/// How AllReduce combines the ranks' values (plan.fbs CollectiveReduction).
enum class CollectiveReduction : uint8_t {
  Sum = 0,    ///< The sum over ranks.
  L2Norm = 1, ///< sqrt of the sum over ranks of the squares (f32): a global norm from local ones.
  Max = 2     ///< The largest over ranks (f32): FP8 amax statistics (docs/fp8.md).
};
/// The collectives and ShardSlice (docs/sharding.md): the ranks they span (the plan's) and,
/// for AllReduce, how values combine.
struct CollectiveAttrs {
  uint32_t ranks = 0;
  CollectiveReduction reduction = CollectiveReduction::Sum;
};

/// The attributes of a kernel: the struct of its kind's attribute table.
using KernelAttrsInfo =
    std::variant<NoAttrs, NormAttrs, RoPEAttrs, AttentionAttrs, GeLUAttrs, AxisAttrs,
                 CrossEntropyAttrs, LinearCrossEntropyAttrs, TransposeAttrs, SliceAttrs, FillAttrs,
                 DoraScaleAttrs, LearningRateAttrs, AdamWAttrs, SGDAttrs, GaloreRefreshAttrs,
                 GaloreProjectAttrs, GaloreAdamWAttrs, GeneratedKernelAttrs, Fp8Attrs,
                 CollectiveAttrs>;

/// The struct of each attribute table by its name in KernelKinds.def (NONE: NoAttrs).
namespace attribute_tables {
using NONE = NoAttrs;
using ::bonsai::rt::AdamWAttrs;
using ::bonsai::rt::AttentionAttrs;
using ::bonsai::rt::AxisAttrs;
using ::bonsai::rt::CollectiveAttrs;
using ::bonsai::rt::CrossEntropyAttrs;
using ::bonsai::rt::DoraScaleAttrs;
using ::bonsai::rt::FillAttrs;
using ::bonsai::rt::Fp8Attrs;
using ::bonsai::rt::GaloreAdamWAttrs;
using ::bonsai::rt::GaloreProjectAttrs;
using ::bonsai::rt::GaloreRefreshAttrs;
using ::bonsai::rt::GeLUAttrs;
using ::bonsai::rt::GeneratedKernelAttrs;
using ::bonsai::rt::LearningRateAttrs;
using ::bonsai::rt::LinearCrossEntropyAttrs;
using ::bonsai::rt::NormAttrs;
using ::bonsai::rt::RoPEAttrs;
using ::bonsai::rt::SGDAttrs;
using ::bonsai::rt::SliceAttrs;
using ::bonsai::rt::TransposeAttrs;
} // namespace attribute_tables

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_KERNELATTRS_H
