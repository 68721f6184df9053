//===- PackedSequencesTest.cpp - Packed rows: segment ids, positions, llama3 rope ===//
//
// Packed training rows hold several documents (docs/training.md, "Packed sequences"): attention
// with segment ids must give each document what it gives the document alone, and rope with
// positions that restart at each document must rotate it as if it started the row. Checked on
// fresh random data (fixed seeds):
//
// - the CPU kernels (attention, flash attention, both gradients, rope and rope_grad) on a
//   packed batch against the same kernels run on each document alone, within 1e-6;
// - a plan (embedding -> rope with positions -> attention with segment ids -> LM head ->
//   cross-entropy) run by the executor: each document's loss in the packed batch equals its
//   loss alone in a row, within 1e-5 (fp32), which also checks that the executor binds the
//   plan's "positions" and "segment_ids" inputs by name from the TokenBatch;
// - ropeInverseFrequencies with Llama 3.1's "llama3" scaling against transformers' formula
//   written in NumPy (Inputs/llama3_rope_inv_freq.py prints the values below), within 1e-12;
// - on a GPU, the CUDA kernels with segment ids (f32 and bf16) and rope with positions and
//   llama3 scaling against the CPU's, with CudaAttentionTest's tolerances; "no GPU here"
//   skips them otherwise.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/Executor.h"
#include "bonsai/runtime/KernelAttrs.h"

#include "TestPlans.h"

#ifdef BONSAI_HAVE_CUDA
#include "bonsai/runtime/CudaKernels.h"
#include <cuda_runtime.h>
#endif

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

namespace bonsai::rt {
namespace {

using Shape = std::vector<int64_t>;

/// One document of a packed batch: batch row, first position, length.
struct Doc {
  int64_t row, start, length;
};

std::vector<float> randomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float &v : x) {
    do
      v = dist(rng);
    while (std::fabs(v) < 1e-3f);
  }
  return x;
}

TensorView f32(std::vector<float> &x, Shape shape) { return {x.data(), DType::F32, shape}; }

/// Rows [start, start + length) of batch row `row` of a [B, S, H, D] tensor, as [1, L, H, D].
std::vector<float> sliceDoc(const std::vector<float> &x, const Shape &shape, const Doc &doc) {
  int64_t rowSize = shape[2] * shape[3];
  auto first = x.begin() + (doc.row * shape[1] + doc.start) * rowSize;
  return std::vector<float>(first, first + doc.length * rowSize);
}

/// The segment ids and positions of `docs` (covering every token) for [B, S].
void packedIds(const std::vector<Doc> &docs, int64_t batch, int64_t seq,
               std::vector<int64_t> &segments, std::vector<int64_t> &positions) {
  segments.assign(size_t(batch * seq), -1);
  positions.assign(size_t(batch * seq), -1);
  std::vector<int64_t> count(size_t(batch), 0);
  for (const Doc &d : docs) {
    for (int64_t t = 0; t < d.length; ++t) {
      segments[size_t(d.row * seq + d.start + t)] = count[size_t(d.row)];
      positions[size_t(d.row * seq + d.start + t)] = t;
    }
    ++count[size_t(d.row)];
  }
}

void expectNear(const std::vector<float> &got, const std::vector<float> &want, double tol,
                const std::string &what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol) << what << " element " << i;
}

// Two rows of 12 tokens: documents of 5 and 7 tokens, and of 3, 1 (a one-token document) and 8.
const std::vector<Doc> kDocs = {{0, 0, 5}, {0, 5, 7}, {1, 0, 3}, {1, 3, 1}, {1, 4, 8}};
constexpr int64_t kB = 2, kS = 12, kH = 4, kKv = 2, kD = 8;

