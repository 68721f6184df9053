//===- FusedTest.cpp - The fused LM head and residual norms, on the CPU and in plans ===//
//
// The CPU fused kernels against the chains of unfused CPU kernels they replace, on fresh
// random data from fixed seeds (every output poisoned with NaN first, every element checked):
// linear_cross_entropy in one chunk is bit for bit linear + cross_entropy + cross_entropy_grad
// + linear_grad_input + linear_grad_weight, for f32 and bf16, with ignored rows, another
// ignore_index and a frozen weight (no dw); in several chunks (a ragged last one) the loss is
// still bit for bit (each row's loss, summed in row order) and dx and dw agree to fp32
// summation-order noise. A batch of only ignored labels has a NaN loss and zero gradients; a
// bad label throws before anything is written. The residual norms are bit for bit their add +
// norm and norm-gradient + add chains. Then plans: a training plan with the fused LM head and
// fused norms loads, and one planted mistake at a time (arity, attributes, workspace size,
// dtypes, shapes, overlaps, labels beyond the vocabulary) gets a message naming it.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/Fusion.h"
#include "bonsai/runtime/Plan.h"

#include "TestPlans.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace bonsai::rt {
namespace {

using Shape = std::vector<int64_t>;

int64_t numelOf(const Shape &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

/// A host tensor with its own storage.
struct Buf {
  Buf(DType dtype, Shape shape)
      : dtype(dtype), shape(std::move(shape)),
        bytes(size_t(numelOf(this->shape)) * dtypeSize(dtype), uint8_t(0xff)) {}
  TensorView view() const { return TensorView{const_cast<uint8_t *>(bytes.data()), dtype, shape}; }
  std::vector<float> floats() const {
    std::vector<float> v(size_t(numelOf(shape)));
    loadF32(view(), v.data());
    return v;
  }
  void poison() { std::fill(bytes.begin(), bytes.end(), uint8_t(0xff)); }
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};

Buf randomFloats(std::mt19937 &rng, DType dtype, Shape shape, float lo = -1, float hi = 1) {
  Buf b(dtype, std::move(shape));
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(size_t(numelOf(b.shape)));
  for (float &x : v) {
    do
      x = dist(rng);
    while (std::fabs(x) < 1e-3f);
  }
  storeF32(v.data(), b.view());
  return b;
}

/// Labels in [0, vocab), every `ignoreEvery`-th set to `ignore` (none when 0).
Buf randomLabels(std::mt19937 &rng, DType dtype, Shape shape, int64_t vocab, int64_t ignore,
                 int ignoreEvery) {
  Buf b(dtype, std::move(shape));
  std::uniform_int_distribution<int64_t> dist(0, vocab - 1);
  for (int64_t i = 0; i < numelOf(b.shape); ++i) {
    int64_t v = ignoreEvery && i % ignoreEvery == 1 ? ignore : dist(rng);
    if (dtype == DType::I64)
      std::memcpy(&b.bytes[size_t(i) * 8], &v, 8);
    else {
      int32_t w = int32_t(v);
      std::memcpy(&b.bytes[size_t(i) * 4], &w, 4);
    }
  }
  return b;
}

void expectSameBytes(const std::string &what, const Buf &a, const Buf &b) {
  ASSERT_EQ(a.bytes.size(), b.bytes.size()) << what;
  size_t diff = 0;
  for (size_t i = 0; i < a.bytes.size(); ++i)
    diff += a.bytes[i] != b.bytes[i];
  EXPECT_EQ(diff, 0u) << what << ": " << diff << " bytes differ";
}

/// |got - want| <= rel (|want| + max|want|) everywhere, no NaN.
void expectClose(const std::string &what, const Buf &got, const Buf &want, double rel) {
  std::vector<float> g = got.floats(), w = want.floats();
  ASSERT_EQ(g.size(), w.size()) << what;
  double scale = 0;
  for (float v : w)
    scale = std::max(scale, double(std::fabs(v)));
  int bad = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::fabs(double(g[i]) - double(w[i])) <= rel * (std::fabs(double(w[i])) + scale)) &&
        bad++ < 3)
      ADD_FAILURE() << what << "[" << i << "]: got " << g[i] << ", want " << w[i];
  EXPECT_EQ(bad, 0) << what;
}

/// The unfused chain's results for the LM head.
struct HeadResult {
  Buf loss, dx, dw;
};

