//===- Remat.cpp - Recompute activations in the backward pass -------------===//
//
// The `bonsai-remat` pass (see Passes.td and docs/remat.md). The pass names no model op: it
// asks CostOpInterface what an op costs and whether it is GEMM-shaped, NormalizationOpInterface
// which values open a block, ViewLikeOpInterface which ops alias their source, and
// KernelOpInterface and the side-effect interfaces whether an op can simply run again. Policy
// `auto` searches on the peak model (Remat/PeakModel.h) and checks what it chooses against the
// real planner: a copy of the function with the set applied is fused, lowered, scheduled and
// planned by the pipeline's own passes, and the arenas of the resulting step are summed. The
// forward graph and how a set is applied are in Remat/RematGraph.h.
//
//===----------------------------------------------------------------------===//

#include "Remat/ActivationOffload.h"
#include "Remat/PeakModel.h"
#include "Remat/RematGraph.h"

#include "bonsai/Analysis/PlanSummary.h"
#include "bonsai/Analysis/StepTime.h"
#include "bonsai/Conversion/Passes.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Target/TargetProfile.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/BitVector.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/Support/Debug.h"
#include "llvm/Support/Format.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <tuple>

#define DEBUG_TYPE "bonsai-remat"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIREMATPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {
using namespace remat;

/// Exhaustive search tries every subset of the candidates: 2^24 sets is about 17 million.
constexpr unsigned kMaxExhaustiveCandidates = 24;
/// Auto judges every set by the peak model, and plans the cheapest few it says fit, for
/// graphs of at most this many candidates (2^20 sets take about a second to enumerate); at
/// most kMaxExhaustivePlans plans.
constexpr unsigned kMaxModelExhaustiveCandidates = 20, kMaxExhaustivePlans = 1024;
/// The greedy moves candidates one by one while (candidates x positions) of the model, what
/// scoring every move once costs, stays within this; beyond, it moves a kind of candidate in
/// every repeated layer at once.
constexpr uint64_t kPerCandidateWork = 100'000'000;
/// Real plans auto spends keeping candidates again after the search (keepAgainOnPlans), which
/// tries at most twice as many candidates, and swaps them only where (candidates x positions)
/// stays within kSwapWork.
constexpr unsigned kRefinePlans = 8;
constexpr uint64_t kSwapWork = 10'000'000;

/// 1234567 -> "1,234,567".
std::string withCommas(int64_t value) {
  std::string digits = std::to_string(value < 0 ? -value : value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0)
      out += ',';
    out += digits[i];
  }
  return value < 0 ? "-" + out : out;
}

/// `value` as %g prints it (a time limit: "60", "0.5", "1e-06").
std::string shortest(double value) {
  std::string s;
  llvm::raw_string_ostream(s) << llvm::format("%g", value);
  return s;
}

/// `value` with three decimals.
std::string fixedPoint(double value) {
  std::string s;
  llvm::raw_string_ostream(s) << llvm::format("%.3f", value);
  return s;
}

/// `part` as a percentage of `whole`, two decimals.
std::string percent(int64_t part, int64_t whole) {
  std::string s;
  llvm::raw_string_ostream(s) << llvm::format("%.2f", 100.0 * part / std::max<int64_t>(1, whole))
                              << "%";
  return s;
}

//===----------------------------------------------------------------------===//
// Trial plans
//===----------------------------------------------------------------------===//

/// Plans copies of one function with recompute sets applied (and, with activation offload,
/// saved activations offloaded), through the pipeline's own lowering, scheduling and
/// memory-planning passes; results are memoised by set.
class TrialPlanner {
public:
  TrialPlanner(func::FuncOp function, StringRef target, StringRef profile, bool fuse,
               ArrayRef<std::string> fuseDisable, bool offload)
      : function(function), pm(function.getContext()) {
    // The copies are made by this pass and lowered at once: verifying each is wasted time.
    pm.enableVerifier(false);
    // The pipeline fuses after remat: a trial planned unfused would overstate the peak of the
    // plan that will run (the LM head's logits, above all). Fusion's remarks on the copies
    // are swallowed while they run (see evaluate).
    if (fuse) {
      BonsaiFusePassOptions fusion;
      fusion.target = target.str();
      fusion.perSiteRemarks = false;
      fusion.disable.assign(fuseDisable.begin(), fuseDisable.end());
      pm.addPass(createBonsaiFusePass(fusion));
    }
    // Activation offload places its copies after fusion, as the pipeline does, and its
    // choices are weighed by the predicted step time (getPredictedSeconds).
    if (offload) {
      pm.addPass(createBonsaiOffloadActivationsPass());
      BonsaiTimeOpsPassOptions timing;
      timing.target = profile.str();
      pm.addPass(createBonsaiTimeOpsPass(timing));
    }
    BonsaiLowerToPlanPassOptions lower;
    lower.target = target.str();
    pm.addPass(createBonsaiLowerToPlanPass(lower));
    // One gather ahead (no target to weigh a deeper prefetch on): the pipeline's schedule
    // takes a deeper one only where it fits the budget these trials hold the step to.
    pm.addPass(createBonsaiSchedulePass());
    pm.addPass(createBonsaiPlanMemoryPass());
    if (offload) {
      BonsaiPredictStepPassOptions predict;
      predict.target = profile.str();
      pm.addPass(createBonsaiPredictStepPass(predict));
    }
  }

  /// With activation offload: the bytes evaluate(recompute) offloads.
  void setOffloadBytes(std::optional<int64_t> bytes) { defaultOffload = bytes; }

  /// The planned memory of the step with `recompute` applied and, with activation offload,
  /// the default bytes of saved activations offloaded.
  FailureOr<PlanMemorySummary> evaluate(const BitVector &recompute) {
    return evaluate(recompute, defaultOffload);
  }

  /// The planned memory of the step with `recompute` applied and, given `offloadBytes`, up to
  /// that many bytes of saved activations offloaded (kOffloadActivationsAttr); with
  /// `materialization`, also what the plan keeps in per-step buffers, by op of the function
  /// (the set is planned again even if it was before: its plan must carry the tags).
  FailureOr<PlanMemorySummary> evaluate(const BitVector &recompute,
                                        std::optional<int64_t> offloadBytes,
                                        Materialization *materialization = nullptr) {
    std::pair<BitVector, int64_t> key{recompute, offloadBytes.value_or(-1)};
    if (auto it = memo.find(key); it != memo.end() && !materialization)
      return it->second.first;
    OwningOpRef<ModuleOp> scratch = ModuleOp::create(function.getLoc());
    auto copy = cast<func::FuncOp>(function->clone());
    scratch->push_back(copy);
    if (materialization)
      tagPositions(copy);
    applyRecompute(collectForwardOps(copy), recompute);
    if (offloadBytes)
      copy->setAttr(kOffloadActivationsAttr,
                    IntegerAttr::get(IntegerType::get(copy.getContext(), 64), *offloadBytes));
    // Remarks about the copies (bonsai-fuse's) would read as remarks about the model.
    ScopedDiagnosticHandler quiet(function.getContext(), [](Diagnostic &diagnostic) {
      return success(diagnostic.getSeverity() == DiagnosticSeverity::Remark);
    });
    if (failed(pm.run(*scratch)))
      return function.emitError("bonsai-remat could not plan a trial step (above)");
    auto steps = scratch->getOps<plan::StepOp>();
    if (steps.empty())
      return function.emitError("bonsai-remat's trial lowering produced no step");
    PlanMemorySummary summary = summarizePlanMemory(*steps.begin());
    if (auto seconds = (*steps.begin())->getAttrOfType<FloatAttr>("bonsai.predicted_step_seconds"))
      predicted[key] = seconds.getValueAsDouble();
    if (materialization)
      *materialization = readMaterialization(function, *steps.begin());
    memo.try_emplace(key, summary, recompute);
    LLVM_DEBUG({
      llvm::dbgs() << "trial " << memo.size() << ": peak " << summary.peakDevice << " set";
      for (unsigned i : recompute.set_bits())
        llvm::dbgs() << " " << i;
      llvm::dbgs() << "\n";
    });
    return summary;
  }

