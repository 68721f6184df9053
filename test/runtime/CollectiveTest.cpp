//===- CollectiveTest.cpp - Sharded tensors and the collective kinds, one process -===//
//
// docs/sharding.md: the loader's contract of sharded tensors (Tensor.shard_ranks, full_shape),
// of Plan.ranks and of the collective kinds, each rule's message; the executor's refusal of a
// plan whose ranks its communicator does not have; the four kinds on one rank (each a copy,
// bit for bit); and, with a communicator that says rank 1 of 2 without moving anything, what a
// rank's shards hold after init, binding and converting copies. The kinds across real ranks are
// test/runtime/mpi/ShardMpiTest.cpp.
//
//===----------------------------------------------------------------------===//

#include "TestPlans.h"

#include "bonsai/runtime/Checkpoint.h"
#include "bonsai/runtime/Communicator.h"
#include "bonsai/runtime/Executor.h"
#include "bonsai/runtime/Init.h"
#include "bonsai/runtime/KernelBackend.h"
#include "bonsai/runtime/Nf4.h"
#include "bonsai/runtime/Safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace bonsai::rt {
namespace {

namespace fb = bonsai::plan;
using namespace test;

/// A plan of `ranks` ranks with the ids, labels and loss every plan has; arena 0 persistent,
/// arena 1 the step's.
PlanSpec basePlan(uint32_t ranks) {
  PlanSpec p;
  p.model = "collectives";
  p.ranks = ranks;
  p.shardStrategy = ranks > 1 ? "zero3" : "";
  p.arenas = {{"weights", Lifetime::Persistent, 0, 256}, {"step", Lifetime::Step, 0, 256}};
  uint32_t ids = p.add("ids", DType::I32, {1, 4}, TensorRole::Input, 1);
  uint32_t labels = p.add("labels", DType::I32, {1, 4}, TensorRole::Input, 1);
  p.loss = p.add("loss", DType::F32, {}, TensorRole::Loss, 1);
  p.kernel(KernelKind::Fill, {}, {p.loss}, fb::KernelAttrs::FillAttrs, fillAttrs(0.0));
  p.inputs = {ids, labels};
  p.tokensPerStep = 4;
  p.vocabSize = 16;
  return p;
}

LoadedPlan load(const PlanSpec &p) {
  std::vector<uint8_t> bytes = buildPlan(p);
  return loadPlanBuffer(bytes.data(), bytes.size(), "c.plan");
}

/// The loader's message for `p`, or "" when it loads.
std::string loadError(const PlanSpec &p) {
  try {
    load(p);
  } catch (const Error &e) {
    return e.what();
  }
  return "";
}

uint32_t shardOf(PlanSpec &p, const std::string &name, std::vector<int64_t> shape,
                 std::vector<int64_t> full, uint32_t ranks, TensorRole role, uint32_t arena) {
  uint32_t t = p.add(name, DType::F32, std::move(shape), role, arena);
  p.tensors[t].shardRanks = ranks;
  p.tensors[t].fullShape = std::move(full);
  return t;
}

/// Appends `bytes` bytes of `dtype` (NF4 storage or a u8 share of it) to `arena`, with NF4
/// blocks (64, 256).
uint32_t addBytes(PlanSpec &p, const std::string &name, DType dtype, std::vector<int64_t> shape,
                  uint64_t bytes, TensorRole role, uint32_t arena) {
  uint32_t t = p.add(name, dtype, std::move(shape), role, arena);
  p.tensors[t].bytes = int64_t(bytes);
  p.tensors[t].quantBlock = 64;
  p.tensors[t].quantDoubleBlock = 256;
  p.tensors[t].trainable = false;
  p.arenas[arena].size = p.tensors[t].offset + bytes;
  return t;
}

/// Rank `rank`'s share over `ranks` of the NF4 storage of a frozen [64, 64] weight.
uint32_t nf4Share(PlanSpec &p, const std::string &name, uint32_t ranks) {
  const uint64_t whole = nf4StorageBytes(64 * 64, 64, 256);
  uint32_t t = addBytes(p, name, DType::U8, {int64_t(whole / ranks)}, whole / ranks,
                        TensorRole::Parameter, 0);
  p.tensors[t].shardRanks = ranks;
  p.tensors[t].fullShape = {64, 64};
  return t;
}

#define EXPECT_LOAD_ERROR(spec, text)                                                              \
  EXPECT_NE(loadError(spec).find(text), std::string::npos) << loadError(spec)

TEST(ShardContract, ShardedTensorsAndPlanRanks) {
  PlanSpec p = basePlan(2);
  uint32_t w = shardOf(p, "w", {3, 4}, {6, 4}, 2, TensorRole::Parameter, 0);
  ASSERT_EQ(loadError(p), "");
  LoadedPlan plan = load(p);
  EXPECT_EQ(plan.ranks, 2u);
  EXPECT_EQ(plan.shardStrategy, "zero3");
  EXPECT_TRUE(plan.tensors[w].sharded());
  EXPECT_EQ(plan.tensors[w].fullShape, (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(plan.tensors[w].shardOffset(1), 12);

  PlanSpec bad = p;
  bad.tensors[w].fullShape = {5, 4};
  EXPECT_LOAD_ERROR(bad, "tensor 3 'w' is sharded over 2 ranks: full_shape [5, 4] has 20 "
                         "elements, expected 2 x 12 (shape [3, 4])");
  bad = p;
  bad.tensors[w].fullShape = {};
  EXPECT_LOAD_ERROR(bad, "'w' is sharded over 2 ranks with full_shape []");
  bad = p;
  bad.tensors[w].shardRanks = 4;
  bad.tensors[w].fullShape = {12, 4};
  EXPECT_LOAD_ERROR(bad, "'w' is sharded over 4 ranks, but the plan is for 2 ranks (Plan.ranks)");
  bad = p;
  bad.tensors[w].shardRanks = 0;
  EXPECT_LOAD_ERROR(bad, "'w' has full_shape [6, 4] but shard_ranks 0");
  bad = p;
  bad.shardStrategy = "fsdp";
  EXPECT_LOAD_ERROR(bad, "the plan is for 2 ranks but its shard_strategy is 'fsdp'");
}

/// basePlan(ranks) with one attention over a ring of `ringRanks` (its attribute `kernelRing`)
/// on [1, seq] rows: q, k, v [1, seq, 2, 4] f32.
PlanSpec ringPlan(uint32_t ranks, uint32_t ringRanks, uint32_t kernelRing, int64_t seq = 4) {
  PlanSpec p = basePlan(ranks);
  p.shardStrategy = ranks > ringRanks ? "zero3" : "";
  p.ringRanks = ringRanks;
  // The inputs at 64-byte boundaries have room for up to 16 tokens.
  for (uint32_t input : p.inputs) {
    p.tensors[input].shape = {1, seq};
    p.tensors[input].bytes = -1;
  }
  uint32_t q = p.add("q", DType::F32, {1, seq, 2, 4}, TensorRole::Activation, 1);
  uint32_t o = p.add("o", DType::F32, {1, seq, 2, 4}, TensorRole::Activation, 1);
  p.kernel(KernelKind::Attention, {q, q, q}, {o}, fb::KernelAttrs::AttentionAttrs,
           attentionAttrs(true, 0.5, kernelRing));
  return p;
}

// Ring attention's plan contract (docs/ring-attention.md, docs/plan-format.md).
TEST(RingContract, RingRanksAndAttentionKernels) {
  PlanSpec p = ringPlan(2, 2, 2);
  ASSERT_EQ(loadError(p), "");
  LoadedPlan plan = load(p);
  EXPECT_EQ(plan.ranks, 2u);
  EXPECT_EQ(plan.ringRanks, 2u);
  EXPECT_EQ(plan.shardStrategy, "");
  // A data x ring grid: 4 ranks, rings of 2, sharded.
  EXPECT_EQ(loadError(ringPlan(4, 2, 2)), "");

  EXPECT_LOAD_ERROR(ringPlan(2, 3, 3), "ring_ranks 3 does not divide the plan's 2 ranks");
  // Four ranks of rings of 2 with nothing sharded: not a plan bonsai-compile writes.
  PlanSpec unsharded = ringPlan(4, 2, 2);
  unsharded.shardStrategy = "";
  EXPECT_LOAD_ERROR(unsharded, "the plan is for 4 ranks but its shard_strategy is ''");
  EXPECT_LOAD_ERROR(ringPlan(2, 2, 0), "has ring_ranks 0, but the plan's sequence is split "
                                       "over a ring of 2 ranks");
  EXPECT_LOAD_ERROR(ringPlan(2, 2, 4), "has ring_ranks 4, but the plan's sequence is split "
                                       "over a ring of 2 ranks");
  PlanSpec noRing = ringPlan(1, 0, 2);
  EXPECT_LOAD_ERROR(noRing, "has ring_ranks 2, but the plan's sequence is not split (no "
                            "Plan.ring_ranks)");
  EXPECT_LOAD_ERROR(ringPlan(2, 2, 2, 5), "ids shape [1, 5] is not two equal chunks of a row "
                                          "split over a ring of 2 ranks");
}

TEST(RingContract, TheSeedPlanLoads) {
  LoadedPlan plan = load(ringPlanSpec());
  EXPECT_EQ(plan.ringRanks, 2u);
  ASSERT_TRUE(plan.positionsInput.has_value());
}

TEST(RingContract, ExecutorNeedsTheRing) {
  try {
    Executor executor(load(ringPlan(2, 2, 2)), ExecutorOptions{});
    FAIL() << "a ring plan ran on one rank";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find(
                  "was compiled for 2 ranks (bonsai.ring ranks 2): start it as 2 processes"),
              std::string::npos)
        << e.what();
  }
  try {
    Executor executor(load(ringPlan(4, 2, 2)), ExecutorOptions{});
    FAIL() << "a grid plan ran on one rank";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("was compiled for 4 ranks (bonsai.shard \"zero3\" "
                                         "ranks 2 x bonsai.ring ranks 2)"),
              std::string::npos)
        << e.what();
  }
}

// The CUDA backend runs ring plans through NCCL (CudaRingAttentionTest checks the kernels and
// the ring on one GPU): without the ranks' communicator it has nothing to start NCCL over.
TEST(RingContract, CudaBackendNeedsTheRanksForARingPlan) {
  if (!cudaDeviceAvailable())
    GTEST_SKIP() << "no GPU here";
  LoadedPlan plan = load(ringPlan(2, 2, 2));
  try {
    createCudaBackend(plan, {0, false, false, true}, nullptr);
    FAIL() << "the CUDA backend took a ring plan without its ranks";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("has ring attention but the CUDA backend was given no "
                                         "communicator"),
              std::string::npos)
        << e.what();
  }
}