HeadResult unfusedHead(const Buf &x, const Buf &w, const Buf &labels, const Buf &dloss,
                       int64_t ignore) {
  int64_t rows = numelOf(labels.shape), vocab = w.shape[0];
  Shape logitsShape = labels.shape;
  logitsShape.push_back(vocab);
  Buf logits(x.dtype, logitsShape), dlogits(x.dtype, logitsShape);
  HeadResult r{Buf(DType::F32, {}), Buf(x.dtype, x.shape), Buf(w.dtype, w.shape)};
  cpu::linear(x.view(), w.view(), nullptr, logits.view());
  cpu::crossEntropy(logits.view(), labels.view(), ignore, r.loss.view());
  cpu::crossEntropyGrad(dloss.view(), logits.view(), labels.view(), ignore, dlogits.view());
  cpu::linearGradInput(dlogits.view(), w.view(), r.dx.view());
  cpu::linearGradWeight(dlogits.view(), x.view(), r.dw.view());
  (void)rows;
  return r;
}

HeadResult fusedHead(const Buf &x, const Buf &w, const Buf &labels, const Buf &dloss,
                     int64_t ignore, int64_t chunkRows, bool weightGrad = true) {
  int64_t rows = numelOf(labels.shape);
  int64_t elements = linearCrossEntropyWorkspaceElements(rows, w.shape[0], w.shape[1], chunkRows,
                                                         int64_t(dtypeSize(x.dtype)), weightGrad);
  Buf workspace(DType::F32, {elements});
  HeadResult r{Buf(DType::F32, {}), Buf(x.dtype, x.shape), Buf(w.dtype, w.shape)};
  TensorView dw = r.dw.view();
  cpu::linearCrossEntropy(x.view(), w.view(), labels.view(), dloss.view(), ignore, chunkRows,
                          r.loss.view(), r.dx.view(), workspace.view(), weightGrad ? &dw : nullptr);
  return r;
}

Buf scalar(float v) {
  Buf b(DType::F32, {});
  storeF32(&v, b.view());
  return b;
}

TEST(CpuFusedTest, LinearCrossEntropyInOneChunkIsTheUnfusedChain) {
  std::mt19937 rng(7001);
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t ignore : {int64_t(-100), int64_t(3)}) {
      SCOPED_TRACE(std::string(dtypeName(dt)) + " ignore_index " + std::to_string(ignore));
      Buf x = randomFloats(rng, dt, {3, 13, 24});
      Buf w = randomFloats(rng, dt, {53, 24}, -0.5f, 0.5f);
      Buf labels = randomLabels(rng, DType::I32, {3, 13}, 53, ignore, 4);
      Buf dloss = scalar(0.37f);
      HeadResult want = unfusedHead(x, w, labels, dloss, ignore);
      HeadResult got = fusedHead(x, w, labels, dloss, ignore, 39);
      expectSameBytes("loss", got.loss, want.loss);
      expectSameBytes("dx", got.dx, want.dx);
      expectSameBytes("dw", got.dw, want.dw);
      // A chunk larger than the batch is one chunk too.
      HeadResult big = fusedHead(x, w, labels, dloss, ignore, 1000);
      expectSameBytes("dw (chunk above the batch)", big.dw, want.dw);
      // Frozen weight: dx alone, the same.
      HeadResult frozen = fusedHead(x, w, labels, dloss, ignore, 39, /*weightGrad=*/false);
      expectSameBytes("dx (frozen w)", frozen.dx, want.dx);
      expectSameBytes("loss (frozen w)", frozen.loss, want.loss);
    }
}

TEST(CpuFusedTest, LinearCrossEntropyInChunksWithARaggedLastOne) {
  std::mt19937 rng(7002);
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t chunk : {int64_t(1), int64_t(8), int64_t(16)}) {
      SCOPED_TRACE(std::string(dtypeName(dt)) + " chunk " + std::to_string(chunk));
      Buf x = randomFloats(rng, dt, {37, 24}); // 37 = 4 * 8 + 5 = 2 * 16 + 5
      Buf w = randomFloats(rng, dt, {61, 24}, -0.5f, 0.5f);
      Buf labels = randomLabels(rng, DType::I64, {37}, 61, -100, 5);
      Buf dloss = scalar(1.0f);
      HeadResult want = unfusedHead(x, w, labels, dloss, -100);
      HeadResult got = fusedHead(x, w, labels, dloss, -100, chunk);
      // Each row's loss is the same, summed in row order: the loss is bit for bit.
      expectSameBytes("loss", got.loss, want.loss);
      // dx rows are GEMMs of fewer rows, dw sums the positions chunk by chunk in fp32.
      double rel = dt == DType::F32 ? 1e-5 : 1e-2;
      expectClose("dx", got.dx, want.dx, rel);
      expectClose("dw", got.dw, want.dw, rel);
    }
}