TEST(PackedSequencesTest, AttentionWithSegmentsMatchesEachDocumentAlone) {
  Shape qShape = {kB, kS, kH, kD}, kvShape = {kB, kS, kKv, kD};
  std::vector<float> q = randomFloats(size_t(kB * kS * kH * kD), 1);
  std::vector<float> k = randomFloats(size_t(kB * kS * kKv * kD), 2);
  std::vector<float> v = randomFloats(size_t(kB * kS * kKv * kD), 3);
  std::vector<float> dout = randomFloats(q.size(), 4);
  std::vector<int64_t> segments, positions;
  packedIds(kDocs, kB, kS, segments, positions);
  TensorView seg{segments.data(), DType::I64, {kB, kS}};
  double scale = 1.0 / std::sqrt(double(kD));
  for (bool causal : {true, false}) {
    std::vector<float> o(q.size()), o2(q.size()), lse(size_t(kB * kH * kS));
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    std::vector<float> fdq(q.size()), fdk(k.size()), fdv(v.size());
    cpu::attention(f32(q, qShape), f32(k, kvShape), f32(v, kvShape), causal, scale,
                   f32(o, qShape), &seg);
    cpu::flashAttention(f32(q, qShape), f32(k, kvShape), f32(v, kvShape), causal, scale,
                        f32(o2, qShape), f32(lse, {kB, kH, kS}), &seg);
    EXPECT_EQ(o, o2) << "flash attention's output is attention's, bit for bit";
    cpu::attentionGrad(f32(dout, qShape), f32(q, qShape), f32(k, kvShape), f32(v, kvShape),
                       f32(o, qShape), causal, scale, f32(dq, qShape), f32(dk, kvShape),
                       f32(dv, kvShape), &seg);
    cpu::flashAttentionGrad(f32(dout, qShape), f32(q, qShape), f32(k, kvShape), f32(v, kvShape),
                            f32(o, qShape), f32(lse, {kB, kH, kS}), causal, scale,
                            f32(fdq, qShape), f32(fdk, kvShape), f32(fdv, kvShape), &seg);
    for (const Doc &d : kDocs) {
      SCOPED_TRACE("document at row " + std::to_string(d.row) + ", start " +
                   std::to_string(d.start) + (causal ? ", causal" : ""));
      Shape dq1 = {1, d.length, kH, kD}, dkv1 = {1, d.length, kKv, kD};
      std::vector<float> qd = sliceDoc(q, qShape, d), kd = sliceDoc(k, kvShape, d),
                         vd = sliceDoc(v, kvShape, d), dod = sliceDoc(dout, qShape, d);
      std::vector<float> od(qd.size()), dqd(qd.size()), dkd(kd.size()), dvd(vd.size());
      cpu::attention(f32(qd, dq1), f32(kd, dkv1), f32(vd, dkv1), causal, scale, f32(od, dq1));
      cpu::attentionGrad(f32(dod, dq1), f32(qd, dq1), f32(kd, dkv1), f32(vd, dkv1),
                         f32(od, dq1), causal, scale, f32(dqd, dq1), f32(dkd, dkv1),
                         f32(dvd, dkv1));
      expectNear(sliceDoc(o, qShape, d), od, 1e-6, "o");
      expectNear(sliceDoc(dq, qShape, d), dqd, 1e-6, "dq");
      expectNear(sliceDoc(dk, kvShape, d), dkd, 1e-6, "dk");
      expectNear(sliceDoc(dv, kvShape, d), dvd, 1e-6, "dv");
      expectNear(sliceDoc(fdq, qShape, d), dqd, 1e-5, "flash dq");
      expectNear(sliceDoc(fdk, kvShape, d), dkd, 1e-5, "flash dk");
      expectNear(sliceDoc(fdv, kvShape, d), dvd, 1e-5, "flash dv");
    }
  }
}

TEST(PackedSequencesTest, RopeWithPositionsMatchesEachDocumentAlone) {
  Shape shape = {kB, kS, kH, kD};
  std::vector<float> x = randomFloats(size_t(kB * kS * kH * kD), 5);
  std::vector<int64_t> segments, positions;
  packedIds(kDocs, kB, kS, segments, positions);
  // i32 positions, as the compiled models declare them.
  std::vector<int32_t> pos32(positions.begin(), positions.end());
  TensorView pos{pos32.data(), DType::I32, {kB, kS}};
  RoPEAttrs attrs{10000.0};
  RoPEAttrs llama3{500000.0, 8.0, 1.0, 4.0, 16};
  for (const RoPEAttrs &a : {attrs, llama3}) {
    std::vector<float> y(x.size()), back(x.size());
    cpu::rope(f32(x, shape), a, &pos, f32(y, shape));
    cpu::ropeGrad(f32(y, shape), a, &pos, f32(back, shape));
    expectNear(back, x, 1e-6, "rope_grad(rope(x))");
    for (const Doc &d : kDocs) {
      Shape one = {1, d.length, kH, kD};
      std::vector<float> xd = sliceDoc(x, shape, d), yd(xd.size());
      cpu::rope(f32(xd, one), a, nullptr, f32(yd, one));
      expectNear(sliceDoc(y, shape, d), yd, 0.0, "rope of a document");
    }
  }
  // Without positions, the sequence index: the two-argument kernel.
  std::vector<float> a(x.size()), b(x.size());
  cpu::rope(f32(x, shape), 10000.0, f32(a, shape));
  cpu::rope(f32(x, shape), attrs, nullptr, f32(b, shape));
  EXPECT_EQ(a, b);
}

