//===- ShardMpiTest.cpp - The collective kernel kinds across MPI ranks ----===//
//
// Run by run-mpi-test.sh under `mpirun -np N` (N = 2, 4): one plan of ShardSlice,
// ReduceScatter, AllGather and AllReduce (Sum and L2Norm) kernels of N ranks, run by the
// executor on the CPU backend, whose handlers go through the MPI communicator
// (docs/sharding.md). Every rank fills its inputs from (rank, tensor, element), computes what
// every rank's outputs must be from every rank's inputs (sums in rank order in fp32, rounded
// once), and compares the plan's outputs with them bit for bit; it prints a DIGEST of all
// outputs (run-mpi-test.sh's `repeat` mode runs the job twice and compares them) and exits 0
// when every output matched. Also checked: a plan of N ranks refused by an executor without a
// communicator, a sharded parameter initialized as its slice of the 1-rank init, and training
// steps of N ranks equal to the 1-rank steps of N micro-batches (checkTraining).
//
//===----------------------------------------------------------------------===//

#include "../TestPlans.h"

#include "bonsai/runtime/Communicator.h"
#include "bonsai/runtime/Data.h"
#include "bonsai/runtime/Executor.h"
#include "bonsai/runtime/Init.h"
#include "bonsai/runtime/Sha256.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using namespace bonsai::rt;
using namespace bonsai::rt::test;
namespace fb = bonsai::plan;

namespace {

int failures = 0;

void fail(int rank, const std::string &what) {
  std::printf("FAIL rank %d: %s\n", rank, what.c_str());
  ++failures;
}

/// Input element i of tensor `t` on rank `rank`: exponents spread over 2^-10..2^10 so that
/// another summation order gives other bits.
float valueOf(int rank, uint32_t t, int64_t i) {
  uint64_t h = uint64_t(rank + 1) * 0x9E3779B97F4A7C15ull ^ uint64_t(t) * 0xC2B2AE3D27D4EB4Full ^
               uint64_t(i) * 0x165667B19E3779F9ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  float mantissa = float(h % 2001) / 1000.0f - 1.0f; // [-1, 1]
  int exponent = int((h >> 20) % 21) - 10;
  return std::ldexp(mantissa, exponent);
}

/// `values` stored as `dtype` and read back: what a rank's input of that dtype holds.
std::vector<float> rounded(std::vector<float> values, DType dtype) {
  std::vector<uint8_t> bytes(values.size() * dtypeSize(dtype));
  TensorView v{bytes.data(), dtype, {int64_t(values.size())}};
  storeF32(values.data(), v);
  loadF32(v, values.data());
  return values;
}

std::vector<float> inputOf(int rank, uint32_t t, int64_t n, DType dtype) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = valueOf(rank, t, i);
  return rounded(v, dtype);
}

struct Case {
  std::string what;
  uint32_t in = 0, out = 0;
  std::vector<float> expected; // in `out`'s dtype, widened to f32
};

