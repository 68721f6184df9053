//===- CpuKernelHandlers.cpp - The CPU backend's handler of every kernel kind -===//
//
// One `launch` overload per kind of KernelKinds.def, each calling the CPU reference kernel
// (CpuKernels.h) with the kernel's operands read by name, and the table that dispatches to them
// by the kind's position in the kernel table. A kind added to the table without a handler here
// does not compile (docs/adding-a-kernel.md).
//
//===----------------------------------------------------------------------===//

#include "KernelCall.h"
#include "KernelParams.h"
#include "RingAttention.h"

#include "bonsai/runtime/Communicator.h"
#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/Fp8.h"
#include "bonsai/runtime/GaLore.h"

#include <cmath>
#include <cstring>

namespace bonsai::rt {

namespace {

void launch(kinds::Embedding, const KernelCall &c) {
  using In = kinds::Embedding::In;
  using Out = kinds::Embedding::Out;
  cpu::embedding(c.in(In::table), c.in(In::ids), c.out(Out::result));
}

void launch(kinds::Linear, const KernelCall &c) {
  using In = kinds::Linear::In;
  using Out = kinds::Linear::Out;
  cpu::linear(c.in(In::x), c.in(In::w), c.optionalIn(In::bias), c.out(Out::y));
}

void launch(kinds::Matmul, const KernelCall &c) {
  using In = kinds::Matmul::In;
  using Out = kinds::Matmul::Out;
  cpu::matmul(c.in(In::a), c.in(In::b), c.out(Out::c));
}

void launch(kinds::Add, const KernelCall &c) {
  using In = kinds::Add::In;
  using Out = kinds::Add::Out;
  cpu::add(c.in(In::lhs), c.in(In::rhs), c.out(Out::result));
}

void launch(kinds::Mul, const KernelCall &c) {
  using In = kinds::Mul::In;
  using Out = kinds::Mul::Out;
  cpu::mul(c.in(In::lhs), c.in(In::rhs), c.out(Out::result));
}

void launch(kinds::RMSNorm, const KernelCall &c) {
  using In = kinds::RMSNorm::In;
  using Out = kinds::RMSNorm::Out;
  const auto &a = c.attrs<kinds::RMSNorm>();
  cpu::rmsNorm(c.in(In::x), c.in(In::weight), a.epsilon, c.out(Out::y));
}

void launch(kinds::LayerNorm, const KernelCall &c) {
  using In = kinds::LayerNorm::In;
  using Out = kinds::LayerNorm::Out;
  const auto &a = c.attrs<kinds::LayerNorm>();
  cpu::layerNorm(c.in(In::x), c.in(In::weight), c.in(In::bias), a.epsilon, c.out(Out::y));
}

void launch(kinds::RoPE, const KernelCall &c) {
  using In = kinds::RoPE::In;
  using Out = kinds::RoPE::Out;
  const auto &a = c.attrs<kinds::RoPE>();
  cpu::rope(c.in(In::x), a, c.optionalIn(In::positions), c.out(Out::y));
}

/// The host communicator of a collective or ring attention: the executor checked its size against
/// the plan's ranks before any kernel ran.
Communicator &hostCommunicator(const KernelCall &c) {
  if (!c.ranks().host)
    throw Error("internal error: a collective kernel ran without a communicator");
  return *c.ranks().host;
}

void launch(kinds::Attention, const KernelCall &c) {
  using In = kinds::Attention::In;
  using Out = kinds::Attention::Out;
  const auto &a = c.attrs<kinds::Attention>();
  if (a.ringRanks > 1)
    return cpuRingAttention(hostCommunicator(c), a, c.in(In::q), c.in(In::k), c.in(In::v),
                            c.optionalIn(In::segment_ids), c.out(Out::o), nullptr,
                            c.collectiveContext(c.kernel().outputs[Out::o]));
  cpu::attention(c.in(In::q), c.in(In::k), c.in(In::v), a.causal, a.scale, c.out(Out::o),
                 c.optionalIn(In::segment_ids));
}

void launch(kinds::SiLU, const KernelCall &c) {
  using In = kinds::SiLU::In;
  using Out = kinds::SiLU::Out;
  cpu::silu(c.in(In::x), c.out(Out::y));
}

void launch(kinds::GeLU, const KernelCall &c) {
  using In = kinds::GeLU::In;
  using Out = kinds::GeLU::Out;
  const auto &a = c.attrs<kinds::GeLU>();
  cpu::gelu(c.in(In::x), a.tanh, c.out(Out::y));
}

void launch(kinds::SwiGLU, const KernelCall &c) {
  using In = kinds::SwiGLU::In;
  using Out = kinds::SwiGLU::Out;
  cpu::swiglu(c.in(In::gate), c.in(In::up), c.out(Out::y));
}

void launch(kinds::Softmax, const KernelCall &c) {
  using In = kinds::Softmax::In;
  using Out = kinds::Softmax::Out;
  const auto &a = c.attrs<kinds::Softmax>();
  cpu::softmax(c.in(In::x), a.axis, c.out(Out::y));
}

void launch(kinds::CrossEntropy, const KernelCall &c) {
  using In = kinds::CrossEntropy::In;
  using Out = kinds::CrossEntropy::Out;
  const auto &a = c.attrs<kinds::CrossEntropy>();
  cpu::crossEntropy(c.in(In::logits), c.in(In::labels), a.ignoreIndex, c.out(Out::loss));
}

void launch(kinds::Transpose, const KernelCall &c) {
  using In = kinds::Transpose::In;
  using Out = kinds::Transpose::Out;
  const auto &a = c.attrs<kinds::Transpose>();
  cpu::transpose(c.in(In::x), a.permutation, c.out(Out::y));
}

void launch(kinds::Slice, const KernelCall &c) {
  using In = kinds::Slice::In;
  using Out = kinds::Slice::Out;
  const auto &a = c.attrs<kinds::Slice>();
  cpu::slice(c.in(In::x), a.axis, a.start, c.out(Out::y));
}

void launch(kinds::Concat, const KernelCall &c) {
  using Out = kinds::Concat::Out;
  cpu::concat(c.inputsFrom(0), c.attrs<kinds::Concat>().axis, c.out(Out::y));
}

void launch(kinds::Cast, const KernelCall &c) {
  using In = kinds::Cast::In;
  using Out = kinds::Cast::Out;
  cpu::cast(c.in(In::x), c.out(Out::y));
}

void launch(kinds::Copy, const KernelCall &c) {
  using In = kinds::Copy::In;
  using Out = kinds::Copy::Out;
  // An exact alias is a no-op; the verifier allows no other overlap.
  if (c.in(In::x).data != c.out(Out::y).data)
    cpu::copy(c.in(In::x), c.out(Out::y));
}

// The CPU backend keeps every arena in host memory: crossing "PCIe" is a byte copy.
void launch(kinds::CopyHostToDevice, const KernelCall &c) {
  using In = kinds::CopyHostToDevice::In;
  using Out = kinds::CopyHostToDevice::Out;
  cpu::copy(c.in(In::x), c.out(Out::y));
}

void launch(kinds::CopyDeviceToHost, const KernelCall &c) {
  using In = kinds::CopyDeviceToHost::In;
  using Out = kinds::CopyDeviceToHost::Out;
  cpu::copy(c.in(In::x), c.out(Out::y));
}

void launch(kinds::Fill, const KernelCall &c) {
  using Out = kinds::Fill::Out;
  const auto &a = c.attrs<kinds::Fill>();
  cpu::fill(a.value, c.out(Out::y));
}

void launch(kinds::EmbeddingGrad, const KernelCall &c) {
  using In = kinds::EmbeddingGrad::In;
  using Out = kinds::EmbeddingGrad::Out;
  cpu::embeddingGrad(c.in(In::dy), c.in(In::ids), c.out(Out::dtable));
}

void launch(kinds::LinearGradInput, const KernelCall &c) {
  using In = kinds::LinearGradInput::In;
  using Out = kinds::LinearGradInput::Out;
  cpu::linearGradInput(c.in(In::dy), c.in(In::w), c.out(Out::dx));
}

void launch(kinds::LinearGradWeight, const KernelCall &c) {
  using In = kinds::LinearGradWeight::In;
  using Out = kinds::LinearGradWeight::Out;
  cpu::linearGradWeight(c.in(In::dy), c.in(In::x), c.out(Out::dw));
}

void launch(kinds::ReduceTo, const KernelCall &c) {
  using In = kinds::ReduceTo::In;
  using Out = kinds::ReduceTo::Out;
  cpu::reduceTo(c.in(In::x), c.out(Out::y));
}

void launch(kinds::RMSNormGrad, const KernelCall &c) {
  using In = kinds::RMSNormGrad::In;
  using Out = kinds::RMSNormGrad::Out;
  const auto &a = c.attrs<kinds::RMSNormGrad>();
  cpu::rmsNormGrad(c.in(In::dy), c.in(In::x), c.in(In::w), a.epsilon, c.out(Out::dx),
                   c.out(Out::dw));
}

void launch(kinds::LayerNormGrad, const KernelCall &c) {
  using In = kinds::LayerNormGrad::In;
  using Out = kinds::LayerNormGrad::Out;
  const auto &a = c.attrs<kinds::LayerNormGrad>();
  cpu::layerNormGrad(c.in(In::dy), c.in(In::x), c.in(In::w), a.epsilon, c.out(Out::dx),
                     c.out(Out::dw), c.out(Out::db));
}

void launch(kinds::RoPEGrad, const KernelCall &c) {
  using In = kinds::RoPEGrad::In;
  using Out = kinds::RoPEGrad::Out;
  const auto &a = c.attrs<kinds::RoPEGrad>();
  cpu::ropeGrad(c.in(In::dy), a, c.optionalIn(In::positions), c.out(Out::dx));
}

void launch(kinds::AttentionGrad, const KernelCall &c) {
  using In = kinds::AttentionGrad::In;
  using Out = kinds::AttentionGrad::Out;
  const auto &a = c.attrs<kinds::AttentionGrad>();
  if (a.ringRanks > 1)
    return cpuRingAttentionGrad(hostCommunicator(c), a, c.in(In::do_), c.in(In::q), c.in(In::k),
                                c.in(In::v), c.in(In::o), nullptr, c.optionalIn(In::segment_ids),
                                c.out(Out::dq), c.out(Out::dk), c.out(Out::dv),
                                c.collectiveContext(c.kernel().outputs[Out::dq]));
  cpu::attentionGrad(c.in(In::do_), c.in(In::q), c.in(In::k), c.in(In::v), c.in(In::o), a.causal,
                     a.scale, c.out(Out::dq), c.out(Out::dk), c.out(Out::dv),
                     c.optionalIn(In::segment_ids));
}

void launch(kinds::FlashAttention, const KernelCall &c) {
  using In = kinds::FlashAttention::In;
  using Out = kinds::FlashAttention::Out;
  const auto &a = c.attrs<kinds::FlashAttention>();
  if (a.ringRanks > 1)
    return cpuRingAttention(hostCommunicator(c), a, c.in(In::q), c.in(In::k), c.in(In::v),
                            c.optionalIn(In::segment_ids), c.out(Out::o), &c.out(Out::lse),
                            c.collectiveContext(c.kernel().outputs[Out::o]));
  cpu::flashAttention(c.in(In::q), c.in(In::k), c.in(In::v), a.causal, a.scale, c.out(Out::o),
                      c.out(Out::lse), c.optionalIn(In::segment_ids));
}

void launch(kinds::FlashAttentionGrad, const KernelCall &c) {
  using In = kinds::FlashAttentionGrad::In;
  using Out = kinds::FlashAttentionGrad::Out;
  const auto &a = c.attrs<kinds::FlashAttentionGrad>();
  if (a.ringRanks > 1)
    return cpuRingAttentionGrad(hostCommunicator(c), a, c.in(In::do_), c.in(In::q), c.in(In::k),
                                c.in(In::v), c.in(In::o), &c.in(In::lse),
                                c.optionalIn(In::segment_ids), c.out(Out::dq), c.out(Out::dk),
                                c.out(Out::dv), c.collectiveContext(c.kernel().outputs[Out::dq]));
  cpu::flashAttentionGrad(c.in(In::do_), c.in(In::q), c.in(In::k), c.in(In::v), c.in(In::o),
                          c.in(In::lse), a.causal, a.scale, c.out(Out::dq), c.out(Out::dk),
                          c.out(Out::dv), c.optionalIn(In::segment_ids));
}

void launch(kinds::FlashAttentionQkv, const KernelCall &c) {
  using In = kinds::FlashAttentionQkv::In;
  using Out = kinds::FlashAttentionQkv::Out;
  const auto &a = c.attrs<kinds::FlashAttentionQkv>();
  cpu::flashAttentionQkv(c.in(In::qkv), a.causal, a.scale, c.out(Out::o), c.out(Out::lse),
                         c.optionalIn(In::segment_ids));
}

void launch(kinds::FlashAttentionQkvGrad, const KernelCall &c) {
  using In = kinds::FlashAttentionQkvGrad::In;
  using Out = kinds::FlashAttentionQkvGrad::Out;
  const auto &a = c.attrs<kinds::FlashAttentionQkvGrad>();
  cpu::flashAttentionQkvGrad(c.in(In::do_), c.in(In::qkv), c.in(In::o), c.in(In::lse), a.causal,
                             a.scale, c.out(Out::dqkv), c.optionalIn(In::segment_ids));
}

void launch(kinds::SiLUGrad, const KernelCall &c) {
  using In = kinds::SiLUGrad::In;
  using Out = kinds::SiLUGrad::Out;
  cpu::siluGrad(c.in(In::dy), c.in(In::x), c.out(Out::dx));
}

void launch(kinds::GeLUGrad, const KernelCall &c) {
  using In = kinds::GeLUGrad::In;
  using Out = kinds::GeLUGrad::Out;
  const auto &a = c.attrs<kinds::GeLUGrad>();
  cpu::geluGrad(c.in(In::dy), c.in(In::x), a.tanh, c.out(Out::dx));
}

void launch(kinds::SwiGLUGrad, const KernelCall &c) {
  using In = kinds::SwiGLUGrad::In;
  using Out = kinds::SwiGLUGrad::Out;
  cpu::swigluGrad(c.in(In::dy), c.in(In::gate), c.in(In::up), c.out(Out::dgate), c.out(Out::dup));
}

void launch(kinds::SoftmaxGrad, const KernelCall &c) {
  using In = kinds::SoftmaxGrad::In;
  using Out = kinds::SoftmaxGrad::Out;
  const auto &a = c.attrs<kinds::SoftmaxGrad>();
  cpu::softmaxGrad(c.in(In::dy), c.in(In::y), a.axis, c.out(Out::dx));
}

void launch(kinds::CrossEntropyGrad, const KernelCall &c) {
  using In = kinds::CrossEntropyGrad::In;
  using Out = kinds::CrossEntropyGrad::Out;
  const auto &a = c.attrs<kinds::CrossEntropyGrad>();
  cpu::crossEntropyGrad(c.in(In::dloss), c.in(In::logits), c.in(In::labels), a.ignoreIndex,
                        c.out(Out::dlogits));
}

void launch(kinds::SliceGrad, const KernelCall &c) {
  using In = kinds::SliceGrad::In;
  using Out = kinds::SliceGrad::Out;
  const auto &a = c.attrs<kinds::SliceGrad>();
  cpu::sliceGrad(c.in(In::dy), a.axis, a.start, c.out(Out::dx));
}

void launch(kinds::GradNorm, const KernelCall &c) {
  using Out = kinds::GradNorm::Out;
  cpu::gradNorm(c.inputsFrom(0), c.out(Out::norm));
}

void launch(kinds::LearningRate, const KernelCall &c) {
  using In = kinds::LearningRate::In;
  using Out = kinds::LearningRate::Out;
  const auto &a = c.attrs<kinds::LearningRate>();
  cpu::learningRate(c.in(In::step), learningRateSchedule(a), c.out(Out::lr));
}

void launch(kinds::AdamWUpdate, const KernelCall &c) {
  using In = kinds::AdamWUpdate::In;
  using Out = kinds::AdamWUpdate::Out;
  const auto &a = c.attrs<kinds::AdamWUpdate>();
  cpu::adamwUpdate(c.in(In::grad), c.in(In::step), c.in(In::lr), c.in(In::norm), adamwHyper(a),
                   c.out(Out::param), c.out(Out::m), c.out(Out::v), c.optionalOut(Out::master));
}

void launch(kinds::SGDUpdate, const KernelCall &c) {
  using In = kinds::SGDUpdate::In;
  using Out = kinds::SGDUpdate::Out;
  const auto &a = c.attrs<kinds::SGDUpdate>();
  cpu::sgdUpdate(c.in(In::grad), c.in(In::lr), c.in(In::norm), sgdHyper(a), c.out(Out::param),
                 c.out(Out::momentum), c.optionalOut(Out::master));
}

void launch(kinds::GaloreRefresh, const KernelCall &c) {
  using In = kinds::GaloreRefresh::In;
  using Out = kinds::GaloreRefresh::Out;
  const auto &a = c.attrs<kinds::GaloreRefresh>();
  cpu::galoreRefresh(c.in(In::grad), c.in(In::step), galoreRefreshParams(a), c.out(Out::workspace),
                     c.out(Out::projector), c.out(Out::status));
}

void launch(kinds::GaloreProject, const KernelCall &c) {
  using In = kinds::GaloreProject::In;
  using Out = kinds::GaloreProject::Out;
  const auto &a = c.attrs<kinds::GaloreProject>();
  cpu::galoreProject(c.in(In::grad), c.in(In::projector), a.left, a.bf16Operands, c.out(Out::r));
}

void launch(kinds::GaloreAdamWUpdate, const KernelCall &c) {
  using In = kinds::GaloreAdamWUpdate::In;
  using Out = kinds::GaloreAdamWUpdate::Out;
  const auto &a = c.attrs<kinds::GaloreAdamWUpdate>();
  cpu::galoreAdamwUpdate(c.in(In::step), c.in(In::lr), c.in(In::norm), c.in(In::projector),
                         adamwHyper(a), a.scale, a.left, c.out(Out::r), c.out(Out::param),
                         c.out(Out::m), c.out(Out::v), c.optionalOut(Out::master));
}

void launch(kinds::StepIncrement, const KernelCall &c) {
  using Out = kinds::StepIncrement::Out;
  cpu::stepIncrement(c.out(Out::step));
}

void launch(kinds::Accumulate, const KernelCall &c) {
  using In = kinds::Accumulate::In;
  using Out = kinds::Accumulate::Out;
  cpu::accumulate(c.in(In::g), c.out(Out::acc));
}

void launch(kinds::AccumulateMax, const KernelCall &c) {
  using In = kinds::AccumulateMax::In;
  using Out = kinds::AccumulateMax::Out;
  cpu::accumulateMax(c.in(In::x), c.out(Out::acc));
}

void launch(kinds::Zero, const KernelCall &c) {
  using Out = kinds::Zero::Out;
  cpu::zero(c.out(Out::x));
}

void launch(kinds::DoraScale, const KernelCall &c) {
  using In = kinds::DoraScale::In;
  using Out = kinds::DoraScale::Out;
  const auto &a = c.attrs<kinds::DoraScale>();
  cpu::doraScale(c.in(In::magnitude), c.in(In::w), c.in(In::lora_a), c.in(In::lora_b), a.scale,
                 c.out(Out::y));
}

void launch(kinds::DoraGrad, const KernelCall &c) {
  using In = kinds::DoraGrad::In;
  using Out = kinds::DoraGrad::Out;
  cpu::doraGrad(c.in(In::dy), c.in(In::y), c.in(In::scale), c.in(In::magnitude), c.out(Out::dx),
                c.out(Out::dmagnitude));
}

void launch(kinds::Dequantize, const KernelCall &c) {
  using In = kinds::Dequantize::In;
  using Out = kinds::Dequantize::Out;
  cpu::dequantize(c.in(In::q), c.out(Out::y));
}

void launch(kinds::LinearCrossEntropy, const KernelCall &c) {
  using In = kinds::LinearCrossEntropy::In;
  using Out = kinds::LinearCrossEntropy::Out;
  const auto &a = c.attrs<kinds::LinearCrossEntropy>();
  cpu::linearCrossEntropy(c.in(In::x), c.in(In::w), c.in(In::labels), c.in(In::dloss),
                          a.ignoreIndex, a.chunkRows, c.out(Out::loss), c.out(Out::dx),
                          c.out(Out::workspace), c.optionalOut(Out::dw));
}

void launch(kinds::AddRMSNorm, const KernelCall &c) {
  using In = kinds::AddRMSNorm::In;
  using Out = kinds::AddRMSNorm::Out;
  const auto &a = c.attrs<kinds::AddRMSNorm>();
  cpu::addRmsNorm(c.in(In::lhs), c.in(In::rhs), c.in(In::weight), a.epsilon, c.out(Out::sum),
                  c.out(Out::y));
}

void launch(kinds::AddLayerNorm, const KernelCall &c) {
  using In = kinds::AddLayerNorm::In;
  using Out = kinds::AddLayerNorm::Out;
  const auto &a = c.attrs<kinds::AddLayerNorm>();
  cpu::addLayerNorm(c.in(In::lhs), c.in(In::rhs), c.in(In::weight), c.in(In::bias), a.epsilon,
                    c.out(Out::sum), c.out(Out::y));
}

void launch(kinds::RMSNormGradAdd, const KernelCall &c) {
  using In = kinds::RMSNormGradAdd::In;
  using Out = kinds::RMSNormGradAdd::Out;
  const auto &a = c.attrs<kinds::RMSNormGradAdd>();
  cpu::rmsNormGradAdd(c.in(In::dy), c.in(In::x), c.in(In::w), c.in(In::addend), a.epsilon,
                      c.out(Out::dx), c.out(Out::dw));
}

void launch(kinds::LayerNormGradAdd, const KernelCall &c) {
  using In = kinds::LayerNormGradAdd::In;
  using Out = kinds::LayerNormGradAdd::Out;
  const auto &a = c.attrs<kinds::LayerNormGradAdd>();
  cpu::layerNormGradAdd(c.in(In::dy), c.in(In::x), c.in(In::w), c.in(In::addend), a.epsilon,
                        c.out(Out::dx), c.out(Out::dw), c.out(Out::db));
}

void launch(kinds::MultiTensorAdamWUpdate, const KernelCall &c) {
  using In = kinds::MultiTensorAdamWUpdate::In;
  const auto &a = c.attrs<kinds::MultiTensorAdamWUpdate>();
  MultiTensorOperands t = c.multiTensor(3, 3);
  cpu::multiTensorAdamwUpdate(t.grads, c.in(In::step), c.in(In::lr), c.in(In::norm), adamwHyper(a),
                              t.lists[0], t.lists[1], t.lists[2], t.masters);
}

void launch(kinds::MultiTensorSGDUpdate, const KernelCall &c) {
  using In = kinds::MultiTensorSGDUpdate::In;
  const auto &a = c.attrs<kinds::MultiTensorSGDUpdate>();
  MultiTensorOperands t = c.multiTensor(2, 2);
  cpu::multiTensorSgdUpdate(t.grads, c.in(In::lr), c.in(In::norm), sgdHyper(a), t.lists[0],
                            t.lists[1], t.masters);
}
void launch(kinds::LinearGeLU, const KernelCall &c) {
  using In = kinds::LinearGeLU::In;
  using Out = kinds::LinearGeLU::Out;
  cpu::linearGelu(c.in(In::x), c.in(In::w), c.optionalIn(In::bias), c.out(Out::y), c.out(Out::pre));
}

void launch(kinds::LinearAdd, const KernelCall &c) {
  using In = kinds::LinearAdd::In;
  using Out = kinds::LinearAdd::Out;
  cpu::linearAdd(c.in(In::x), c.in(In::w), c.in(In::addend), c.out(Out::y));
}

void launch(kinds::LinearGradWeightAccumulate, const KernelCall &c) {
  using In = kinds::LinearGradWeightAccumulate::In;
  using Out = kinds::LinearGradWeightAccumulate::Out;
  cpu::linearGradWeightAccumulate(c.in(In::dy), c.in(In::x), c.out(Out::acc));
}

void launch(kinds::Fp8Linear, const KernelCall &c) {
  using In = kinds::Fp8Linear::In;
  using Out = kinds::Fp8Linear::Out;
  const auto &a = c.attrs<kinds::Fp8Linear>();
  // Fp8Attrs.fast_accumulation is a GPU GEMM's mode: the CPU reference sums in f32 in k
  // order either way (docs/fp8.md).
  cpu::fp8Linear(c.in(In::x), c.in(In::w), c.in(In::state), c.optionalIn(In::bias), a.current,
                 a.margin, c.out(Out::y), c.out(Out::stats), c.out(Out::workspace));
}

void launch(kinds::Fp8LinearGradInput, const KernelCall &c) {
  using In = kinds::Fp8LinearGradInput::In;
  using Out = kinds::Fp8LinearGradInput::Out;
  const auto &a = c.attrs<kinds::Fp8LinearGradInput>();
  cpu::fp8LinearGradInput(c.in(In::dy), c.in(In::w), c.in(In::state), a.current, a.margin,
                          c.out(Out::dx), c.out(Out::stats), c.out(Out::workspace));
}

void launch(kinds::Fp8LinearGradWeight, const KernelCall &c) {
  using In = kinds::Fp8LinearGradWeight::In;
  using Out = kinds::Fp8LinearGradWeight::Out;
  const auto &a = c.attrs<kinds::Fp8LinearGradWeight>();
  cpu::fp8LinearGradWeight(c.in(In::dy), c.in(In::x), c.in(In::state), a.current, a.margin,
                           c.out(Out::dw), c.out(Out::stats), c.out(Out::workspace));
}

void launch(kinds::Fp8LinearGradWeightAccumulate, const KernelCall &c) {
  using In = kinds::Fp8LinearGradWeightAccumulate::In;
  using Out = kinds::Fp8LinearGradWeightAccumulate::Out;
  const auto &a = c.attrs<kinds::Fp8LinearGradWeightAccumulate>();
  cpu::fp8LinearGradWeightAccumulate(c.in(In::dy), c.in(In::x), c.in(In::state), a.current,
                                     a.margin, c.out(Out::stats), c.out(Out::workspace),
                                     c.out(Out::acc));
}

void launch(kinds::Fp8LinearBackward, const KernelCall &c) {
  using In = kinds::Fp8LinearBackward::In;
  using Out = kinds::Fp8LinearBackward::Out;
  const auto &a = c.attrs<kinds::Fp8LinearBackward>();
  cpu::fp8LinearBackward(c.in(In::dy), c.in(In::w), c.in(In::x), c.in(In::state), a.current,
                         a.margin, c.out(Out::dx), c.out(Out::input_grad_stats),
                         c.out(Out::weight_grad_stats), c.out(Out::workspace), c.out(Out::acc));
}

void launch(kinds::Fp8LinearSharedInput, const KernelCall &c) {
  using In = kinds::Fp8LinearSharedInput::In;
  using Out = kinds::Fp8LinearSharedInput::Out;
  const auto &a = c.attrs<kinds::Fp8LinearSharedInput>();
  cpu::fp8LinearSharedInput(c.in(In::input_cast), c.in(In::input_stats), c.in(In::w),
                            c.in(In::state), c.optionalIn(In::bias), a.current, a.margin,
                            c.out(Out::y), c.out(Out::stats), c.out(Out::workspace));
}

void launch(kinds::Fp8LinearBackwardSharedInput, const KernelCall &c) {
  using In = kinds::Fp8LinearBackwardSharedInput::In;
  using Out = kinds::Fp8LinearBackwardSharedInput::Out;
  const auto &a = c.attrs<kinds::Fp8LinearBackwardSharedInput>();
  cpu::fp8LinearBackwardSharedInput(
      c.in(In::dy), c.in(In::w), c.in(In::input_cast), c.in(In::input_stats), c.in(In::state),
      a.current, a.margin, c.out(Out::dx), c.out(Out::input_grad_stats),
      c.out(Out::weight_grad_stats), c.out(Out::workspace), c.out(Out::acc));
}

void launch(kinds::Fp8LinearWithInputCast, const KernelCall &c) {
  using In = kinds::Fp8LinearWithInputCast::In;
  using Out = kinds::Fp8LinearWithInputCast::Out;
  const auto &a = c.attrs<kinds::Fp8LinearWithInputCast>();
  cpu::fp8LinearWithInputCast(c.in(In::x), c.in(In::w), c.in(In::state), c.optionalIn(In::bias),
                              a.current, a.margin, c.out(Out::y), c.out(Out::stats),
                              c.out(Out::input_cast), c.out(Out::workspace));
}

void launch(kinds::Fp8LinearBackwardFromInputCast, const KernelCall &c) {
  using In = kinds::Fp8LinearBackwardFromInputCast::In;
  using Out = kinds::Fp8LinearBackwardFromInputCast::Out;
  const auto &a = c.attrs<kinds::Fp8LinearBackwardFromInputCast>();
  cpu::fp8LinearBackwardFromInputCast(
      c.in(In::dy), c.in(In::w), c.in(In::input_cast), c.in(In::input_stats), c.in(In::state),
      a.current, a.margin, c.out(Out::dx), c.out(Out::input_grad_stats),
      c.out(Out::weight_grad_stats), c.out(Out::workspace), c.out(Out::acc));
}

void launch(kinds::Fp8UpdateScales, const KernelCall &c) {
  using In = kinds::Fp8UpdateScales::In;
  using Out = kinds::Fp8UpdateScales::Out;
  const auto &a = c.attrs<kinds::Fp8UpdateScales>();
  cpu::fp8UpdateScales(c.in(In::step), c.in(In::forward_stats), c.optionalIn(In::backward_stats),
                       a.margin, c.out(Out::state));
}

void launch(kinds::FusedElementwise, const KernelCall &c) {
  const auto &a = c.attrs<kinds::FusedElementwise>();
  cpu::fusedElementwise(c.plan().generatedKernels[a.kernel].program, c.inputPointers(),
                        c.outputPointers());
}

// The collectives (docs/sharding.md) go through the executor's host communicator, whose sums
// are in rank order in fp32 and therefore the same bits on every rank and in every run.

void launch(kinds::ShardSlice, const KernelCall &c) {
  using In = kinds::ShardSlice::In;
  using Out = kinds::ShardSlice::Out;
  const TensorView &shard = c.out(Out::shard);
  size_t bytes = shard.bytes();
  std::memcpy(shard.data, static_cast<const char *>(c.in(In::full).data) + c.ranks().rank * bytes,
              bytes);
}

void launch(kinds::ReduceScatter, const KernelCall &c) {
  using In = kinds::ReduceScatter::In;
  using Out = kinds::ReduceScatter::Out;
  const TensorView &shard = c.out(Out::shard);
  hostCommunicator(c).reduceScatterSum(c.in(In::full).data, shard.data, size_t(shard.numel()),
                                       shard.dtype,
                                       c.collectiveContext(c.kernel().outputs[Out::shard]));
}

void launch(kinds::AllGather, const KernelCall &c) {
  using In = kinds::AllGather::In;
  using Out = kinds::AllGather::Out;
  const TensorView &shard = c.in(In::shard);
  hostCommunicator(c).allGather(shard.data, c.out(Out::full).data, size_t(shard.numel()),
                                shard.dtype, c.collectiveContext(c.kernel().outputs[Out::full]));
}

void launch(kinds::AllReduce, const KernelCall &c) {
  using In = kinds::AllReduce::In;
  using Out = kinds::AllReduce::Out;
  const TensorView &x = c.in(In::x), &y = c.out(Out::y);
  std::string context = c.collectiveContext(c.kernel().outputs[Out::y]);
  Communicator &comm = hostCommunicator(c);
  CollectiveReduction reduction = c.attrs<kinds::AllReduce>().reduction;
  if (reduction == CollectiveReduction::Sum) {
    comm.allReduceSum(x.data, y.data, size_t(x.numel()), x.dtype, context);
    return;
  }
  if (reduction == CollectiveReduction::Max) {
    comm.allReduceMax(x.data, y.data, size_t(x.numel()), x.dtype, context);
    return;
  }
  // L2Norm (f32): y = sqrt(sum over ranks of x^2), the squares and their rank-order sum in f32.
  std::vector<float> squares(size_t(x.numel()));
  const auto *in = static_cast<const float *>(x.data);
  for (size_t i = 0; i < squares.size(); ++i)
    squares[i] = in[i] * in[i];
  comm.allReduceSum(squares.data(), squares.data(), squares.size(), DType::F32, context);
  auto *out = static_cast<float *>(y.data);
  for (size_t i = 0; i < squares.size(); ++i)
    out[i] = std::sqrt(squares[i]);
}

using CpuHandler = void (*)(const KernelCall &);

/// One handler per kind, in kernel-table order.
const CpuHandler kCpuHandlers[] = {
#define BONSAI_KERNEL_KIND(Name, ...) [](const KernelCall &c) { launch(kinds::Name{}, c); },
#include "bonsai/runtime/KernelKinds.def"
};
static_assert(sizeof kCpuHandlers / sizeof kCpuHandlers[0] == kKernelKindCount);

} // namespace

void launchOnCpu(const KernelCall &call) {
  kCpuHandlers[kernelKindIndex(call.kernel().kind)](call);
}

} // namespace bonsai::rt