TEST(PackedSequencesTest, Llama3InverseFrequenciesMatchNumPy) {
  // Inputs/llama3_rope_inv_freq.py: transformers' _compute_llama3_parameters in NumPy (fp64)
  // for theta 500000, head_dim 128, factor 8, low_freq_factor 1, high_freq_factor 4,
  // original_max_position_embeddings 8192.
  const double expected[] = {
      1, 0.81461723385654472, 0.66360123769608836, 0.54058100463576697, 0.44036660267178046,
      0.35873022375128993, 0.29222782257301516, 0.23805382048035076, 0.19392274474868576,
      0.15797280990904319, 0.12868737343265052, 0.10483095217796996, 0.085397100285765609,
      0.069565949614160322, 0.056669621445291044, 0.04616405026546052, 0.037606030930863933,
      0.030634520893224042, 0.024955408670558694, 0.020329105980970156, 0.016560440080994446,
      0.01349041989022675, 0.010989528534539824, 0.008952259336194401, 0.0072926647372171102,
      0.0059407303756749668, 0.0048394213457198928, 0.0039422760301166563,
      0.0032114459947525913, 0.0021665707635033591, 0.0013718935677611381,
      0.00085675141291963208, 0.0005248461609929549, 0.00031269375038406517,
      0.00017850781276799638, 9.5562123539646833e-05, 7.7846552739324512e-05,
      6.3415143457776137e-05, 5.1659068748189563e-05, 4.2082367687255257e-05,
      3.4281021959525912e-05, 2.7925911282444464e-05, 2.2748928601828186e-05,
      1.8531669290821308e-05, 1.509621717643313e-05, 1.2297638677963614e-05,
      1.0017868402809974e-05, 8.1607282474359434e-06, 6.6478698711812362e-06,
      5.4154693654999229e-06, 4.4115346745584042e-06, 3.5937121736509999e-06,
      2.9274998701761677e-06, 2.3847918463583037e-06, 1.942692537204043e-06,
      1.5825508208909103e-06, 1.2891731721515574e-06, 1.0501826834601687e-06,
      8.5549691264436605e-07, 6.9690252855116753e-07, 5.6770881007598369e-07,
      4.6246538050008837e-07, 3.7673226901739645e-07, 3.0689259889145111e-07};
  RoPEAttrs a{500000.0, 8.0, 1.0, 4.0, 8192};
  std::vector<double> got = ropeInverseFrequencies(a, 128);
  ASSERT_EQ(got.size(), std::size(expected));
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], expected[i], 1e-12 * expected[i]) << "inv_freq[" << i << "]";
  // The rotation uses them: position p of pair i turns by p * inv_freq[i].
  Shape shape = {1, 3, 1, 128};
  std::vector<float> x(size_t(3 * 128), 0.0f), y(x.size());
  for (int64_t p = 0; p < 3; ++p)
    x[size_t(p * 128 + 40)] = 1.0f; // pair 40's low half: y = (cos, sin) of p * inv_freq[40]
  std::vector<int32_t> pos = {0, 1000, 7000};
  TensorView positions{pos.data(), DType::I32, {1, 3}};
  cpu::rope(f32(x, shape), a, &positions, f32(y, shape));
  for (int64_t p = 0; p < 3; ++p) {
    double angle = double(pos[size_t(p)]) * expected[40];
    EXPECT_NEAR(y[size_t(p * 128 + 40)], std::cos(angle), 1e-6);
    EXPECT_NEAR(y[size_t(p * 128 + 40 + 64)], std::sin(angle), 1e-6);
  }
}

