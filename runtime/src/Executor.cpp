//===- Executor.cpp - Runs a verified plan on the CPU backend -------------===//
//
// Everything here trusts the plan's verification (Plan.cpp): operand counts, indices, byte
// ranges and shapes were checked once at load, so dispatch is a switch over the kind with no
// re-checking beyond what the kernels themselves do (ids and labels in range).
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Executor.h"

#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/Init.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace bonsai::rt {

namespace {
/// Every arena starts at least this aligned: enough for any vector load of any dtype.
constexpr uint64_t kMinArenaAlignment = 256;
} // namespace

void Executor::ArenaFree::operator()(void *p) const { std::free(p); }

Executor::Executor(const LoadedPlan &plan) : plan_(plan) {
  for (const ArenaInfo &arena : plan_.arenas) {
    uint64_t alignment = std::max(arena.alignment, kMinArenaAlignment);
    // aligned_alloc wants a size that is a multiple of the alignment, and never 0.
    uint64_t size = std::max<uint64_t>(arena.size, 1);
    size = (size + alignment - 1) / alignment * alignment;
    void *p = std::aligned_alloc(size_t(alignment), size_t(size));
    if (!p)
      throw Error("cannot allocate arena '" + arena.name + "' of " + std::to_string(arena.size) +
                  " bytes");
    std::memset(p, 0, size_t(size));
    arenas_.emplace_back(p);
  }
  measured_.assign(plan_.arenas.size(), 0);
  views_.reserve(plan_.tensors.size());
  for (const TensorInfo &t : plan_.tensors) {
    TensorView v;
    v.data = static_cast<char *>(arenas_[t.arena].get()) + t.offset;
    v.dtype = t.dtype;
    v.shape = t.shape;
    views_.push_back(std::move(v));
  }
}

Executor::~Executor() = default;

void Executor::touch(uint32_t tensor) {
  const TensorInfo &t = plan_.tensors[tensor];
  measured_[t.arena] = std::max(measured_[t.arena], t.offset + t.bytes);
}

void Executor::bindWeights(const Checkpoint &checkpoint) {
  bindCheckpoint(plan_, checkpoint, views_);
  for (uint32_t i = 0; i < plan_.tensors.size(); ++i)
    if (plan_.tensors[i].role == TensorRole::Parameter)
      touch(i);
}

void Executor::initWeights(uint64_t seed) {
  initParameters(plan_, views_, seed);
  for (uint32_t i = 0; i < plan_.tensors.size(); ++i)
    if (plan_.tensors[i].role == TensorRole::Parameter)
      touch(i);
}

std::vector<int64_t> Executor::inputShape() const { return plan_.tensors[plan_.inputs[0]].shape; }

void Executor::setInputs(const TokenBatch &batch) {
  writeTokenBatch(batch, views_[plan_.inputs[0]], views_[plan_.inputs[1]]);
  touch(plan_.inputs[0]);
  touch(plan_.inputs[1]);
}

void Executor::runKernel(size_t index) {
  const KernelInfo &k = plan_.kernels[index];
  auto in = [&](size_t i) -> const TensorView & { return views_[k.inputs[i]]; };
  const TensorView &out = views_[k.outputs[0]];
  for (uint32_t t : k.inputs)
    touch(t);
  touch(k.outputs[0]);
  const KernelAttrsInfo &a = k.attrs;
  switch (k.kind) {
  case KernelKind::Embedding:
    cpu::embedding(in(0), in(1), out);
    break;
  case KernelKind::Linear:
    cpu::linear(in(0), in(1), k.inputs.size() == 3 ? &in(2) : nullptr, out);
    break;
  case KernelKind::Matmul:
    cpu::matmul(in(0), in(1), out);
    break;
  case KernelKind::Add:
    cpu::add(in(0), in(1), out);
    break;
  case KernelKind::Mul:
    cpu::mul(in(0), in(1), out);
    break;
  case KernelKind::RMSNorm:
    cpu::rmsNorm(in(0), in(1), a.epsilon, out);
    break;
  case KernelKind::LayerNorm:
    cpu::layerNorm(in(0), in(1), in(2), a.epsilon, out);
    break;
  case KernelKind::RoPE:
    cpu::rope(in(0), a.theta, out);
    break;
  case KernelKind::Attention:
    cpu::attention(in(0), in(1), in(2), a.causal, a.scale, out);
    break;
  case KernelKind::SiLU:
    cpu::silu(in(0), out);
    break;
  case KernelKind::GeLU:
    cpu::gelu(in(0), a.geluTanh, out);
    break;
  case KernelKind::SwiGLU:
    cpu::swiglu(in(0), in(1), out);
    break;
  case KernelKind::Softmax:
    cpu::softmax(in(0), a.axis, out);
    break;
  case KernelKind::CrossEntropy:
    cpu::crossEntropy(in(0), in(1), a.ignoreIndex, out);
    break;
  case KernelKind::Transpose:
    cpu::transpose(in(0), a.permutation, out);
    break;
  case KernelKind::Slice:
    cpu::slice(in(0), a.axis, a.start, out);
    break;
  case KernelKind::Cast:
    cpu::cast(in(0), out);
    break;
  case KernelKind::Copy:
    // An exact alias is a no-op; the verifier allows no other overlap.
    if (in(0).data != out.data)
      cpu::copy(in(0), out);
    break;
  }
}

float Executor::runStep() {
  for (size_t i = 0; i < plan_.kernels.size(); ++i) {
    try {
      runKernel(i);
    } catch (const Error &e) {
      throw Error(plan_.describeKernel(i) + ": " + e.what());
    }
  }
  touch(plan_.loss);
  float loss;
  std::memcpy(&loss, views_[plan_.loss].data, sizeof loss);
  return loss;
}

std::vector<ArenaUsage> Executor::memoryUsage() const {
  std::vector<ArenaUsage> usage;
  for (size_t i = 0; i < plan_.arenas.size(); ++i)
    usage.push_back({&plan_.arenas[i], plan_.arenas[i].size, measured_[i]});
  return usage;
}

} // namespace bonsai::rt
