//===- ActivationOffload.cpp - Saved activations kept in host memory ------===//
//
// See ActivationOffload.h.
//
//===----------------------------------------------------------------------===//

#include "ActivationOffload.h"

namespace mlir::bonsai::remat {

BitVector getOffloadable(const ForwardGraph &g, const BitVector &recompute,
                         const BitVector &materialized) {
  BitVector offloadable = g.getSavedRoots(recompute);
  offloadable &= g.candidate;
  offloadable &= materialized;
  offloadable.reset(recompute);
  offloadable.reset(g.alwaysRecomputed);
  offloadable.reset(g.isView);
  return offloadable;
}

} // namespace mlir::bonsai::remat
