//===- Remat.cpp - Recompute activations in the backward pass -------------===//
//
// The `bonsai-remat` pass (see Passes.td and docs/remat.md). The pass names no model op: it
// asks CostOpInterface what an op costs and whether it is GEMM-shaped, NormalizationOpInterface
// which values open a block, ViewLikeOpInterface which ops alias their source, and
// KernelOpInterface and the side-effect interfaces whether an op can simply run again. Policy
// `auto` judges every candidate recompute set by the real planner: a copy of the function with
// the set applied is lowered, scheduled and planned by the pipeline's own passes, and the
// arenas of the resulting step are summed.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/PlanSummary.h"
#include "bonsai/Conversion/Passes.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/BitVector.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/Support/Debug.h"
#include "llvm/Support/Format.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#define DEBUG_TYPE "bonsai-remat"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIREMATPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {

constexpr StringLiteral kPhaseAttr = "bonsai.phase";
constexpr StringLiteral kRecomputedAttr = "bonsai.recomputed";

/// Exhaustive search tries every subset of the candidates: 2^24 sets is about 17 million.
constexpr unsigned kMaxExhaustiveCandidates = 24;

bool isBackward(Operation *op) {
  auto phase = op->getAttrOfType<StringAttr>(kPhaseAttr);
  return phase && phase.getValue() == "backward";
}

/// Whether `user`, an op of the update phase, reads only results of `op` that no backward op
/// reads: the FP8 statistics a scale update takes from a forward GEMM (docs/fp8.md). Such a
/// reader does not pin `op`: recomputing it for the backward leaves the update reading the
/// forward's small result, while the results the backward reads are recomputed.
bool readsOnlySideResults(Operation *op, Operation *user) {
  auto phase = user->getAttrOfType<StringAttr>(kPhaseAttr);
  if (!phase || phase.getValue() != "update")
    return false;
  return llvm::none_of(op->getResults(), [&](OpResult result) {
    return llvm::is_contained(user->getOperands(), result) &&
           llvm::any_of(result.getUsers(), isBackward);
  });
}

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

/// The forward ops of a model function (those without a phase), in block order. Their
/// positions in this list name them in a copy of the function as well.
SmallVector<Operation *> collectForwardOps(func::FuncOp function) {
  SmallVector<Operation *> forward;
  for (Operation &op : function.getBody().front().without_terminator())
    if (!op.hasAttr(kPhaseAttr))
      forward.push_back(&op);
  return forward;
}

//===----------------------------------------------------------------------===//
// The forward graph as remat sees it
//===----------------------------------------------------------------------===//

/// What the pass needs to know about the forward ops of one function. Ops are named by their
/// position in collectForwardOps' list.
struct ForwardGraph {
  SmallVector<Operation *> ops;
  /// Forward ops that read a result of each op.
  SmallVector<SmallVector<unsigned>> users;
  /// A backward op reads a result of the op: the value is saved for the backward pass.
  BitVector backwardUse;
  /// Ops that can be recomputed and are decided on: pure, costed kernels that are not views
  /// and whose results only forward and backward ops read (not the return, not the update).
  BitVector candidate;
  /// Views alias a buffer: `viewRoot` is the op that owns it (-1: a parameter, an argument or
  /// an op that is not forward). A view is recomputed exactly when its root is.
  BitVector isView;
  SmallVector<int> viewRoot;
  /// Block inputs (values a NormalizationOpInterface op normalises) and GEMM outputs.
  BitVector blockInput, gemm;
  /// Candidates that RecomputeOpInterface says are always recomputed (dequantized weights):
  /// every choice drops them.
  BitVector alwaysRecomputed;
  /// Forward FLOPs and result bytes of each op.
  SmallVector<int64_t> flops, bytes;
  /// The owners (see viewRoot) of each op's operands that forward ops own.
  SmallVector<SmallVector<unsigned>> operandRoots;
  /// FLOPs of the whole step as the function stands (forward, backward, update).
  int64_t stepFlops = 0;
  /// The function has a backward pass.
  bool hasBackward = false;

