//===- KernelTableTest.cpp - Every kind of the kernel table, run from its row -===//
//
// For every row of KernelKinds.def, in table order, a sample kernel of that kind is built into
// a one-step plan with exactly the operands the row names (its required ones and, where the
// row has them, its optional ones), loaded (so the kind's contract must accept it), and run on
// the CPU backend; with a GPU, on the CUDA backend too, every output compared with the CPU's.
// The samples are overloads on the kinds' tag types gathered by the table's X-macro: a kind
// added to the table without a sample does not compile, and one whose contract rejects its
// sample, or whose kernels fail or disagree, fails here. docs/adding-a-kernel.md.
//
//===----------------------------------------------------------------------===//

#include "TestPlans.h"

#include "bonsai/runtime/Executor.h"
#include "bonsai/runtime/Fp8.h"
#include "bonsai/runtime/Fusion.h"
#include "bonsai/runtime/GaLore.h"
#include "bonsai/runtime/KernelKinds.h"
#include "bonsai/runtime/Nf4.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>

#ifdef BONSAI_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace bonsai::rt {
namespace {

namespace fb = bonsai::plan;
using namespace test;

/// A one-step plan around the kernels of one kind: arena 0 holds parameters, 1 the step's
/// tensors, 2 optimizer state, 3 optimizer state in pinned host memory; the plan's ids, labels
/// and loss (written by a Fill) are there only because every plan has them.
struct Sample {
  PlanSpec p;
  /// Inputs that must be positive (learning rates, norms, FP8 statistics).
  std::set<uint32_t> positive;

  Sample() {
    p.model = "sample";
    p.arenas = {{"weights", Lifetime::Persistent, 0, 256},
                {"step", Lifetime::Step, 0, 256},
                {"state", Lifetime::Persistent, 0, 256},
                {"host_state", Lifetime::Persistent, 0, 256, MemorySpace::PinnedHost}};
    uint32_t ids = p.add("ids", DType::I32, {1, 4}, TensorRole::Input, 1);
    uint32_t labels = p.add("labels", DType::I32, {1, 4}, TensorRole::Input, 1);
    p.loss = p.add("loss", DType::F32, {}, TensorRole::Loss, 1);
    p.kernel(KernelKind::Fill, {}, {p.loss}, fb::KernelAttrs::FillAttrs, fillAttrs(0.0));
    p.inputs = {ids, labels};
    p.tokensPerStep = 4;
    p.vocabSize = 16;
  }

  uint32_t param(std::vector<int64_t> shape, DType dtype = DType::F32) {
    return p.add("p" + std::to_string(p.tensors.size()), dtype, std::move(shape),
                 TensorRole::Parameter, 0);
  }
  uint32_t act(std::vector<int64_t> shape, DType dtype = DType::F32) {
    return p.add("a" + std::to_string(p.tensors.size()), dtype, std::move(shape),
                 TensorRole::Activation, 1);
  }
  /// A positive f32 scalar (lr, norm, a loss gradient).
  uint32_t scalar() {
    uint32_t t = act({});
    positive.insert(t);
    return t;
  }
  uint32_t state(std::vector<int64_t> shape, DType dtype = DType::F32) {
    return p.addInit("s" + std::to_string(p.tensors.size()), dtype, std::move(shape),
                     TensorRole::OptimizerState, 2, TensorInit::Zeros);
  }
  /// Optimizer state kept in pinned host memory (docs/offload.md), zero at the start.
  uint32_t hostState(std::vector<int64_t> shape) {
    return p.addInit("h" + std::to_string(p.tensors.size()), DType::F32, std::move(shape),
                     TensorRole::OptimizerState, 3, TensorInit::Zeros);
  }
  /// A scratch workspace, on a 256-byte boundary as the memory planner places them (the FP8
  /// kernels on CUDA read their control block there).
  uint32_t workspace(int64_t elements) {
    p.arenas[1].size = (p.arenas[1].size + 255) / 256 * 256;
    return p.add("w" + std::to_string(p.tensors.size()), DType::F32, {elements},
                 TensorRole::Workspace, 1);
  }
  /// FP8 statistics f32 [2, 4], as an input (positive) or an output.
  uint32_t stats() {
    uint32_t t = act({2, fp8::kStatsColumns});
    positive.insert(t);
    return t;
  }
  /// An FP8 scaling state f32 [3, 4 + 4], persistent and zero.
  uint32_t fp8State() { return state({3, fp8::kStateColumns + 4}); }