TEST(ShardContract, CopyOfShards) {
  PlanSpec p = basePlan(2);
  uint32_t w = p.add("w", DType::BF16, {6, 4}, TensorRole::Parameter, 0);
  uint32_t m = shardOf(p, "w.master", {12}, {6, 4}, 2, TensorRole::OptimizerState, 0);
  p.tensors[m].init = TensorInit::CopyOf;
  p.tensors[m].initSource = w;
  EXPECT_EQ(loadError(p), "");
  PlanSpec bad = p;
  bad.tensors[m].fullShape = {4, 6};
  EXPECT_LOAD_ERROR(bad, "'w.master' is a shard of [4, 6] but a copy of tensor 3 'w' [6, 4]");
}

TEST(ShardContract, CollectiveKinds) {
  // ranks x shard = full, one dtype, the plan's ranks, float sums, f32 norms.
  auto plan = [](KernelKind kind, DType in, std::vector<int64_t> inShape, DType out,
                 std::vector<int64_t> outShape, uint32_t attrRanks = 2,
                 CollectiveReduction r = CollectiveReduction::Sum) {
    PlanSpec p = basePlan(2);
    uint32_t x = p.add("x", in, std::move(inShape), TensorRole::Activation, 1);
    uint32_t y = p.add("y", out, std::move(outShape), TensorRole::Activation, 1);
    p.kernel(kind, {x}, {y}, fb::KernelAttrs::CollectiveAttrs, collectiveAttrs(attrRanks, r));
    return p;
  };
  EXPECT_EQ(loadError(plan(KernelKind::ShardSlice, DType::I32, {4, 3}, DType::I32, {6})), "");
  EXPECT_EQ(loadError(plan(KernelKind::ReduceScatter, DType::BF16, {12}, DType::BF16, {2, 3})), "");
  EXPECT_EQ(loadError(plan(KernelKind::AllGather, DType::F16, {6}, DType::F16, {3, 4})), "");
  EXPECT_EQ(loadError(plan(KernelKind::AllReduce, DType::F32, {5}, DType::F32, {5}, 2,
                           CollectiveReduction::L2Norm)),
            "");
  EXPECT_LOAD_ERROR(plan(KernelKind::AllGather, DType::F32, {6}, DType::F32, {13}),
                    "(AllGather): full (tensor 4 'y') [13] has 13 elements, expected 2 ranks x "
                    "6 (shard (tensor 3 'x') [6])");
  EXPECT_LOAD_ERROR(plan(KernelKind::ShardSlice, DType::F32, {12}, DType::F32, {5}),
                    "full (tensor 3 'x') [12] has 12 elements, expected 2 ranks x 5");
  EXPECT_LOAD_ERROR(plan(KernelKind::ReduceScatter, DType::F32, {12}, DType::BF16, {6}),
                    "shard (tensor 4 'y') dtype bf16 differs from full (tensor 3 'x') dtype f32");
  EXPECT_LOAD_ERROR(plan(KernelKind::ReduceScatter, DType::I32, {12}, DType::I32, {6}),
                    "full (tensor 3 'x') dtype: expected f32, f16 or bf16, got i32");
  EXPECT_LOAD_ERROR(plan(KernelKind::AllGather, DType::F32, {6}, DType::F32, {12}, 4),
                    "attrs.ranks is 4, but the plan is for 2 ranks (Plan.ranks)");
  EXPECT_LOAD_ERROR(plan(KernelKind::AllReduce, DType::BF16, {5}, DType::BF16, {5}, 2,
                         CollectiveReduction::L2Norm),
                    "an L2Norm all-reduce takes f32 (norms), got bf16");
  EXPECT_LOAD_ERROR(plan(KernelKind::AllGather, DType::F32, {6}, DType::F32, {12}, 2,
                         CollectiveReduction::L2Norm),
                    "reduction L2Norm applies to AllReduce only");
  // Max (FP8's cast statistics) takes f32; a reduction byte outside the enum is refused.
  EXPECT_EQ(loadError(plan(KernelKind::AllReduce, DType::F32, {2, 4}, DType::F32, {2, 4}, 2,
                           CollectiveReduction::Max)),
            "");
  EXPECT_LOAD_ERROR(
      plan(KernelKind::AllReduce, DType::BF16, {5}, DType::BF16, {5}, 2, CollectiveReduction::Max),
      "a Max all-reduce takes f32 (amaxes), got bf16");
  EXPECT_LOAD_ERROR(
      plan(KernelKind::AllReduce, DType::F32, {5}, DType::F32, {5}, 2, CollectiveReduction(7)),
      "reduction 7 is not a reduction (Sum, L2Norm or Max)");
  EXPECT_LOAD_ERROR(
      plan(KernelKind::ShardSlice, DType::F32, {12}, DType::F32, {6}, 2, CollectiveReduction::Max),
      "reduction Max applies to AllReduce only");
  EXPECT_LOAD_ERROR(plan(KernelKind::AllReduce, DType::F32, {5}, DType::F32, {6}),
                    "y (tensor 4 'y') shape: expected [5], got [6]");
}