  unsigned size() const { return ops.size(); }

  /// The recompute set of a choice of dropped candidates (those not kept): every dropped
  /// value that a backward op or another recomputed op reads, and the views of those.
  BitVector resolve(const BitVector &dropped) const;
  /// FLOPs of recomputing `recompute` once.
  int64_t getFlops(const BitVector &recompute) const;
  /// Owners of buffers the backward pass reads, given `recompute`: read by a backward op or
  /// by a clone, directly or through a view.
  BitVector getSavedRoots(const BitVector &recompute) const;
  /// Candidate `c` with the candidates it is computed from, recursively, that are neither
  /// dropped nor in `savedRoots`: recomputing `c` alone would keep those alive.
  BitVector getChain(unsigned c, const BitVector &dropped, const BitVector &savedRoots) const;
  /// The candidates some choice recomputes: those recomputed when nothing is kept.
  BitVector getRelevant() const {
    BitVector relevant = resolve(candidate);
    relevant &= candidate;
    relevant.reset(alwaysRecomputed); // Not a choice.
    return relevant;
  }
};

ForwardGraph analyzeForwardGraph(func::FuncOp function) {
  ForwardGraph g;
  g.ops = collectForwardOps(function);
  unsigned n = g.ops.size();
  llvm::DenseMap<Operation *, unsigned> index;
  for (auto [i, op] : llvm::enumerate(g.ops))
    index[op] = i;
  g.users.resize(n);
  g.backwardUse.resize(n);
  g.candidate.resize(n);
  g.isView.resize(n);
  g.viewRoot.assign(n, -1);
  g.blockInput.resize(n);
  g.gemm.resize(n);
  g.alwaysRecomputed.resize(n);
  g.flops.assign(n, 0);
  g.bytes.assign(n, 0);
  g.operandRoots.resize(n);
  BitVector pinned(n);

  // The op that owns the buffer of `v`, through views; -1 if no forward op does.
  auto rootOf = [&](Value v) -> int {
    auto it = index.find(v.getDefiningOp());
    if (!v.getDefiningOp() || it == index.end())
      return -1;
    return g.isView.test(it->second) ? g.viewRoot[it->second] : int(it->second);
  };

  for (auto [i, op] : llvm::enumerate(g.ops)) {
    for (Operation *user : op->getUsers()) {
      if (auto it = index.find(user); it != index.end())
        g.users[i].push_back(it->second);
      else if (isBackward(user))
        g.backwardUse.set(i);
      else if (!readsOnlySideResults(op, user))
        pinned.set(i); // The return (the loss), an update, a metric: left as they are.
    }
    for (Value result : op->getResults())
      if (auto type = dyn_cast<RankedTensorType>(result.getType()))
        g.bytes[i] += getStorageBytes(type);
    for (Value operand : op->getOperands())
      if (int root = rootOf(operand); root >= 0)
        g.operandRoots[i].push_back(root);
    if (auto view = dyn_cast<ViewLikeOpInterface>(op)) {
      g.isView.set(i);
      g.viewRoot[i] = rootOf(view.getViewSource());
      continue;
    }
    if (auto norm = dyn_cast<NormalizationOpInterface>(op))
      if (int root = rootOf(norm.getNormalizedInput()); root >= 0)
        g.blockInput.set(root);
    auto cost = dyn_cast<CostOpInterface>(op);
    if (!cost)
      continue;
    OpCost forward = cost.getForwardCost();
    g.flops[i] = forward.totalFlops();
    g.gemm[i] = forward.matmulFlops > 0;
  }
  // A pinned view pins the buffer it aliases.
  for (unsigned i = 0; i < n; ++i)
    if (g.isView.test(i) && pinned.test(i) && g.viewRoot[i] >= 0)
      pinned.set(g.viewRoot[i]);
  for (auto [i, op] : llvm::enumerate(g.ops))
    g.candidate[i] = !g.isView.test(i) && !pinned.test(i) && isa<CostOpInterface>(op) &&
                     isa<KernelOpInterface>(op) && op->getNumRegions() == 0 &&
                     isMemoryEffectFree(op);
  for (auto [i, op] : llvm::enumerate(g.ops))
    if (auto recompute = dyn_cast<RecomputeOpInterface>(op))
      g.alwaysRecomputed[i] = g.candidate[i] && recompute.isAlwaysRecomputed();

  for (Operation &op : function.getBody().front()) {
    g.hasBackward |= isBackward(&op);
    if (auto cost = dyn_cast<CostOpInterface>(op))
      g.stepFlops += cost.getForwardCost().totalFlops();
  }
  return g;
}