TEST(CpuFusedTest, LinearCrossEntropyAllIgnoredAndBadLabels) {
  std::mt19937 rng(7003);
  Buf x = randomFloats(rng, DType::F32, {6, 8});
  Buf w = randomFloats(rng, DType::F32, {11, 8});
  Buf labels = randomLabels(rng, DType::I32, {6}, 11, -100, 1); // every row: i % 1 == 0 != 1
  std::vector<int32_t> all(6, -100);
  std::memcpy(labels.bytes.data(), all.data(), 24);
  Buf dloss = scalar(1.0f);
  HeadResult got = fusedHead(x, w, labels, dloss, -100, 4);
  EXPECT_TRUE(std::isnan(got.loss.floats()[0]));
  for (float v : got.dx.floats())
    ASSERT_EQ(v, 0.0f);
  for (float v : got.dw.floats())
    ASSERT_EQ(v, 0.0f);

  std::vector<int32_t> bad = {1, 2, 11, 3, -100, 4};
  std::memcpy(labels.bytes.data(), bad.data(), 24);
  Buf dx(DType::F32, {6, 8});
  int64_t elements = linearCrossEntropyWorkspaceElements(6, 11, 8, 4, 4, false);
  Buf workspace(DType::F32, {elements}), loss(DType::F32, {});
  try {
    cpu::linearCrossEntropy(x.view(), w.view(), labels.view(), dloss.view(), -100, 4, loss.view(),
                            dx.view(), workspace.view(), nullptr);
    ADD_FAILURE() << "a label of 11 for a vocabulary of 11 was accepted";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("label 11 at labels[2] is outside [0, 11)"),
              std::string::npos)
        << e.what();
  }
  // Nothing was written.
  for (uint8_t b : dx.bytes)
    ASSERT_EQ(b, 0xff);
  Buf small(DType::F32, {elements - 1});
  EXPECT_THROW(cpu::linearCrossEntropy(x.view(), w.view(), labels.view(), dloss.view(), -100, 4,
                                       loss.view(), dx.view(), small.view(), nullptr),
               Error);
}

TEST(CpuFusedTest, ResidualNormsAreTheirChains) {
  std::mt19937 rng(7004);
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtypeName(dt));
    Shape shape = {3, 5, 40};
    Buf a = randomFloats(rng, dt, shape), b = randomFloats(rng, dt, shape);
    Buf wgt = randomFloats(rng, dt, {40}), bias = randomFloats(rng, dt, {40});
    Buf sum(dt, shape), y(dt, shape), wantSum(dt, shape), wantY(dt, shape);
    cpu::add(a.view(), b.view(), wantSum.view());
    cpu::rmsNorm(wantSum.view(), wgt.view(), 1e-5, wantY.view());
    cpu::addRmsNorm(a.view(), b.view(), wgt.view(), 1e-5, sum.view(), y.view());
    expectSameBytes("add_rms_norm sum", sum, wantSum);
    expectSameBytes("add_rms_norm y", y, wantY);
    sum.poison();
    y.poison();
    cpu::layerNorm(wantSum.view(), wgt.view(), bias.view(), 1e-5, wantY.view());
    cpu::addLayerNorm(a.view(), b.view(), wgt.view(), bias.view(), 1e-5, sum.view(), y.view());
    expectSameBytes("add_layer_norm sum", sum, wantSum);
    expectSameBytes("add_layer_norm y", y, wantY);

    Buf dy = randomFloats(rng, dt, shape), addend = randomFloats(rng, dt, shape);
    Buf dx(dt, shape), dw(dt, {40}), db(dt, {40});
    Buf wantDx(dt, shape), wantDw(dt, {40}), wantDb(dt, {40}), normDx(dt, shape);
    cpu::rmsNormGrad(dy.view(), a.view(), wgt.view(), 1e-5, normDx.view(), wantDw.view());
    cpu::add(addend.view(), normDx.view(), wantDx.view()); // as autodiff orders the addends
    cpu::rmsNormGradAdd(dy.view(), a.view(), wgt.view(), addend.view(), 1e-5, dx.view(), dw.view());
    expectSameBytes("rms_norm_grad_add dx", dx, wantDx);
    expectSameBytes("rms_norm_grad_add dw", dw, wantDw);
    dx.poison();
    dw.poison();
    cpu::layerNormGrad(dy.view(), a.view(), wgt.view(), 1e-5, normDx.view(), wantDw.view(),
                       wantDb.view());
    cpu::add(normDx.view(), addend.view(), wantDx.view());
    cpu::layerNormGradAdd(dy.view(), a.view(), wgt.view(), addend.view(), 1e-5, dx.view(),
                          dw.view(), db.view());
    expectSameBytes("layer_norm_grad_add dx", dx, wantDx);
    expectSameBytes("layer_norm_grad_add dw", dw, wantDw);
    expectSameBytes("layer_norm_grad_add db", db, wantDb);
    // The sum is not the norm's gradient alone: the addend reached it.
    std::vector<float> plain = normDx.floats(), fused = dx.floats();
    EXPECT_NE(plain, fused);
  }
}