// A sharded NF4 weight: u8 shares of its storage bytes, gathered into the NF4 tensor that
// Dequantize reads; what the loader refuses about them, naming the rule.
TEST(ShardContract, Nf4StorageShares) {
  const uint64_t whole = nf4StorageBytes(64 * 64, 64, 256);
  ASSERT_EQ(whole, 2120u);
  PlanSpec p = basePlan(2);
  uint32_t q = nf4Share(p, "q", 2);
  uint32_t full = addBytes(p, "q.full", DType::NF4, {64, 64}, whole, TensorRole::Activation, 1);
  uint32_t w = p.add("q.dequantized", DType::F32, {64, 64}, TensorRole::Activation, 1);
  p.kernel(KernelKind::AllGather, {q}, {full}, fb::KernelAttrs::CollectiveAttrs,
           collectiveAttrs(2, CollectiveReduction::Sum));
  p.kernel(KernelKind::Dequantize, {full}, {w});
  ASSERT_EQ(loadError(p), "");
  LoadedPlan plan = load(p);
  const TensorInfo &t = plan.tensors[q];
  EXPECT_TRUE(t.nf4Share());
  EXPECT_EQ(t.wholeDType(), DType::NF4);
  EXPECT_EQ(t.wholeBytes(), whole);
  EXPECT_EQ(t.shardOffset(1), 1060);

  PlanSpec bad = p;
  bad.tensors[q].shape = {1000};
  bad.tensors[q].bytes = 1000;
  EXPECT_LOAD_ERROR(bad, "'q' is a u8 share over 2 ranks of the nf4 storage of full_shape "
                         "[64, 64] (2120 bytes), expected shape [1060], got [1000]");
  bad = p;
  bad.tensors[q].shardRanks = 0;
  bad.tensors[q].fullShape = {};
  EXPECT_LOAD_ERROR(bad, "'q' is u8 but not sharded: u8 tensors are the shares of sharded nf4 "
                         "storage");
  bad = p;
  bad.tensors[q].quantBlock = 0;
  EXPECT_LOAD_ERROR(bad, "'q' is a u8 share of nf4 storage with block size 0: expected a power "
                         "of two");
  bad = p;
  bad.tensors[q].trainable = true;
  EXPECT_LOAD_ERROR(bad, "'q' is a trainable u8 share of nf4 storage: NF4 weights are frozen");
  bad = p;
  bad.tensors[full].shardRanks = 2;
  bad.tensors[full].fullShape = {128, 64};
  EXPECT_LOAD_ERROR(bad, "'q.full' is an nf4 tensor sharded over ranks: a share of nf4 storage "
                         "is u8 (its bytes)");
  // The gather must rebuild this very layout, and only a gather reads the bytes.
  bad = p;
  bad.tensors[q].fullShape = {32, 128};
  EXPECT_LOAD_ERROR(bad, "shard (tensor 3 'q') is a share of the nf4 storage of [32, 128] with "
                         "blocks (64, 256), but full (tensor 4 'q.full') is [64, 64] with blocks "
                         "(64, 256)");
  bad = p;
  bad.kernels[1].outputs = {w};
  bad.kernels[1].kind = KernelKind::AllGather;
  bad.kernels.pop_back();
  EXPECT_LOAD_ERROR(bad, "an nf4 tensor is gathered from the u8 shares of its storage");
  bad = p;
  bad.kernels[1].kind = KernelKind::Copy;
  bad.kernels[1].attrsType = fb::KernelAttrs::NONE;
  bad.kernels[1].attrs = nullptr;
  bad.kernels[1].outputs = {full};
  EXPECT_LOAD_ERROR(bad, "is u8 (a share of nf4 storage), which only an AllGather reads");
}