/// embedding -> rope (positions) -> attention (segment ids, q = k = rope(x), v = x) -> LM head
/// -> cross-entropy, forward only, with the plan inputs ids, labels, positions, segment_ids.
test::PlanSpec packedPlanSpec(int64_t vocab) {
  test::PlanSpec p;
  p.model = "packed";
  p.arenas = {{"weights", Lifetime::Persistent, 0, 256}, {"step", Lifetime::Step, 0, 256}};
  int64_t hidden = kH * kD;
  uint32_t table = p.add("model.embed_tokens.weight", DType::F32, {vocab, hidden},
                         TensorRole::Parameter, 0);
  uint32_t head = p.add("lm_head.weight", DType::F32, {vocab, hidden}, TensorRole::Parameter, 0);
  uint32_t ids = p.add("ids", DType::I32, {kB, kS}, TensorRole::Input, 1);
  uint32_t labels = p.add("labels", DType::I32, {kB, kS}, TensorRole::Input, 1);
  uint32_t positions = p.add("positions", DType::I32, {kB, kS}, TensorRole::Input, 1);
  uint32_t segments = p.add("segment_ids", DType::I64, {kB, kS}, TensorRole::Input, 1);
  uint32_t x = p.add("x", DType::F32, {kB, kS, hidden}, TensorRole::Activation, 1);
  uint32_t x4 = p.view("x4", x, {kB, kS, kH, kD});
  uint32_t q = p.add("q", DType::F32, {kB, kS, kH, kD}, TensorRole::Activation, 1);
  uint32_t o = p.add("o", DType::F32, {kB, kS, kH, kD}, TensorRole::Activation, 1);
  uint32_t o3 = p.view("o3", o, {kB, kS, hidden});
  uint32_t logits = p.add("logits", DType::F32, {kB, kS, vocab}, TensorRole::Activation, 1);
  uint32_t loss = p.add("loss", DType::F32, {}, TensorRole::Loss, 1);
  uint32_t logits2d = p.view("logits.flat", logits, {kB * kS, vocab});
  uint32_t labels1d = p.view("labels.flat", labels, {kB * kS});
  p.kernel(KernelKind::Embedding, {table, ids}, {x});
  p.kernel(KernelKind::RoPE, {x4, positions}, {q}, bonsai::plan::KernelAttrs::RoPEAttrs,
           test::ropeAttrs(10000.0));
  p.kernel(KernelKind::Attention, {q, q, x4, segments}, {o},
           bonsai::plan::KernelAttrs::AttentionAttrs,
           test::attentionAttrs(true, 1.0 / std::sqrt(double(kD))));
  p.kernel(KernelKind::Linear, {o3, head}, {logits});
  p.kernel(KernelKind::CrossEntropy, {logits2d, labels1d}, {loss},
           bonsai::plan::KernelAttrs::CrossEntropyAttrs, test::crossEntropyAttrs(-100));
  p.inputs = {ids, labels, positions, segments};
  p.loss = loss;
  p.tokensPerStep = uint64_t(kB * kS);
  p.vocabSize = uint64_t(vocab);
  return p;
}

