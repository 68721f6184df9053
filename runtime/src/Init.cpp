//===- Init.cpp - Deterministic random initialization of parameters -------===//
//
// Values are drawn in double precision and stored through storeF32, so a bf16 or f16 parameter
// holds the correctly rounded value of the same draw an f32 one would hold.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Init.h"
#include "bonsai/runtime/Communicator.h"
#include "bonsai/runtime/HostThreads.h"
#include "bonsai/runtime/Nf4.h"
#include "bonsai/runtime/Random.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

namespace bonsai::rt {

InitRule initRuleFor(const std::string &name, size_t rank) {
  if (rank >= 2)
    return InitRule::Normal;
  if (rank == 0)
    return InitRule::Zeros;
  auto endsWith = [&](const char *suffix) {
    std::string s(suffix);
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (endsWith("bias"))
    return InitRule::Zeros;
  if (name.find("norm") != std::string::npos || name.find("ln_") != std::string::npos)
    return InitRule::Ones;
  return InitRule::Zeros;
}

void initTensor(const std::string &name, InitRule rule, uint64_t seed, const TensorView &view,
                int64_t first) {
  if (view.dtype == DType::NF4) {
    // The same draw an f32 parameter would get, then quantized as bound weights are.
    std::vector<float> values(size_t(view.numel()));
    TensorView staging = view;
    staging.data = values.data();
    staging.dtype = DType::F32;
    initTensor(name, rule, seed, staging);
    quantizeNf4(values.data(), uint64_t(values.size()), view.quantBlock, view.quantDoubleBlock,
                static_cast<uint8_t *>(view.data));
    return;
  }
  if (view.dtype != DType::F32 && view.dtype != DType::F16 && view.dtype != DType::BF16)
    throw Error("cannot initialize parameter '" + name + "' of dtype " + dtypeName(view.dtype) +
                ": random init covers f32, f16, bf16 and nf4 (pass --weights)");
  std::vector<float> values(size_t(view.numel()));
  if (rule == InitRule::Normal) {
    // The stream is a function of the seed and the name only.
    Rng rng(seed ^ fnv1a64(name));
    // The draws before the slice: Box-Muller takes two uniforms per pair of normals, so whole
    // pairs are skipped without their logarithms and sines.
    for (int64_t i = 0; i < first / 2; ++i) {
      rng.uniform();
      rng.uniform();
    }
    if (first % 2)
      rng.normal();
    for (float &v : values)
      v = float(kInitStd * rng.normal());
  } else {
    std::fill(values.begin(), values.end(), rule == InitRule::Ones ? 1.0f : 0.0f);
  }
  storeF32(values.data(), view);
}

void initParameters(const LoadedPlan &plan, const std::vector<TensorView> &views, uint64_t seed,
                    int rank, Communicator *comm) {
  if (views.size() != plan.tensors.size())
    throw Error("internal error: initialization needs one view per plan tensor");
  // Each tensor's values depend on the seed and its name only, so the tensors are drawn on
  // several threads (a 7B model is 6.7e9 normal draws) with the same result as on one.
  std::vector<size_t> pending;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorInfo &t = plan.tensors[i];
    // Adapter parameters have their own initializer, applied below.
    if (t.role == TensorRole::Parameter && t.init == TensorInit::None)
      pending.push_back(i);
  }
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failureMutex;
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < pending.size();) {
      const TensorInfo &t = plan.tensors[pending[k]];
      try {
        // A share of NF4 storage: the whole weight drawn and quantized, its bytes kept.
        // A shard: its slice of the whole tensor, whose rank picks the rule.
        if (t.nf4Share()) {
          std::vector<uint8_t> storage;
          TensorView whole = wholeNf4View(t, storage);
          initTensor(t.name, initRuleFor(t.name, t.fullShape.size()), seed, whole);
          copyNf4Share(t, whole, rank, views[pending[k]]);
        } else if (t.sharded())
          initTensor(t.name, initRuleFor(t.name, t.fullShape.size()), seed, views[pending[k]],
                     t.shardOffset(rank));
        else
          initTensor(t.name, initRuleFor(t.name, t.shape.size()), seed, views[pending[k]]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(failureMutex);
        if (!failure)
          failure = std::current_exception();
      }
    }
  };
  unsigned threads = std::min(hostThreads(), 32u);
  threads = unsigned(std::min<size_t>(threads, pending.size()));
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < threads; ++i)
    pool.emplace_back(work);
  work();
  for (std::thread &thread : pool)
    thread.join();
  if (failure)
    std::rethrow_exception(failure);
  initUnboundParameters(plan, views, seed, std::vector<bool>(plan.tensors.size(), false), rank,
                        comm);
}