  /// Trial plans made so far (distinct sets).
  unsigned getNumPlans() const { return memo.size(); }

  /// The predicted step time of a set planned with activation offload (infinity if none).
  double getPredictedSeconds(const BitVector &recompute, std::optional<int64_t> offloadBytes) {
    auto it = predicted.find({recompute, offloadBytes.value_or(-1)});
    return it == predicted.end() ? INFINITY : it->second;
  }

  /// The trial with the smallest peak so far (ties: the fewest FLOPs, then the first set in
  /// position order), as its peak and set.
  std::pair<int64_t, BitVector> getSmallestPeak(const ForwardGraph &g) const {
    std::tuple<int64_t, int64_t, SmallVector<unsigned>> best{INT64_MAX, 0, {}};
    BitVector bestSet;
    for (auto &[memoKey, planned] : memo) {
      auto &[summary, set] = planned;
      std::tuple<int64_t, int64_t, SmallVector<unsigned>> key{summary.peakDevice, g.getFlops(set),
                                                              llvm::to_vector(set.set_bits())};
      if (bestSet.empty() || key < best) {
        best = std::move(key);
        bestSet = set;
      }
    }
    return {std::get<0>(best), bestSet};
  }

private:
  func::FuncOp function;
  PassManager pm;
  /// With activation offload, what evaluate(recompute) offloads.
  std::optional<int64_t> defaultOffload;
  /// By recompute set and bytes offloaded (-1: no offload): the plan's memory and the set.
  llvm::DenseMap<std::pair<BitVector, int64_t>, std::pair<PlanMemorySummary, BitVector>> memo;
  llvm::DenseMap<std::pair<BitVector, int64_t>, double> predicted;
};

//===----------------------------------------------------------------------===//
// The policies
//===----------------------------------------------------------------------===//

/// A recompute set with its cost and planned peak.
struct Trial {
  BitVector recompute;
  int64_t flops = 0;
  int64_t peak = 0;
};

/// The search's time: progress on stderr once it has run for a second (a line a second at
/// most), and the time limit after which it returns the best it has.
class SearchClock {
public:
  explicit SearchClock(double limitSeconds) : limit(limitSeconds) {}

  double getElapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  bool expired() const { return limit > 0 && getElapsed() > limit; }
  double getLimit() const { return limit; }
  /// Prints what `describe` writes, if a line is due.
  void progress(llvm::function_ref<void(llvm::raw_ostream &)> describe) {
    double elapsed = getElapsed();
    if (elapsed < 1 || elapsed - lastReport < 1)
      return;
    lastReport = elapsed;
    llvm::errs() << "bonsai-remat: " << llvm::format("%.1f", elapsed) << " s: ";
    describe(llvm::errs());
    llvm::errs() << "\n";
  }

private:
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double limit;
  double lastReport = 0;
};

struct RematPass : impl::BonsaiRematPassBase<RematPass> {
  using Base::Base;

  /// The candidates a fixed policy drops (does not keep); "everything" keeps nothing.
  BitVector getDropped(const ForwardGraph &g, StringRef chosen) {
    BitVector dropped = g.candidate;
    if (chosen == "none")
      dropped.reset();
    if (chosen == "full" || chosen == "selective")
      dropped.reset(g.blockInput);
    if (chosen == "selective")
      dropped.reset(g.gemm);
    return dropped;
  }

  FailureOr<Trial> evaluate(const ForwardGraph &g, TrialPlanner &planner,
                            const BitVector &recompute) {
    FailureOr<PlanMemorySummary> summary = planner.evaluate(recompute);
    if (failed(summary))
      return failure();
    return Trial{recompute, g.getFlops(recompute), summary->peakDevice};
  }

  /// The fixed policies auto falls back on, planned as the planner plans by default.
  FailureOr<SmallVector<std::pair<StringRef, Trial>>> evaluateFixed(const ForwardGraph &g,
                                                                    TrialPlanner &planner) {
    SmallVector<std::pair<StringRef, Trial>> fixed;
    for (StringRef policy : {"selective", "full", "everything"}) {
      FailureOr<Trial> trial = evaluate(g, planner, g.resolve(getDropped(g, policy)));
      if (failed(trial))
        return failure();
      fixed.emplace_back(policy, *trial);
    }
    return fixed;
  }

  /// A recompute set the peak model chose, and whether the model says it fits.
  struct ModelResult {
    BitVector recompute;
    bool met = false;
  };
  ModelResult descendOnModel(const ForwardGraph &g, const PeakModel &model, int64_t modelBudget,
                             SearchClock &clock);
  FailureOr<Trial> searchGreedy(const ForwardGraph &g, TrialPlanner &planner,
                                const PeakModel &model, int64_t budget, const Trial &none,
                                ArrayRef<std::pair<StringRef, Trial>> fixed, SearchClock &clock,
                                bool exhaustiveWhenSmall = true);
  FailureOr<Trial> keepAgainOnPlans(const ForwardGraph &g, TrialPlanner &planner,
                                    const PeakModel &model, int64_t budget, Trial best,
                                    SearchClock &clock);
  FailureOr<std::vector<BitVector>> enumerateSets(const ForwardGraph &g);
  FailureOr<Trial> searchExhaustive(const ForwardGraph &g, TrialPlanner &planner, int64_t budget);
  /// Auto's choice for `budget`: the search's, or a fixed policy's if it fits more cheaply.
  FailureOr<Trial> searchAuto(const ForwardGraph &g, TrialPlanner &planner, const PeakModel &model,
                              int64_t budget, const Trial &none,
                              ArrayRef<std::pair<StringRef, Trial>> fixed, bool exhaustive,
                              SearchClock &clock);
  LogicalResult compareSearches(func::FuncOp function, const ForwardGraph &g, TrialPlanner &planner,
                                const PeakModel &model, const Trial &none,
                                ArrayRef<std::pair<StringRef, Trial>> fixed);
  /// Which trial plans an infeasible budget was judged on.
  enum class InfeasibleScope { Fixed, Exhaustive, Greedy };
  LogicalResult reportInfeasible(func::FuncOp function, const ForwardGraph &g,
                                 TrialPlanner &planner, int64_t budget, InfeasibleScope scope);
  FailureOr<int64_t> keepOnDevice(TrialPlanner &planner, const PeakModel &model, int64_t budget,
                                  const Trial &chosen, int64_t offloadBytes);
  /// The bytes of saved activations the link can move to the host while the forward pass of
  /// `g` computes, at the rates of the `profile` option's target (INT64_MAX without rates).
  int64_t getOffloadLinkBudget(const ForwardGraph &g);
  LogicalResult rematFunction(func::FuncOp function, StringRef chosen, int64_t budget,
                              bool offload);
  void runOnOperation() override;