  /// Appends a kernel of `kind`, in the update phase when the kind is update-only.
  void
  kernel(KernelKind kind, std::vector<uint32_t> in, std::vector<uint32_t> out,
         fb::KernelAttrs attrsType = fb::KernelAttrs::NONE,
         std::function<flatbuffers::Offset<void>(flatbuffers::FlatBufferBuilder &)> attrs = {}) {
    p.phase = kernelKindInfo(kind).has(kernel_traits::kUpdateOnly) ? Phase::Update : Phase::Forward;
    p.kernel(kind, std::move(in), std::move(out), attrsType, std::move(attrs));
  }
};

auto doraScaleAttrs(double scale) {
  return
      [=](flatbuffers::FlatBufferBuilder &b) { return fb::CreateDoraScaleAttrs(b, scale).Union(); };
}
auto linearCrossEntropyAttrs(int64_t chunkRows) {
  return [=](flatbuffers::FlatBufferBuilder &b) {
    return fb::CreateLinearCrossEntropyAttrs(b, -100, chunkRows).Union();
  };
}
auto galoreRefreshAttrs() {
  return [](flatbuffers::FlatBufferBuilder &b) {
    return fb::CreateGaloreRefreshAttrs(b, /*rank=*/8, /*gap=*/3, 0, 0, /*left=*/false,
                                        /*randomized=*/true, 1, 0)
        .Union();
  };
}
auto galoreProjectAttrs() {
  return [](flatbuffers::FlatBufferBuilder &b) {
    return fb::CreateGaloreProjectAttrs(b, /*left=*/false, false).Union();
  };
}
auto galoreAdamWAttrs() {
  return [](flatbuffers::FlatBufferBuilder &b) {
    return fb::CreateGaloreAdamWAttrs(b, 0.9, 0.95, 1e-8, 0.01, 1.0, 0.25, /*left=*/false).Union();
  };
}

// Shapes: [2, 3, 4] activations, a linear 4 -> 5, attention [batch 1, seq 3, 2 heads over 1 kv
// head, head_dim 4], FP8 GEMMs 16 x 16 x 16 (their tensor cores take multiples of 16).
const std::vector<int64_t> X = {2, 3, 4}, Q = {1, 3, 2, 4}, KV = {1, 3, 1, 4}, F16x16 = {16, 16};
constexpr auto Norm = fb::KernelAttrs::NormAttrs;
constexpr auto Fp8 = fb::KernelAttrs::Fp8Attrs;
const int64_t kFp8Workspace = fp8::gemmWorkspaceBytes(256, 256) / 4;

void sample(kinds::Embedding, Sample &s) {
  s.kernel(KernelKind::Embedding, {s.param({8, 4}), s.act({2, 3}, DType::I32)}, {s.act(X)});
}
void sample(kinds::Linear, Sample &s) {
  s.kernel(KernelKind::Linear, {s.act(X), s.param({5, 4}), s.param({5})}, {s.act({2, 3, 5})});
}
void sample(kinds::Matmul, Sample &s) {
  s.kernel(KernelKind::Matmul, {s.act(X), s.act({2, 4, 5})}, {s.act({2, 3, 5})});
}
void sample(kinds::Add, Sample &s) {
  s.kernel(KernelKind::Add, {s.act(X), s.param({4})}, {s.act(X)});
}
void sample(kinds::Mul, Sample &s) {
  s.kernel(KernelKind::Mul, {s.act(X), s.act({3, 4})}, {s.act(X)});
}
void sample(kinds::RMSNorm, Sample &s) {
  s.kernel(KernelKind::RMSNorm, {s.act(X), s.param({4})}, {s.act(X)}, Norm, normAttrs(1e-5));
}
void sample(kinds::LayerNorm, Sample &s) {
  s.kernel(KernelKind::LayerNorm, {s.act(X), s.param({4}), s.param({4})}, {s.act(X)}, Norm,
           normAttrs(1e-5));
}
void sample(kinds::RoPE, Sample &s) {
  s.kernel(KernelKind::RoPE, {s.act(Q)}, {s.act(Q)}, fb::KernelAttrs::RoPEAttrs,
           ropeAttrs(10000.0));
}
void sample(kinds::Attention, Sample &s) {
  s.kernel(KernelKind::Attention, {s.act(Q), s.act(KV), s.act(KV)}, {s.act(Q)},
           fb::KernelAttrs::AttentionAttrs, attentionAttrs(true, 0.5));
}
void sample(kinds::SiLU, Sample &s) { s.kernel(KernelKind::SiLU, {s.act(X)}, {s.act(X)}); }
void sample(kinds::GeLU, Sample &s) {
  s.kernel(KernelKind::GeLU, {s.act(X)}, {s.act(X)}, fb::KernelAttrs::GeLUAttrs, geluAttrs(true));
}
void sample(kinds::SwiGLU, Sample &s) {
  s.kernel(KernelKind::SwiGLU, {s.act(X), s.act(X)}, {s.act(X)});
}
void sample(kinds::Softmax, Sample &s) {
  s.kernel(KernelKind::Softmax, {s.act(X)}, {s.act(X)}, fb::KernelAttrs::AxisAttrs, axisAttrs(2));
}
void sample(kinds::CrossEntropy, Sample &s) {
  s.kernel(KernelKind::CrossEntropy, {s.act({2, 3, 6}), s.act({2, 3}, DType::I32)}, {s.act({})},
           fb::KernelAttrs::CrossEntropyAttrs, crossEntropyAttrs(-100));
}
void sample(kinds::Transpose, Sample &s) {
  s.kernel(KernelKind::Transpose, {s.act(X)}, {s.act({2, 4, 3})}, fb::KernelAttrs::TransposeAttrs,
           transposeAttrs({0, 2, 1}));
}
void sample(kinds::Slice, Sample &s) {
  s.kernel(KernelKind::Slice, {s.act({2, 3, 6})}, {s.act({2, 3, 2})}, fb::KernelAttrs::SliceAttrs,
           sliceAttrs(2, 1));
}
void sample(kinds::Concat, Sample &s) {
  s.kernel(KernelKind::Concat, {s.act({2, 3, 2}), s.act({2, 1, 2}), s.act({2, 2, 2})},
           {s.act({2, 6, 2})}, fb::KernelAttrs::AxisAttrs, axisAttrs(1));
}
// The collectives on one rank (docs/sharding.md): a copy each; the L2Norm all-reduce of f32.
void sample(kinds::ShardSlice, Sample &s) {
  s.kernel(KernelKind::ShardSlice, {s.act(X)}, {s.act({24})}, fb::KernelAttrs::CollectiveAttrs,
           collectiveAttrs(1));
}
void sample(kinds::ReduceScatter, Sample &s) {
  s.kernel(KernelKind::ReduceScatter, {s.act(X, DType::BF16)}, {s.act({24}, DType::BF16)},
           fb::KernelAttrs::CollectiveAttrs, collectiveAttrs(1));
}
void sample(kinds::AllGather, Sample &s) {
  s.kernel(KernelKind::AllGather, {s.act({24})}, {s.act(X)}, fb::KernelAttrs::CollectiveAttrs,
           collectiveAttrs(1));
}
void sample(kinds::AllReduce, Sample &s) {
  s.kernel(KernelKind::AllReduce, {s.act(X)}, {s.act(X)}, fb::KernelAttrs::CollectiveAttrs,
           collectiveAttrs(1, CollectiveReduction::L2Norm));
}
void sample(kinds::Cast, Sample &s) {
  s.kernel(KernelKind::Cast, {s.act(X)}, {s.act(X, DType::BF16)});
}
void sample(kinds::Copy, Sample &s) { s.kernel(KernelKind::Copy, {s.act(X)}, {s.act(X)}); }
// The copies of an offloaded update: from a pinned host arena to the step arena, and back.
void sample(kinds::CopyHostToDevice, Sample &s) {
  s.kernel(KernelKind::CopyHostToDevice, {s.hostState(X)}, {s.act(X)});
}
void sample(kinds::CopyDeviceToHost, Sample &s) {
  s.kernel(KernelKind::CopyDeviceToHost, {s.act(X)}, {s.hostState(X)});
}
void sample(kinds::Fill, Sample &s) {
  s.kernel(KernelKind::Fill, {}, {s.act(X)}, fb::KernelAttrs::FillAttrs, fillAttrs(0.5));
}
void sample(kinds::EmbeddingGrad, Sample &s) {
  s.kernel(KernelKind::EmbeddingGrad, {s.act(X), s.act({2, 3}, DType::I32)}, {s.act({8, 4})});
}
void sample(kinds::LinearGradInput, Sample &s) {
  s.kernel(KernelKind::LinearGradInput, {s.act({2, 3, 5}), s.param({5, 4})}, {s.act(X)});
}
void sample(kinds::LinearGradWeight, Sample &s) {
  s.kernel(KernelKind::LinearGradWeight, {s.act({2, 3, 5}), s.act(X)}, {s.act({5, 4})});
}
void sample(kinds::ReduceTo, Sample &s) {
  s.kernel(KernelKind::ReduceTo, {s.act(X)}, {s.act({4})});
}
void sample(kinds::RMSNormGrad, Sample &s) {
  s.kernel(KernelKind::RMSNormGrad, {s.act(X), s.act(X), s.param({4})}, {s.act(X), s.act({4})},
           Norm, normAttrs(1e-5));
}
void sample(kinds::LayerNormGrad, Sample &s) {
  s.kernel(KernelKind::LayerNormGrad, {s.act(X), s.act(X), s.param({4})},
           {s.act(X), s.act({4}), s.act({4})}, Norm, normAttrs(1e-5));
}
void sample(kinds::RoPEGrad, Sample &s) {
  s.kernel(KernelKind::RoPEGrad, {s.act(Q)}, {s.act(Q)}, fb::KernelAttrs::RoPEAttrs,
           ropeAttrs(10000.0));
}
void sample(kinds::AttentionGrad, Sample &s) {
  s.kernel(KernelKind::AttentionGrad, {s.act(Q), s.act(Q), s.act(KV), s.act(KV), s.act(Q)},
           {s.act(Q), s.act(KV), s.act(KV)}, fb::KernelAttrs::AttentionAttrs,
           attentionAttrs(true, 0.5));
}
void sample(kinds::SiLUGrad, Sample &s) {
  s.kernel(KernelKind::SiLUGrad, {s.act(X), s.act(X)}, {s.act(X)});
}
void sample(kinds::GeLUGrad, Sample &s) {
  s.kernel(KernelKind::GeLUGrad, {s.act(X), s.act(X)}, {s.act(X)}, fb::KernelAttrs::GeLUAttrs,
           geluAttrs(true));
}
void sample(kinds::SwiGLUGrad, Sample &s) {
  s.kernel(KernelKind::SwiGLUGrad, {s.act(X), s.act(X), s.act(X)}, {s.act(X), s.act(X)});
}
void sample(kinds::SoftmaxGrad, Sample &s) {
  s.kernel(KernelKind::SoftmaxGrad, {s.act(X), s.act(X)}, {s.act(X)}, fb::KernelAttrs::AxisAttrs,
           axisAttrs(2));
}
void sample(kinds::CrossEntropyGrad, Sample &s) {
  s.kernel(KernelKind::CrossEntropyGrad, {s.scalar(), s.act({2, 3, 6}), s.act({2, 3}, DType::I32)},
           {s.act({2, 3, 6})}, fb::KernelAttrs::CrossEntropyAttrs, crossEntropyAttrs(-100));
}
void sample(kinds::SliceGrad, Sample &s) {
  s.kernel(KernelKind::SliceGrad, {s.act({2, 3, 2})}, {s.act({2, 3, 6})},
           fb::KernelAttrs::SliceAttrs, sliceAttrs(2, 1));
}
void sample(kinds::GradNorm, Sample &s) {
  s.kernel(KernelKind::GradNorm, {s.act({4}), s.act({2, 3})}, {s.act({})});
}
void sample(kinds::LearningRate, Sample &s) {
  s.kernel(KernelKind::LearningRate, {s.state({}, DType::I64)}, {s.act({})},
           fb::KernelAttrs::LearningRateAttrs, learningRateAttrs(1e-2, false, 2));
}
void sample(kinds::AdamWUpdate, Sample &s) {
  // bf16 parameters updated through fp32 master weights: every optional output.
  uint32_t param = s.param({4, 4}, DType::BF16);
  uint32_t master = s.p.addInit("master", DType::F32, {4, 4}, TensorRole::OptimizerState, 2,
                                TensorInit::CopyOf, param);
  s.kernel(KernelKind::AdamWUpdate,
           {s.act({4, 4}), s.state({}, DType::I64), s.scalar(), s.scalar()},
           {param, s.state({4, 4}), s.state({4, 4}), master}, fb::KernelAttrs::AdamWAttrs,
           adamwAttrs(0.9, 0.999, 1e-8, 0.01, 1.0));
}
void sample(kinds::SGDUpdate, Sample &s) {
  s.kernel(KernelKind::SGDUpdate, {s.act({4, 4}), s.scalar(), s.scalar()},
           {s.param({4, 4}), s.state({4, 4})}, fb::KernelAttrs::SGDAttrs, sgdAttrs(0.9, 0.01, 1.0));
}
void sample(kinds::StepIncrement, Sample &s) {
  s.kernel(KernelKind::StepIncrement, {}, {s.state({}, DType::I64)});
}
void sample(kinds::Accumulate, Sample &s) {
  s.kernel(KernelKind::Accumulate, {s.act(X)}, {s.state(X)});
}
void sample(kinds::Zero, Sample &s) { s.kernel(KernelKind::Zero, {}, {s.act(X)}); }
void sample(kinds::AccumulateMax, Sample &s) {
  s.kernel(KernelKind::AccumulateMax, {s.act(X)}, {s.state(X)});
}
void sample(kinds::Dequantize, Sample &s) {
  // 128 elements in two NF4 blocks of 64, one block per double-quantization group.
  uint32_t q = s.param({16, 8});
  s.p.tensors[q].dtype = DType::NF4;
  s.p.tensors[q].trainable = false;
  s.p.tensors[q].quantBlock = 64;
  s.p.tensors[q].quantDoubleBlock = 1;
  s.p.tensors[q].bytes = int64_t(nf4StorageBytes(128, 64, 1));
  s.kernel(KernelKind::Dequantize, {q}, {s.act({16, 8})});
}
void sample(kinds::DoraScale, Sample &s) {
  s.kernel(KernelKind::DoraScale, {s.param({4}), s.param({4, 6}), s.param({2, 6}), s.param({4, 2})},
           {s.act({4})}, fb::KernelAttrs::DoraScaleAttrs, doraScaleAttrs(2.0));
}
void sample(kinds::DoraGrad, Sample &s) {
  uint32_t magnitude = s.act({4}); // non-zero: dm divides by it
  s.positive.insert(magnitude);
  s.kernel(KernelKind::DoraGrad, {s.act(X), s.act(X), s.act({4}), magnitude},
           {s.act(X), s.act({4})});
}
void sample(kinds::GaloreRefresh, Sample &s) {
  // A gradient [64, 32] projected on its right (smaller) side at rank 8.
  s.kernel(KernelKind::GaloreRefresh, {s.act({64, 32}), s.state({}, DType::I64)},
           {s.workspace(galore::workspaceElements(32, 64, 8)), s.state({32, 8}), s.state({1})},
           fb::KernelAttrs::GaloreRefreshAttrs, galoreRefreshAttrs());
}
void sample(kinds::GaloreProject, Sample &s) {
  s.kernel(KernelKind::GaloreProject, {s.act({8, 4}), s.act({4, 2})}, {s.act({8, 2})},
           fb::KernelAttrs::GaloreProjectAttrs, galoreProjectAttrs());
}
void sample(kinds::GaloreAdamWUpdate, Sample &s) {
  uint32_t r = s.act({8, 2});
  s.kernel(KernelKind::GaloreAdamWUpdate,
           {s.state({}, DType::I64), s.scalar(), s.scalar(), s.act({4, 2})},
           {r, s.param({8, 4}), s.state({8, 2}), s.state({8, 2})},
           fb::KernelAttrs::GaloreAdamWAttrs, galoreAdamWAttrs());
}
void sample(kinds::LinearCrossEntropy, Sample &s) {
  int64_t elements = linearCrossEntropyWorkspaceElements(6, 6, 4, 4, 4, /*weightGrad=*/true);
  s.kernel(KernelKind::LinearCrossEntropy,
           {s.act(X), s.param({6, 4}), s.act({2, 3}, DType::I32), s.scalar()},
           {s.act({}), s.act(X), s.workspace(elements), s.act({6, 4})},
           fb::KernelAttrs::LinearCrossEntropyAttrs, linearCrossEntropyAttrs(4));
}
void sample(kinds::AddRMSNorm, Sample &s) {
  s.kernel(KernelKind::AddRMSNorm, {s.act(X), s.act(X), s.param({4})}, {s.act(X), s.act(X)}, Norm,
           normAttrs(1e-5));
}
void sample(kinds::AddLayerNorm, Sample &s) {
  s.kernel(KernelKind::AddLayerNorm, {s.act(X), s.act(X), s.param({4}), s.param({4})},
           {s.act(X), s.act(X)}, Norm, normAttrs(1e-5));
}
void sample(kinds::RMSNormGradAdd, Sample &s) {
  s.kernel(KernelKind::RMSNormGradAdd, {s.act(X), s.act(X), s.param({4}), s.act(X)},
           {s.act(X), s.act({4})}, Norm, normAttrs(1e-5));
}
void sample(kinds::LayerNormGradAdd, Sample &s) {
  s.kernel(KernelKind::LayerNormGradAdd, {s.act(X), s.act(X), s.param({4}), s.act(X)},
           {s.act(X), s.act({4}), s.act({4})}, Norm, normAttrs(1e-5));
}
void sample(kinds::FusedElementwise, Sample &s) {
  // y = x1 · x2 + x1, x2 broadcast (read at the index modulo its size).
  GeneratedKernelSpec g;
  g.inputs = {DType::F32, DType::F32};
  g.instructions = {{ElementwiseOpcode::Mul, DType::F32, 0, 1, 0},
                    {ElementwiseOpcode::Add, DType::F32, 2, 0, 0}};
  g.outputs = {3};
  s.p.generatedKernels.push_back(g);
  s.kernel(KernelKind::FusedElementwise, {s.act(X), s.act({4})}, {s.act(X)},
           fb::KernelAttrs::GeneratedKernelAttrs, generatedKernelAttrs(0));
}
void sample(kinds::MultiTensorAdamWUpdate, Sample &s) {
  s.kernel(
      KernelKind::MultiTensorAdamWUpdate,
      {s.state({}, DType::I64), s.scalar(), s.scalar(), s.act({4}), s.act({2, 3})},
      {s.param({4}), s.param({2, 3}), s.state({4}), s.state({2, 3}), s.state({4}), s.state({2, 3})},
      fb::KernelAttrs::AdamWAttrs, adamwAttrs(0.9, 0.999, 1e-8, 0.01, 1.0));
}
void sample(kinds::MultiTensorSGDUpdate, Sample &s) {
  s.kernel(KernelKind::MultiTensorSGDUpdate, {s.scalar(), s.scalar(), s.act({4}), s.act({2, 3})},
           {s.param({4}), s.param({2, 3}), s.state({4}), s.state({2, 3})},
           fb::KernelAttrs::SGDAttrs, sgdAttrs(0.9, 0.01, 0.0));
}
void sample(kinds::LinearGeLU, Sample &s) {
  s.kernel(KernelKind::LinearGeLU, {s.act(X), s.param({5, 4}), s.param({5})},
           {s.act({2, 3, 5}), s.act({2, 3, 5})});
}
void sample(kinds::LinearGradWeightAccumulate, Sample &s) {
  s.kernel(KernelKind::LinearGradWeightAccumulate, {s.act({2, 3, 5}), s.act(X)}, {s.state({5, 4})});
}
void sample(kinds::LinearAdd, Sample &s) {
  s.kernel(KernelKind::LinearAdd, {s.act(X), s.param({5, 4}), s.act({2, 3, 5})},
           {s.act({2, 3, 5})});
}
void sample(kinds::Fp8Linear, Sample &s) {
  // With its bias, in bf16 as an FP8 recipe trains. (In f32, cuBLASLt finds no FP8 GEMM with
  // a bias epilogue on the H200 and the CUDA backend fails at run time: docs/runtime.md.)
  const std::vector<int64_t> M = {64, 64};
  s.kernel(
      KernelKind::Fp8Linear,
      {s.act(M, DType::BF16), s.param(M, DType::BF16), s.fp8State(), s.param({64}, DType::BF16)},
      {s.act(M, DType::BF16), s.act({2, 4}), s.workspace(fp8::gemmWorkspaceBytes(4096, 4096) / 4)},
      Fp8, fp8Attrs());
}
void sample(kinds::Fp8LinearGradInput, Sample &s) {
  s.kernel(KernelKind::Fp8LinearGradInput, {s.act(F16x16), s.param(F16x16), s.fp8State()},
           {s.act(F16x16), s.act({2, 4}), s.workspace(kFp8Workspace)}, Fp8, fp8Attrs());
}
void sample(kinds::Fp8LinearGradWeight, Sample &s) {
  s.kernel(KernelKind::Fp8LinearGradWeight, {s.act(F16x16), s.act(F16x16), s.fp8State()},
           {s.act(F16x16), s.act({2, 4}), s.workspace(kFp8Workspace)}, Fp8, fp8Attrs());
}
void sample(kinds::Fp8UpdateScales, Sample &s) {
  s.kernel(KernelKind::Fp8UpdateScales, {s.state({}, DType::I64), s.stats(), s.stats()},
           {s.fp8State()}, Fp8, fp8Attrs());
}
void sample(kinds::Fp8LinearGradWeightAccumulate, Sample &s) {
  s.kernel(KernelKind::Fp8LinearGradWeightAccumulate, {s.act(F16x16), s.act(F16x16), s.fp8State()},
           {s.act({2, 4}), s.workspace(kFp8Workspace), s.state(F16x16)}, Fp8, fp8Attrs());
}
/// Fp8LinearBackward's operands, its outputs appended to `outs` (dx, the two stats, the
/// workspace, the accumulator).
void fp8Backward(Sample &s, std::vector<uint32_t> &outs) {
  outs = {s.act(F16x16), s.act({2, 4}), s.act({2, 4}), s.workspace(2 * kFp8Workspace),
          s.state(F16x16)};
  s.kernel(KernelKind::Fp8LinearBackward,
           {s.act(F16x16), s.param(F16x16), s.act(F16x16), s.fp8State()}, outs, Fp8, fp8Attrs());
}
void sample(kinds::Fp8LinearBackward, Sample &s) {
  std::vector<uint32_t> outs;
  fp8Backward(s, outs);
}
void sample(kinds::Fp8LinearSharedInput, Sample &s) {
  // The first linear casts x; the second reads its codes and stats.
  uint32_t stats = s.act({2, 4}), ws = s.workspace(kFp8Workspace);
  s.kernel(KernelKind::Fp8Linear, {s.act(F16x16), s.param(F16x16), s.fp8State()},
           {s.act(F16x16), stats, ws}, Fp8, fp8Attrs());
  s.kernel(KernelKind::Fp8LinearSharedInput, {ws, stats, s.param(F16x16), s.fp8State()},
           {s.act(F16x16), s.act({2, 4}), s.workspace(kFp8Workspace)}, Fp8, fp8Attrs());
}
void sample(kinds::Fp8LinearBackwardSharedInput, Sample &s) {
  std::vector<uint32_t> first;
  fp8Backward(s, first); // dx, input-grad stats, weight-grad stats, workspace, acc
  s.kernel(KernelKind::Fp8LinearBackwardSharedInput,
           {s.act(F16x16), s.param(F16x16), first[3], first[2], s.fp8State()},
           {s.act(F16x16), s.act({2, 4}), s.act({2, 4}), s.workspace(2 * kFp8Workspace),
            s.state(F16x16)},
           Fp8, fp8Attrs());
}
/// Fp8LinearWithInputCast's operands; returns its stats and x's transposed codes.
std::pair<uint32_t, uint32_t> fp8WithInputCast(Sample &s) {
  uint32_t stats = s.act({2, 4}), codes = s.act(F16x16, DType::F8E4M3FN);
  s.kernel(KernelKind::Fp8LinearWithInputCast, {s.act(F16x16), s.param(F16x16), s.fp8State()},
           {s.act(F16x16), stats, codes, s.workspace(kFp8Workspace)}, Fp8, fp8Attrs());
  return {stats, codes};
}
void sample(kinds::Fp8LinearWithInputCast, Sample &s) { fp8WithInputCast(s); }
void sample(kinds::Fp8LinearBackwardFromInputCast, Sample &s) {
  auto [stats, codes] = fp8WithInputCast(s);
  s.kernel(KernelKind::Fp8LinearBackwardFromInputCast,
           {s.act(F16x16), s.param(F16x16), codes, stats, s.fp8State()},
           {s.act(F16x16), s.act({2, 4}), s.act({2, 4}), s.workspace(2 * kFp8Workspace),
            s.state(F16x16)},
           Fp8, fp8Attrs());
}
void sample(kinds::FlashAttention, Sample &s) {
  s.kernel(KernelKind::FlashAttention, {s.act(Q), s.act(KV), s.act(KV)},
           {s.act(Q), s.act({1, 2, 3})}, fb::KernelAttrs::AttentionAttrs,
           attentionAttrs(true, 0.5));
}
void sample(kinds::FlashAttentionGrad, Sample &s) {
  s.kernel(KernelKind::FlashAttentionGrad,
           {s.act(Q), s.act(Q), s.act(KV), s.act(KV), s.act(Q), s.act({1, 2, 3})},
           {s.act(Q), s.act(KV), s.act(KV)}, fb::KernelAttrs::AttentionAttrs,
           attentionAttrs(true, 0.5));
}

// q (2 heads), k and v (1 head each) packed in [1, 3, 4, 4].
const std::vector<int64_t> Qkv = {1, 3, 4, 4};
void sample(kinds::FlashAttentionQkv, Sample &s) {
  s.kernel(KernelKind::FlashAttentionQkv, {s.act(Qkv)}, {s.act(Q), s.act({1, 2, 3})},
           fb::KernelAttrs::AttentionAttrs, attentionAttrs(true, 0.5));
}
void sample(kinds::FlashAttentionQkvGrad, Sample &s) {
  s.kernel(KernelKind::FlashAttentionQkvGrad, {s.act(Q), s.act(Qkv), s.act(Q), s.act({1, 2, 3})},
           {s.act(Qkv)}, fb::KernelAttrs::AttentionAttrs, attentionAttrs(true, 0.5));
}

/// The sample of every kind, in table order.
using SampleBuilder = void (*)(Sample &);
const SampleBuilder kSamples[] = {
#define BONSAI_KERNEL_KIND(Name, ...) [](Sample &s) { sample(kinds::Name{}, s); },
#include "bonsai/runtime/KernelKinds.def"
};
static_assert(sizeof kSamples / sizeof kSamples[0] == kKernelKindCount);

/// A kind's sample, loaded.
LoadedPlan loadSample(const KernelKindInfo &info, Sample &s) {
  kSamples[kernelKindIndex(info.kind)](s);
  std::vector<uint8_t> bytes = buildPlan(s.p);
  return loadPlanBuffer(bytes.data(), bytes.size(), std::string(info.name) + ".plan");
}

/// Fills, the same way on every executor, each tensor a kernel of the plan reads (an input, or
/// an output the table marks read-write) before any kernel writes it and that no initializer
/// sets: floats uniform in [-1, 1] (or [0.1, 1] for the sample's positive ones), indices (token
/// ids, labels, steps) in [0, 4), FP8 codes from floats in [-1, 1].
void fillInputs(const LoadedPlan &plan, const Sample &s, Executor &e) {
  std::vector<bool> written(plan.tensors.size(), false);
  std::mt19937 rng(7);
  const std::vector<TensorView> &views = e.views();
  for (const KernelInfo &k : plan.kernels) {
    std::vector<uint32_t> read = k.inputs;
    const KernelKindInfo &info = kernelKindInfo(k.kind);
    for (size_t j = 0; j < k.outputs.size() && !info.has(kernel_traits::kCustomArity); ++j)
      if (j < info.readWrite.size() && info.readWrite[j])
        read.push_back(k.outputs[j]);
    for (uint32_t t : read) {
      const TensorInfo &info = plan.tensors[t];
      if (written[t] || info.role == TensorRole::Parameter || info.init != TensorInit::None)
        continue;
      written[t] = true;
      const TensorView &v = views[t];
      if (info.dtype == DType::I32 || info.dtype == DType::I64) {
        for (int64_t i = 0; i < info.numel; ++i) {
          int64_t value = int64_t(rng() % 4);
          if (info.dtype == DType::I32) {
            int32_t narrow = int32_t(value);
            std::memcpy(static_cast<char *>(v.data) + 4 * i, &narrow, 4);
          } else {
            std::memcpy(static_cast<char *>(v.data) + 8 * i, &value, 8);
          }
        }
        continue;
      }
      bool positive = s.positive.count(t) > 0;
      std::uniform_real_distribution<float> dist(positive ? 0.1f : -1.0f, 1.0f);
      std::vector<float> values(size_t(info.numel));
      for (float &x : values)
        x = dist(rng);
      if (info.dtype == DType::F8E4M3FN) {
        for (int64_t i = 0; i < info.numel; ++i)
          static_cast<uint8_t *>(v.data)[i] = fp8::encode(values[size_t(i)], fp8::Format::E4M3FN);
      } else {
        storeF32(values.data(), v);
      }
    }
    for (uint32_t t : k.outputs)
      written[t] = true;
  }
}

/// The outputs of the kernels under test (every kernel but the loss's Fill) whose values
/// mean something on every backend: float tensors that are not scratch workspaces.
std::vector<uint32_t> comparedOutputs(const LoadedPlan &plan) {
  std::vector<uint32_t> outputs;
  for (size_t k = 1; k < plan.kernels.size(); ++k)
    for (uint32_t t : plan.kernels[k].outputs) {
      const TensorInfo &info = plan.tensors[t];
      if (info.role != TensorRole::Workspace && isComputeFloat(info.dtype))
        outputs.push_back(t);
    }
  return outputs;
}

class KernelTableTest : public ::testing::TestWithParam<size_t> {};

// Every kind's sample loads and runs on the CPU backend, its outputs finite.
TEST_P(KernelTableTest, SampleRunsOnTheCpu) {
  const KernelKindInfo &info = kernelKinds()[GetParam()];
  Sample s;
  LoadedPlan plan = loadSample(info, s);
  // The sample has the kind's kernel with as many operands as the table names.
  auto kernel = std::find_if(plan.kernels.rbegin(), plan.kernels.rend(),
                             [&](const KernelInfo &k) { return k.kind == info.kind; });
  ASSERT_NE(kernel, plan.kernels.rend());
  if (!info.has(kernel_traits::kCustomArity) && !info.has(kernel_traits::kVariadic)) {
    EXPECT_GE(kernel->inputs.size(), info.minInputs);
    EXPECT_LE(kernel->inputs.size(), info.inputs.size());
    EXPECT_GE(kernel->outputs.size(), info.minOutputs);
    EXPECT_LE(kernel->outputs.size(), info.outputs.size());
  }
  Executor e(plan);
  e.initWeights(3);
  fillInputs(plan, s, e);
  e.runStep();
  for (uint32_t t : comparedOutputs(plan))
    for (float x : floatsOf(e, t))
      ASSERT_TRUE(std::isfinite(x)) << plan.describeTensor(t);
}

#ifdef BONSAI_HAVE_CUDA
// Every kind's sample runs on the CUDA backend (kernel by kernel, and replayed from a CUDA
// Graph) with the CPU's results: each compared output within 2% of its largest magnitude for
// the FP8 and bf16 kinds, 0.1% for the others. GaLore's refresh is compared through what it
// promises rather than element by element: its projector spans the same subspace (a basis
// from a randomized range finder may differ in sign or rotation between backends).
TEST_P(KernelTableTest, SampleRunsOnTheGpuAsOnTheCpu) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    GTEST_SKIP() << "no GPU here";
  }
  const KernelKindInfo &info = kernelKinds()[GetParam()];
  for (bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "CUDA Graphs" : "eager");
    Sample s;
    LoadedPlan plan = loadSample(info, s);
    ExecutorOptions gpuOptions;
    gpuOptions.backend = Backend::Cuda;
    gpuOptions.cudaGraphs = graphs;
    Executor cpu(plan), gpu(plan, gpuOptions);
    for (Executor *e : {&cpu, &gpu}) {
      e->initWeights(3);
      fillInputs(plan, s, *e);
      e->runStep();
    }
    bool loose = info.has(kernel_traits::kFp8Gemm) || info.kind == KernelKind::Fp8UpdateScales;
    for (uint32_t t : comparedOutputs(plan)) {
      const TensorInfo &tensor = plan.tensors[t];
      loose = loose || tensor.dtype == DType::BF16;
      std::vector<float> c = floatsOf(cpu, t), g = floatsOf(gpu, t);
      if (info.kind == KernelKind::GaloreRefresh && tensor.shape == std::vector<int64_t>{32, 8}) {
        // P_cpu P_cpuᵀ = P_gpu P_gpuᵀ: the same projection.
        for (int i = 0; i < 32; ++i)
          for (int j = 0; j < 32; ++j) {
            float pc = 0, pg = 0;
            for (int r = 0; r < 8; ++r) {
              pc += c[size_t(i * 8 + r)] * c[size_t(j * 8 + r)];
              pg += g[size_t(i * 8 + r)] * g[size_t(j * 8 + r)];
            }
            EXPECT_NEAR(pg, pc, 1e-3f) << plan.describeTensor(t) << " projection " << i << j;
          }
        continue;
      }
      float scale = 1e-6f;
      for (float x : c)
        scale = std::max(scale, std::fabs(x));
      for (size_t i = 0; i < c.size(); ++i)
        ASSERT_NEAR(g[i], c[i], (loose ? 2e-2f : 1e-3f) * scale)
            << plan.describeTensor(t) << "[" << i << "]";
    }
  }
}