TEST(PackedSequencesTest, ExecutorPerDocumentLossesMatchDocumentsAlone) {
  const int64_t vocab = 32;
  std::vector<uint8_t> bytes = test::buildPlan(packedPlanSpec(vocab));
  LoadedPlan plan = loadPlanBuffer(bytes.data(), bytes.size(), "packed.plan");
  ASSERT_TRUE(plan.positionsInput.has_value());
  ASSERT_TRUE(plan.segmentIdsInput.has_value());
  Executor executor(plan);
  executor.initWeights(7);

  std::mt19937 rng(11);
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  TokenBatch packed;
  packed.batch = kB;
  packed.seq = kS;
  for (int64_t i = 0; i < kB * kS; ++i) {
    packed.inputs.push_back(token(rng));
    packed.labels.push_back(token(rng));
  }
  packedIds(kDocs, kB, kS, packed.segmentIds, packed.positions);

  for (const Doc &d : kDocs) {
    SCOPED_TRACE("document at row " + std::to_string(d.row) + ", start " +
                 std::to_string(d.start));
    // The packed batch, every label but the document's ignored: the document's mean loss.
    TokenBatch inRow = packed;
    for (int64_t i = 0; i < kB * kS; ++i) {
      int64_t row = i / kS, t = i % kS;
      if (row != d.row || t < d.start || t >= d.start + d.length)
        inRow.labels[size_t(i)] = -100;
    }
    float packedLoss = executor.forward(inRow);
    // The document alone at the start of its row; the rest of the row is padding (token 0,
    // segment 1, labels ignored), the other row is ignored.
    TokenBatch alone;
    alone.batch = kB;
    alone.seq = kS;
    alone.inputs.assign(size_t(kB * kS), 0);
    alone.labels.assign(size_t(kB * kS), -100);
    alone.segmentIds.assign(size_t(kB * kS), 1);
    alone.positions.assign(size_t(kB * kS), 0);
    for (int64_t t = 0; t < d.length; ++t) {
      size_t from = size_t(d.row * kS + d.start + t), to = size_t(d.row * kS + t);
      alone.inputs[to] = packed.inputs[from];
      alone.labels[to] = packed.labels[from];
      alone.segmentIds[to] = 0;
      alone.positions[to] = t;
    }
    float aloneLoss = executor.forward(alone);
    EXPECT_TRUE(std::isfinite(packedLoss));
    EXPECT_NEAR(packedLoss, aloneLoss, 1e-5);
  }

  // A batch without positions and segment ids (as generation builds them) is one document
  // per row: the same loss as explicit defaults.
  TokenBatch plain = packed, defaults = packed;
  plain.positions.clear();
  plain.segmentIds.clear();
  for (int64_t i = 0; i < kB * kS; ++i) {
    defaults.positions[size_t(i)] = i % kS;
    defaults.segmentIds[size_t(i)] = 0;
  }
  EXPECT_EQ(executor.forward(plain), executor.forward(defaults));
}

TEST(PackedSequencesTest, PlanInputsAreBoundByName) {
  test::PlanSpec spec = packedPlanSpec(32);
  spec.tensors[spec.inputs[2]].name = "pos";
  std::vector<uint8_t> bytes = test::buildPlan(spec);
  try {
    loadPlanBuffer(bytes.data(), bytes.size(), "packed.plan");
    FAIL() << "an input named 'pos' loaded";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("neither \"positions\" nor \"segment_ids\""),
              std::string::npos)
        << e.what();
  }
}

TEST(PackedSequencesTest, ContractChecksTheSegmentIds) {
  // Attention's segment_ids must be an integer [batch, seq] of its query: the flat labels view
  // ([B * S]) is not.
  test::PlanSpec spec = packedPlanSpec(32);
  uint32_t flat = 0;
  for (uint32_t t = 0; t < spec.tensors.size(); ++t)
    if (spec.tensors[t].name == "labels.flat")
      flat = t;
  for (test::KernelSpec &k : spec.kernels)
    if (k.kind == KernelKind::Attention)
      k.inputs[3] = flat;
  std::vector<uint8_t> bytes = test::buildPlan(spec);
  try {
    loadPlanBuffer(bytes.data(), bytes.size(), "packed.plan");
    FAIL() << "a [24] segment_ids loaded";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("segment_ids"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("shape: expected [2, 12], got [24]"), std::string::npos)
        << e.what();
  }
}

#ifdef BONSAI_HAVE_CUDA

bool haveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

/// Device copy of host bytes, freed on scope exit.
struct Device {
  void *data = nullptr;
  size_t bytes = 0;
  Device(const void *host, size_t n) : bytes(n) {
    if (cudaMalloc(&data, std::max<size_t>(n, 16)) == cudaSuccess && host)
      cudaMemcpy(data, host, n, cudaMemcpyHostToDevice);
  }
  ~Device() { cudaFree(data); }
  Device(const Device &) = delete;
  Device &operator=(const Device &) = delete;
  /// Fills with NaN bytes (0xff), so unwritten elements show.
  void poison() { cudaMemset(data, 0xff, bytes); }
};