  /// The function being decided offloads its saved activations (for the diagnostics).
  bool offloading = false;
  /// The pinned host memory budget in bytes (the option, else the recipe target's; 0: none).
  int64_t hostBudget = 0;
  /// What the host budget leaves of itself for the offloaded activations of the function
  /// being decided, when there is a host budget and it offloads.
  std::optional<int64_t> hostRoom;
};

/// The greedy on the peak model for one model budget: drops candidates until the model's live
/// bytes stay within `modelBudget` everywhere, then keeps again what it need not drop.
///
/// Descent: a move drops one candidate, alone or with its chain (the operands, recursively,
/// that nothing keeps alive for the backward pass yet: recomputing a value from an operand
/// that would otherwise die in the forward pass only moves the memory). A move is scored by
/// the live bytes above the budget it removes, summed over the positions of the step, per
/// FLOP it adds: unlike the peak alone, the sum sees every position over the budget, so a
/// move counts when several tensors or several moments hold the peak together. Each step
/// takes the best-scored move. Scores are refreshed lazily (the best stale score is
/// re-evaluated until the best is fresh) and all of them every kRefreshEvery steps, or at
/// every step where that costs little (small graphs).
///
/// Keeping again: dropped candidates, costliest first, are kept again wherever the model
/// stays within the budget.
RematPass::ModelResult RematPass::descendOnModel(const ForwardGraph &g, const PeakModel &model,
                                                 int64_t modelBudget, SearchClock &clock) {
  constexpr unsigned kRefreshEvery = 16;
  unsigned n = g.size();
  BitVector dropped(n);
  BitVector recompute = g.resolve(dropped);
  int64_t excess = model.getExcess(recompute, modelBudget);
  int64_t flops = g.getFlops(recompute);
  SmallVector<unsigned> relevant = llvm::to_vector(g.getRelevant().set_bits());
  uint64_t positions = model.getNumPositions();
  // A move drops a group of candidates: each candidate alone where judging every candidate
  // at every step costs little, else the candidates of one kind in every repeated layer.
  std::vector<SmallVector<unsigned>> groups;
  if (uint64_t(relevant.size()) * 2 * positions <= kPerCandidateWork) {
    for (unsigned c : relevant)
      groups.push_back({c});
  } else {
    groups = groupRepeated(g, relevant);
  }
  // Refreshing every score costs (moves x positions); small graphs afford it at every step.
  bool refreshAlways = uint64_t(groups.size()) * 2 * positions <= 4'000'000;

  struct Score {
    double perFlop = 0;
    unsigned move = 0;
    unsigned step = 0;
  };
  auto worse = [](const Score &a, const Score &b) {
    return std::tie(a.perFlop, b.move) < std::tie(b.perFlop, a.move);
  };
  unsigned step = 1;
  BitVector savedRoots = g.getSavedRoots(recompute);
  // The cheapest move seen that meets the budget on its own, as a dropped set: one big move
  // may beat the few cheap ones the descent takes (the usual greedy for covering knapsacks).
  struct Cover {
    BitVector dropped;
    int64_t flops = INT64_MAX;
  } cover;
  // Move 2k drops the first `limit` members of groups[k] not dropped yet, each alone; move
  // 2k + 1 each with its chain.
  auto getMove = [&](unsigned move, unsigned limit = UINT_MAX) {
    BitVector moved(n);
    unsigned taken = 0;
    for (unsigned c : groups[move / 2]) {
      if (dropped.test(c))
        continue;
      if (taken++ == limit)
        break;
      if (move % 2 == 0)
        moved.set(c);
      else
        moved |= g.getChain(c, dropped, savedRoots);
    }
    return moved;
  };
  auto remaining = [&](unsigned move) {
    return unsigned(llvm::count_if(groups[move / 2], [&](unsigned c) { return !dropped.test(c); }));
  };
  auto rescore = [&](Score &s) {
    s.step = step;
    s.perFlop = 0;
    unsigned left = remaining(s.move);
    if (left == 0)
      return;
    BitVector moved = getMove(s.move);
    if (s.move % 2 == 1 && moved.count() == left)
      return; // The same as dropping them alone.
    BitVector next = dropped;
    next |= moved;
    BitVector nextRecompute = g.resolve(next);
    if (nextRecompute == recompute)
      return;
    int64_t nextExcess = model.getExcess(nextRecompute, modelBudget);
    if (nextExcess >= excess)
      return;
    int64_t nextFlops = g.getFlops(nextRecompute);
    if (nextExcess == 0 && nextFlops < cover.flops)
      cover = {next, nextFlops};
    s.perFlop = double(excess - nextExcess) / std::max<int64_t>(1, nextFlops - flops);
  };

  std::vector<Score> heap;
  auto refreshAll = [&] {
    heap.clear();
    for (unsigned move = 0; move < 2 * groups.size(); ++move) {
      Score s;
      s.move = move;
      rescore(s);
      if (s.perFlop > 0)
        heap.push_back(s);
    }
    std::make_heap(heap.begin(), heap.end(), worse);
  };
  refreshAll();
  unsigned sinceRefresh = 0;
  while (excess > 0 && !clock.expired()) {
    clock.progress([&](llvm::raw_ostream &os) {
      os << "descending: " << dropped.count() << " tensors dropped, "
         << formatBytes(excess / std::max<unsigned>(1, model.getNumPositions()))
         << " over the budget on average";
    });
    if (refreshAlways || sinceRefresh >= kRefreshEvery) {
      refreshAll();
      sinceRefresh = 0;
    }
    // Lazily: re-score the best until the best is fresh.
    while (!heap.empty() && heap.front().step != step) {
      std::pop_heap(heap.begin(), heap.end(), worse);
      Score s = heap.back();
      heap.pop_back();
      rescore(s);
      if (s.perFlop > 0) {
        heap.push_back(s);
        std::push_heap(heap.begin(), heap.end(), worse);
      }
    }
    if (heap.empty()) {
      if (sinceRefresh == 0)
        break;                      // No move brings the model closer to the budget.
      sinceRefresh = kRefreshEvery; // Stale scores may have hidden one: refresh them all.
      continue;
    }
    std::pop_heap(heap.begin(), heap.end(), worse);
    Score best = heap.back();
    heap.pop_back();
    // A group whose whole move meets the budget: only as many of its members (in forward
    // order) as that takes.
    unsigned limit = UINT_MAX, left = remaining(best.move);
    if (left > 1) {
      auto meets = [&](unsigned count) {
        BitVector next = dropped;
        next |= getMove(best.move, count);
        return model.getExcess(g.resolve(next), modelBudget) == 0;
      };
      if (meets(left)) {
        unsigned low = 1, high = left; // meets(high) holds.
        while (low < high) {
          unsigned mid = low + (high - low) / 2;
          if (meets(mid))
            high = mid;
          else
            low = mid + 1;
        }
        limit = high;
      }
    }
    dropped |= getMove(best.move, limit);
    recompute = g.resolve(dropped);
    excess = model.getExcess(recompute, modelBudget);
    flops = g.getFlops(recompute);
    savedRoots = g.getSavedRoots(recompute);
    ++step;
    ++sinceRefresh;
  }

  // Keeps again, costliest first, what the budget does not need dropped.
  auto keepAgain = [&](BitVector &set) {
    SmallVector<unsigned> order = llvm::to_vector(set.set_bits());
    llvm::stable_sort(order, [&](unsigned a, unsigned b) { return g.flops[a] > g.flops[b]; });
    for (unsigned c : order) {
      if (clock.expired())
        break;
      BitVector next = set;
      next.reset(c);
      if (model.getExcess(g.resolve(next), modelBudget) == 0)
        set = next;
    }
    return g.resolve(set);
  };
  if (excess == 0)
    recompute = keepAgain(dropped);
  if (cover.flops != INT64_MAX && cover.flops < g.getFlops(recompute)) {
    BitVector covered = keepAgain(cover.dropped);
    if (excess != 0 || g.getFlops(covered) < g.getFlops(recompute)) {
      recompute = covered;
      excess = 0;
    }
  }
  return {recompute, excess == 0};
}