// DoRA's magnitude sharded (and its base weight sharded or not): its full_shape is the whole
// base weight's row count.
TEST(ShardContract, RowNormsOfShards) {
  PlanSpec p = basePlan(2);
  uint32_t w = shardOf(p, "w", {64}, {8, 16}, 2, TensorRole::Parameter, 0);
  p.tensors[w].trainable = false;
  uint32_t m = shardOf(p, "w.lora_magnitude_vector", {4}, {8}, 2, TensorRole::Parameter, 0);
  p.tensors[m].init = TensorInit::RowNorm;
  p.tensors[m].initSource = w;
  EXPECT_EQ(loadError(p), "");
  PlanSpec bad = p;
  bad.tensors[m].shape = {3};
  bad.tensors[m].bytes = 12;
  bad.tensors[m].fullShape = {6};
  EXPECT_LOAD_ERROR(bad, "shape [6] is not the row count of tensor 3 'w' [8, 16] (RowNorm gives "
                         "one norm per row)");
}

// The fuzzers' sharded seed (TestPlans.h) loads: a flat shard, an NF4 share, the gathers, the
// dequantize and an all-reduce; the NF4 share is 38 bytes of the head's 76.
TEST(ShardContract, TheShardedSeedPlanLoads) {
  ASSERT_EQ(loadError(shardedPlanSpec()), "");
  LoadedPlan plan = load(shardedPlanSpec());
  // Only the collectives run on the collectives stream; the dequantize reading a gather waits
  // for it.
  PlanSpec bad = shardedPlanSpec();
  for (KernelSpec &k : bad.kernels)
    if (k.kind == KernelKind::Dequantize)
      k.stream = uint8_t(StreamId::Collectives);
  EXPECT_LOAD_ERROR(bad, "runs on the collectives stream, but only the exchanges with other "
                         "ranks (ReduceScatter, AllGather, AllReduce) run there");
  for (size_t k = 0; k < plan.kernels.size(); ++k)
    if (plan.kernels[k].kind == KernelKind::Dequantize) {
      ASSERT_EQ(plan.kernels[k].waits.size(), 1u);
      EXPECT_EQ(plan.kernels[plan.kernels[k].waits[0]].kind, KernelKind::AllGather);
    }
  EXPECT_EQ(nf4StorageBytes(16 * 8, 64, 256), 76u);
  for (const TensorInfo &t : plan.tensors)
    if (t.name == "lm_head.weight") {
      EXPECT_TRUE(t.nf4Share());
      EXPECT_EQ(t.bytes, 38u);
    }
}