//===----------------------------------------------------------------------===//
// Plans
//===----------------------------------------------------------------------===//

namespace fb = bonsai::plan;
using test::buildPlan;
using test::PlanSpec;

auto linearCrossEntropyAttrs(int64_t ignoreIndex, int64_t chunkRows) {
  return [=](flatbuffers::FlatBufferBuilder &b) {
    return fb::CreateLinearCrossEntropyAttrs(b, ignoreIndex, chunkRows).Union();
  };
}

/// Indices of the fused plan's notable tensors and kernels.
struct FusedPlan {
  PlanSpec spec;
  uint32_t x, head, labels, lossScale, loss, dx, workspace, dw, res, sum, n, addend, dres;
  size_t headKernel, addNorm, gradAdd;
};

/// embedding -> add_rms_norm (the embedding plus itself, a residual add) -> fused LM head;
/// backward: rms_norm_grad_add (the head's dx plus the residual path's), embedding_grad.
/// Gradients are per-step tensors; no optimizer (Forward and Backward only).
/// `tableRows`: rows of the embedding table (and of its gradient), V = 16 by default.
FusedPlan fusedPlanSpec(int64_t chunkRows = 3, int64_t tableRows = 16) {
  const int64_t B = 2, T = 4, V = 16, D = 8;
  FusedPlan f;
  PlanSpec &p = f.spec;
  p.model = "fused";
  p.arenas = {{"weights", Lifetime::Persistent, 0, 256}, {"step", Lifetime::Step, 0, 256}};
  uint32_t table =
      p.add("model.embed_tokens.weight", DType::F32, {tableRows, D}, TensorRole::Parameter, 0);
  uint32_t norm = p.add("model.norm.weight", DType::F32, {D}, TensorRole::Parameter, 0);
  f.head = p.add("lm_head.weight", DType::F32, {V, D}, TensorRole::Parameter, 0);
  uint32_t ids = p.add("ids", DType::I32, {B, T}, TensorRole::Input, 1);
  f.labels = p.add("labels", DType::I32, {B, T}, TensorRole::Input, 1);
  f.lossScale = p.add("loss_scale", DType::F32, {}, TensorRole::LossScale, 1);
  f.x = p.add("h", DType::F32, {B, T, D}, TensorRole::Activation, 1);
  f.sum = p.add("sum", DType::F32, {B, T, D}, TensorRole::Activation, 1);
  f.n = p.add("n", DType::F32, {B, T, D}, TensorRole::Activation, 1);
  f.loss = p.add("loss", DType::F32, {}, TensorRole::Loss, 1);
  f.dx = p.add("n.grad", DType::F32, {B, T, D}, TensorRole::Gradient, 1);
  f.workspace = p.add("workspace", DType::F32,
                      {linearCrossEntropyWorkspaceElements(B * T, V, D, chunkRows, 4, true)},
                      TensorRole::Workspace, 1);
  f.dw = p.add("lm_head.weight", DType::F32, {V, D}, TensorRole::Gradient, 1);
  f.addend = p.add("h.grad.residual", DType::F32, {B, T, D}, TensorRole::Gradient, 1);
  f.dres = p.add("h.grad", DType::F32, {B, T, D}, TensorRole::Gradient, 1);
  uint32_t dnorm = p.add("model.norm.weight", DType::F32, {D}, TensorRole::Gradient, 1);
  uint32_t dtable =
      p.add("model.embed_tokens.weight", DType::F32, {tableRows, D}, TensorRole::Gradient, 1);
  f.res = f.x;
  p.kernel(KernelKind::Embedding, {table, ids}, {f.x});
  f.addNorm = p.kernel(KernelKind::AddRMSNorm, {f.x, f.x, norm}, {f.sum, f.n},
                       fb::KernelAttrs::NormAttrs, test::normAttrs(1e-5));
  f.headKernel =
      p.kernel(KernelKind::LinearCrossEntropy, {f.n, f.head, f.labels, f.lossScale},
               {f.loss, f.dx, f.workspace, f.dw}, fb::KernelAttrs::LinearCrossEntropyAttrs,
               linearCrossEntropyAttrs(-100, chunkRows));
  p.phase = Phase::Backward;
  p.kernel(KernelKind::Copy, {f.dx}, {f.addend});
  f.gradAdd = p.kernel(KernelKind::RMSNormGradAdd, {f.dx, f.sum, norm, f.addend}, {f.dres, dnorm},
                       fb::KernelAttrs::NormAttrs, test::normAttrs(1e-5));
  p.kernel(KernelKind::EmbeddingGrad, {f.dres, ids}, {dtable});
  p.phase = Phase::Forward;
  p.inputs = {ids, f.labels};
  p.loss = f.loss;
  p.tokensPerStep = uint64_t(B * T);
  p.vocabSize = uint64_t(V);
  return f;
}