void initKaimingUniform(const std::string &name, uint64_t seed, const TensorView &view,
                        int64_t fanIn, int64_t first) {
  if (fanIn <= 0 && view.rank() != 2)
    throw Error("KaimingUniform init of '" + name + "' needs a 2-D tensor");
  // torch.nn.init.kaiming_uniform_(a=sqrt(5)), PEFT's lora_A init: bound = 1/sqrt(fan_in).
  double bound = 1.0 / std::sqrt(double(fanIn > 0 ? fanIn : view.dim(1)));
  Rng rng(seed ^ fnv1a64(name));
  for (int64_t i = 0; i < first; ++i)
    rng.uniform();
  std::vector<float> values(size_t(view.numel()));
  for (float &v : values)
    v = float(bound * (2.0 * rng.uniform() - 1.0));
  storeF32(values.data(), view);
}

void initRowNorm(const TensorView &source, const TensorView &view) {
  int64_t rows = source.dim(0), cols = source.dim(1);
  std::vector<float> w(size_t(source.numel()));
  if (source.dtype == DType::NF4)
    dequantizeNf4(static_cast<const uint8_t *>(source.data), uint64_t(w.size()),
                  source.quantBlock, source.quantDoubleBlock, w.data());
  else
    loadF32(source, w.data());
  // The norm of the values the kernels compute with: a dequantized NF4 weight reaches them in
  // the compute dtype, the magnitude's. Rounded like this, the magnitude equals the norm that
  // dora_scale computes at B = 0, and the step-0 scale is exactly 1.
  if (source.dtype == DType::NF4 && view.dtype != DType::F32) {
    std::vector<uint16_t> rounded(w.size());
    TensorView staging{rounded.data(), view.dtype, source.shape};
    storeF32(w.data(), staging);
    loadF32(staging, w.data());
  }
  std::vector<float> norms(static_cast<size_t>(rows));
  for (int64_t o = 0; o < rows; ++o) {
    double sum = 0;
    for (int64_t i = 0; i < cols; ++i) {
      double x = w[size_t(o * cols + i)];
      sum += x * x;
    }
    norms[size_t(o)] = float(std::sqrt(sum));
  }
  storeF32(norms.data(), view);
}

namespace {

/// DoRA's magnitude `i`: the row norms of its base weight. A sharded base (ZeRO-3: its shares,
/// or the u8 shares of its NF4 storage) is gathered whole first; a sharded magnitude keeps its
/// slice of the whole weight's norms, so every rank holds what one rank would.
void initShardedRowNorm(const LoadedPlan &plan, const std::vector<TensorView> &views, size_t i,
                        int rank, Communicator *comm) {
  const TensorInfo &t = plan.tensors[i], &s = plan.tensors[t.initSource];
  if (!t.sharded() && !s.sharded()) {
    initRowNorm(views[t.initSource], views[i]);
    return;
  }
  TensorView source = views[t.initSource];
  std::vector<uint8_t> gathered;
  if (s.sharded()) {
    if (!comm)
      throw Error("internal error: the row norms of '" + t.name + "' need the ranks' shares of '" +
                  s.name + "', but no communicator was given");
    gathered.resize(size_t(s.wholeBytes()));
    comm->allGather(source.data, gathered.data(), size_t(s.numel), s.dtype,
                    "the row norms of " + t.name + ", all-gather of " + s.name);
    source.data = gathered.data();
    source.dtype = s.wholeDType();
    source.shape = s.fullShape;
  }
  if (!t.sharded()) {
    initRowNorm(source, views[i]);
    return;
  }
  std::vector<uint8_t> norms(size_t(t.wholeBytes()));
  TensorView whole = views[i];
  whole.data = norms.data();
  whole.shape = t.fullShape;
  initRowNorm(source, whole);
  std::memcpy(views[i].data, norms.data() + size_t(t.shardOffset(rank)) * dtypeSize(t.dtype),
              size_t(t.bytes));
}

} // namespace

void initUnboundParameters(const LoadedPlan &plan, const std::vector<TensorView> &views,
                           uint64_t seed, const std::vector<bool> &bound, int rank,
                           Communicator *comm) {
  // Row norms read their base weight, which is bound or initialized (its init is None).
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < plan.tensors.size(); ++i) {
      const TensorInfo &t = plan.tensors[i];
      if (t.role != TensorRole::Parameter || bound[i] || t.init == TensorInit::None ||
          (t.init == TensorInit::RowNorm) != (pass == 1))
        continue;
      switch (t.init) {
      case TensorInit::Zeros:
        initTensor(t.name, InitRule::Zeros, seed, views[i]);
        break;
      case TensorInit::KaimingUniform:
        if (t.sharded())
          initKaimingUniform(t.name, seed, views[i], t.fullShape[1], t.shardOffset(rank));
        else
          initKaimingUniform(t.name, seed, views[i]);
        break;
      case TensorInit::RowNorm:
        initShardedRowNorm(plan, views, i, rank, comm);
        break;
      default:
        throw Error("internal error: parameter '" + t.name + "' has init CopyOf");
      }
    }
}

} // namespace bonsai::rt