/// Auto's search: the greedy on the peak model, confirmed by real plans. The model is
/// calibrated by the plan without recomputation (what it leaves out: persistent arenas,
/// inputs, the planner's fragmentation); each confirmed set moves the model's budget by what
/// the real plan missed or had to spare, bisecting between the largest model budget whose set
/// fitted and the smallest whose set did not, for at most kMaxConfirmations plans. The
/// cheapest set that fits wins.
FailureOr<Trial> RematPass::searchGreedy(const ForwardGraph &g, TrialPlanner &planner,
                                         const PeakModel &model, int64_t budget, const Trial &none,
                                         ArrayRef<std::pair<StringRef, Trial>> fixed,
                                         SearchClock &clock, bool exhaustiveWhenSmall) {
  constexpr unsigned kMaxConfirmations = 8;
  // What the model misses depends on the set (fusion of clones, fragmentation): calibrate it
  // on the real plan nearest the budget, without recomputation or a fixed policy.
  const Trial *nearest = &none;
  for (auto &[policy, trial] : fixed)
    if (std::abs(trial.peak - budget) < std::abs(nearest->peak - budget))
      nearest = &trial;
  int64_t calibration = nearest->peak - model.getPeak(nearest->recompute);
  // Small graphs: every distinct set, cheapest first, is judged by the model, and those it
  // says fit (within a margin for what it misses) are planned until one fits: the optimum,
  // unless the model misses by more than the margin.
  if (exhaustiveWhenSmall && g.getRelevant().count() <= kMaxModelExhaustiveCandidates) {
    FailureOr<std::vector<BitVector>> sets = enumerateSets(g);
    if (failed(sets))
      return failure();
    int64_t margin = budget / 20;
    unsigned plans = 0;
    for (const BitVector &set : *sets) {
      if (model.getPeak(set) + calibration > budget + margin)
        continue;
      FailureOr<Trial> trial = evaluate(g, planner, set);
      if (failed(trial))
        return failure();
      if (trial->peak <= budget)
        return *trial;
      if (++plans == kMaxExhaustivePlans || clock.expired())
        break;
    }
  }
  int64_t modelBudget = budget - calibration;
  // Close enough: a set within this much of the budget is not worth another plan.
  int64_t tolerance = std::max<int64_t>(budget / 200, 1 << 20);
  int64_t fits = INT64_MIN, overflows = INT64_MAX;
  Trial best{BitVector(), 0, INT64_MAX};
  for (unsigned round = 0; round < kMaxConfirmations && !clock.expired(); ++round) {
    ModelResult result = descendOnModel(g, model, modelBudget, clock);
    FailureOr<Trial> trial = evaluate(g, planner, result.recompute);
    if (failed(trial))
      return failure();
    clock.progress([&](llvm::raw_ostream &os) {
      os << "trial plan " << round + 1 << ": planned peak " << formatBytes(trial->peak)
         << ", recomputing " << withCommas(trial->flops) << " FLOPs";
    });
    LLVM_DEBUG(llvm::dbgs() << "model budget " << modelBudget << ": model peak "
                            << model.getPeak(result.recompute) << ", planned " << trial->peak
                            << ", " << trial->flops << " FLOPs\n");
    int64_t next;
    if (trial->peak <= budget) {
      if (trial->flops < best.flops || best.peak > budget)
        best = *trial;
      fits = std::max(fits, modelBudget);
      if (budget - trial->peak <= tolerance)
        break;
      next = overflows == INT64_MAX ? modelBudget + (budget - trial->peak)
                                    : fits + (overflows - fits) / 2;
    } else {
      if (!result.met)
        break; // The model cannot go lower: neither can a smaller model budget.
      overflows = std::min(overflows, modelBudget);
      // The set was below the model budget already: go below the set's own model peak.
      int64_t lowered =
          std::min(modelBudget, model.getPeak(result.recompute)) - (trial->peak - budget);
      next = fits == INT64_MIN ? lowered : fits + (overflows - fits) / 2;
    }
    if (overflows != INT64_MAX && fits != INT64_MIN && overflows - fits <= tolerance)
      break;
    if (next == modelBudget)
      break;
    modelBudget = next;
  }
  if (best.peak == INT64_MAX)
    return Trial{BitVector(), 0, INT64_MAX};

  return best;
}