TEST(ShardExecutor, RanksMustMatchTheCommunicator) {
  PlanSpec p = basePlan(2);
  shardOf(p, "w", {3, 4}, {6, 4}, 2, TensorRole::Parameter, 0);
  LoadedPlan plan = load(p);
  try {
    Executor e(plan);
    FAIL() << "a plan of 2 ranks ran on one";
  } catch (const Error &e) {
    EXPECT_STREQ(e.what(), "plan 'c.plan' was compiled for 2 ranks (bonsai.shard \"zero3\" ranks "
                           "2): start it as 2 processes, mpirun -np 2 bonsai-run ...");
  }
}

/// Says rank `rank` of `size` and moves nothing: what a rank's shards hold after init, binding
/// and copies needs no other rank.
class FakeRank final : public Communicator {
public:
  FakeRank(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int localRank() const override { return rank_; }
  int localSize() const override { return size_; }
  double timeoutSeconds() const override { return 1; }
  const char *backendName() const override { return "fake"; }

protected:
  [[noreturn]] void refuse() { throw Error("the fake rank has no collectives"); }
  void doAllReduceSum(const void *, void *, size_t, DType, const std::string &) override {
    refuse();
  }
  void doReduceScatterSum(const void *, void *, size_t, DType, const std::string &) override {
    refuse();
  }
  void doAllGather(const void *, void *, size_t, DType, const std::string &) override { refuse(); }
  void doBroadcast(void *, size_t, DType, int, const std::string &) override { refuse(); }
  void doRingShift(const void *, void *, size_t, DType, int, const std::string &) override {
    refuse();
  }
  void doBarrier(const std::string &) override { refuse(); }

private:
  int rank_, size_;
};

TEST(ShardExecutor, OneRankOfSeveralRefusesAPlanOfOne) {
  LoadedPlan plan = load(basePlan(1));
  FakeRank comm(1, 2);
  ExecutorOptions options;
  options.communicator = &comm;
  try {
    Executor e(plan, options);
    FAIL() << "a plan of one rank ran as rank 1 of 2";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("runs on one rank, but this process is rank 1 of 2"),
              std::string::npos)
        << e.what();
  }
}

