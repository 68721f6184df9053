//===- Init.cpp - Deterministic random initialization of parameters -------===//
//
// Values are drawn in double precision and stored through storeF32, so a bf16 or f16 parameter
// holds the correctly rounded value of the same draw an f32 one would hold.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Init.h"

#include "bonsai/runtime/Random.h"

#include <algorithm>

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

void initTensor(const std::string &name, InitRule rule, uint64_t seed, const TensorView &view) {
  if (view.dtype != DType::F32 && view.dtype != DType::F16 && view.dtype != DType::BF16)
    throw Error("cannot initialize parameter '" + name + "' of dtype " + dtypeName(view.dtype) +
                ": random init covers f32, f16 and bf16 (pass --weights)");
  std::vector<float> values(size_t(view.numel()));
  if (rule == InitRule::Normal) {
    // The stream is a function of the seed and the name only.
    Rng rng(seed ^ fnv1a64(name));
    for (float &v : values)
      v = float(kInitStd * rng.normal());
  } else {
    std::fill(values.begin(), values.end(), rule == InitRule::Ones ? 1.0f : 0.0f);
  }
  storeF32(values.data(), view);
}

void initParameters(const LoadedPlan &plan, const std::vector<TensorView> &views, uint64_t seed) {
  if (views.size() != plan.tensors.size())
    throw Error("internal error: initialization needs one view per plan tensor");
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorInfo &t = plan.tensors[i];
    if (t.role == TensorRole::Parameter)
      initTensor(t.name, initRuleFor(t.name, t.shape.size()), seed, views[i]);
  }
}

} // namespace bonsai::rt