BitVector ForwardGraph::resolve(const BitVector &dropped) const {
  unsigned n = size();
  BitVector recompute(n);
  // Users come after their operands: walking backwards, every user's decision is known.
  for (unsigned i = n; i-- > 0;) {
    int owner = isView.test(i) ? viewRoot[i] : int(i);
    if (owner < 0 || !candidate.test(owner) ||
        !(dropped.test(owner) || alwaysRecomputed.test(owner)))
      continue;
    if (backwardUse.test(i) ||
        llvm::any_of(users[i], [&](unsigned user) { return recompute.test(user); }))
      recompute.set(i);
  }
  return recompute;
}

BitVector ForwardGraph::getSavedRoots(const BitVector &recompute) const {
  BitVector saved(size());
  for (unsigned i = 0; i < size(); ++i) {
    int owner = isView.test(i) ? viewRoot[i] : int(i);
    if (owner >= 0 && (backwardUse.test(i) ||
                       llvm::any_of(users[i], [&](unsigned user) { return recompute.test(user); })))
      saved.set(owner);
  }
  return saved;
}

BitVector ForwardGraph::getChain(unsigned c, const BitVector &dropped,
                                 const BitVector &savedRoots) const {
  BitVector chain(size());
  chain.set(c);
  SmallVector<unsigned> work{c};
  while (!work.empty()) {
    unsigned x = work.pop_back_val();
    for (unsigned root : operandRoots[x]) {
      if (!candidate.test(root) || dropped.test(root) || alwaysRecomputed.test(root) ||
          chain.test(root) || savedRoots.test(root))
        continue;
      chain.set(root);
      work.push_back(root);
    }
  }
  return chain;
}

int64_t ForwardGraph::getFlops(const BitVector &recompute) const {
  int64_t total = 0;
  for (unsigned i : recompute.set_bits())
    total += flops[i];
  return total;
}

//===----------------------------------------------------------------------===//
// Applying a recompute set
//===----------------------------------------------------------------------===//

/// Clones the ops of `recompute` (positions in `forward`) into the backward pass, each right
/// before the first backward op or clone that reads it, in forward order where several go
/// before the same op; backward ops then read the clones. Returns the clones.
SmallVector<Operation *> applyRecompute(ArrayRef<Operation *> forward, const BitVector &recompute) {
  if (recompute.none())
    return {};
  MLIRContext *ctx = forward.front()->getContext();
  // Where each clone goes, from the last recomputed op to the first: a clone must precede
  // its backward readers and the clones that read it.
  llvm::DenseMap<Operation *, Operation *> anchor;
  for (unsigned i = forward.size(); i-- > 0;) {
    if (!recompute.test(i))
      continue;
    Operation *first = nullptr;
    auto consider = [&](Operation *op) {
      if (!first || op->isBeforeInBlock(first))
        first = op;
    };
    for (Operation *user : forward[i]->getUsers()) {
      if (isBackward(user))
        consider(user);
      else if (Operation *userAnchor = anchor.lookup(user))
        consider(userAnchor);
    }
    assert(first && "a recomputed op has a backward reader");
    anchor[forward[i]] = first;
  }

  OpBuilder builder(ctx);
  IRMapping mapping;
  StringAttr backward = StringAttr::get(ctx, "backward");
  SmallVector<Operation *> clones;
  for (unsigned i : recompute.set_bits()) {
    Operation *op = forward[i];
    builder.setInsertionPoint(anchor.lookup(op));
    Operation *clone = builder.clone(*op, mapping);
    clone->setAttr(kPhaseAttr, backward);
    clone->setAttr(kRecomputedAttr, UnitAttr::get(ctx));
    clones.push_back(clone);
  }
  for (unsigned i : recompute.set_bits())
    for (Value result : forward[i]->getResults())
      result.replaceUsesWithIf(mapping.lookup(result), [](OpOperand &use) {
        return isBackward(use.getOwner()) && !use.getOwner()->hasAttr(kRecomputedAttr);
      });
  return clones;
}

