//===- GaLore.cpp - The contracts of the GaLore kernels -------------------===//
//
// The operand contracts of GaLore's projector refresh, projection and update (docs/galore.md): what
// the plan loader checks of each such kernel before any backend runs it (KernelChecker.h). Each
// kind's `verify` checks its attributes, then its operands, then the state it keeps.
//
//===----------------------------------------------------------------------===//

#include "KernelChecker.h"

namespace bonsai::rt::contract {

void KernelChecker::verify(kinds::GaloreRefresh) {
  const auto &a = attrs<kinds::GaloreRefresh>();
  // Attributes.
  if (a.updateProjGap <= 0)
    fail("update_proj_gap must be positive, got " + std::to_string(a.updateProjGap));
  if (a.offset < 0 || a.offset >= a.updateProjGap)
    fail("offset " + std::to_string(a.offset) +
         " is outside [0, update_proj_gap = " + std::to_string(a.updateProjGap) + ")");
  if (a.powerIterations < 0 || a.powerIterations > 16)
    fail("power_iterations must be in [0, 16], got " + std::to_string(a.powerIterations));
  // Operands.
  expectFloat(0);
  expectRank(0, 2);
  const std::vector<int64_t> &g = in(0).shape;
  checkGaloreSide(g, a.left);
  int64_t small = std::min(g[0], g[1]), large = std::max(g[0], g[1]);
  if (a.rank <= 0 || a.rank >= small)
    fail("rank " + std::to_string(a.rank) +
         " must be positive and below min(m, n) = " + std::to_string(small));
  expectScalarInput(1, DType::I64);
  expectF32Output(0, {galore::workspaceElements(small, large, a.rank)});
  expectF32Output(1, {small, a.rank});
  if (out(2).dtype != DType::F32 || out(2).shape.size() != 1)
    fail(outName(2) + ": expected a 1-D f32 status vector, got " + formatShape(out(2).shape) + " " +
         dtypeName(out(2).dtype));
  if (a.slot < 0 || a.slot >= out(2).shape[0])
    fail("slot " + std::to_string(a.slot) + " is outside " + outName(2) + " of " +
         std::to_string(out(2).shape[0]) + (out(2).shape[0] == 1 ? " weight" : " weights"));
  // State.
  expectPersistent(1);
  expectPersistent(2);
  expectInit(1, TensorInit::Zeros, "the projector is zero until its first refresh");
  expectInit(2, TensorInit::Zeros, "no refresh has failed before the first step");
}

void KernelChecker::verify(kinds::GaloreProject) {
  expectFloat(0);
  expectRank(0, 2);
  const std::vector<int64_t> &g = in(0).shape;
  bool left = attrs<kinds::GaloreProject>().left;
  checkGaloreSide(g, left);
  expectGaloreProjector(1, left ? g[0] : g[1]);
  int64_t r = in(1).shape[1];
  expectF32Output(0, left ? std::vector<int64_t>{r, g[1]} : std::vector<int64_t>{g[0], r});
}

void KernelChecker::verify(kinds::GaloreAdamWUpdate) {
  const auto &a = attrs<kinds::GaloreAdamWUpdate>();
  // Attributes.
  checkAdamWAttrs(attrs<kinds::GaloreAdamWUpdate>());
  if (!(a.scale > 0) || !std::isfinite(a.scale))
    fail("scale must be positive and finite, got " + num(a.scale));
  // Operands.
  expectScalarInput(0, DType::I64);
  expectScalarInput(1, DType::F32); // lr
  expectScalarInput(2, DType::F32); // norm
  if (out(1).shape.size() != 2)
    fail(outName(1) + " rank: expected 2, got " + formatShape(out(1).shape));
  const std::vector<int64_t> w = out(1).shape;
  bool left = attrs<kinds::GaloreAdamWUpdate>().left;
  checkGaloreSide(w, left);
  expectFloatOutput(1, w);
  expectGaloreProjector(3, left ? w[0] : w[1]);
  int64_t r = in(3).shape[1];
  std::vector<int64_t> reduced =
      left ? std::vector<int64_t>{r, w[1]} : std::vector<int64_t>{w[0], r};
  expectF32Output(0, reduced);
  expectF32Output(2, reduced);
  expectF32Output(3, reduced);
  if (kernel.outputs.size() > 4)
    expectF32Output(4, w);
  // State.
  // The projected gradient (output 0) is this step's scratch; the rest is state.
  for (size_t j = 1; j < kernel.outputs.size(); ++j)
    expectPersistent(j);
  expectInit(2, TensorInit::Zeros, "moments start at zero");
  expectInit(3, TensorInit::Zeros, "moments start at zero");
  if (kernel.outputs.size() > 4)
    expectMasterCopy(4, 1);
}

} // namespace bonsai::rt::contract