std::string loadError(const PlanSpec &spec) {
  std::vector<uint8_t> bytes = buildPlan(spec);
  try {
    loadPlanBuffer(bytes.data(), bytes.size(), "fused.plan");
  } catch (const Error &e) {
    return e.what();
  }
  return "";
}

void expectError(const PlanSpec &spec, std::initializer_list<std::string> parts) {
  std::string message = loadError(spec);
  ASSERT_FALSE(message.empty()) << "the plan loaded";
  for (const std::string &part : parts)
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
}

TEST(PlanFusedTest, LoadsTheFusedPlan) {
  FusedPlan f = fusedPlanSpec();
  std::vector<uint8_t> bytes = buildPlan(f.spec);
  LoadedPlan plan = loadPlanBuffer(bytes.data(), bytes.size(), "fused.plan");
  const KernelInfo &head = plan.kernels[f.headKernel];
  EXPECT_EQ(head.kind, KernelKind::LinearCrossEntropy);
  EXPECT_EQ(head.attrsAs<LinearCrossEntropyAttrs>().chunkRows, 3);
  EXPECT_EQ(head.attrsAs<LinearCrossEntropyAttrs>().ignoreIndex, -100);
  EXPECT_STREQ(kernelKindName(KernelKind::LayerNormGradAdd), "LayerNormGradAdd");
  EXPECT_DOUBLE_EQ(plan.kernels[f.gradAdd].attrsAs<NormAttrs>().epsilon, 1e-5);
  // Without dw (a frozen head) too.
  f.spec.kernels[f.headKernel].outputs.pop_back();
  f.spec.tensors[f.workspace].shape = {linearCrossEntropyWorkspaceElements(8, 16, 8, 3, 4, false)};
  f.spec.tensors[f.workspace].bytes = -1;
  EXPECT_EQ(loadError(f.spec), "");
}

TEST(PlanFusedTest, ArityAndAttributes) {
  FusedPlan f = fusedPlanSpec();
  f.spec.kernels[f.headKernel].inputs.pop_back();
  expectError(f.spec, {"(LinearCrossEntropy): expected 4 inputs (x, w, labels, dloss), got 3"});
  f = fusedPlanSpec();
  f.spec.kernels[f.headKernel].outputs.resize(2);
  expectError(f.spec, {"(LinearCrossEntropy): expected 3 or 4 outputs (loss, dx, workspace, "
                       "dw), got 2"});
  f = fusedPlanSpec();
  f.spec.kernels[f.gradAdd].inputs.pop_back();
  expectError(f.spec, {"(RMSNormGradAdd): expected 4 inputs (dy, x, w, addend), got 3"});
  f = fusedPlanSpec();
  f.spec.kernels[f.addNorm].outputs.pop_back();
  expectError(f.spec, {"(AddRMSNorm): expected 2 outputs (sum, y), got 1"});
  f = fusedPlanSpec();
  f.spec.kernels[f.headKernel].attrs = linearCrossEntropyAttrs(-100, 0);
  expectError(f.spec, {"(LinearCrossEntropy): chunk_rows must be positive, got 0"});
  f = fusedPlanSpec();
  f.spec.kernels[f.headKernel].attrsType = fb::KernelAttrs::CrossEntropyAttrs;
  f.spec.kernels[f.headKernel].attrs = test::crossEntropyAttrs(-100);
  expectError(f.spec, {"(LinearCrossEntropy) attributes: expected LinearCrossEntropyAttrs, got "
                       "CrossEntropyAttrs"});
  f = fusedPlanSpec();
  f.spec.kernels[f.addNorm].attrs = test::normAttrs(0.0);
  expectError(f.spec, {"(AddRMSNorm): epsilon must be positive, got 0"});
}