// The CUDA backend zeroes a run of Zero kernels whose outputs follow one another in memory with
// one memset (the update's gradient accumulators): the run must stop where a tensor it does not
// zero lies between two it does. Four tensors of 256 bytes, adjacent: a, b and d zeroed, g (between
// b and d) not; every one first filled with 3.
TEST(CudaZeroRunTest, AdjacentZeroesAreOneMemsetThatStopsAtAGap) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    GTEST_SKIP() << "no GPU here";
  }
  for (bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "CUDA Graphs" : "eager");
    Sample s;
    uint32_t a = s.act({64}), b = s.act({64}), g = s.act({64}), d = s.act({64});
    for (uint32_t t : {a, b, g, d})
      s.kernel(KernelKind::Fill, {}, {t}, fb::KernelAttrs::FillAttrs, fillAttrs(3.0));
    for (uint32_t t : {a, b, d})
      s.kernel(KernelKind::Zero, {}, {t});
    std::vector<uint8_t> bytes = buildPlan(s.p);
    LoadedPlan plan = loadPlanBuffer(bytes.data(), bytes.size(), "zero-run.plan");
    ASSERT_EQ(plan.tensors[b].offset + 256, plan.tensors[g].offset);
    ExecutorOptions options;
    options.backend = Backend::Cuda;
    options.cudaGraphs = graphs;
    Executor gpu(plan, options);
    fillInputs(plan, s, gpu);
    gpu.runStep();
    for (uint32_t t : {a, b, d})
      for (float x : floatsOf(gpu, t))
        ASSERT_EQ(x, 0.0f) << plan.describeTensor(t);
    for (float x : floatsOf(gpu, g))
      ASSERT_EQ(x, 3.0f) << plan.describeTensor(g);
  }
}
#endif

INSTANTIATE_TEST_SUITE_P(EveryKind, KernelTableTest, ::testing::Range<size_t>(0, kKernelKindCount),
                         [](const ::testing::TestParamInfo<size_t> &p) {
                           return std::string(kernelKinds()[p.param].name);
                         });

} // namespace
} // namespace bonsai::rt