/// A [.., ..] tensor's values in `dtype` storage (f32, bf16 or f16), and back as f32.
std::vector<uint8_t> encode(const std::vector<float> &x, DType dtype) {
  std::vector<uint8_t> out(x.size() * dtypeSize(dtype));
  for (size_t i = 0; i < x.size(); ++i) {
    if (dtype == DType::F32) {
      std::memcpy(&out[i * 4], &x[i], 4);
    } else {
      uint16_t h = dtype == DType::F16 ? f32ToF16(x[i]) : f32ToBf16(x[i]);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

std::vector<float> download(const Device &d, DType dtype, const Shape &shape) {
  std::vector<uint8_t> raw(d.bytes);
  EXPECT_EQ(cudaMemcpy(raw.data(), d.data, d.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  int64_t n = 1;
  for (int64_t s : shape)
    n *= s;
  std::vector<float> out(static_cast<size_t>(n));
  TensorView view{raw.data(), dtype, shape};
  loadF32(view, out.data());
  return out;
}

/// Every element within abs * max|want| + rel * |want|, and no NaN.
void expectClose(const std::vector<float> &got, const std::vector<float> &want, double abs,
                 double rel, const std::string &what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (float w : want)
    scale = std::max(scale, double(std::fabs(w)));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::fabs(double(got[i]) - want[i]), abs * scale + rel * std::fabs(want[i]) + 1e-6)
        << what << " element " << i << ": " << got[i] << " against " << want[i];
}

/// One shape of attention with segment ids on the GPU against the CPU: flashAttention and its
/// gradient, attention and attentionGrad, causal and not, for each storage type in `dtypes`; the
/// GPU reads the ids as i64 when `ids64`, else as i32, and runs under Context::deterministic
/// `deterministic` (off: on Hopper the flash gradient forms dq in its dk/dv pass).
void expectSegmentedAttentionMatchesCpu(int64_t B, int64_t S, int64_t H, int64_t KV, int64_t D,
                                        const std::vector<int64_t> &segments, bool ids64,
                                        std::initializer_list<DType> dtypes,
                                        bool deterministic = true) {
  Shape qShape = {B, S, H, D}, kvShape = {B, S, KV, D}, lseShape = {B, H, S};
  std::vector<int32_t> seg32(segments.begin(), segments.end());
  for (DType dtype : dtypes) {
    SCOPED_TRACE(dtypeName(dtype));
    // Inputs rounded to the storage type, so the CPU sees what the GPU reads.
    auto rounded = [&](std::vector<float> x) {
      std::vector<uint8_t> raw = encode(x, dtype);
      TensorView view{raw.data(), dtype, {int64_t(x.size())}};
      loadF32(view, x.data());
      return x;
    };
    std::vector<float> q = rounded(randomFloats(size_t(B * S * H * D), 21));
    std::vector<float> k = rounded(randomFloats(size_t(B * S * KV * D), 22));
    std::vector<float> v = rounded(randomFloats(size_t(B * S * KV * D), 23));
    std::vector<float> dout = rounded(randomFloats(q.size(), 24));
    double scale = 1.0 / std::sqrt(double(D));
    for (bool causal : {true, false}) {
      SCOPED_TRACE(causal ? "causal" : "not causal");
      TensorView segCpu{const_cast<int64_t *>(segments.data()), DType::I64, {B, S}};
      std::vector<float> o(q.size()), lse(size_t(B * H * S)), dq(q.size()), dk(k.size()),
          dv(v.size());
      cpu::flashAttention(f32(q, qShape), f32(k, kvShape), f32(v, kvShape), causal, scale,
                          f32(o, qShape), f32(lse, lseShape), &segCpu);
      cpu::attentionGrad(f32(dout, qShape), f32(q, qShape), f32(k, kvShape), f32(v, kvShape),
                         f32(o, qShape), causal, scale, f32(dq, qShape), f32(dk, kvShape),
                         f32(dv, kvShape), &segCpu);

      std::vector<uint8_t> qb = encode(q, dtype), kb = encode(k, dtype), vb = encode(v, dtype),
                           dob = encode(dout, dtype), ob = encode(o, dtype);
      Device dQ(qb.data(), qb.size()), dK(kb.data(), kb.size()), dV(vb.data(), vb.size()),
          dDo(dob.data(), dob.size()), dOref(ob.data(), ob.size());
      Device dSeg(ids64 ? static_cast<const void *>(segments.data()) : seg32.data(),
                  segments.size() * (ids64 ? 8 : 4));
      Device dLse(lse.data(), lse.size() * 4);
      Device dO(nullptr, qb.size()), dLseOut(nullptr, lse.size() * 4);
      Device dDq(nullptr, qb.size()), dDk(nullptr, kb.size()), dDv(nullptr, vb.size());
      for (Device *d : {&dO, &dLseOut, &dDq, &dDk, &dDv})
        d->poison();
      TensorView segGpu{dSeg.data, ids64 ? DType::I64 : DType::I32, {B, S}};
      cuda::Context ctx;
      ctx.deterministic = deterministic;
      cuda::flashAttention(ctx, {dQ.data, dtype, qShape}, {dK.data, dtype, kvShape},
                           {dV.data, dtype, kvShape}, causal, scale, {dO.data, dtype, qShape},
                           {dLseOut.data, DType::F32, lseShape}, &segGpu);
      // The gradient from the CPU's o and lse, so that it is checked alone.
      cuda::flashAttentionGrad(ctx, {dDo.data, dtype, qShape}, {dQ.data, dtype, qShape},
                               {dK.data, dtype, kvShape}, {dV.data, dtype, kvShape},
                               {dOref.data, dtype, qShape}, {dLse.data, DType::F32, lseShape},
                               causal, scale, {dDq.data, dtype, qShape},
                               {dDk.data, dtype, kvShape}, {dDv.data, dtype, kvShape}, &segGpu);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      double abs = dtype == DType::F32 ? 1e-5 : 1e-2, rel = dtype == DType::F32 ? 1e-4 : 2e-2;
      expectClose(download(dO, dtype, qShape), o, abs, rel, "o");
      expectClose(download(dLseOut, DType::F32, lseShape), lse, 1e-5, 1e-5, "lse");
      expectClose(download(dDq, dtype, qShape), dq, abs, rel, "dq");
      expectClose(download(dDk, dtype, kvShape), dk, abs, rel, "dk");
      expectClose(download(dDv, dtype, kvShape), dv, abs, rel, "dv");
      // attention and attentionGrad (the statistics recomputed) take the same path.
      for (Device *d : {&dO, &dDq, &dDk, &dDv})
        d->poison();
      cuda::attention(ctx, {dQ.data, dtype, qShape}, {dK.data, dtype, kvShape},
                      {dV.data, dtype, kvShape}, causal, scale, {dO.data, dtype, qShape},
                      &segGpu);
      cuda::attentionGrad(ctx, {dDo.data, dtype, qShape}, {dQ.data, dtype, qShape},
                          {dK.data, dtype, kvShape}, {dV.data, dtype, kvShape},
                          {dOref.data, dtype, qShape}, causal, scale, {dDq.data, dtype, qShape},
                          {dDk.data, dtype, kvShape}, {dDv.data, dtype, kvShape}, &segGpu);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      expectClose(download(dO, dtype, qShape), o, abs, rel, "attention o");
      expectClose(download(dDq, dtype, qShape), dq, abs, rel, "attention_grad dq");
      expectClose(download(dDk, dtype, kvShape), dk, abs, rel, "attention_grad dk");
      expectClose(download(dDv, dtype, kvShape), dv, abs, rel, "attention_grad dv");
    }
  }
}

TEST(PackedSequencesTest, CudaAttentionWithSegmentsMatchesCpu) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU here";
  // Head dim 128 and a sequence over one 128-row tile: f32 takes the generic kernels, bf16 the
  // tensor-core ones (on Hopper the warpgroup kernels), f16 the mma.sync ones everywhere.
  const std::vector<Doc> docs = {{0, 0, 37}, {0, 37, 100}, {0, 137, 23}, {1, 0, 1}, {1, 1, 159}};
  std::vector<int64_t> segments, positions;
  packedIds(docs, 2, 160, segments, positions);
  expectSegmentedAttentionMatchesCpu(2, 160, 4, 2, 128, segments, /*ids64=*/false,
                                     {DType::F32, DType::BF16, DType::F16});
}

TEST(PackedSequencesTest, CudaTensorCoreAttentionSkipsOtherDocuments) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU here";
  // Documents over several 64- and 128-row tiles, one-token documents at a tile's edge and a
  // document longer than two tiles, at head dims 64 and 128, GQA 4:1, ids as i64: the tensor-core
  // kernels visit only the tiles of the block's documents and mask those that straddle an edge
  // (bf16: the warpgroup kernels on Hopper, mma.sync elsewhere; f16: mma.sync); on Hopper also
  // with the one-pass gradient (Context::deterministic off), whose dk/dv/dq kernel has its own
  // segmented instance.
  const int64_t S = 700;
  const std::vector<Doc> docs = {{0, 0, 1},     {0, 1, 127},   {0, 128, 1},  {0, 129, 64},
                                 {0, 193, 300}, {0, 493, 207}, {1, 0, 37},   {1, 37, 1},
                                 {1, 38, 1},    {1, 39, 400},  {1, 439, 261}};
  std::vector<int64_t> segments, positions;
  packedIds(docs, 2, S, segments, positions);
  for (int64_t d : {64, 128})
    for (bool deterministic : {true, false}) {
      SCOPED_TRACE("head dim " + std::to_string(d) +
                   (deterministic ? "" : ", Context::deterministic off"));
      expectSegmentedAttentionMatchesCpu(2, S, 4, 1, d, segments, /*ids64=*/true,
                                         {DType::BF16, DType::F16}, deterministic);
    }
}

TEST(PackedSequencesTest, CudaTensorCoreAttentionTakesAnySegmentIds) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU here";
  // Ids that do not keep a segment's tokens together (runs of 7 tokens cycling through three
  // segments, as no packer writes them): every tile then holds several segments, and the kernels'
  // windows must still cover every key of a row's segment.
  const int64_t S = 300;
  std::vector<int64_t> segments(static_cast<size_t>(S));
  for (int64_t t = 0; t < S; ++t)
    segments[size_t(t)] = (t / 7) % 3;
  expectSegmentedAttentionMatchesCpu(1, S, 2, 2, 128, segments, /*ids64=*/false,
                                     {DType::BF16, DType::F16});
}

TEST(PackedSequencesTest, CudaRopeWithPositionsAndLlama3MatchesCpu) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU here";
  const int64_t B = 2, S = 64, H = 4, D = 128;
  Shape shape = {B, S, H, D};
  const std::vector<Doc> docs = {{0, 0, 20}, {0, 20, 44}, {1, 0, 64}};
  std::vector<int64_t> segments, positions;
  packedIds(docs, B, S, segments, positions);
  for (int64_t &p : positions)
    p *= 97; // long-range positions, where llama3's scaled frequencies matter
  std::vector<float> x = randomFloats(size_t(B * S * H * D), 31);
  RoPEAttrs a{500000.0, 8.0, 1.0, 4.0, 8192};
  TensorView posCpu{positions.data(), DType::I64, {B, S}};
  std::vector<float> y(x.size()), dx(x.size());
  cpu::rope(f32(x, shape), a, &posCpu, f32(y, shape));
  cpu::ropeGrad(f32(x, shape), a, &posCpu, f32(dx, shape));
  Device dX(x.data(), x.size() * 4), dPos(positions.data(), positions.size() * 8);
  Device dY(nullptr, x.size() * 4), dDx(nullptr, x.size() * 4);
  dY.poison();
  dDx.poison();
  TensorView posGpu{dPos.data, DType::I64, {B, S}};
  cuda::Context ctx;
  cuda::rope(ctx, {dX.data, DType::F32, shape}, a, &posGpu, {dY.data, DType::F32, shape});
  cuda::ropeGrad(ctx, {dX.data, DType::F32, shape}, a, &posGpu, {dDx.data, DType::F32, shape});
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The angle tables are fp64 on both; the GPU rounds cos and sin to f32.
  expectClose(download(dY, DType::F32, shape), y, 1e-6, 1e-6, "rope");
  expectClose(download(dDx, DType::F32, shape), dx, 1e-6, 1e-6, "rope_grad");
}

#endif // BONSAI_HAVE_CUDA

} // namespace
} // namespace bonsai::rt
