//===- OffloadActivations.cpp - Saved activations in pinned host memory ---===//
//
// The `bonsai-offload-activations` pass (see Passes.td and docs/remat.md, "Offloading
// activations"): carries out bonsai-remat's third choice after fusion, so that the fusion
// patterns match the graph they would match without offload and the step computes the same
// values, bit for bit.
//
//===----------------------------------------------------------------------===//

#include "Remat/ActivationOffload.h"

#include "bonsai/Analysis/PlanSummary.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/ViewLikeInterface.h"
#include "llvm/ADT/DenseMap.h"

#include <functional>

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIOFFLOADACTIVATIONSPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {
using remat::isBackward;
using remat::kOffloadActivationsAttr;
using remat::kPhaseAttr;

/// A result of a forward op that the backward pass reads.
struct SavedValue {
  OpResult value;
  /// The backward pass's reads of it and of the forward views made from it.
  SmallVector<OpOperand *> uses;
  /// The first of those readers.
  Operation *firstReader;
  /// Ops of the function between the value's op and its first backward reader: how long it
  /// would stay in host memory.
  int64_t stay;
  int64_t bytes;
};

struct OffloadActivationsPass : impl::BonsaiOffloadActivationsPassBase<OffloadActivationsPass> {
  using Base::Base;

  /// Every result of a forward kernel that the backward pass reads and nothing outside the
  /// forward and backward passes does (the loss, an update's operand, a metric stay put),
  /// but the last forward kernel's.
  static SmallVector<SavedValue> collectSaved(func::FuncOp function) {
    llvm::DenseMap<Operation *, int64_t> position;
    for (auto [p, op] : llvm::enumerate(function.getBody().front()))
      position[&op] = p;
    // The forward pass's last kernel (a fused loss that computes its gradients there): no
    // forward work after it would hide a copy out, and its results are read at once.
    Operation *lastKernel = nullptr;
    for (Operation &op : function.getBody().front().without_terminator())
      if (!op.hasAttr(kPhaseAttr) && isa<KernelOpInterface>(op) && !isa<ViewLikeOpInterface>(op))
        lastKernel = &op;
    SmallVector<SavedValue> saved;
    for (Operation &op : function.getBody().front().without_terminator()) {
      if (op.hasAttr(kPhaseAttr) || !isa<KernelOpInterface>(op) || isa<ViewLikeOpInterface>(op) ||
          &op == lastKernel)
        continue;
      for (OpResult result : op.getResults()) {
        auto type = dyn_cast<RankedTensorType>(result.getType());
        if (!type)
          continue;
        SavedValue value{result, {}, nullptr, 0, getStorageBytes(type)};
        bool pinned = false;
        SmallVector<Value> work{result};
        while (!work.empty() && !pinned) {
          Value current = work.pop_back_val();
          for (OpOperand &use : current.getUses()) {
            Operation *user = use.getOwner();
            if (isBackward(user)) {
              value.uses.push_back(&use);
              continue;
            }
            if (user->hasAttr(kPhaseAttr) || isa<func::ReturnOp>(user)) {
              pinned = true; // An update, a metric, the returned loss.
              break;
            }
            auto view = dyn_cast<ViewLikeOpInterface>(user);
            if (view && view.getViewSource() == current)
              work.push_back(user->getResult(0));
          }
        }
        if (pinned || value.uses.empty())
          continue;
        value.firstReader = value.uses.front()->getOwner();
        for (OpOperand *use : value.uses)
          if (position.lookup(use->getOwner()) < position.lookup(value.firstReader))
            value.firstReader = use->getOwner();
        value.stay = position.lookup(value.firstReader) - position.lookup(&op);
        saved.push_back(std::move(value));
      }
    }
    return saved;
  }

  /// Out right after the value is computed (the copy stream overlaps it with the forward ops
  /// after it), back right before the backward pass first needs it (bonsai-schedule issues
  /// it earlier, one group of copies ahead); views the backward pass reads are remade on the
  /// device copy.
  static void offload(SavedValue &saved) {
    Operation *op = saved.value.getOwner();
    OpBuilder builder(op->getContext());
    auto type = cast<RankedTensorType>(saved.value.getType());
    builder.setInsertionPointAfter(op);
    auto toHost = CopyToHostOp::create(builder, op->getLoc(), type, saved.value);
    builder.setInsertionPoint(saved.firstReader);
    auto toDevice = CopyH2DOp::create(builder, op->getLoc(), type, toHost.getResult());
    StringAttr backward = builder.getStringAttr("backward");
    toDevice->setAttr(kPhaseAttr, backward);
    llvm::DenseMap<Value, Value> onDevice{{saved.value, toDevice.getResult()}};
    std::function<Value(Value)> deviceValue = [&](Value value) -> Value {
      if (Value known = onDevice.lookup(value))
        return known;
      Operation *view = value.getDefiningOp();
      Value source = cast<ViewLikeOpInterface>(view).getViewSource();
      IRMapping mapping;
      mapping.map(source, deviceValue(source));
      builder.setInsertionPoint(saved.firstReader);
      Operation *remade = builder.clone(*view, mapping);
      remade->setAttr(kPhaseAttr, backward);
      Value remadeValue = remade->getResult(cast<OpResult>(value).getResultNumber());
      onDevice[value] = remadeValue;
      return remadeValue;
    };
    for (OpOperand *use : saved.uses)
      use->set(deviceValue(use->get()));
  }

  void runOnFunction(func::FuncOp function, int64_t offloadBytes) {
    SmallVector<SavedValue> saved = collectSaved(function);
    // What goes to the host: the longest stays between the passes first (the most device
    // memory freed for the bytes moved), while they fit in the bytes bonsai-remat allows.
    SmallVector<unsigned> order = llvm::to_vector(llvm::seq<unsigned>(0, saved.size()));
    llvm::stable_sort(order, [&](unsigned a, unsigned b) { return saved[a].stay > saved[b].stay; });
    int64_t kept = 0, offloaded = 0;
    unsigned keptCount = 0, offloadedCount = 0;
    for (unsigned i : order) {
      if (offloaded + saved[i].bytes > offloadBytes) {
        kept += saved[i].bytes;
        ++keptCount;
        continue;
      }
      offload(saved[i]);
      offloaded += saved[i].bytes;
      ++offloadedCount;
    }
    numOffloaded += offloadedCount;
    bytesOffloaded += offloaded;
    emitRemark(function.getLoc()) << "bonsai-offload-activations: " << offloadedCount << " of "
                                  << saved.size()
                                  << " saved activations in pinned host memory between the passes ("
                                  << formatBytes(offloaded) << " each way per micro-batch), "
                                  << keptCount << " on the device (" << formatBytes(kept) << ")";
  }

  void runOnOperation() override {
    for (auto function : getOperation().getOps<func::FuncOp>()) {
      auto bytes = function->getAttrOfType<IntegerAttr>(kOffloadActivationsAttr);
      if (!bytes)
        continue;
      function->removeAttr(kOffloadActivationsAttr);
      runOnFunction(function, bytes.getInt());
    }
  }
};
} // namespace
} // namespace mlir::bonsai
