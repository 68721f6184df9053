//===- Schedule.cpp - Order and streams for plan launches -----------------===//
//
// The `bonsai-schedule` pass (see Passes.td): declarations above the work, every launch on a
// stream, and the host-offload copies overlapped with the work around them (docs/offload.md,
// "Overlap").
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/PlanSummary.h"
#include "bonsai/Dialect/Plan/IR/PlanDialect.h"
#include "bonsai/Target/TargetProfile.h"
#include "bonsai/Transforms/Passes.h"
#include "bonsai/Transforms/PlannedStep.h"
#include "bonsai/runtime/KernelKinds.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/Format.h"

#include <limits>

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAISCHEDULEPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {
using plan::LaunchOp;

using plan::PlanStream;

/// The stream `launch` is issued on.
PlanStream streamOf(LaunchOp launch) { return PlanStream(launch.getStream()); }

/// Whether `kernel` exchanges data with the other ranks (the kCollective trait of the
/// runtime's kernel table, KernelKinds.def): all-gathers, reduce-scatters, all-reduces.
bool isCollective(StringRef kernel) {
  static const llvm::StringSet<> names = [] {
    using namespace ::bonsai::rt::kernel_traits;
    llvm::StringSet<> set;
#define BONSAI_KERNEL_KIND(Name, Value, OpName, Attrs, MinIn, In, MinOut, Out, ReadWrite, Traits)  \
  if (((Traits)&kCollective) != 0)                                                                 \
    set.insert(OpName);
#include "bonsai/runtime/KernelKinds.def"
    return set;
  }();
  return names.contains(kernel);
}

/// The prefetch distances of the all-gathers bonsai-schedule weighs, in gathers.
constexpr unsigned kDistances[] = {1, 2, 3, 4, 6, 8, 12, 16};
/// A deeper prefetch is taken only if no shallower one comes this close to the fastest
/// predicted step: the simulation's own error is larger than the differences below it.
constexpr double kWorthwhile = 0.005;

struct SchedulePass : impl::BonsaiSchedulePassBase<SchedulePass> {
  using Base::Base;

  /// Declarations move above all work, keeping their relative order (so views still follow
  /// their sources); the work keeps its order, which is the step's meaning.
  static void hoistDeclarations(Block &body) {
    Operation *anchor = nullptr;
    for (Operation &op : llvm::make_early_inc_range(body)) {
      if (!isa<plan::ArenaOp, plan::BufferOp, plan::ViewOp>(op))
        continue;
      if (anchor)
        op.moveAfter(anchor);
      else
        op.moveBefore(&body, body.begin());
      anchor = &op;
    }
  }

  /// A launch that reads a pinned host buffer and writes device buffers is a host-to-device
  /// copy, the reverse a device-to-host copy, and one that touches pinned host buffers only
  /// is an update that runs on the host (the runtime's loader holds every other kind to
  /// device arenas); everything else computes.
  static PlanStream assignedStream(LaunchOp launch,
                                   const llvm::StringMap<plan::MemorySpace> &spaces) {
    auto onHost = [&](ValueRange values) {
      bool host = false, device = false;
      for (Value v : values)
        if (plan::BufferOp buffer = plan::getUnderlyingBuffer(v))
          (spaces.lookup(buffer.getArena()) == plan::MemorySpace::PinnedHost ? host : device) =
              true;
      return std::pair(host, device);
    };
    if (isCollective(launch.getKernel()))
      return PlanStream::Collectives;
    auto [insHost, insDevice] = onHost(launch.getIns());
    auto [outsHost, outsDevice] = onHost(launch.getOuts());
    if (insHost && !insDevice && outsDevice && !outsHost)
      return PlanStream::HostToDevice;
    if (outsHost && !outsDevice && insDevice && !insHost)
      return PlanStream::DeviceToHost;
    if ((insHost || outsHost) && !insDevice && !outsDevice)
      return PlanStream::Host;
    return PlanStream::Compute;
  }

  static bool touches(Operation *op, plan::BufferOp buffer) {
    return llvm::any_of(op->getOperands(),
                        [&](Value v) { return plan::getUnderlyingBuffer(v) == buffer; });
  }

  static std::optional<plan::Phase> phaseOf(Operation *op) {
    if (auto launch = dyn_cast<LaunchOp>(op))
      return launch.getPhase();
    return std::nullopt;
  }

  /// Host-to-device copies are issued one update ahead: the copies an op reads (its group)
  /// move up to just after the op that read the previous group, within their phase, so that
  /// they cross PCIe while that op, the previous group's copies back and whatever compute lies
  /// between run. Device-to-host copies stay right after their update; a retain of their
  /// sources before the next group's reader keeps the planner from handing those bytes to
  /// the compute stream while the copy may still read them. Offloaded activations go out in
  /// the forward pass, which reads no group: their sources are kept until the next copy out
  /// (the work between hides the copy) and come back in the backward pass as groups do. The
  /// runtime derives every wait from the bytes (orderStreams), so this order is a
  /// performance choice only.
  /// Returns the groups moved and the sources retained.
  static std::pair<unsigned, unsigned> overlapCopies(Block &body) {
    unsigned prefetched = 0, retainedSources = 0;
    // Groups of host-to-device copies by the first op that reads their result.
    SmallVector<std::pair<Operation *, SmallVector<LaunchOp>>> groups;
    for (LaunchOp copy : body.getOps<LaunchOp>()) {
      if (streamOf(copy) != PlanStream::HostToDevice || copy.getOuts().size() != 1)
        continue;
      plan::BufferOp staged = plan::getUnderlyingBuffer(copy.getOuts()[0]);
      Operation *reader = nullptr;
      for (Operation *op = copy->getNextNode(); op && !reader; op = op->getNextNode())
        if (phaseOf(op) == copy.getPhase() && touches(op, staged))
          reader = op;
      if (!reader)
        continue;
      if (!groups.empty() && groups.back().first == reader)
        groups.back().second.push_back(copy);
      else
        groups.push_back({reader, {copy}});
    }

    Operation *previousReader = nullptr;
    for (auto &[reader, copies] : groups) {
      // Walk up from the group's first copy while the op above is of the same phase, is not
      // the previous group's reader, and touches none of the copies' host sources.
      Operation *first = copies.front();
      Operation *above = first->getPrevNode();
      auto blocks = [&](Operation *op) {
        if (op == previousReader || !phaseOf(op) || phaseOf(op) != phaseOf(first) ||
            isa<plan::ArenaOp, plan::BufferOp, plan::ViewOp>(op))
          return true;
        return llvm::any_of(copies, [&](LaunchOp copy) {
          return llvm::any_of(copy.getIns(),
                              [&](Value v) { return touches(op, plan::getUnderlyingBuffer(v)); });
        });
      };
      while (above && !blocks(above))
        above = above->getPrevNode();
      if (above != first->getPrevNode()) {
        Operation *anchor = above;
        for (LaunchOp copy : copies) {
          copy->moveAfter(anchor);
          anchor = copy;
        }
        ++prefetched;
      }
      previousReader = reader;
    }

    // Retains of device-to-host sources: before the reader of the next group issued after the
    // copy, or after the last op of its phase.
    llvm::DenseSet<Operation *> readers;
    for (auto &group : groups)
      readers.insert(group.first);
    SmallVector<LaunchOp> backCopies;
    for (LaunchOp copy : body.getOps<LaunchOp>())
      if (streamOf(copy) == PlanStream::DeviceToHost)
        backCopies.push_back(copy);
    llvm::DenseMap<Operation *, SmallVector<Value>> retained;
    llvm::DenseMap<Operation *, bool> retainAfter;
    for (LaunchOp copy : backCopies) {
      Operation *until = nullptr, *last = copy;
      bool sawWork = false;
      bool activation = copy.getPhase() == plan::Phase::Forward;
      // A copy staged for an update on the host: its source is kept until the update after
      // the one that reads it, so that one update's compute covers the copy.
      plan::BufferOp staged = plan::getUnderlyingBuffer(copy.getOuts()[0]);
      bool readOnHost = false;
      for (Operation *op = copy->getNextNode(); op; op = op->getNextNode()) {
        if (phaseOf(op) != copy.getPhase())
          break;
        last = op;
        auto launch = dyn_cast<LaunchOp>(op);
        if (activation && sawWork && launch && streamOf(launch) == PlanStream::DeviceToHost) {
          until = op;
          break;
        }
        if (launch && streamOf(launch) == PlanStream::Host) {
          if (readOnHost) {
            until = op;
            break;
          }
          readOnHost = touches(op, staged);
        }
        if (!launch || streamOf(launch) == PlanStream::Compute) {
          if (readers.contains(op)) {
            until = op;
            break;
          }
          sawWork = true;
        }
      }
      if (!sawWork)
        continue; // Nothing computes between the copy and the point: nothing to keep out.
      Operation *point = until ? until : last;
      retained[point].push_back(copy.getIns()[0]);
      retainAfter[point] = !until;
    }
    for (Operation &op : llvm::make_early_inc_range(body)) {
      auto it = retained.find(&op);
      if (it == retained.end())
        continue;
      OpBuilder builder(&op);
      if (retainAfter[&op])
        builder.setInsertionPointAfter(&op);
      plan::RetainOp::create(builder, op.getLoc(), it->second);
      retainedSources += it->second.size();
    }
    return {prefetched, retainedSources};
  }

  /// The all-gathers of the forward and backward passes are issued `distance` gathers ahead:
  /// each moves up, within its phase, to just after the first reader of the gather `distance`
  /// before it (or just after the gather before it, if that one is later still), so that the
  /// collectives stream brings in the next parameters' weights while the compute stream works
  /// on the layer before (FSDP's forward and backward prefetch). The memory planner runs after
  /// this pass, so each gathered buffer lives from where it is issued. Returns the gathers
  /// moved.
  static unsigned prefetchGathers(Block &body, unsigned distance) {
    unsigned moved = 0;
    // Positions in the order before any move. A move takes a gather up to just after an
    // earlier op, behind the gathers placed there before it, which keeps the order of every
    // other pair; so a gather's place is the position of the op it follows and its rank among
    // the gathers placed after that op, and "is the anchor before this gather" needs no
    // Operation::isBeforeInBlock, whose order each move invalidates (an O(ops) renumbering per
    // gather: minutes for a 70B step's remat trials).
    llvm::DenseMap<Operation *, size_t> position;
    for (Operation &op : body)
      position[&op] = position.size();
    using Place = std::pair<size_t, size_t>;
    SmallVector<Operation *> readers; // Of the gathers so far in the current phase.
    std::optional<plan::Phase> phase;
    LaunchOp previousGather;
    Place previousPlace;
    for (LaunchOp gather : llvm::to_vector(body.getOps<LaunchOp>())) {
      if (streamOf(gather) != PlanStream::Collectives || gather.getKernel() != "all_gather" ||
          gather.getPhase() == plan::Phase::Update || gather.getOuts().size() != 1)
        continue;
      if (phase != gather.getPhase()) {
        readers.clear();
        previousGather = nullptr;
      }
      phase = gather.getPhase();
      plan::BufferOp gathered = plan::getUnderlyingBuffer(gather.getOuts()[0]);
      Operation *reader = nullptr;
      for (Operation *op = gather->getNextNode(); op && !reader; op = op->getNextNode())
        if (phaseOf(op) == gather.getPhase() && touches(op, gathered))
          reader = op;
      Place place{position.lookup(gather), 0};
      Operation *anchor = readers.size() >= distance ? readers[readers.size() - distance] : nullptr;
      if (anchor && position.lookup(anchor) < place.first) {
        Place anchorPlace{position.lookup(anchor), 0};
        // Behind the gather before, if that one is issued later: the collectives stream
        // keeps the gathers in their order.
        if (previousGather && previousPlace >= anchorPlace) {
          anchor = previousGather;
          anchorPlace = {previousPlace.first, previousPlace.second + 1};
        } else {
          anchorPlace.second = 1;
        }
        auto writesShare = [&](Operation *op) {
          auto launch = dyn_cast<LaunchOp>(op);
          return launch && llvm::any_of(gather.getIns(), [&](Value in) {
                   plan::BufferOp share = plan::getUnderlyingBuffer(in);
                   return llvm::any_of(launch.getOuts(), [&](Value out) {
                     return plan::getUnderlyingBuffer(out) == share;
                   });
                 });
        };
        // Nothing between may write the share (the update does, in another phase).
        bool blocked = anchor->getNextNode() == gather;
        for (Operation *op = anchor->getNextNode(); op != gather && !blocked;
             op = op->getNextNode())
          blocked = writesShare(op);
        if (!blocked) {
          gather->moveAfter(anchor);
          place = anchorPlace;
          ++moved;
        }
      }
      readers.push_back(reader);
      previousGather = gather;
      previousPlace = place;
    }
    return moved;
  }

  /// The reader of each reduce-scatter's share (its accumulation) moves down, within its
  /// phase, to just before the next reduce-scatter: the compute stream goes on with the next
  /// layer's backward while the collectives stream reduces this layer's gradient, instead of
  /// waiting for it at once. A reader moves only past ops that touch none of its buffers.
  /// Returns the readers moved.
  static unsigned deferScatterReaders(Block &body) {
    SmallVector<LaunchOp> scatters;
    for (LaunchOp launch : body.getOps<LaunchOp>())
      if (streamOf(launch) == PlanStream::Collectives && launch.getKernel() == "reduce_scatter" &&
          launch.getPhase() != plan::Phase::Update && launch.getOuts().size() == 1)
        scatters.push_back(launch);
    unsigned moved = 0;
    for (size_t i = 0; i + 1 < scatters.size(); ++i) {
      LaunchOp scatter = scatters[i], next = scatters[i + 1];
      if (next.getPhase() != scatter.getPhase())
        continue;
      plan::BufferOp share = plan::getUnderlyingBuffer(scatter.getOuts()[0]);
      SmallVector<Operation *> readers;
      for (Operation *op = scatter->getNextNode(); op && op != next; op = op->getNextNode())
        if (touches(op, share))
          readers.push_back(op);
      if (readers.size() != 1 || !isa<LaunchOp>(readers[0]))
        continue;
      Operation *reader = readers[0];
      SmallVector<plan::BufferOp> mine;
      for (Value v : reader->getOperands())
        if (plan::BufferOp buffer = plan::getUnderlyingBuffer(v))
          mine.push_back(buffer);
      bool clear = true;
      for (Operation *op = reader->getNextNode(); op != next && clear; op = op->getNextNode())
        clear = !isa<plan::ArenaOp, plan::BufferOp, plan::ViewOp>(op) &&
                llvm::none_of(mine, [&](plan::BufferOp buffer) { return touches(op, buffer); });
      if (!clear || reader->getNextNode() == next)
        continue;
      reader->moveBefore(next);
      ++moved;
    }
    return moved;
  }

  /// What the overlap moved.
  struct Moves {
    unsigned prefetchedGathers = 0, deferredScatters = 0;
    std::pair<unsigned, unsigned> copies{0, 0}; // overlapCopies' result
  };

  /// Orders the collectives (the all-gathers `distance` ahead, the reduce-scatters' readers
  /// deferred) and, with `copies`, the host-offload copies, in a step whose launches have
  /// their streams.
  static Moves overlapLaunches(Block &body, unsigned distance, bool collectives, bool copies) {
    Moves moves;
    if (collectives) {
      moves.prefetchedGathers = prefetchGathers(body, distance);
      moves.deferredScatters = deferScatterReaders(body);
    }
    if (copies)
      moves.copies = overlapCopies(body);
    return moves;
  }

  /// A copy of a step scheduled with its all-gathers `distance` ahead, planned and simulated.
  struct Trial {
    unsigned distance = 1;
    double seconds = 0;
    int64_t peak = 0;
  };

  static std::optional<Trial> tryDistance(plan::StepOp step, unsigned distance, bool copies,
                                          const SimMachine &machine) {
    OwningOpRef<plan::StepOp> trial(cast<plan::StepOp>(step->clone()));
    overlapLaunches(trial->getBody().front(), distance, /*collectives=*/true, copies);
    planStepBuffers(*trial);
    std::optional<std::vector<SimLaunch>> launches = collectSimLaunches(*trial);
    if (!launches)
      return std::nullopt;
    SimulatedStep simulated = simulateStep(*launches, trial->getMicroBatches(), machine);
    return Trial{distance, simulated.stepSeconds, summarizePlanMemory(*trial).peakDevice};
  }

  /// The prefetch distance of the all-gathers: `prefetch-distance` when it names one; else
  /// the smallest of kDistances whose predicted step (the scheduled copy planned and
  /// simulated as bonsai-predict-step will) is within kWorthwhile of the fastest that fits the
  /// step's device budget. A deeper prefetch keeps more gathered weights live at once, so
  /// the smallest that reaches the link's or the compute's limit is taken. Without a step
  /// time for the target (no rates, or no `target`), one gather ahead. `why` says which.
  unsigned chooseDistance(plan::StepOp step, bool copies, unsigned gathers,
                          llvm::raw_string_ostream &why) {
    if (prefetchDistance > 0) {
      why << "asked for";
      return prefetchDistance;
    }
    std::optional<TargetProfile> profile =
        target.empty() ? std::nullopt : lookupTargetProfile(target);
    if (!profile) {
      why << "no step time to weigh a deeper prefetch on";
      return 1;
    }
    SimMachine machine = runtimeMachine(*profile);
    SmallVector<Trial> trials;
    for (unsigned distance : kDistances) {
      if (distance > 1 && distance >= gathers)
        break;
      std::optional<Trial> trial = tryDistance(step, distance, copies, machine);
      if (!trial) {
        why << "no step time to weigh a deeper prefetch on";
        return 1;
      }
      trials.push_back(*trial);
    }
    int64_t budget = step.getDeviceMemoryAttr().getInt();
    auto fits = [&](const Trial &trial) {
      return trial.distance == 1 || budget <= 0 || trial.peak <= budget;
    };
    double fastest = std::numeric_limits<double>::infinity();
    for (const Trial &trial : trials)
      if (fits(trial))
        fastest = std::min(fastest, trial.seconds);
    unsigned chosen = 1;
    for (const Trial &trial : trials)
      if (fits(trial) && trial.seconds <= fastest * (1 + kWorthwhile)) {
        chosen = trial.distance;
        break;
      }
    why << "predicted step";
    for (const Trial &trial : trials) {
      why << (trial.distance == 1 ? " " : ", ") << trial.distance << " ahead "
          << llvm::format("%.2f", trial.seconds * 1e3) << " ms at "
          << (trial.distance == 1 ? "a " : "") << formatBytes(trial.peak)
          << (trial.distance == 1 ? " peak" : "");
      if (!fits(trial))
        why << " over the " << formatBytes(budget) << " budget";
    }
    why << ": the shallowest within " << llvm::format("%.1f", kWorthwhile * 100)
        << "% of the fastest";
    return chosen;
  }

  void scheduleStep(plan::StepOp step) {
    Block &body = step.getBody().front();
    hoistDeclarations(body);
    llvm::StringMap<plan::MemorySpace> spaces;
    for (auto arena : body.getOps<plan::ArenaOp>())
      spaces[arena.getSymName()] = arena.getSpace();
    unsigned copies = 0, hostSteps = 0, copiesAfterHostSteps = 0, collectives = 0;
    // The most all-gathers of one phase: the deepest prefetch that can move one.
    unsigned gathers[3] = {0, 0, 0};
    // The buffers the host updates write.
    llvm::DenseSet<Operation *> writtenOnHost;
    for (LaunchOp launch : body.getOps<LaunchOp>()) {
      // An update on the host runs on the host stream whatever `overlap` says: no other
      // stream reaches pinned host memory from the CPU.
      PlanStream stream = assignedStream(launch, spaces);
      if (stream == PlanStream::Host) {
        ++hostSteps;
        for (Value out : launch.getOuts())
          if (plan::BufferOp buffer = plan::getUnderlyingBuffer(out))
            writtenOnHost.insert(buffer);
      } else if (!overlap) {
        stream = PlanStream::Compute;
      } else if (stream == PlanStream::HostToDevice && llvm::all_of(launch.getIns(), [&](Value in) {
                   plan::BufferOp buffer = plan::getUnderlyingBuffer(in);
                   return buffer && writtenOnHost.contains(buffer);
                 })) {
        // A copy back of what a host update wrote waits for the update: on the copy stream
        // it would hold up every copy behind it (the streamed updates' state) until the CPU
        // is done, on the host stream the next host update. It gets a stream of its own.
        stream = PlanStream::HostResults;
        ++copiesAfterHostSteps;
      }
      launch.setStream(int64_t(stream));
      copies += stream == PlanStream::HostToDevice || stream == PlanStream::DeviceToHost;
      collectives += stream == PlanStream::Collectives;
      if (stream == PlanStream::Collectives && launch.getKernel() == "all_gather")
        ++gathers[unsigned(launch.getPhase()) % 3];
    }
    bool overlapCopiesToo = overlap && (copies || hostSteps);
    std::string why;
    llvm::raw_string_ostream whyStream(why);
    unsigned distance = collectives ? chooseDistance(step, overlapCopiesToo,
                                                     std::max(gathers[0], gathers[1]), whyStream)
                                    : 1;
    Moves moves = overlapLaunches(body, distance, collectives != 0, overlapCopiesToo);
    if (collectives) {
      numPrefetchedGathers += moves.prefetchedGathers;
      step.emitRemark() << "schedule: " << collectives << " collectives on the collectives stream; "
                        << "all-gathers issued " << distance << " ahead, "
                        << moves.prefetchedGathers << " of them moved (" << why << "); "
                        << moves.deferredScatters
                        << " reduce-scatters read one reduce-scatter later";
    }
    if (!copies && !hostSteps)
      return;
    copies += copiesAfterHostSteps;
    auto [prefetched, retainedSources] = moves.copies;
    numPrefetched += prefetched;
    numRetained += retainedSources;
    InFlightDiagnostic remark = step.emitRemark() << "schedule: ";
    if (hostSteps)
      remark << hostSteps << " updates on the host stream";
    if (copiesAfterHostSteps)
      remark << ", their " << copiesAfterHostSteps
             << " copies back to the device on a stream of their own";
    if (hostSteps)
      remark << "; ";
    if (!overlap) {
      remark << "the copies in order on the compute stream";
      return;
    }
    remark << copies << " host-offload copies on the copy streams; the copies into " << prefetched
           << " updates issued one update ahead; " << retainedSources
           << " sources of copies back kept from reuse until the next update";
  }

  void runOnOperation() override {
    for (auto step : getOperation().getOps<plan::StepOp>())
      scheduleStep(step);
  }
};
} // namespace
} // namespace mlir::bonsai