/// Keeping again, or swapping, on real plans. The model is calibrated exactly at the chosen
/// set, so a candidate whose keeping it then says still fits is worth a plan; where keeping it
/// alone does not fit, on graphs where scoring every candidate is cheap, so is the cheapest
/// swap for another candidate (alone or with its chain) that it says fits and that costs
/// fewer FLOPs: what the search's wider calibration, or a fixed policy, did not need, and the
/// knapsack exchanges a greedy misses. Costliest first: at most 2 x kRefinePlans candidates
/// tried, kRefinePlans plans.
FailureOr<Trial> RematPass::keepAgainOnPlans(const ForwardGraph &g, TrialPlanner &planner,
                                             const PeakModel &model, int64_t budget, Trial best,
                                             SearchClock &clock) {
  SmallVector<unsigned> relevant = llvm::to_vector(g.getRelevant().set_bits());
  // A swap scans every candidate on the model for each one tried: only where that is cheap.
  bool swaps = uint64_t(relevant.size()) * 2 * model.getNumPositions() <= kSwapWork;
  unsigned refined = 0, tried = 0;
  SmallVector<unsigned> order;
  for (unsigned i : best.recompute.set_bits())
    if (g.candidate.test(i) && !g.alwaysRecomputed.test(i))
      order.push_back(i);
  llvm::stable_sort(order, [&](unsigned a, unsigned b) { return g.flops[a] > g.flops[b]; });
  for (unsigned c : order) {
    if (refined == kRefinePlans || tried == 2 * kRefinePlans || clock.expired())
      break;
    if (!best.recompute.test(c))
      continue; // Kept again, or no longer needed, since.
    ++tried;
    // The model's estimate of a set's planned peak, calibrated at the best set.
    int64_t bestModelPeak = model.getPeak(best.recompute);
    auto fits = [&](const BitVector &set) {
      return model.getPeak(set) - bestModelPeak + best.peak <= budget;
    };
    BitVector dropped = best.recompute;
    dropped &= g.candidate;
    dropped.reset(c);
    BitVector next = g.resolve(dropped);
    if (next == best.recompute)
      continue;
    if (!fits(next)) {
      if (!swaps)
        continue;
      BitVector savedRoots = g.getSavedRoots(next);
      std::optional<BitVector> cheapest;
      int64_t cheapestFlops = best.flops;
      for (unsigned d : relevant) {
        if (d == c || dropped.test(d) || g.flops[d] >= g.flops[c])
          continue;
        for (bool chain : {false, true}) {
          BitVector swapped = dropped;
          if (chain)
            swapped |= g.getChain(d, dropped, savedRoots);
          else
            swapped.set(d);
          if (swapped.test(c))
            continue;
          BitVector candidate = g.resolve(swapped);
          int64_t flops = g.getFlops(candidate);
          if (flops < cheapestFlops && fits(candidate)) {
            cheapest = candidate;
            cheapestFlops = flops;
          }
        }
      }
      if (!cheapest)
        continue;
      next = *cheapest;
    }
    ++refined;
    FailureOr<Trial> trial = evaluate(g, planner, next);
    if (failed(trial))
      return failure();
    if (trial->peak <= budget && trial->flops < best.flops)
      best = *trial;
  }
  return best;
}

/// Every distinct recompute set that some subset of the relevant candidates resolves to,
/// cheapest first (then smallest).
FailureOr<std::vector<BitVector>> RematPass::enumerateSets(const ForwardGraph &g) {
  SmallVector<unsigned> relevant = llvm::to_vector(g.getRelevant().set_bits());
  if (relevant.size() > kMaxExhaustiveCandidates) {
    g.ops.front()->getParentOp()->emitError()
        << "search=" << search << " tries every subset of the " << relevant.size()
        << " candidate tensors; it is limited to " << kMaxExhaustiveCandidates
        << " (use search=greedy)";
    return failure();
  }
  llvm::DenseMap<BitVector, int64_t> sets;
  for (uint64_t mask = 0; mask < (uint64_t(1) << relevant.size()); ++mask) {
    BitVector dropped(g.size());
    for (auto [bit, c] : llvm::enumerate(relevant))
      if (mask & (uint64_t(1) << bit))
        dropped.set(c);
    BitVector recompute = g.resolve(dropped);
    sets.try_emplace(recompute, g.getFlops(recompute));
  }
  std::vector<std::pair<int64_t, BitVector>> ordered;
  for (auto &[set, flops] : sets)
    ordered.emplace_back(flops, set);
  llvm::stable_sort(ordered, [](const auto &a, const auto &b) {
    if (a.first != b.first)
      return a.first < b.first;
    if (a.second.count() != b.second.count())
      return a.second.count() < b.second.count();
    // Any fixed order: DenseMap's iteration order is not one.
    return llvm::to_vector(a.second.set_bits()) < llvm::to_vector(b.second.set_bits());
  });
  std::vector<BitVector> result;
  for (auto &[flops, set] : ordered)
    result.push_back(set);
  return result;
}

/// Every distinct recompute set, cheapest first: the first whose trial plan fits is the
/// optimum.
FailureOr<Trial> RematPass::searchExhaustive(const ForwardGraph &g, TrialPlanner &planner,
                                             int64_t budget) {
  FailureOr<std::vector<BitVector>> sets = enumerateSets(g);
  if (failed(sets))
    return failure();
  for (const BitVector &set : *sets) {
    FailureOr<Trial> trial = evaluate(g, planner, set);
    if (failed(trial))
      return failure();
    if (trial->peak <= budget)
      return *trial;
  }
  return Trial{BitVector(), 0, INT64_MAX};
}

FailureOr<Trial> RematPass::searchAuto(const ForwardGraph &g, TrialPlanner &planner,
                                       const PeakModel &model, int64_t budget, const Trial &none,
                                       ArrayRef<std::pair<StringRef, Trial>> fixed, bool exhaustive,
                                       SearchClock &clock) {
  FailureOr<Trial> found = exhaustive ? searchExhaustive(g, planner, budget)
                                      : searchGreedy(g, planner, model, budget, none, fixed, clock);
  if (failed(found))
    return failure();
  // The fixed policies are fallbacks: the cheapest set that fits wins.
  for (auto &[policy, trial] : fixed)
    if (trial.peak <= budget && (found->peak > budget || trial.flops < found->flops)) {
      LLVM_DEBUG(llvm::dbgs() << "policy " << policy << " beats the search\n");
      found = trial;
    }
  if (exhaustive || found->peak > budget)
    return found;
  return keepAgainOnPlans(g, planner, model, budget, *found, clock);
}

/// search=compare: plans every distinct recompute set, takes the exhaustive frontier (for
/// each peak that some set reaches more cheaply than every cheaper set, the fewest FLOPs
/// that reach it) and runs auto's greedy search with each frontier peak as the budget.
LogicalResult RematPass::compareSearches(func::FuncOp function, const ForwardGraph &g,
                                         TrialPlanner &planner, const PeakModel &model,
                                         const Trial &none,
                                         ArrayRef<std::pair<StringRef, Trial>> fixed) {
  FailureOr<std::vector<BitVector>> sets = enumerateSets(g);
  if (failed(sets))
    return failure();
  std::vector<Trial> frontier;
  for (const BitVector &set : *sets) {
    FailureOr<Trial> trial = evaluate(g, planner, set);
    if (failed(trial))
      return failure();
    if (frontier.empty() || trial->peak < frontier.back().peak)
      frontier.push_back(*trial);
  }
  // Auto's search as it runs, and its greedy alone (what it runs on graphs too large for the
  // model's exhaustive stage).
  struct Tally {
    unsigned optimal = 0;
    double worst = 1;
  } tally[2];
  for (const Trial &optimum : frontier) {
    InFlightDiagnostic remark = emitRemark(function.getLoc());
    remark << "budget " << optimum.peak << " bytes: optimum " << withCommas(optimum.flops)
           << " FLOPs";
    for (unsigned which = 0; which < 2; ++which) {
      SearchClock clock(0);
      FailureOr<Trial> found =
          which == 0 ? searchAuto(g, planner, model, optimum.peak, none, fixed, false, clock)
                     : searchGreedy(g, planner, model, optimum.peak, none, fixed, clock,
                                    /*exhaustiveWhenSmall=*/false);
      if (failed(found))
        return failure();
      remark << (which == 0 ? ", auto " : ", greedy alone ");
      if (found->peak > optimum.peak) {
        remark << "does not fit";
        tally[which].worst = INFINITY;
        continue;
      }
      remark << withCommas(found->flops) << " FLOPs";
      if (found->flops == optimum.flops) {
        ++tally[which].optimal;
        continue;
      }
      double ratio = optimum.flops ? double(found->flops) / optimum.flops : INFINITY;
      tally[which].worst = std::max(tally[which].worst, ratio);
      remark << " (" << fixedPoint(ratio) << "x)";
    }
  }
  emitRemark(function.getLoc()) << "bonsai-remat (search 'compare'): auto is optimal at "
                                << tally[0].optimal << " of " << frontier.size()
                                << " budgets on the exhaustive frontier ("
                                << g.getRelevant().count() << " candidate tensors, " << sets->size()
                                << " distinct recompute sets planned); worst auto/optimum FLOPs "
                                << fixedPoint(tally[0].worst) << "; the greedy alone is optimal at "
                                << tally[1].optimal << ", worst " << fixedPoint(tally[1].worst);
  numPlans += planner.getNumPlans();
  return success();
}