/// A data-parallel step equals one rank's step of all its micro-batches: the test plans'
/// trained model (TestPlans.h), every rank with one micro-batch a step and its gradient
/// accumulators all-reduced in place ahead of the update (ZeRO-1's gradients, without
/// sharding), against the 1-rank plan with `ranks` micro-batches a step, run on every rank.
/// One micro-batch per rank sums the gradients in the 1-rank run's order (((0 + g0) + g1) +
/// ...: the accumulation there, the rank-order sum here), so losses, gradient norms and
/// weights agree bit for bit, step after step.
void checkTraining(Communicator &comm) {
  const int rank = comm.rank(), ranks = comm.size();
  TrainingDims dims;
  dims.microBatches = uint32_t(ranks);
  TrainingTensors t;
  PlanSpec one = trainingPlanSpec(dims, &t);
  PlanSpec many = one;
  many.ranks = uint32_t(ranks);
  many.shardStrategy = "zero1";
  many.microBatches = 1;
  size_t norm = 0;
  while (many.kernels[norm].kind != KernelKind::GradNorm)
    ++norm;
  for (uint32_t g : {t.gradTable, t.gradHead}) {
    KernelSpec k;
    k.kind = KernelKind::AllReduce;
    k.inputs = {g};
    k.outputs = {g};
    k.attrsType = fb::KernelAttrs::CollectiveAttrs;
    k.attrs = collectiveAttrs(uint32_t(ranks));
    k.name = "all_reduce " + many.tensors[g].name;
    k.phase = Phase::Update;
    many.kernels.insert(many.kernels.begin() + long(norm), k);
  }
  std::vector<uint8_t> oneBytes = buildPlan(one), manyBytes = buildPlan(many);
  LoadedPlan onePlan = loadPlanBuffer(oneBytes.data(), oneBytes.size(), "one.plan");
  LoadedPlan manyPlan = loadPlanBuffer(manyBytes.data(), manyBytes.size(), "many.plan");
  Executor reference(onePlan);
  ExecutorOptions options;
  options.communicator = &comm;
  Executor sharded(manyPlan, options);
  reference.initWeights(11);
  sharded.initWeights(11);
  TokenLoader referenceData("", dims.batch, dims.seq, dims.vocab, 11);
  TokenLoader shardedData("", dims.batch, dims.seq, dims.vocab, 11);
  uint64_t position = 0;
  for (int step = 1; step <= 4; ++step) {
    StepResult want = reference.trainStep(referenceData, position, uint32_t(ranks));
    sharded.setWhere("step " + std::to_string(step));
    StepResult got = sharded.trainStep(shardedData, position, 1);
    position += uint64_t(ranks);
    std::string where = "training step " + std::to_string(step) + ": ";
    if (std::memcmp(&want.loss, &got.loss, sizeof(float)) != 0)
      fail(rank, where + "loss " + std::to_string(got.loss) + ", the 1-rank run's " +
                     std::to_string(want.loss));
    if (got.microBatchLosses != want.microBatchLosses)
      fail(rank, where + "the micro-batch losses differ from the 1-rank run's");
    if (!got.gradNorm || !want.gradNorm || *got.gradNorm != *want.gradNorm)
      fail(rank, where + "grad_norm differs from the 1-rank run's");
    for (uint32_t w : {t.table, t.head})
      if (floatsOf(sharded, w) != floatsOf(reference, w))
        fail(rank, where + "weight '" + onePlan.tensors[w].name + "' differs");
    if (rank == 0)
      std::printf("training step %d: loss %.9g (1 rank: %.9g), grad_norm %.9g\n", step,
                  double(got.loss), double(want.loss), double(got.gradNorm.value_or(-1)));
  }
}

} // namespace

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  std::unique_ptr<Communicator> comm = makeCommunicator();
  const int rank = comm->rank(), ranks = comm->size();
  const int64_t n = 37; // elements per shard: odd, not a multiple of anything

  PlanSpec p;
  p.model = "shard-kinds";
  p.ranks = uint32_t(ranks);
  p.shardStrategy = "zero3";
  p.arenas = {{"weights", Lifetime::Persistent, 0, 256}, {"step", Lifetime::Step, 0, 256}};
  uint32_t ids = p.add("ids", DType::I32, {1, 4}, TensorRole::Input, 1);
  uint32_t labels = p.add("labels", DType::I32, {1, 4}, TensorRole::Input, 1);
  p.loss = p.add("loss", DType::F32, {}, TensorRole::Loss, 1);
  p.kernel(KernelKind::Fill, {}, {p.loss}, fb::KernelAttrs::FillAttrs, fillAttrs(0.0));
  p.inputs = {ids, labels};
  p.tokensPerStep = 4;
  p.vocabSize = 16;
  const int64_t full = n * ranks;
  auto attrs = [&](CollectiveReduction r = CollectiveReduction::Sum) {
    return collectiveAttrs(uint32_t(ranks), r);
  };
  std::vector<Case> cases;
  // A sharded parameter: rank r's slice of what one rank initializes for "w" [ranks, n].
  uint32_t w = p.add("w", DType::F32, {n}, TensorRole::Parameter, 0);
  p.tensors[w].shardRanks = uint32_t(ranks);
  p.tensors[w].fullShape = {int64_t(ranks), n};
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    std::string type = dtypeName(dtype);
    // ShardSlice: this rank's slice of its own full tensor.
    uint32_t a = p.add("slice_in_" + type, dtype, {int64_t(ranks), n}, TensorRole::Activation, 1);
    uint32_t sa = p.add("slice_out_" + type, dtype, {n}, TensorRole::Activation, 1);
    p.kernel(KernelKind::ShardSlice, {a}, {sa}, fb::KernelAttrs::CollectiveAttrs, attrs());
    // ReduceScatter: shard r of the rank-order sum.
    uint32_t b = p.add("rs_in_" + type, dtype, {full}, TensorRole::Activation, 1);
    uint32_t sb = p.add("rs_out_" + type, dtype, {n, 1}, TensorRole::Activation, 1);
    p.kernel(KernelKind::ReduceScatter, {b}, {sb}, fb::KernelAttrs::CollectiveAttrs, attrs());
    // AllGather: every rank's shard in rank order.
    uint32_t c = p.add("ag_in_" + type, dtype, {n}, TensorRole::Activation, 1);
    uint32_t fc = p.add("ag_out_" + type, dtype, {full}, TensorRole::Activation, 1);
    p.kernel(KernelKind::AllGather, {c}, {fc}, fb::KernelAttrs::CollectiveAttrs, attrs());
    // AllReduce Sum, out of place.
    uint32_t d = p.add("ar_in_" + type, dtype, {3, n}, TensorRole::Activation, 1);
    uint32_t yd = p.add("ar_out_" + type, dtype, {3, n}, TensorRole::Activation, 1);
    p.kernel(KernelKind::AllReduce, {d}, {yd}, fb::KernelAttrs::CollectiveAttrs, attrs());

    std::vector<float> mineA = inputOf(rank, a, full, dtype);
    cases.push_back({"shard_slice " + type, a, sa,
                     std::vector<float>(mineA.begin() + rank * n, mineA.begin() + (rank + 1) * n)});
    std::vector<float> sum(size_t(n), 0.0f), gathered, reduced(size_t(3 * n), 0.0f);
    for (int r = 0; r < ranks; ++r) {
      std::vector<float> in = inputOf(r, b, full, dtype);
      for (int64_t i = 0; i < n; ++i)
        sum[size_t(i)] += in[size_t(rank * n + i)];
      std::vector<float> shard = inputOf(r, c, n, dtype);
      gathered.insert(gathered.end(), shard.begin(), shard.end());
      std::vector<float> x = inputOf(r, d, 3 * n, dtype);
      for (size_t i = 0; i < reduced.size(); ++i)
        reduced[i] += x[i];
    }
    cases.push_back({"reduce_scatter " + type, b, sb, rounded(sum, dtype)});
    cases.push_back({"all_gather " + type, c, fc, gathered});
    cases.push_back({"all_reduce sum " + type, d, yd, rounded(reduced, dtype)});
  }
  // AllReduce Sum in place, and L2Norm (f32): sqrt of the rank-order f32 sum of f32 squares.
  uint32_t e = p.add("ar_inplace", DType::F32, {n}, TensorRole::Activation, 1);
  p.kernel(KernelKind::AllReduce, {e}, {e}, fb::KernelAttrs::CollectiveAttrs, attrs());
  uint32_t f = p.add("norms", DType::F32, {5}, TensorRole::Activation, 1);
  uint32_t yf = p.add("global_norms", DType::F32, {5}, TensorRole::Activation, 1);
  p.kernel(KernelKind::AllReduce, {f}, {yf}, fb::KernelAttrs::CollectiveAttrs,
           attrs(CollectiveReduction::L2Norm));
  {
    std::vector<float> sum(size_t(n), 0.0f), squares(5, 0.0f);
    for (int r = 0; r < ranks; ++r) {
      std::vector<float> x = inputOf(r, e, n, DType::F32);
      for (int64_t i = 0; i < n; ++i)
        sum[size_t(i)] += x[size_t(i)];
      std::vector<float> norms = inputOf(r, f, 5, DType::F32);
      for (size_t i = 0; i < 5; ++i)
        squares[i] += norms[i] * norms[i];
    }
    for (float &s : squares)
      s = std::sqrt(s);
    cases.push_back({"all_reduce sum in place f32", e, e, sum});
    cases.push_back({"all_reduce l2norm f32", f, yf, squares});
  }
  // AllReduce Max (f32, FP8's amax statistics): every rank gets the largest.
  uint32_t g = p.add("amaxes", DType::F32, {6}, TensorRole::Activation, 1);
  uint32_t yg = p.add("global_amaxes", DType::F32, {6}, TensorRole::Activation, 1);
  p.kernel(KernelKind::AllReduce, {g}, {yg}, fb::KernelAttrs::CollectiveAttrs,
           attrs(CollectiveReduction::Max));
  {
    std::vector<float> largest = inputOf(0, g, 6, DType::F32);
    for (int r = 1; r < ranks; ++r) {
      std::vector<float> x = inputOf(r, g, 6, DType::F32);
      for (size_t i = 0; i < 6; ++i)
        largest[i] = std::max(largest[i], x[i]);
    }
    cases.push_back({"all_reduce max f32", g, yg, largest});
  }

  std::vector<uint8_t> bytes = buildPlan(p);
  LoadedPlan plan = loadPlanBuffer(bytes.data(), bytes.size(), "shard-kinds.plan");

  // Without a communicator of N ranks the executor refuses the plan, naming how to start it.
  try {
    Executor refused(plan);
    fail(rank,
         "an executor without a communicator ran a plan of " + std::to_string(ranks) + " ranks");
  } catch (const Error &error) {
    std::string message = error.what();
    if (message.find("was compiled for " + std::to_string(ranks) + " ranks") == std::string::npos ||
        message.find("mpirun -np " + std::to_string(ranks)) == std::string::npos)
      fail(rank, "unexpected refusal: " + message);
  }

  ExecutorOptions options;
  options.communicator = comm.get();
  Executor executor(plan, options);
  executor.initWeights(5);
  {
    // The 1-rank init of "w" [ranks, n], sliced.
    std::vector<float> whole(static_cast<size_t>(full));
    TensorView v{whole.data(), DType::F32, {int64_t(ranks), n}};
    initTensor("w", initRuleFor("w", 2), 5, v);
    std::vector<float> shard = floatsOf(executor, w);
    if (std::memcmp(shard.data(), whole.data() + rank * n, size_t(n) * sizeof(float)) != 0)
      fail(rank, "the sharded parameter is not its slice of the 1-rank init");
  }
  const std::vector<TensorView> &views = executor.views();
  for (const Case &c : cases) {
    const TensorInfo &t = plan.tensors[c.in];
    std::vector<float> input = inputOf(rank, c.in, t.numel, t.dtype);
    storeF32(input.data(), views[c.in]);
  }
  executor.setWhere("step 1");
  executor.runStep();
  Sha256 digest;
  for (const Case &c : cases) {
    const TensorInfo &t = plan.tensors[c.out];
    std::vector<float> got(size_t(t.numel));
    loadF32(executor.view(c.out), got.data());
    digest.update(got.data(), got.size() * sizeof(float));
    if (got.size() != c.expected.size()) {
      fail(rank, c.what + ": " + std::to_string(got.size()) + " elements, expected " +
                     std::to_string(c.expected.size()));
      continue;
    }
    for (size_t i = 0; i < got.size(); ++i)
      if (std::memcmp(&got[i], &c.expected[i], sizeof(float)) != 0) {
        fail(rank, c.what + ": element " + std::to_string(i) + " is " + std::to_string(got[i]) +
                       ", expected " + std::to_string(c.expected[i]));
        break;
      }
  }
  checkTraining(*comm);

  // Every rank's digest: the gathered results are the same on every rank where they should
  // be (the sums and gathers), so rank 0 prints the digest of the whole job.
  std::string mine = toHex(digest.digest());
  std::vector<char> all(mine.size() * size_t(ranks));
  comm->allGather(mine.data(), all.data(), mine.size() / 4, DType::I32, "digests");
  if (rank == 0)
    std::printf("DIGEST %s\n", sha256Hex(std::string_view(all.data(), all.size())).c_str());
  std::printf("rank %d of %d: %zu collective kernels checked, %d failure(s)\n", rank, ranks,
              cases.size(), failures);
  comm->barrier("the end");
  return failures == 0 ? 0 : 1;
}