//===----------------------------------------------------------------------===//
// Trial plans
//===----------------------------------------------------------------------===//

/// Plans copies of one function with recompute sets applied, through the pipeline's own
/// lowering, scheduling and memory-planning passes; results are memoised by set.
class TrialPlanner {
public:
  TrialPlanner(func::FuncOp function, StringRef target, bool fuse,
               ArrayRef<std::string> fuseDisable)
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
    BonsaiLowerToPlanPassOptions lower;
    lower.target = target.str();
    pm.addPass(createBonsaiLowerToPlanPass(lower));
    pm.addPass(createBonsaiSchedulePass());
    pm.addPass(createBonsaiPlanMemoryPass());
  }

  /// The planned memory of the step with `recompute` applied.
  FailureOr<PlanMemorySummary> evaluate(const BitVector &recompute) {
    if (auto it = memo.find(recompute); it != memo.end())
      return it->second;
    OwningOpRef<ModuleOp> scratch = ModuleOp::create(function.getLoc());
    auto copy = cast<func::FuncOp>(function->clone());
    scratch->push_back(copy);
    applyRecompute(collectForwardOps(copy), recompute);
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
    memo.try_emplace(recompute, summary);
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

  /// The trial with the smallest peak so far (ties: the fewest FLOPs, then the first set in
  /// position order), as its peak and set.
  std::pair<int64_t, BitVector> getSmallestPeak(const ForwardGraph &g) const {
    std::tuple<int64_t, int64_t, SmallVector<unsigned>> best{INT64_MAX, 0, {}};
    BitVector bestSet;
    for (auto &[set, summary] : memo) {
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
  llvm::DenseMap<BitVector, PlanMemorySummary> memo;
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

  FailureOr<Trial> searchGreedy(const ForwardGraph &g, TrialPlanner &planner, int64_t budget,
                                const Trial &none);
  FailureOr<std::vector<BitVector>> enumerateSets(const ForwardGraph &g);
  FailureOr<Trial> searchExhaustive(const ForwardGraph &g, TrialPlanner &planner, int64_t budget);
  /// Auto's choice for `budget`: the search's, or a fixed policy's if it fits more cheaply.
  FailureOr<Trial> searchAuto(const ForwardGraph &g, TrialPlanner &planner, int64_t budget,
                              const Trial &none, ArrayRef<std::pair<StringRef, Trial>> fixed,
                              bool exhaustive);
  LogicalResult compareSearches(func::FuncOp function, const ForwardGraph &g, TrialPlanner &planner,
                                const Trial &none, ArrayRef<std::pair<StringRef, Trial>> fixed);
  /// Which trial plans an infeasible budget was judged on.
  enum class InfeasibleScope { Fixed, Exhaustive, Greedy };
  LogicalResult reportInfeasible(func::FuncOp function, const ForwardGraph &g,
                                 TrialPlanner &planner, int64_t budget, InfeasibleScope scope);
  LogicalResult rematFunction(func::FuncOp function, StringRef chosen, int64_t budget);
  void runOnOperation() override;
};

/// Greedy by real peak bytes freed per recomputed FLOP, in rounds of two phases.
///
/// Descent: a move drops one candidate, alone or with its chain (the operands, recursively,
/// that nothing keeps alive for the backward pass yet: recomputing a value from an operand
/// that would otherwise die in the forward pass only moves the memory). Every move is scored
/// by its trial plan: the peak bytes it frees per FLOP it adds, then (for moves that free
/// none but do not raise the peak, when several tensors hold the peak together) the bytes it
/// stops keeping per FLOP. A step takes the best-scored move; the cheapest fresh move that
/// meets the budget at each step is remembered, and wins if it is cheaper than where the
/// descent ends (a few cheap moves may beat one big one, and the other way round: the usual
/// greedy for covering knapsacks). Scores go stale when a step changes the plan; they are
/// refreshed lazily (the best stale score is re-evaluated until the best is fresh), all of
/// them at every step when there are at most kRefreshAll moves and every few steps beyond
/// (kRefreshPerStep re-planned moves per step on average), and whenever no fresh move frees
/// anything. The descent ends when the budget is met, when it can no longer beat the
/// remembered move, or when no move changes anything; short of the budget, it goes back to
/// the cheapest set with the lowest peak it reached.
///
/// Keeping again: dropped candidates, costliest first, are kept again wherever the peak
/// stays within the budget (or, while it is not met, falls). What an earlier step dropped may
/// stand in the way of a lower peak once later steps have changed the plan; if the budget is
/// still not met, the descent runs again without those candidates (at most three rounds).
FailureOr<Trial> RematPass::searchGreedy(const ForwardGraph &g, TrialPlanner &planner,
                                         int64_t budget, const Trial &none) {
  // Refreshing every score re-plans every move: every step for small graphs, every few steps
  // (kRefreshPerStep moves per step on average) beyond.
  constexpr unsigned kRefreshAll = 64, kRefreshPerStep = 16;
  unsigned n = g.size();
  BitVector dropped(n), tabu(n);
  Trial current = none;
  BitVector savedRoots;

  // Move 2c drops candidate c alone, move 2c + 1 drops it with its chain.
  auto getMove = [&](unsigned move) {
    unsigned c = move / 2;
    if (move % 2 == 0) {
      BitVector single(n);
      single.set(c);
      return single;
    }
    BitVector chain = g.getChain(c, dropped, savedRoots);
    chain.reset(tabu);
    chain.set(c);
    return chain;
  };
  struct Score {
    unsigned move = 0;
    /// The step the score was computed at; 0: never.
    unsigned step = 0;
    /// A chain move that is its candidate alone: never taken.
    bool duplicate = false;
    /// Real peak bytes freed per FLOP, then bytes no longer kept per FLOP.
    double perFlop = 0, keptPerFlop = 0;
    /// The move's trial.
    int64_t peak = INT64_MAX, flops = 0;
    std::pair<double, double> key() const { return {perFlop, keptPerFlop}; }
  };
  unsigned step = 1;
  auto rescore = [&](Score &s) -> LogicalResult {
    s.step = step;
    s.perFlop = s.keptPerFlop = 0;
    s.peak = current.peak;
    s.flops = current.flops;
    BitVector moved = getMove(s.move);
    s.duplicate = s.move % 2 == 1 && moved.count() == 1;
    if (s.duplicate)
      return success();
    BitVector next = dropped;
    next |= moved;
    BitVector recompute = g.resolve(next);
    if (recompute == current.recompute)
      return success(); // Nothing reads it in the backward pass yet.
    FailureOr<Trial> trial = evaluate(g, planner, recompute);
    if (failed(trial))
      return failure();
    double flops = std::max<int64_t>(1, trial->flops - current.flops);
    int64_t newlyRecomputed = 0;
    for (unsigned i : recompute.set_bits())
      if (!current.recompute.test(i) && !g.isView.test(i))
        newlyRecomputed += g.bytes[i];
    s.peak = trial->peak;
    s.flops = trial->flops;
    s.perFlop = std::max<int64_t>(0, current.peak - trial->peak) / flops;
    // A move that raises the peak is never taken for the bytes it stops keeping.
    s.keptPerFlop = trial->peak <= current.peak ? newlyRecomputed / flops : 0;
    return success();
  };

  auto descend = [&]() -> LogicalResult {
    savedRoots = g.getSavedRoots(current.recompute);
    std::vector<Score> scores;
    BitVector movable = g.getRelevant();
    movable.reset(tabu);
    movable.reset(dropped);
    for (unsigned c : movable.set_bits())
      for (unsigned move : {2 * c, 2 * c + 1})
        scores.push_back(Score{move});
    unsigned refreshPeriod =
        scores.size() <= kRefreshAll ? 1 : std::max<size_t>(1, scores.size() / kRefreshPerStep);
    // Moves that only stop keeping bytes may lead nowhere: if the budget is not met, the
    // descent ends where it reached its lowest peak most cheaply.
    Trial best = current;
    BitVector bestDropped = dropped;
    // The cheapest set met on the way that fits the budget.
    Trial fit{BitVector(), INT64_MAX, INT64_MAX};
    BitVector fitDropped;

    for (unsigned sinceRefresh = refreshPeriod; current.peak > budget; ++sinceRefresh) {
      // Steps only add FLOPs: past the cheapest set that fits, the descent cannot win.
      if (current.flops >= fit.flops)
        break;
      llvm::erase_if(scores, [&](const Score &s) { return dropped.test(s.move / 2); });
      auto refreshAll = [&]() -> LogicalResult {
        for (Score &s : scores)
          if (s.step != step && failed(rescore(s)))
            return failure();
        return success();
      };
      if (sinceRefresh >= refreshPeriod) {
        if (failed(refreshAll()))
          return failure();
        sinceRefresh = 0;
      }
      // Lazily: re-evaluate the best until it is fresh. Stale scores never beat a fresh
      // one, so the choice below is among fresh scores.
      auto rank = [](const Score &s) {
        return s.step == 0 ? std::make_pair(double(INFINITY), double(INFINITY)) : s.key();
      };
      auto bestScore = [&]() -> Score * {
        Score *top = nullptr;
        for (Score &s : scores)
          if (!s.duplicate && (!top || rank(s) > rank(*top)))
            top = &s;
        return top;
      };
      Score *top = nullptr;
      while ((top = bestScore()) && top->step != step)
        if (failed(rescore(*top)))
          return failure();
      if (top && top->perFlop == 0 && sinceRefresh != 0) {
        // No fresh move frees peak bytes: stale ones may have grown.
        if (failed(refreshAll()))
          return failure();
        sinceRefresh = 0;
        top = bestScore();
      }
      if (!top || (top->perFlop == 0 && top->keptPerFlop == 0))
        break; // No move changes anything any more.
      // The cheapest fresh move that meets the budget is a solution; the descent goes on by
      // score, as a few cheaper moves may meet it for less.
      for (Score &s : scores)
        if (s.step == step && !s.duplicate && s.peak <= budget && s.flops < fit.flops) {
          fit.flops = s.flops;
          fit.peak = s.peak;
          fitDropped = dropped;
          fitDropped |= getMove(s.move);
          fit.recompute = g.resolve(fitDropped);
        }
      dropped |= getMove(top->move);
      FailureOr<Trial> next = evaluate(g, planner, g.resolve(dropped));
      if (failed(next))
        return failure();
      current = *next;
      if (std::make_pair(current.peak, current.flops) < std::make_pair(best.peak, best.flops)) {
        best = current;
        bestDropped = dropped;
      }
      savedRoots = g.getSavedRoots(current.recompute);
      LLVM_DEBUG(llvm::dbgs() << "greedy step " << step << ": drop " << top->move / 2
                              << (top->move % 2 ? " with its chain (" : " (")
                              << g.ops[top->move / 2]->getName() << "), peak " << current.peak
                              << ", flops " << current.flops << "\n");
      ++step;
    }
    if (current.peak > budget &&
        std::make_pair(best.peak, best.flops) < std::make_pair(current.peak, current.flops)) {
      current = best;
      dropped = bestDropped;
    }
    if (fit.peak <= budget && (current.peak > budget || fit.flops < current.flops)) {
      current = fit;
      dropped = fitDropped;
    }
    return success();
  };

  // Returns whether anything was kept again.
  auto keepAgain = [&]() -> FailureOr<bool> {
    bool changed = false;
    SmallVector<unsigned> order = llvm::to_vector(dropped.set_bits());
    llvm::stable_sort(order, [&](unsigned a, unsigned b) { return g.flops[a] > g.flops[b]; });
    for (unsigned c : order) {
      BitVector next = dropped;
      next.reset(c);
      BitVector recompute = g.resolve(next);
      if (recompute == current.recompute) {
        dropped = next;
        continue;
      }
      FailureOr<Trial> trial = evaluate(g, planner, recompute);
      if (failed(trial))
        return failure();
      // Within the budget, any set that stays within it; above it, only a lower peak.
      bool better = current.peak > budget ? trial->peak < current.peak : trial->peak <= budget;
      if (better && trial->flops <= current.flops) {
        LLVM_DEBUG(llvm::dbgs() << "keep " << c << " again: peak " << trial->peak << "\n");
        dropped = next;
        current = *trial;
        if (current.peak > budget)
          tabu.set(c);
        changed = true;
      }
    }
    return changed;
  };

  for (unsigned round = 0; round < 3; ++round) {
    if (failed(descend()))
      return failure();
    FailureOr<bool> changed = keepAgain();
    if (failed(changed))
      return failure();
    if (current.peak <= budget || !*changed)
      break;
  }
  if (current.peak > budget)
    return Trial{BitVector(), 0, INT64_MAX}; // Out of the greedy's reach.
  return current;
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

FailureOr<Trial> RematPass::searchAuto(const ForwardGraph &g, TrialPlanner &planner, int64_t budget,
                                       const Trial &none,
                                       ArrayRef<std::pair<StringRef, Trial>> fixed,
                                       bool exhaustive) {
  FailureOr<Trial> found =
      exhaustive ? searchExhaustive(g, planner, budget) : searchGreedy(g, planner, budget, none);
  if (failed(found))
    return failure();
  // The fixed policies are fallbacks: the cheapest set that fits wins.
  for (auto &[policy, trial] : fixed)
    if (trial.peak <= budget && trial.flops < found->flops) {
      LLVM_DEBUG(llvm::dbgs() << "policy " << policy << " beats the search\n");
      found = trial;
    }
  return found;
}

/// search=compare: plans every distinct recompute set, takes the exhaustive frontier (for
/// each peak that some set reaches more cheaply than every cheaper set, the fewest FLOPs
/// that reach it) and runs auto's greedy search with each frontier peak as the budget.
LogicalResult RematPass::compareSearches(func::FuncOp function, const ForwardGraph &g,
                                         TrialPlanner &planner, const Trial &none,
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
  unsigned optimal = 0;
  double worst = 1;
  for (const Trial &optimum : frontier) {
    FailureOr<Trial> greedy = searchAuto(g, planner, optimum.peak, none, fixed, false);
    if (failed(greedy))
      return failure();
    InFlightDiagnostic remark = emitRemark(function.getLoc());
    remark << "budget " << optimum.peak << " bytes: optimum " << withCommas(optimum.flops)
           << " FLOPs, greedy ";
    if (greedy->peak > optimum.peak) {
      remark << "does not fit";
      worst = INFINITY;
      continue;
    }
    remark << withCommas(greedy->flops) << " FLOPs";
    if (greedy->flops == optimum.flops) {
      ++optimal;
      continue;
    }
    double ratio = optimum.flops ? double(greedy->flops) / optimum.flops : INFINITY;
    worst = std::max(worst, ratio);
    remark << " (" << fixedPoint(ratio) << "x)";
  }
  emitRemark(function.getLoc()) << "bonsai-remat (search 'compare'): greedy is optimal at "
                                << optimal << " of " << frontier.size()
                                << " budgets on the exhaustive frontier ("
                                << g.getRelevant().count() << " candidate tensors, " << sets->size()
                                << " distinct recompute sets planned); worst greedy/optimum FLOPs "
                                << fixedPoint(worst);
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
  InFlightDiagnostic diag = function.emitError() << "no recomputation fits the budget of "
                                                 << formatBytes(budget) << ": ";
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
    diag << "the smallest planned device peak the greedy search reached";
    break;
  }
  diag << " is " << formatBytes(peak) << " (" << peak << " bytes, recomputing " << tensors
       << " tensors for " << withCommas(g.getFlops(set)) << " FLOPs; " << planner.getNumPlans()
       << " trial plans), over by " << formatBytes(peak - budget);
  auto [dominant, bytes] = summary->dominant();
  diag << "; " << dominant << (StringRef(dominant).ends_with("s") ? " take " : " takes ")
       << formatBytes(bytes);
  if (StringRef(dominant) == "weights")
    diag << ": quantize the frozen base weights (bonsai.quantize), shard them over ranks "
            "(bonsai.shard) or offload them (bonsai.offload)";
  else if (StringRef(dominant) == "activations")
    diag << ": lower the batch size or the sequence length";
  else
    diag << ": shard or offload them (bonsai.shard, bonsai.offload)";
  return failure();
}

LogicalResult RematPass::rematFunction(func::FuncOp function, StringRef chosen, int64_t budget) {
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

  TrialPlanner planner(function, target, fuse, fuseDisable);
  // The baseline keeps everything it may: only what is always recomputed is.
  FailureOr<Trial> none = evaluate(g, planner, g.resolve(BitVector(g.size())));
  if (failed(none))
    return failure();

  Trial chosenTrial = *none;
  std::string how;
  if (chosen == "auto") {
    if (search != "compare" && none->peak <= budget) {
      emitRemark(function.getLoc())
          << "bonsai-remat (policy 'auto'): the plan fits the budget of " << formatBytes(budget)
          << " without recomputation (planned device peak " << formatBytes(none->peak) << ")";
      peakBefore = peakAfter = none->peak;
      numPlans += planner.getNumPlans();
      applyRecompute(g.ops, none->recompute);
      return success();
    }
    SmallVector<std::pair<StringRef, Trial>> fixed;
    for (StringRef policy : {"selective", "full", "everything"}) {
      FailureOr<Trial> trial = evaluate(g, planner, g.resolve(getDropped(g, policy)));
      if (failed(trial))
        return failure();
      fixed.emplace_back(policy, *trial);
    }
    if (search == "compare")
      return compareSearches(function, g, planner, *none, fixed);
    // Recomputation moves activations only: weights, gradients, optimizer state and inputs
    // stay. A budget below them is out of reach without searching.
    FailureOr<PlanMemorySummary> base = planner.evaluate(none->recompute);
    if (failed(base))
      return failure();
    if (budget < base->peakDevice - base->activations)
      return reportInfeasible(function, g, planner, budget, InfeasibleScope::Fixed);
    FailureOr<Trial> found = searchAuto(g, planner, budget, *none, fixed, search == "exhaustive");
    if (failed(found))
      return failure();
    if (found->peak > budget)
      return reportInfeasible(function, g, planner, budget,
                              search == "exhaustive" ? InfeasibleScope::Exhaustive
                                                     : InfeasibleScope::Greedy);
    chosenTrial = *found;
    how = (Twine("search ") + search + ", " + Twine(planner.getNumPlans()) +
           " trial plans; budget " + formatBytes(budget))
              .str();
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
  summary << "; planned device peak " << formatBytes(none->peak) << " -> "
          << formatBytes(chosenTrial.peak);
  if (!how.empty())
    summary << " (" << how << ")";
  summary.report();

  applyRecompute(g.ops, chosenTrial.recompute);
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
  if (chosen == "none" && !anyAlwaysRecomputed)
    return;
  for (auto function : module.getOps<func::FuncOp>())
    if (!function.isExternal() && !function.getBody().getOps<ParamOp>().empty())
      if (failed(rematFunction(function, chosen, budget)))
        return signalPassFailure();
}

} // namespace
} // namespace mlir::bonsai