TEST(PlanFusedTest, DTypesShapesAndWorkspace) {
  FusedPlan f = fusedPlanSpec();
  f.spec.tensors[f.workspace].shape = {100};
  f.spec.tensors[f.workspace].bytes = -1;
  int64_t want = linearCrossEntropyWorkspaceElements(8, 16, 8, 3, 4, true);
  expectError(f.spec, {"(LinearCrossEntropy): workspace (tensor",
                       "shape: expected [" + std::to_string(want) + "], got [100]"});
  f = fusedPlanSpec();
  f.spec.kernels[f.headKernel].inputs[3] = f.labels;
  expectError(f.spec, {"dloss (tensor", "must be a scalar [] of dtype f32, got [2, 4] i32"});
  f = fusedPlanSpec();
  f.spec.tensors[f.dw].shape = {8, 16};
  f.spec.tensors[f.dw].bytes = -1;
  expectError(f.spec, {"(LinearCrossEntropy): dw (tensor", "expected [16, 8] f32 (as w), got "
                                                           "[8, 16] f32"});
  f = fusedPlanSpec();
  f.spec.tensors[f.head].shape = {16, 4};
  f.spec.tensors[f.head].bytes = -1;
  expectError(f.spec, {"(LinearCrossEntropy): w (tensor", "expected [vocab, 8]"});
  f = fusedPlanSpec();
  f.spec.tensors[f.n].dtype = DType::BF16;
  f.spec.tensors[f.n].bytes = -1;
  expectError(f.spec, {"(AddRMSNorm): y (tensor", "expected [2, 4, 8] f32 (as lhs), got [2, 4, "
                                                  "8] bf16"});
  f = fusedPlanSpec();
  f.spec.tensors[f.addend].shape = {2, 8, 4};
  f.spec.tensors[f.addend].bytes = -1;
  expectError(f.spec, {"(RMSNormGradAdd): addend (tensor", "shape: expected [2, 4, 8], got "
                                                           "[2, 8, 4]"});
}

TEST(PlanFusedTest, OverlapsAndVocabulary) {
  FusedPlan f = fusedPlanSpec();
  // The fused kernels cannot run in place: the sum over an input is rejected.
  f.spec.kernels[f.addNorm].outputs[0] = f.x;
  expectError(f.spec, {"(AddRMSNorm)", "this kind cannot run in place"});
  f = fusedPlanSpec();
  f.spec.tensors[f.workspace].offset = f.spec.tensors[f.dw].offset;
  expectError(f.spec, {"(LinearCrossEntropy): dw (tensor", "overlaps workspace"});
  // Labels index the head's rows: a head smaller than the plan's vocabulary is rejected.
  // A plan vocabulary of 17 (the table has 17 rows) with a head of 16 rows.
  f = fusedPlanSpec(3, 17);
  f.spec.vocabSize = 17;
  expectError(f.spec, {"the LM head weight indexed by the plan's labels", "has 16 rows, fewer "
                                                                          "than vocab_size 17"});
}

TEST(PlanFusedTest, RandomByteFlipsLoadOrThrow) {
  // Every corruption of a plan with the fused kinds is either a valid plan or an rt::Error
  // (never a crash: ASan builds check the reads, scripts/test-asan.sh).
  std::vector<uint8_t> bytes = buildPlan(fusedPlanSpec().spec);
  std::mt19937 rng(7005);
  int rejected = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<uint8_t> copy = bytes;
    for (int k = 0; k < 1 + trial % 3; ++k)
      copy[rng() % copy.size()] ^= uint8_t(1u << (rng() % 8));
    try {
      loadPlanBuffer(copy.data(), copy.size(), "flipped.plan");
    } catch (const Error &) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 100);
}

} // namespace
} // namespace bonsai::rt