// Rank 1 of 2: a sharded parameter is its slice of the 1-rank init or of the bound tensor, and
// a shard copied from a whole parameter (fp32 masters of ZeRO-1/2) is the slice, converted.
TEST(ShardExecutor, ShardsAreSlicesOfTheWhole) {
  PlanSpec p = basePlan(2);
  uint32_t w = shardOf(p, "layers.0.w", {3, 4}, {6, 4}, 2, TensorRole::Parameter, 0);
  uint32_t whole = p.add("layers.0.v", DType::BF16, {4, 4}, TensorRole::Parameter, 0);
  uint32_t master = shardOf(p, "layers.0.v.master", {8}, {4, 4}, 2, TensorRole::OptimizerState, 0);
  p.tensors[master].init = TensorInit::CopyOf;
  p.tensors[master].initSource = whole;
  LoadedPlan plan = load(p);
  FakeRank comm(1, 2);
  ExecutorOptions options;
  options.communicator = &comm;
  Executor e(plan, options);
  EXPECT_EQ(e.rank(), 1);
  EXPECT_EQ(e.ranks(), 2);
  e.initWeights(9);
  std::vector<float> full(24);
  initTensor("layers.0.w", initRuleFor("layers.0.w", 2), 9, {full.data(), DType::F32, {6, 4}});
  std::vector<float> shard = floatsOf(e, w);
  ASSERT_EQ(shard.size(), 12u);
  EXPECT_EQ(std::memcmp(shard.data(), full.data() + 12, 12 * sizeof(float)), 0);
  std::vector<float> v = floatsOf(e, whole), m = floatsOf(e, master);
  EXPECT_EQ(std::memcmp(m.data(), v.data() + 8, 8 * sizeof(float)), 0);

  // Bound from a file holding the whole tensors: the shard reads its slice (converted).
  std::string dir = makeTempDir("shard-bind");
  std::vector<float> wValues(24), vValues(16);
  for (size_t i = 0; i < wValues.size(); ++i)
    wValues[i] = float(i) + 0.5f;
  for (size_t i = 0; i < vValues.size(); ++i)
    vValues[i] = -float(i);
  std::vector<uint16_t> wHalf(24);
  TensorView wView{wHalf.data(), DType::BF16, {6, 4}};
  storeF32(wValues.data(), wView);
  writeSafetensors(dir + "/w.safetensors", {{"layers.0.w", DType::BF16, {6, 4}, wHalf.data()},
                                            {"layers.0.v", DType::F32, {4, 4}, vValues.data()}});
  e.bindWeights(Checkpoint::open(dir + "/w.safetensors"));
  shard = floatsOf(e, w);
  for (size_t i = 0; i < 12; ++i)
    EXPECT_EQ(shard[i], wValues[12 + i]) << i;
  m = floatsOf(e, master);
  for (size_t i = 0; i < 8; ++i)
    EXPECT_EQ(m[i], vValues[8 + i]) << i;

  // A file whose tensor has the shard's shape, not the whole's, is refused, naming both.
  writeSafetensors(dir + "/bad.safetensors", {{"layers.0.w", DType::F32, {3, 4}, wValues.data()},
                                              {"layers.0.v", DType::F32, {4, 4}, vValues.data()}});
  try {
    e.bindWeights(Checkpoint::open(dir + "/bad.safetensors"));
    FAIL() << "a shard-shaped tensor was bound";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what())
                  .find("layers.0.w (plan shard of 2 of [6, 4] f32, checkpoint [3, 4] F32)"),
              std::string::npos)
        << error.what();
  }
  removeTree(dir);
}