/// The error for a budget no recomputation meets: the smallest peak of the trial plans made
/// (`scope` says which), and what dominates it.
LogicalResult RematPass::reportInfeasible(func::FuncOp function, const ForwardGraph &g,
                                          TrialPlanner &planner, int64_t budget,
                                          InfeasibleScope scope) {
  auto [peak, set] = planner.getSmallestPeak(g);
  FailureOr<PlanMemorySummary> summary = planner.evaluate(set);
  if (failed(summary))
    return failure();
  unsigned tensors = 0;
  for (unsigned i : set.set_bits())
    tensors += !g.isView.test(i);
  InFlightDiagnostic diag = function.emitError()
                            << "no recomputation fits the budget of " << formatBytes(budget);
  if (offloading && hostRoom)
    diag << " with at most " << formatBytes(*hostRoom)
         << " of saved activations in pinned host memory (what the host budget of "
         << formatBytes(hostBudget) << " leaves for them)";
  else if (offloading)
    diag << " with the saved activations in pinned host memory";
  diag << ": ";
  switch (scope) {
  case InfeasibleScope::Fixed:
    diag << "weights, gradients, optimizer state and inputs alone take "
         << formatBytes(summary->peakDevice - summary->activations)
         << ", and recomputation moves only activations; the smallest planned device peak "
            "of the fixed policies";
    break;
  case InfeasibleScope::Exhaustive:
    diag << "the smallest planned device peak of every recompute set";
    break;
  case InfeasibleScope::Greedy:
    diag << "the smallest planned device peak the search reached";
    break;
  }
  diag << " is " << formatBytes(peak) << " (" << peak << " bytes, recomputing " << tensors
       << " tensors for " << withCommas(g.getFlops(set)) << " FLOPs; " << planner.getNumPlans()
       << " trial plans), " << kOverBudget << formatBytes(peak - budget);
  auto [dominant, bytes] = summary->dominant();
  diag << "; " << dominant << (StringRef(dominant).ends_with("s") ? " take " : " takes ")
       << formatBytes(bytes);
  diag << ": " << overBudgetAdvice(dominant, /*recomputing=*/true);
  if (offloading && hostRoom)
    diag << "; or raise the host budget (host_memory on bonsai.target, --host-memory)";
  return failure();
}

/// Activation offload's third choice, after the recompute set is chosen: of the values the
/// search offloads, those with the shortest stays between the passes, whose transfers the
/// fewest ops would hide and which free the least, stay on the device instead, as many as
/// the model (calibrated on the plan with all of them offloaded) says fit; a real plan
/// confirms, and where it does not fit, half as many stay (at most kMaxConfirmations plans).
/// Returns the bytes to offload (kOffloadActivationsAttr).
FailureOr<int64_t> RematPass::keepOnDevice(TrialPlanner &planner, const PeakModel &model,
                                           int64_t budget, const Trial &chosen,
                                           int64_t offloadBytes) {
  constexpr unsigned kMaxConfirmations = 6;
  SmallVector<std::pair<int64_t, unsigned>> offloaded =
      model.getOffloaded(chosen.recompute, offloadBytes);
  BitVector set = model.getOffloadedSet(chosen.recompute, offloadBytes);
  FailureOr<PlanMemorySummary> all = planner.evaluate(chosen.recompute, offloadBytes);
  if (failed(all))
    return failure();
  int64_t calibration = all->peakDevice - model.getPeak(chosen.recompute, &set);
  // The offloaded bytes with the shortest k stays kept on the device, for each k the model
  // allows.
  int64_t total = 0;
  for (auto [stay, op] : offloaded)
    total += model.getBytes(op);
  SmallVector<int64_t> remaining{total};
  for (auto [stay, op] : llvm::reverse(offloaded)) {
    set.reset(op);
    if (model.getPeak(chosen.recompute, &set) + calibration > budget)
      break;
    remaining.push_back(remaining.back() - model.getBytes(op));
  }
  for (unsigned count = remaining.size() - 1, round = 0; count > 0 && round < kMaxConfirmations;
       count /= 2, ++round) {
    FailureOr<PlanMemorySummary> planned = planner.evaluate(chosen.recompute, remaining[count]);
    if (failed(planned))
      return failure();
    if (planned->peakDevice <= budget)
      return remaining[count];
  }
  return offloadBytes;
}

int64_t RematPass::getOffloadLinkBudget(const ForwardGraph &g) {
  // The share of the forward pass's time the copies out may take: what they move beyond it
  // the backward pass waits for (every copy out ends before the backward pass starts).
  constexpr double kForwardShare = 0.8;
  std::optional<TargetProfile> p = lookupTargetProfile(profile.empty() ? target : profile);
  if (!p || !(p->bf16Tflops > 0) || !(p->memoryBandwidthGBs > 0) || !(p->linkBandwidthGBs > 0))
    return INT64_MAX;
  StepRates rates = sustainedStepRates(*p, p->hostUpdateGParamsPerSecond);
  double forward = 0;
  for (Operation *op : g.ops)
    forward += estimateOpSeconds(op, rates);
  return int64_t(forward * kForwardShare * rates.offload.linkBytesPerSecond);
}

