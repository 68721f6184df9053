//===- PeakModel.cpp - bonsai-remat's peak model --------------------------===//
//
// See PeakModel.h.
//
//===----------------------------------------------------------------------===//

#include "PeakModel.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "mlir/Interfaces/ViewLikeInterface.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringSet.h"

#include <functional>

namespace mlir::bonsai::remat {

namespace {
/// Trial plans made for the peak model carry, in every op's location, its position in the
/// function: lowering gives each buffer the location of the op that computes it, and fusion
/// a fused location of the ops it replaced.
constexpr StringLiteral kTagPrefix = "bonsai.remat.op#";

/// Appends the positions tagged into `loc` to `tags`.
void collectTags(Location loc, SmallVectorImpl<unsigned> &tags) {
  if (auto name = dyn_cast<NameLoc>(loc)) {
    StringRef text = name.getName().getValue();
    unsigned position;
    if (text.consume_front(kTagPrefix) && !text.getAsInteger(10, position))
      tags.push_back(position);
    collectTags(name.getChildLoc(), tags);
  } else if (auto fused = dyn_cast<FusedLoc>(loc)) {
    for (Location inner : fused.getLocations())
      collectTags(inner, tags);
  }
}
} // namespace

SmallVector<Operation *> collectPositions(func::FuncOp function) {
  return llvm::map_to_vector(function.getBody().front(), [](Operation &op) { return &op; });
}

void tagPositions(func::FuncOp copy) {
  MLIRContext *ctx = copy.getContext();
  for (auto [position, op] : llvm::enumerate(collectPositions(copy)))
    op->setLoc(NameLoc::get(StringAttr::get(ctx, kTagPrefix + Twine(position)), op->getLoc()));
}

Materialization readMaterialization(func::FuncOp function, plan::StepOp step) {
  SmallVector<Operation *> ops = collectPositions(function);
  Materialization m;
  m.resultBytes.resize(ops.size());
  for (auto [position, op] : llvm::enumerate(ops))
    m.resultBytes[position].assign(op->getNumResults(), 0);
  Block &body = step.getBody().front();
  llvm::StringSet<> perStep;
  for (auto arena : body.getOps<plan::ArenaOp>())
    // Per-step device arenas: host copies of offloaded activations take no device memory.
    if (arena.getLifetime() == plan::Lifetime::Step &&
        arena.getSpace() == plan::MemorySpace::Device)
      perStep.insert(arena.getSymName());
  for (auto buffer : body.getOps<plan::BufferOp>()) {
    // Inputs and the loss scale live through the whole step whatever is recomputed: they are
    // part of what the model's calibration measures.
    if (!perStep.contains(buffer.getArena()) || buffer.getRole() == plan::BufferRole::Input ||
        buffer.getRole() == plan::BufferRole::LossScale)
      continue;
    SmallVector<unsigned> tags;
    collectTags(buffer.getLoc(), tags);
    llvm::erase_if(tags, [&](unsigned tag) { return tag >= ops.size(); });
    if (tags.empty())
      continue;
    llvm::sort(tags);
    tags.erase(std::unique(tags.begin(), tags.end()), tags.end());
    int64_t size = buffer.getSizeInBytes();
    // The result of the latest tagged op of the buffer's size: a fused kernel's outputs are
    // its last members' results. A clone's buffer has its original's tag.
    auto match = [&](bool allowTaken) {
      for (unsigned tag : llvm::reverse(tags))
        for (auto [r, result] : llvm::enumerate(ops[tag]->getResults())) {
          auto type = dyn_cast<RankedTensorType>(result.getType());
          if (!type || getStorageBytes(type) != size || (m.resultBytes[tag][r] != 0 && !allowTaken))
            continue;
          m.resultBytes[tag][r] = size;
          return true;
        }
      return false;
    };
    if (!match(false) && !match(true))
      m.extras.emplace_back(tags.back(), size);
  }
  return m;
}

PeakModel::PeakModel(func::FuncOp function, const ForwardGraph &g, const Materialization &m)
    : g(g) {
  SmallVector<Operation *> ops = collectPositions(function);
  numPositions = ops.size();
  llvm::DenseMap<Operation *, unsigned> positionOf;
  for (auto [p, op] : llvm::enumerate(ops))
    positionOf[op] = p;
  llvm::DenseMap<Operation *, unsigned> forwardIndex;
  for (auto [i, op] : llvm::enumerate(g.ops))
    forwardIndex[op] = i;

  // The last position that reads a value's buffer, through views of it.
  llvm::DenseMap<Value, unsigned> lastThroughViews;
  std::function<unsigned(Value)> lastUse = [&](Value value) -> unsigned {
    if (auto it = lastThroughViews.find(value); it != lastThroughViews.end())
      return it->second;
    unsigned last = positionOf.lookup(value.getDefiningOp());
    for (Operation *user : value.getUsers()) {
      last = std::max(last, positionOf.lookup(user));
      if (auto view = dyn_cast<ViewLikeOpInterface>(user))
        if (view.getViewSource() == value)
          last = std::max(last, lastUse(view->getResult(0)));
    }
    lastThroughViews[value] = last;
    return last;
  };

  fixed.assign(numPositions + 1, 0);
  for (auto [p, op] : llvm::enumerate(ops)) {
    if (forwardIndex.count(op) || isa<ViewLikeOpInterface>(op))
      continue;
    for (auto [r, result] : llvm::enumerate(op->getResults()))
      if (m.resultBytes[p][r] > 0)
        addInterval(fixed, p, lastUse(result), m.resultBytes[p][r]);
  }
  for (auto [p, bytes] : m.extras)
    addInterval(fixed, p, p, bytes);

  unsigned n = g.size();
  position.resize(n);
  firstBackwardRead.assign(n, numPositions);
  valuesOf.resize(n);
  llvm::DenseMap<Value, unsigned> valueOf;
  for (auto [i, op] : llvm::enumerate(g.ops)) {
    position[i] = positionOf.lookup(op);
    for (Operation *user : op->getUsers())
      if (isBackward(user))
        firstBackwardRead[i] = std::min(firstBackwardRead[i], positionOf.lookup(user));
    if (g.isView.test(i)) {
      auto it = valueOf.find(cast<ViewLikeOpInterface>(op).getViewSource());
      if (it != valueOf.end())
        valueOf[op->getResult(0)] = it->second;
      continue;
    }
    for (auto [r, result] : llvm::enumerate(op->getResults())) {
      valueOf[result] = values.size();
      valuesOf[i].push_back(values.size());
      values.push_back({unsigned(i),
                        m.resultBytes[position[i]][r],
                        position[i],
                        0,
                        position[i],
                        {},
                        numPositions});
    }
  }
  // The first backward reader of a value, through forward views.
  std::function<unsigned(Value)> firstBackwardUse = [&](Value value) -> unsigned {
    unsigned first = numPositions;
    for (Operation *user : value.getUsers()) {
      if (isBackward(user))
        first = std::min(first, positionOf.lookup(user));
      else if (auto f = forwardIndex.find(user);
               f != forwardIndex.end() && g.isView.test(f->second))
        first = std::min(first, firstBackwardUse(user->getResult(0)));
    }
    return first;
  };
  // Readers, through forward views.
  for (auto [i, op] : llvm::enumerate(g.ops))
    for (Value result : op->getResults()) {
      auto it = valueOf.find(result);
      if (it == valueOf.end())
        continue;
      ForwardValue &value = values[it->second];
      value.firstBackwardRead = firstBackwardUse(result);
      for (Operation *user : result.getUsers()) {
        unsigned p = positionOf.lookup(user);
        if (auto f = forwardIndex.find(user); f != forwardIndex.end()) {
          if (g.isView.test(f->second))
            continue; // Its readers are this value's readers.
          value.lastForwardRead = std::max(value.lastForwardRead, p);
          value.readers.push_back(f->second);
        } else if (isBackward(user)) {
          unsigned last = p;
          if (isa<ViewLikeOpInterface>(user))
            last = lastUse(user->getResult(0));
          value.lastBackwardRead = std::max(value.lastBackwardRead, last);
        } else {
          // The return, an update, a metric: not the backward pass, and never recomputed.
          value.lastForwardRead = std::max(value.lastForwardRead, lastUse(result));
        }
      }
      value.lastRead = std::max({value.lastRead, value.lastForwardRead, value.lastBackwardRead});
    }
  for (auto [v, value] : llvm::enumerate(values))
    if (value.bytes != 0)
      materialized.push_back(v);
}

SmallVector<unsigned> PeakModel::getAnchors(const BitVector &recompute) const {
  unsigned n = g.size();
  // Anchors as applyRecompute places clones: before the first backward reader, or before the
  // first clone that reads it.
  SmallVector<unsigned> anchor(n, numPositions);
  for (unsigned i = n; i-- > 0;) {
    if (!recompute.test(i))
      continue;
    unsigned a = firstBackwardRead[i];
    for (unsigned user : g.users[i])
      if (recompute.test(user))
        a = std::min(a, anchor[user]);
    anchor[i] = a;
  }
  return anchor;
}

unsigned PeakModel::getFirstBackwardRead(const ForwardValue &value, const BitVector &recompute,
                                         ArrayRef<unsigned> anchor) const {
  unsigned first = value.firstBackwardRead;
  for (unsigned reader : value.readers)
    if (recompute.test(reader))
      first = std::min(first, anchor[reader]);
  return first;
}

SmallVector<std::pair<int64_t, unsigned>> PeakModel::getOffloaded(const BitVector &recompute,
                                                                  int64_t bytes) const {
  return getOffloaded(recompute, bytes, getAnchors(recompute));
}

SmallVector<std::pair<int64_t, unsigned>> PeakModel::getOffloaded(const BitVector &recompute,
                                                                  int64_t bytes,
                                                                  ArrayRef<unsigned> anchor) const {
  SmallVector<std::pair<int64_t, unsigned>> chosen;
  if (!offloadCandidates)
    return chosen;
  BitVector candidates = offloadCandidates(recompute);
  SmallVector<std::tuple<int64_t, unsigned, int64_t>> stays; // stay, op, bytes
  for (unsigned op : candidates.set_bits()) {
    unsigned first = numPositions;
    int64_t opBytes = 0;
    for (unsigned v : valuesOf[op]) {
      first = std::min(first, getFirstBackwardRead(values[v], recompute, anchor));
      opBytes += values[v].bytes;
    }
    if (first < numPositions && opBytes > 0)
      stays.emplace_back(int64_t(first) - int64_t(position[op]), op, opBytes);
  }
  llvm::stable_sort(stays, [](auto &a, auto &b) { return std::get<0>(a) > std::get<0>(b); });
  int64_t total = 0;
  for (auto [stay, op, opBytes] : stays)
    if (total + opBytes <= bytes) {
      total += opBytes;
      chosen.emplace_back(stay, op);
    }
  return chosen;
}

BitVector PeakModel::getOffloadedSet(const BitVector &recompute, int64_t bytes) const {
  BitVector set(g.size());
  for (auto [stay, op] : getOffloaded(recompute, bytes))
    set.set(op);
  return set;
}

void PeakModel::getProfile(const BitVector &recompute, SmallVectorImpl<int64_t> &live,
                           const BitVector *offloaded) const {
  SmallVector<unsigned> anchor = getAnchors(recompute);
  BitVector chosen(g.size());
  if (offloaded)
    chosen = *offloaded;
  else
    for (auto [stay, op] : getOffloaded(recompute, offloadBytes, anchor))
      chosen.set(op);
  // Offloaded values: where each is first read in the backward pass, and in what order they
  // go out and come back, for the schedule's retains and prefetches.
  SmallVector<unsigned> firstRead(values.size(), numPositions);
  SmallVector<unsigned> outs, backs;
  for (unsigned v : materialized) {
    const ForwardValue &value = values[v];
    if (!chosen.test(value.op))
      continue;
    unsigned first = getFirstBackwardRead(value, recompute, anchor);
    if (first >= numPositions)
      continue;
    firstRead[v] = first;
    outs.push_back(position[value.op]);
    backs.push_back(first);
  }
  llvm::sort(outs);
  llvm::sort(backs);

  live.assign(fixed.begin(), fixed.end());
  for (unsigned v : materialized) {
    const ForwardValue &value = values[v];
    unsigned def = position[value.op];
    if (recompute.test(value.op)) {
      addInterval(live, def, value.lastForwardRead, value.bytes);
      unsigned end = std::max(anchor[value.op], value.lastBackwardRead);
      for (unsigned reader : value.readers)
        if (recompute.test(reader))
          end = std::max(end, anchor[reader]);
      if (anchor[value.op] < numPositions)
        addInterval(live, anchor[value.op], end, value.bytes);
      continue;
    }
    unsigned end = value.lastRead;
    for (unsigned reader : value.readers)
      if (recompute.test(reader))
        end = std::max(end, anchor[reader]);
    if (firstRead[v] >= numPositions) {
      addInterval(live, def, end, value.bytes);
      continue;
    }
    // Out: kept from reuse until the next value goes out.
    auto next = llvm::upper_bound(outs, def);
    unsigned out = std::max(value.lastForwardRead, next == outs.end() ? def : *next);
    // Back: issued after the reader of the previous value that comes back.
    auto previous = llvm::lower_bound(backs, firstRead[v]);
    unsigned back = previous == backs.begin() ? firstRead[v] : *std::prev(previous);
    if (out >= back) {
      addInterval(live, def, end, value.bytes);
      continue;
    }
    addInterval(live, def, out, value.bytes);
    addInterval(live, back, end, value.bytes);
  }
  int64_t running = 0;
  for (int64_t &bytes : live) {
    running += bytes;
    bytes = running;
  }
  live.pop_back();
}

int64_t PeakModel::getPeak(const BitVector &recompute, const BitVector *offloaded) const {
  SmallVector<int64_t> live;
  getProfile(recompute, live, offloaded);
  return live.empty() ? 0 : *llvm::max_element(live);
}

int64_t PeakModel::getExcess(const BitVector &recompute, int64_t budget,
                             const BitVector *offloaded) const {
  SmallVector<int64_t> live;
  getProfile(recompute, live, offloaded);
  int64_t excess = 0;
  for (int64_t bytes : live)
    excess += std::max<int64_t>(0, bytes - budget);
  return excess;
}

} // namespace mlir::bonsai::remat