// Rank 1 of 2: a sharded DoRA magnitude of a whole base weight (ZeRO-1/2) is its slice of the
// whole weight's row norms.
TEST(ShardExecutor, ShardedMagnitudeIsItsSliceOfTheRowNorms) {
  PlanSpec p = basePlan(2);
  uint32_t w = p.add("w", DType::F32, {8, 16}, TensorRole::Parameter, 0);
  p.tensors[w].trainable = false;
  uint32_t m = shardOf(p, "w.lora_magnitude_vector", {4}, {8}, 2, TensorRole::Parameter, 0);
  p.tensors[m].init = TensorInit::RowNorm;
  p.tensors[m].initSource = w;
  LoadedPlan plan = load(p);
  FakeRank comm(1, 2);
  ExecutorOptions options;
  options.communicator = &comm;
  Executor e(plan, options);
  e.initWeights(4);
  std::vector<float> weight = floatsOf(e, w), norms(8);
  initRowNorm({weight.data(), DType::F32, {8, 16}}, {norms.data(), DType::F32, {8}});
  std::vector<float> shard = floatsOf(e, m);
  ASSERT_EQ(shard.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(shard[i], norms[4 + i]) << i;
}

// Rank 1 of 2 with a sharded NF4 weight: its share is bytes [1060, 2120) of the whole weight
// quantized, for the random init and for bound f32 weights; bound from saved NF4 storage (U8
// [2120]), the same bytes of it.
TEST(ShardExecutor, Nf4SharesAreBytesOfTheWholeStorage) {
  PlanSpec p = basePlan(2);
  uint32_t q = nf4Share(p, "layers.0.q_proj.weight", 2);
  LoadedPlan plan = load(p);
  FakeRank comm(1, 2);
  ExecutorOptions options;
  options.communicator = &comm;
  Executor e(plan, options);
  auto shareBytes = [&] {
    const auto *b = static_cast<const uint8_t *>(e.view(q).data);
    return std::vector<uint8_t>(b, b + 1060);
  };
  auto wholeOf = [](const std::vector<float> &values) {
    std::vector<uint8_t> storage(2120);
    quantizeNf4(values.data(), values.size(), 64, 256, storage.data());
    return storage;
  };
  e.initWeights(9);
  std::vector<float> drawn(64 * 64);
  initTensor("layers.0.q_proj.weight", initRuleFor("layers.0.q_proj.weight", 2), 9,
             {drawn.data(), DType::F32, {64, 64}});
  std::vector<uint8_t> storage = wholeOf(drawn);
  EXPECT_EQ(shareBytes(), std::vector<uint8_t>(storage.begin() + 1060, storage.end()));

  std::string dir = makeTempDir("shard-nf4");
  std::vector<float> values(64 * 64);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = std::sin(float(i) * 0.37f) * (1.0f + float(i % 64) / 16.0f);
  writeSafetensors(dir + "/w.safetensors",
                   {{"layers.0.q_proj.weight", DType::F32, {64, 64}, values.data()}});
  e.bindWeights(Checkpoint::open(dir + "/w.safetensors"));
  storage = wholeOf(values);
  EXPECT_EQ(shareBytes(), std::vector<uint8_t>(storage.begin() + 1060, storage.end()));

  for (size_t i = 0; i < storage.size(); ++i)
    storage[i] = uint8_t(i * 7 + 3);
  writeSafetensors(dir + "/s.safetensors",
                   {{"layers.0.q_proj.weight", DType::U8, {2120}, storage.data()}});
  e.bindWeights(Checkpoint::open(dir + "/s.safetensors"));
  EXPECT_EQ(shareBytes(), std::vector<uint8_t>(storage.begin() + 1060, storage.end()));
  removeTree(dir);
}

// A full checkpoint (no adapters) saves an NF4 weight as its storage bytes, whole or shared
// out: a plan that shares it out over one rank (its u8 share is all B bytes) and the plan that
// keeps it whole load each other's checkpoints, every byte of the weight restored.
TEST(ShardExecutor, Nf4SharesResumeOnTheWholePlanAndBack) {
  PlanSpec shared = basePlan(1);
  shared.shardStrategy = "zero3";
  uint32_t q = nf4Share(shared, "layers.0.q_proj.weight", 1);
  PlanSpec whole = basePlan(1);
  uint32_t w = addBytes(whole, "layers.0.q_proj.weight", DType::NF4, {64, 64}, 2120,
                        TensorRole::Parameter, 0);
  LoadedPlan sharedPlan = load(shared), wholePlan = load(whole);
  std::string root = makeTempDir("shard-nf4-ckpt");
  auto bytesOf = [](const Executor &e, uint32_t t) {
    const auto *b = static_cast<const uint8_t *>(e.view(t).data);
    return std::vector<uint8_t>(b, b + 2120);
  };
  Executor a(sharedPlan);
  a.initWeights(5);
  std::string dir = saveCheckpoint(root + "/a", a, TrainingPosition{1, 2, 5});
  Executor b(wholePlan);
  b.initWeights(6);
  loadCheckpoint(dir, b);
  EXPECT_EQ(bytesOf(b, w), bytesOf(a, q));

  Executor c(wholePlan);
  c.initWeights(7);
  dir = saveCheckpoint(root + "/c", c, TrainingPosition{1, 2, 7});
  Executor d(sharedPlan);
  d.initWeights(8);
  loadCheckpoint(dir, d);
  EXPECT_EQ(bytesOf(d, q), bytesOf(c, w));
  EXPECT_NE(bytesOf(d, q), bytesOf(a, q)) << "seeds 5 and 7 drew the same weight";
  removeTree(root);
}

// On one rank every collective is a copy, bit for bit; the L2Norm of one rank is sqrt(x^2).
TEST(ShardExecutor, OneRankCollectivesAreExact) {
  PlanSpec p = basePlan(1);
  auto add = [&](const char *name, DType dtype, std::vector<int64_t> shape) {
    return p.add(name, dtype, std::move(shape), TensorRole::Activation, 1);
  };
  uint32_t a = add("a", DType::BF16, {3, 5}), sa = add("sa", DType::BF16, {15});
  uint32_t b = add("b", DType::F16, {15}), sb = add("sb", DType::F16, {5, 3});
  uint32_t c = add("c", DType::I32, {7}), fc = add("fc", DType::I32, {7});
  uint32_t d = add("d", DType::F32, {9}), yd = add("yd", DType::F32, {9});
  uint32_t n = add("n", DType::F32, {4}), yn = add("yn", DType::F32, {4});
  auto one = [](CollectiveReduction r = CollectiveReduction::Sum) { return collectiveAttrs(1, r); };
  p.kernel(KernelKind::ShardSlice, {a}, {sa}, fb::KernelAttrs::CollectiveAttrs, one());
  p.kernel(KernelKind::ReduceScatter, {b}, {sb}, fb::KernelAttrs::CollectiveAttrs, one());
  p.kernel(KernelKind::AllGather, {c}, {fc}, fb::KernelAttrs::CollectiveAttrs, one());
  p.kernel(KernelKind::AllReduce, {d}, {yd}, fb::KernelAttrs::CollectiveAttrs, one());
  p.kernel(KernelKind::AllReduce, {n}, {yn}, fb::KernelAttrs::CollectiveAttrs,
           one(CollectiveReduction::L2Norm));
  LoadedPlan plan = load(p);
  Executor e(plan);
  const std::vector<TensorView> &views = e.views();
  std::vector<float> values = {1.5f, -2.25f, 3e-8f, 65504.0f, 1e30f, -0.0f, 7.0f, 0.1f, 3.0f};
  for (uint32_t t : {a, b, d, n}) {
    std::vector<float> v(size_t(plan.tensors[t].numel));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = values[i % values.size()] * float(i + 1);
    storeF32(v.data(), views[t]);
  }
  for (int32_t i = 0; i < 7; ++i)
    static_cast<int32_t *>(views[c].data)[i] = i * 1000003;
  e.runStep();
  for (auto [in, out] : {std::pair{a, sa}, {b, sb}, {c, fc}, {d, yd}})
    EXPECT_EQ(std::memcmp(e.view(in).data, e.view(out).data, plan.tensors[in].bytes), 0)
        << plan.tensors[in].name;
  std::vector<float> x = floatsOf(e, n), y = floatsOf(e, yn);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_EQ(y[i], std::sqrt(x[i] * x[i])) << i;
}

} // namespace
} // namespace bonsai::rt