LogicalResult RematPass::rematFunction(func::FuncOp function, StringRef chosen, int64_t budget,
                                       bool offload) {
  offloading = offload;
  ForwardGraph g = analyzeForwardGraph(function);
  if (!g.hasBackward)
    return function.emitError() << "bonsai-remat works on the joint forward+backward graph, "
                                   "but @"
                                << function.getSymName()
                                << " has no backward op: run bonsai-autodiff first";
  if (g.size() == 0)
    return success();

  if (chosen == "auto" && budget <= 0 && search != "compare")
    return function.emitError("remat policy 'auto' fits the plan to a memory budget, and there "
                              "is none: give device-memory, or a recipe target with "
                              "device_memory");

  // Before the trial copies are made: the search's plans and the final step are fused alike.
  if (chosen == "auto")
    function->setAttr(kRematSearchedAttr, UnitAttr::get(function.getContext()));
  TrialPlanner planner(function, target, profile.empty() ? target : profile, fuse, fuseDisable,
                       offload);
  // The baseline keeps everything it may: only what is always recomputed is. Auto's peak
  // model, and activation offload, read what its plan materialises.
  Materialization materialization;
  BitVector baseline = g.resolve(BitVector(g.size()));
  FailureOr<PlanMemorySummary> baseSummary = planner.evaluate(
      baseline, std::nullopt, chosen == "auto" || offload ? &materialization : nullptr);
  if (failed(baseSummary))
    return failure();
  std::optional<Trial> none = Trial{baseline, g.getFlops(baseline), baseSummary->peakDevice};

  // Activation offload: of the values a set keeps for the backward pass that the plan gives a
  // buffer, the longest stays first, as many bytes as the link moves while the forward pass
  // computes (what it moves beyond that, the step waits for), fewer where auto keeps some on
  // the device (keepOnDevice). The model judges the unfused values;
  // bonsai-offload-activations offloads the fused step's by the same rule.
  BitVector materialized(g.size());
  if (offload) {
    SmallVector<Operation *> positions = collectPositions(function);
    for (auto [p, op] : llvm::enumerate(positions))
      if (llvm::any_of(materialization.resultBytes[p], [](int64_t bytes) { return bytes > 0; }))
        if (auto it = llvm::find(g.ops, op); it != g.ops.end())
          materialized.set(it - g.ops.begin());
  }
  auto offloadOf = [&](const BitVector &recompute) {
    return getOffloadable(g, recompute, materialized);
  };
  std::optional<int64_t> offloadBytes;
  // The host budget's room for the offloaded activations: what the plan's other pinned
  // arenas (offloaded state) leave of it, less the alignment every buffer may round up to.
  hostRoom.reset();
  if (offload) {
    offloadBytes = getOffloadLinkBudget(g);
    if (hostBudget > 0) {
      constexpr int64_t kArenaAlignment = 256;
      hostRoom = std::max<int64_t>(0, hostBudget - baseSummary->peakHost -
                                          kArenaAlignment * int64_t(g.size()));
      offloadBytes = std::min(*offloadBytes, *hostRoom);
    }
    planner.setOffloadBytes(*offloadBytes);
  }

  Trial chosenTrial = *none;
  std::string how;
  if (chosen == "auto") {
    if (search != "compare" && none->peak <= budget) {
      InFlightDiagnostic remark = emitRemark(function.getLoc());
      remark << "bonsai-remat (policy 'auto'): the plan fits the budget of " << formatBytes(budget)
             << " without recomputation (planned device peak " << formatBytes(none->peak) << ")";
      if (offload)
        remark << "; every saved activation stays on the device, none is offloaded";
      peakBefore = peakAfter = none->peak;
      numPlans += planner.getNumPlans();
      applyRecompute(g.ops, none->recompute);
      return success();
    }
    // With activation offload the search starts from the baseline with its saved
    // activations offloaded, and recomputes only what that does not fit.
    std::optional<Trial> start = none;
    if (offload) {
      FailureOr<Trial> offloadedBaseline = evaluate(g, planner, baseline);
      if (failed(offloadedBaseline))
        return failure();
      start = *offloadedBaseline;
    }
    FailureOr<SmallVector<std::pair<StringRef, Trial>>> fixedTrials = evaluateFixed(g, planner);
    if (failed(fixedTrials))
      return failure();
    SmallVector<std::pair<StringRef, Trial>> fixed = std::move(*fixedTrials);
    PeakModel model(function, g, materialization);
    if (offload)
      model.setOffloadChoice(offloadOf, *offloadBytes);
    if (search == "compare")
      return compareSearches(function, g, planner, model, *start, fixed);
    // Recomputation moves activations only: weights, gradients, optimizer state and inputs
    // stay. A budget below them is out of reach without searching.
    FailureOr<PlanMemorySummary> base = planner.evaluate(none->recompute);
    if (failed(base))
      return failure();
    if (budget < base->peakDevice - base->activations)
      return reportInfeasible(function, g, planner, budget, InfeasibleScope::Fixed);
    SearchClock clock(timeLimit);
    FailureOr<Trial> found =
        start->peak <= budget
            ? FailureOr<Trial>(*start)
            : searchAuto(g, planner, model, budget, *start, fixed, search == "exhaustive", clock);
    if (failed(found))
      return failure();
    bool outOfTime = clock.expired();
    if (found->peak > budget && outOfTime)
      return function.emitError()
             << "bonsai-remat reached its time limit of " << shortest(clock.getLimit())
             << " s before any recompute set it planned fitted the budget of "
             << formatBytes(budget) << " (" << planner.getNumPlans()
             << " trial plans); raise the limit (--remat-time-limit) or the budget";
    if (found->peak > budget)
      return reportInfeasible(function, g, planner, budget,
                              search == "exhaustive" ? InfeasibleScope::Exhaustive
                                                     : InfeasibleScope::Greedy);
    chosenTrial = *found;
    if (offload) {
      // Offloading is a choice, not a given: the search without it is a candidate too.
      int64_t linkBudget = *offloadBytes;
      std::optional<Trial> plain;
      planner.setOffloadBytes(std::nullopt);
      FailureOr<SmallVector<std::pair<StringRef, Trial>>> plainFixed = evaluateFixed(g, planner);
      if (failed(plainFixed))
        return failure();
      PeakModel plainModel(function, g, materialization);
      FailureOr<Trial> plainFound = searchAuto(g, planner, plainModel, budget, *none, *plainFixed,
                                               search == "exhaustive", clock);
      planner.setOffloadBytes(linkBudget);
      if (failed(plainFound))
        return failure();
      if (plainFound->peak <= budget)
        plain = *plainFound;
      // Fastest first. The search minimises recomputation with the link taken as free, and
      // a transfer the link does not hide costs time as recomputation does; keeping on the
      // device what the budget allows saves transfers. So each candidate that fits (the
      // search's set and the fixed policies') keeps what it can on the device, and the one
      // with the shortest predicted step wins, against the search without offload.
      // Without the target's rates (the CPU, a bare sm_XX) nothing predicts a step: the
      // fewest recomputed FLOPs win then, the link counted free, and without offload on a tie.
      bool timed = std::isfinite(planner.getPredictedSeconds(found->recompute, linkBudget));
      auto cost = [&](const Trial &trial, std::optional<int64_t> bytes) {
        return timed ? planner.getPredictedSeconds(trial.recompute, bytes) : double(trial.flops);
      };
      double fastest = INFINITY;
      if (plain) {
        fastest = cost(*plain, std::nullopt);
        chosenTrial = *plain;
        offloadBytes = 0;
      }
      SmallVector<Trial> candidates{*found};
      for (auto &[policy, trial] : fixed)
        if (trial.peak <= budget && trial.recompute != found->recompute)
          candidates.push_back(trial);
      for (Trial &candidate : candidates) {
        FailureOr<int64_t> bytes = keepOnDevice(planner, model, budget, candidate, linkBudget);
        if (failed(bytes))
          return failure();
        FailureOr<PlanMemorySummary> planned = planner.evaluate(candidate.recompute, *bytes);
        if (failed(planned))
          return failure();
        double seconds = cost(candidate, *bytes);
        LLVM_DEBUG(llvm::dbgs() << "candidate of " << candidate.flops << " FLOPs, offloading "
                                << *bytes << " bytes: cost " << seconds << "\n");
        if (planned->peakDevice <= budget && seconds < fastest) {
          fastest = seconds;
          chosenTrial = candidate;
          chosenTrial.peak = planned->peakDevice;
          offloadBytes = *bytes;
        }
      }
    }
    how = (Twine("search ") + search + ", " + Twine(planner.getNumPlans()) + " trial plans in " +
           fixedPoint(clock.getElapsed()) + " s; budget " + formatBytes(budget))
              .str();
    if (outOfTime)
      emitRemark(function.getLoc())
          << "bonsai-remat reached its time limit of " << shortest(clock.getLimit())
          << " s: the plan below is the best found so far, not the search's end";
  } else {
    FailureOr<Trial> trial = evaluate(g, planner, g.resolve(getDropped(g, chosen)));
    if (failed(trial))
      return failure();
    chosenTrial = *trial;
  }
  peakBefore = none->peak;
  peakAfter = chosenTrial.peak;
  numPlans += planner.getNumPlans();

  // Remarks: each recomputed tensor, then the policy's cost.
  llvm::MapVector<StringRef, unsigned> kinds;
  unsigned count = 0;
  for (unsigned i : chosenTrial.recompute.set_bits()) {
    if (g.isView.test(i))
      continue; // A view of a recomputed buffer: no work, no memory.
    Operation *op = g.ops[i];
    ++kinds[op->getName().stripDialect()];
    ++count;
    if (!perValueRemarks)
      continue;
    // mlir::emitRemark, unlike Operation::emitRemark, does not print the op under the remark.
    InFlightDiagnostic remark = emitRemark(op->getLoc(), "recomputed in the backward pass: ");
    llvm::interleaveComma(op->getResultTypes(), remark);
    remark << " (" << formatBytes(g.bytes[i]) << "), " << withCommas(g.flops[i]) << " FLOPs ("
           << percent(g.flops[i], g.stepFlops) << " of the step)";
  }
  InFlightDiagnostic summary = emitRemark(function.getLoc());
  summary << "bonsai-remat (policy '" << chosen << "'): ";
  if (count == 0) {
    summary << "recomputes nothing";
  } else {
    summary << "recomputes " << count << (count == 1 ? " tensor (" : " tensors (");
    llvm::interleaveComma(kinds, summary,
                          [&](const auto &kind) { summary << kind.second << " " << kind.first; });
    summary << ") for " << withCommas(chosenTrial.flops) << " FLOPs per step, "
            << percent(chosenTrial.flops, g.stepFlops) << " of the step's "
            << withCommas(g.stepFlops);
  }
  if (offloadBytes && *offloadBytes == 0) {
    summary << (hostRoom && *hostRoom == 0
                    ? "; offloads no saved activation: the host budget has no room for them"
                    : "; offloads no saved activation: the budget holds them on the device");
  } else if (offloadBytes) {
    summary << "; offloads saved activations to pinned host memory between the passes, the "
               "longest stays first";
    if (*offloadBytes < INT64_MAX)
      summary << ", up to " << formatBytes(*offloadBytes)
              << (hostRoom && *offloadBytes == *hostRoom ? " (what the host budget leaves for them)"
                  : *offloadBytes == getOffloadLinkBudget(g)
                      ? " (what the link moves during the forward pass)"
                      : " (the rest fits on the device)");
  }
  if (offloadBytes && *offloadBytes > 0)
    function->setAttr(kOffloadActivationsAttr,
                      IntegerAttr::get(IntegerType::get(function.getContext(), 64), *offloadBytes));
  summary << "; planned device peak " << formatBytes(none->peak) << " -> "
          << formatBytes(chosenTrial.peak);
  if (!how.empty())
    summary << " (" << how << ")";
  if (unsigned replaced = applyRecompute(g.ops, chosenTrial.recompute))
    summary << "; " << replaced
            << (replaced == 1 ? " recomputed gather replaces"
                              : " of the recomputed gathers replace")
            << " the backward pass's own (each parameter is still gathered once per pass)";
  summary.report();

  numRecomputed += count;
  recomputedFlops += chosenTrial.flops;
  return success();
}

void RematPass::runOnOperation() {
  ModuleOp module = getOperation();
  // The policy and the budget: the options, else the recipe.
  std::string chosen = policy;
  int64_t budget = deviceMemory;
  module.walk([&](RematDirectiveOp directive) {
    if (chosen.empty())
      chosen = directive.getPolicy().str();
  });
  if (budget <= 0)
    module.walk([&](TargetDirectiveOp target) {
      if (IntegerAttr mib = target.getDeviceMemoryMibAttr())
        budget = mib.getInt() * 1024 * 1024;
    });
  hostBudget = hostMemory;
  if (hostBudget <= 0)
    module.walk([&](TargetDirectiveOp target) {
      if (IntegerAttr mib = target.getHostMemoryMibAttr())
        hostBudget = mib.getInt() * 1024 * 1024;
    });
  if (chosen.empty())
    chosen = budget > 0 ? "auto" : "none";
  if (!llvm::is_contained({"none", "full", "selective", "auto"}, chosen)) {
    module.emitError() << "unknown remat policy '" << chosen
                       << "'; expected one of: none, full, selective, auto";
    return signalPassFailure();
  }
  if (!llvm::is_contained({"greedy", "exhaustive", "compare"}, search)) {
    module.emitError() << "unknown remat search '" << search
                       << "'; expected greedy, exhaustive or compare";
    return signalPassFailure();
  }
  if (search == "compare")
    chosen = "auto";
  // Policy none keeps every activation, except those RecomputeOpInterface always recomputes.
  bool anyAlwaysRecomputed = module
                                 .walk([](RecomputeOpInterface op) {
                                   return op.isAlwaysRecomputed() ? WalkResult::interrupt()
                                                                  : WalkResult::advance();
                                 })
                                 .wasInterrupted();
  // Activation offload: the option, else the recipe's bonsai.offload.
  bool offload = offloadActivations;
  module.walk([&](OffloadDirectiveOp directive) {
    offload |= llvm::is_contained(directive.getClasses().getAsValueRange<StringAttr>(),
                                  StringRef("activations"));
  });
  if (chosen == "none" && !anyAlwaysRecomputed && !offload)
    return;
  for (auto function : module.getOps<func::FuncOp>())
    if (!function.isExternal() && !function.getBody().getOps<ParamOp>().empty())
      if (failed(rematFunction(function, chosen, budget, offload)))
        return signalPassFailure();
}

} // namespace
} // namespace mlir::bonsai
