//===- CudaKernelHandlers.cpp - The CUDA backend's handler of every kernel kind -===//
//
// In a build with the CUDA backend: one `launch` overload per kind of KernelKinds.def, each
// enqueueing the CUDA kernels (CudaKernels.h, CudaFp8.h) on the call's stream with the
// kernel's operands read by name, and the table that dispatches to them by the kind's position
// in the kernel table. A kind added to the table without a handler here does not compile
// (docs/adding-a-kernel.md).
//
//===----------------------------------------------------------------------===//

#ifdef BONSAI_HAVE_CUDA

#include "CudaKernelCall.h"
#include "KernelParams.h"

#include "bonsai/runtime/CudaFp8.h"
#include "bonsai/runtime/CudaKernels.h"
#include "bonsai/runtime/GaLore.h"
#include "bonsai/runtime/NcclCommunicator.h"

#include <cuda_runtime.h>

namespace bonsai::rt {

namespace {

void launch(kinds::Embedding, const CudaCall &c) {
  using In = kinds::Embedding::In;
  using Out = kinds::Embedding::Out;
  cuda::embedding(c.ctx, c.in(In::table), c.in(In::ids), c.out(Out::result));
}

void launch(kinds::Linear, const CudaCall &c) {
  using In = kinds::Linear::In;
  using Out = kinds::Linear::Out;
  cuda::linear(c.ctx, c.in(In::x), c.in(In::w), c.optionalIn(In::bias), c.out(Out::y));
}

void launch(kinds::Matmul, const CudaCall &c) {
  using In = kinds::Matmul::In;
  using Out = kinds::Matmul::Out;
  cuda::matmul(c.ctx, c.in(In::a), c.in(In::b), c.out(Out::c));
}

void launch(kinds::Add, const CudaCall &c) {
  using In = kinds::Add::In;
  using Out = kinds::Add::Out;
  cuda::add(c.ctx, c.in(In::lhs), c.in(In::rhs), c.out(Out::result));
}

void launch(kinds::Mul, const CudaCall &c) {
  using In = kinds::Mul::In;
  using Out = kinds::Mul::Out;
  cuda::mul(c.ctx, c.in(In::lhs), c.in(In::rhs), c.out(Out::result));
}

void launch(kinds::RMSNorm, const CudaCall &c) {
  using In = kinds::RMSNorm::In;
  using Out = kinds::RMSNorm::Out;
  const auto &a = c.attrs<kinds::RMSNorm>();
  cuda::rmsNorm(c.ctx, c.in(In::x), c.in(In::weight), a.epsilon, c.out(Out::y));
}

void launch(kinds::LayerNorm, const CudaCall &c) {
  using In = kinds::LayerNorm::In;
  using Out = kinds::LayerNorm::Out;
  const auto &a = c.attrs<kinds::LayerNorm>();
  cuda::layerNorm(c.ctx, c.in(In::x), c.in(In::weight), c.in(In::bias), a.epsilon, c.out(Out::y));
}

void launch(kinds::RoPE, const CudaCall &c) {
  using In = kinds::RoPE::In;
  using Out = kinds::RoPE::Out;
  const auto &a = c.attrs<kinds::RoPE>();
  cuda::rope(c.ctx, c.in(In::x), a, c.optionalIn(In::positions), c.out(Out::y));
}

NcclCommunicator &nccl(const CudaCall &c);

/// Ring attention's transport (docs/ring-attention.md): NCCL's ringShift over the consecutive
/// groups of `ringRanks` ranks, on the backend's ring stream. `context` names the kernel.
cuda::RingTransport ringTransport(const CudaCall &c, int64_t ringRanks,
                                  const std::string &context) {
  NcclCommunicator &comm = nccl(c);
  if (!c.ringStream)
    throw Error("internal error: " + context + " runs ring attention without a ring stream");
  cuda::RingTransport t;
  t.ranks = ringRanks;
  t.rank = ringRanks > 0 ? c.ranks().rank % ringRanks : 0;
  t.stream = c.ringStream;
#ifdef BONSAI_HAVE_NCCL
  t.shift = [&comm, &c, ringRanks, context](const void *send, void *recv, size_t count, DType dtype,
                                            const std::string &what) {
    comm.ringShift(send, recv, count, dtype, c.ringStream, context + ", " + what, int(ringRanks));
  };
#else
  (void)comm;
#endif
  return t;
}

void launch(kinds::Attention, const CudaCall &c) {
  using In = kinds::Attention::In;
  using Out = kinds::Attention::Out;
  const auto &a = c.attrs<kinds::Attention>();
  if (a.ringRanks > 1)
    return cuda::ringAttention(
        c.ctx, ringTransport(c, a.ringRanks, c.collectiveContext(c.kernel().outputs[Out::o])),
        c.in(In::q), c.in(In::k), c.in(In::v), c.optionalIn(In::segment_ids), a.causal, a.scale,
        c.out(Out::o), nullptr);
  cuda::attention(c.ctx, c.in(In::q), c.in(In::k), c.in(In::v), a.causal, a.scale, c.out(Out::o),
                  c.optionalIn(In::segment_ids));
}

void launch(kinds::SiLU, const CudaCall &c) {
  using In = kinds::SiLU::In;
  using Out = kinds::SiLU::Out;
  cuda::silu(c.ctx, c.in(In::x), c.out(Out::y));
}

void launch(kinds::GeLU, const CudaCall &c) {
  using In = kinds::GeLU::In;
  using Out = kinds::GeLU::Out;
  const auto &a = c.attrs<kinds::GeLU>();
  cuda::gelu(c.ctx, c.in(In::x), a.tanh, c.out(Out::y));
}

void launch(kinds::SwiGLU, const CudaCall &c) {
  using In = kinds::SwiGLU::In;
  using Out = kinds::SwiGLU::Out;
  cuda::swiglu(c.ctx, c.in(In::gate), c.in(In::up), c.out(Out::y));
}

void launch(kinds::Softmax, const CudaCall &c) {
  using In = kinds::Softmax::In;
  using Out = kinds::Softmax::Out;
  const auto &a = c.attrs<kinds::Softmax>();
  cuda::softmax(c.ctx, c.in(In::x), a.axis, c.out(Out::y));
}

void launch(kinds::CrossEntropy, const CudaCall &c) {
  using In = kinds::CrossEntropy::In;
  using Out = kinds::CrossEntropy::Out;
  const auto &a = c.attrs<kinds::CrossEntropy>();
  cuda::crossEntropy(c.ctx, c.in(In::logits), c.in(In::labels), a.ignoreIndex, c.out(Out::loss));
}

void launch(kinds::Transpose, const CudaCall &c) {
  using In = kinds::Transpose::In;
  using Out = kinds::Transpose::Out;
  const auto &a = c.attrs<kinds::Transpose>();
  cuda::transpose(c.ctx, c.in(In::x), a.permutation, c.out(Out::y));
}

void launch(kinds::Slice, const CudaCall &c) {
  using In = kinds::Slice::In;
  using Out = kinds::Slice::Out;
  const auto &a = c.attrs<kinds::Slice>();
  cuda::slice(c.ctx, c.in(In::x), a.axis, a.start, c.out(Out::y));
}

void launch(kinds::Concat, const CudaCall &c) {
  using Out = kinds::Concat::Out;
  cuda::concat(c.ctx, c.inputsFrom(0), c.attrs<kinds::Concat>().axis, c.out(Out::y));
}

void launch(kinds::Cast, const CudaCall &c) {
  using In = kinds::Cast::In;
  using Out = kinds::Cast::Out;
  cuda::cast(c.ctx, c.in(In::x), c.out(Out::y));
}

void launch(kinds::Copy, const CudaCall &c) {
  using In = kinds::Copy::In;
  using Out = kinds::Copy::Out;
  // An exact alias is a no-op; the verifier allows no other overlap.
  if (c.in(In::x).data != c.out(Out::y).data)
    cuda::copy(c.ctx, c.in(In::x), c.out(Out::y));
}

void launch(kinds::CopyHostToDevice, const CudaCall &c) {
  using In = kinds::CopyHostToDevice::In;
  using Out = kinds::CopyHostToDevice::Out;
  cuda::copyHostToDevice(c.ctx, c.in(In::x), c.out(Out::y));
}

void launch(kinds::CopyDeviceToHost, const CudaCall &c) {
  using In = kinds::CopyDeviceToHost::In;
  using Out = kinds::CopyDeviceToHost::Out;
  cuda::copyDeviceToHost(c.ctx, c.in(In::x), c.out(Out::y));
}

void launch(kinds::Fill, const CudaCall &c) {
  using Out = kinds::Fill::Out;
  const auto &a = c.attrs<kinds::Fill>();
  cuda::fill(c.ctx, a.value, c.out(Out::y));
}

void launch(kinds::EmbeddingGrad, const CudaCall &c) {
  using In = kinds::EmbeddingGrad::In;
  using Out = kinds::EmbeddingGrad::Out;
  cuda::embeddingGrad(c.ctx, c.in(In::dy), c.in(In::ids), c.out(Out::dtable));
}

void launch(kinds::LinearGradInput, const CudaCall &c) {
  using In = kinds::LinearGradInput::In;
  using Out = kinds::LinearGradInput::Out;
  cuda::linearGradInput(c.ctx, c.in(In::dy), c.in(In::w), c.out(Out::dx));
}

void launch(kinds::LinearGradWeight, const CudaCall &c) {
  using In = kinds::LinearGradWeight::In;
  using Out = kinds::LinearGradWeight::Out;
  cuda::linearGradWeight(c.ctx, c.in(In::dy), c.in(In::x), c.out(Out::dw));
}

void launch(kinds::ReduceTo, const CudaCall &c) {
  using In = kinds::ReduceTo::In;
  using Out = kinds::ReduceTo::Out;
  cuda::reduceTo(c.ctx, c.in(In::x), c.out(Out::y));
}

void launch(kinds::RMSNormGrad, const CudaCall &c) {
  using In = kinds::RMSNormGrad::In;
  using Out = kinds::RMSNormGrad::Out;
  const auto &a = c.attrs<kinds::RMSNormGrad>();
  cuda::rmsNormGrad(c.ctx, c.in(In::dy), c.in(In::x), c.in(In::w), a.epsilon, c.out(Out::dx),
                    c.out(Out::dw));
}

void launch(kinds::LayerNormGrad, const CudaCall &c) {
  using In = kinds::LayerNormGrad::In;
  using Out = kinds::LayerNormGrad::Out;
  const auto &a = c.attrs<kinds::LayerNormGrad>();
  cuda::layerNormGrad(c.ctx, c.in(In::dy), c.in(In::x), c.in(In::w), a.epsilon, c.out(Out::dx),
                      c.out(Out::dw), c.out(Out::db));
}

void launch(kinds::RoPEGrad, const CudaCall &c) {
  using In = kinds::RoPEGrad::In;
  using Out = kinds::RoPEGrad::Out;
  const auto &a = c.attrs<kinds::RoPEGrad>();
  cuda::ropeGrad(c.ctx, c.in(In::dy), a, c.optionalIn(In::positions), c.out(Out::dx));
}

void launch(kinds::AttentionGrad, const CudaCall &c) {
  using In = kinds::AttentionGrad::In;
  using Out = kinds::AttentionGrad::Out;
  const auto &a = c.attrs<kinds::AttentionGrad>();
  if (a.ringRanks > 1)
    return cuda::ringAttentionGrad(
        c.ctx, ringTransport(c, a.ringRanks, c.collectiveContext(c.kernel().outputs[Out::dq])),
        c.in(In::do_), c.in(In::q), c.in(In::k), c.in(In::v), c.in(In::o), nullptr,
        c.optionalIn(In::segment_ids), a.causal, a.scale, c.out(Out::dq), c.out(Out::dk),
        c.out(Out::dv));
  cuda::attentionGrad(c.ctx, c.in(In::do_), c.in(In::q), c.in(In::k), c.in(In::v), c.in(In::o),
                      a.causal, a.scale, c.out(Out::dq), c.out(Out::dk), c.out(Out::dv),
                      c.optionalIn(In::segment_ids));
}

void launch(kinds::FlashAttention, const CudaCall &c) {
  using In = kinds::FlashAttention::In;
  using Out = kinds::FlashAttention::Out;
  const auto &a = c.attrs<kinds::FlashAttention>();
  if (a.ringRanks > 1)
    return cuda::ringAttention(
        c.ctx, ringTransport(c, a.ringRanks, c.collectiveContext(c.kernel().outputs[Out::o])),
        c.in(In::q), c.in(In::k), c.in(In::v), c.optionalIn(In::segment_ids), a.causal, a.scale,
        c.out(Out::o), &c.out(Out::lse));
  cuda::flashAttention(c.ctx, c.in(In::q), c.in(In::k), c.in(In::v), a.causal, a.scale,
                       c.out(Out::o), c.out(Out::lse), c.optionalIn(In::segment_ids));
}

void launch(kinds::FlashAttentionGrad, const CudaCall &c) {
  using In = kinds::FlashAttentionGrad::In;
  using Out = kinds::FlashAttentionGrad::Out;
  const auto &a = c.attrs<kinds::FlashAttentionGrad>();
  if (a.ringRanks > 1)
    return cuda::ringAttentionGrad(
        c.ctx, ringTransport(c, a.ringRanks, c.collectiveContext(c.kernel().outputs[Out::dq])),
        c.in(In::do_), c.in(In::q), c.in(In::k), c.in(In::v), c.in(In::o), &c.in(In::lse),
        c.optionalIn(In::segment_ids), a.causal, a.scale, c.out(Out::dq), c.out(Out::dk),
        c.out(Out::dv));
  cuda::flashAttentionGrad(c.ctx, c.in(In::do_), c.in(In::q), c.in(In::k), c.in(In::v), c.in(In::o),
                           c.in(In::lse), a.causal, a.scale, c.out(Out::dq), c.out(Out::dk),
                           c.out(Out::dv), c.optionalIn(In::segment_ids));
}

void launch(kinds::FlashAttentionQkv, const CudaCall &c) {
  using In = kinds::FlashAttentionQkv::In;
  using Out = kinds::FlashAttentionQkv::Out;
  const auto &a = c.attrs<kinds::FlashAttentionQkv>();
  cuda::flashAttentionQkv(c.ctx, c.in(In::qkv), a.causal, a.scale, c.out(Out::o), c.out(Out::lse),
                          c.optionalIn(In::segment_ids));
}

void launch(kinds::FlashAttentionQkvGrad, const CudaCall &c) {
  using In = kinds::FlashAttentionQkvGrad::In;
  using Out = kinds::FlashAttentionQkvGrad::Out;
  const auto &a = c.attrs<kinds::FlashAttentionQkvGrad>();
  cuda::flashAttentionQkvGrad(c.ctx, c.in(In::do_), c.in(In::qkv), c.in(In::o), c.in(In::lse),
                              a.causal, a.scale, c.out(Out::dqkv), c.optionalIn(In::segment_ids));
}

void launch(kinds::SiLUGrad, const CudaCall &c) {
  using In = kinds::SiLUGrad::In;
  using Out = kinds::SiLUGrad::Out;
  cuda::siluGrad(c.ctx, c.in(In::dy), c.in(In::x), c.out(Out::dx));
}

void launch(kinds::GeLUGrad, const CudaCall &c) {
  using In = kinds::GeLUGrad::In;
  using Out = kinds::GeLUGrad::Out;
  const auto &a = c.attrs<kinds::GeLUGrad>();
  cuda::geluGrad(c.ctx, c.in(In::dy), c.in(In::x), a.tanh, c.out(Out::dx));
}

void launch(kinds::SwiGLUGrad, const CudaCall &c) {
  using In = kinds::SwiGLUGrad::In;
  using Out = kinds::SwiGLUGrad::Out;
  cuda::swigluGrad(c.ctx, c.in(In::dy), c.in(In::gate), c.in(In::up), c.out(Out::dgate),
                   c.out(Out::dup));
}

void launch(kinds::SoftmaxGrad, const CudaCall &c) {
  using In = kinds::SoftmaxGrad::In;
  using Out = kinds::SoftmaxGrad::Out;
  const auto &a = c.attrs<kinds::SoftmaxGrad>();
  cuda::softmaxGrad(c.ctx, c.in(In::dy), c.in(In::y), a.axis, c.out(Out::dx));
}

void launch(kinds::CrossEntropyGrad, const CudaCall &c) {
  using In = kinds::CrossEntropyGrad::In;
  using Out = kinds::CrossEntropyGrad::Out;
  const auto &a = c.attrs<kinds::CrossEntropyGrad>();
  cuda::crossEntropyGrad(c.ctx, c.in(In::dloss), c.in(In::logits), c.in(In::labels), a.ignoreIndex,
                         c.out(Out::dlogits));
}

void launch(kinds::SliceGrad, const CudaCall &c) {
  using In = kinds::SliceGrad::In;
  using Out = kinds::SliceGrad::Out;
  const auto &a = c.attrs<kinds::SliceGrad>();
  cuda::sliceGrad(c.ctx, c.in(In::dy), a.axis, a.start, c.out(Out::dx));
}

void launch(kinds::GradNorm, const CudaCall &c) {
  using Out = kinds::GradNorm::Out;
  cuda::gradNorm(c.ctx, c.inputsFrom(0), c.out(Out::norm));
}

void launch(kinds::LearningRate, const CudaCall &c) {
  using In = kinds::LearningRate::In;
  using Out = kinds::LearningRate::Out;
  const auto &a = c.attrs<kinds::LearningRate>();
  cuda::learningRate(c.ctx, c.in(In::step), learningRateSchedule(a), c.out(Out::lr));
}

void launch(kinds::AdamWUpdate, const CudaCall &c) {
  using In = kinds::AdamWUpdate::In;
  using Out = kinds::AdamWUpdate::Out;
  const auto &a = c.attrs<kinds::AdamWUpdate>();
  cuda::adamwUpdate(c.ctx, c.in(In::grad), c.in(In::step), c.in(In::lr), c.in(In::norm),
                    adamwHyper(a), c.out(Out::param), c.out(Out::m), c.out(Out::v),
                    c.optionalOut(Out::master));
}

void launch(kinds::SGDUpdate, const CudaCall &c) {
  using In = kinds::SGDUpdate::In;
  using Out = kinds::SGDUpdate::Out;
  const auto &a = c.attrs<kinds::SGDUpdate>();
  cuda::sgdUpdate(c.ctx, c.in(In::grad), c.in(In::lr), c.in(In::norm), sgdHyper(a),
                  c.out(Out::param), c.out(Out::momentum), c.optionalOut(Out::master));
}

void launch(kinds::GaloreRefresh, const CudaCall &c) {
  using In = kinds::GaloreRefresh::In;
  using Out = kinds::GaloreRefresh::Out;
  const auto &a = c.attrs<kinds::GaloreRefresh>();
  cuda::galoreRefresh(c.ctx, c.in(In::grad), c.in(In::step), galoreRefreshParams(a),
                      c.out(Out::workspace), c.out(Out::projector), c.out(Out::status));
}

void launch(kinds::GaloreProject, const CudaCall &c) {
  using In = kinds::GaloreProject::In;
  using Out = kinds::GaloreProject::Out;
  const auto &a = c.attrs<kinds::GaloreProject>();
  cuda::galoreProject(c.ctx, c.in(In::grad), c.in(In::projector), a.left, a.bf16Operands,
                      c.out(Out::r));
}

void launch(kinds::GaloreAdamWUpdate, const CudaCall &c) {
  using In = kinds::GaloreAdamWUpdate::In;
  using Out = kinds::GaloreAdamWUpdate::Out;
  const auto &a = c.attrs<kinds::GaloreAdamWUpdate>();
  cuda::galoreAdamwUpdate(c.ctx, c.in(In::step), c.in(In::lr), c.in(In::norm), c.in(In::projector),
                          adamwHyper(a), a.scale, a.left, c.out(Out::r), c.out(Out::param),
                          c.out(Out::m), c.out(Out::v), c.optionalOut(Out::master));
}

void launch(kinds::StepIncrement, const CudaCall &c) {
  using Out = kinds::StepIncrement::Out;
  cuda::stepIncrement(c.ctx, c.out(Out::step));
}

void launch(kinds::Accumulate, const CudaCall &c) {
  using In = kinds::Accumulate::In;
  using Out = kinds::Accumulate::Out;
  cuda::accumulate(c.ctx, c.in(In::g), c.out(Out::acc));
}

void launch(kinds::AccumulateMax, const CudaCall &c) {
  using In = kinds::AccumulateMax::In;
  using Out = kinds::AccumulateMax::Out;
  cuda::accumulateMax(c.ctx, c.in(In::x), c.out(Out::acc));
}

void launch(kinds::Zero, const CudaCall &c) {
  using Out = kinds::Zero::Out;
  cuda::zero(c.ctx, c.out(Out::x));
}

void launch(kinds::DoraScale, const CudaCall &c) {
  using In = kinds::DoraScale::In;
  using Out = kinds::DoraScale::Out;
  const auto &a = c.attrs<kinds::DoraScale>();
  cuda::doraScale(c.ctx, c.in(In::magnitude), c.in(In::w), c.in(In::lora_a), c.in(In::lora_b),
                  a.scale, c.out(Out::y));
}

void launch(kinds::DoraGrad, const CudaCall &c) {
  using In = kinds::DoraGrad::In;
  using Out = kinds::DoraGrad::Out;
  cuda::doraGrad(c.ctx, c.in(In::dy), c.in(In::y), c.in(In::scale), c.in(In::magnitude),
                 c.out(Out::dx), c.out(Out::dmagnitude));
}

void launch(kinds::Dequantize, const CudaCall &c) {
  using In = kinds::Dequantize::In;
  using Out = kinds::Dequantize::Out;
  cuda::dequantize(c.ctx, c.in(In::q), c.out(Out::y));
}

void launch(kinds::LinearCrossEntropy, const CudaCall &c) {
  using In = kinds::LinearCrossEntropy::In;
  using Out = kinds::LinearCrossEntropy::Out;
  const auto &a = c.attrs<kinds::LinearCrossEntropy>();
  cuda::linearCrossEntropy(c.ctx, c.in(In::x), c.in(In::w), c.in(In::labels), c.in(In::dloss),
                           a.ignoreIndex, a.chunkRows, c.out(Out::loss), c.out(Out::dx),
                           c.out(Out::workspace), c.optionalOut(Out::dw));
}

void launch(kinds::AddRMSNorm, const CudaCall &c) {
  using In = kinds::AddRMSNorm::In;
  using Out = kinds::AddRMSNorm::Out;
  const auto &a = c.attrs<kinds::AddRMSNorm>();
  cuda::addRmsNorm(c.ctx, c.in(In::lhs), c.in(In::rhs), c.in(In::weight), a.epsilon,
                   c.out(Out::sum), c.out(Out::y));
}

void launch(kinds::AddLayerNorm, const CudaCall &c) {
  using In = kinds::AddLayerNorm::In;
  using Out = kinds::AddLayerNorm::Out;
  const auto &a = c.attrs<kinds::AddLayerNorm>();
  cuda::addLayerNorm(c.ctx, c.in(In::lhs), c.in(In::rhs), c.in(In::weight), c.in(In::bias),
                     a.epsilon, c.out(Out::sum), c.out(Out::y));
}

void launch(kinds::RMSNormGradAdd, const CudaCall &c) {
  using In = kinds::RMSNormGradAdd::In;
  using Out = kinds::RMSNormGradAdd::Out;
  const auto &a = c.attrs<kinds::RMSNormGradAdd>();
  cuda::rmsNormGradAdd(c.ctx, c.in(In::dy), c.in(In::x), c.in(In::w), c.in(In::addend), a.epsilon,
                       c.out(Out::dx), c.out(Out::dw));
}

void launch(kinds::LayerNormGradAdd, const CudaCall &c) {
  using In = kinds::LayerNormGradAdd::In;
  using Out = kinds::LayerNormGradAdd::Out;
  const auto &a = c.attrs<kinds::LayerNormGradAdd>();
  cuda::layerNormGradAdd(c.ctx, c.in(In::dy), c.in(In::x), c.in(In::w), c.in(In::addend), a.epsilon,
                         c.out(Out::dx), c.out(Out::dw), c.out(Out::db));
}

void launch(kinds::MultiTensorAdamWUpdate, const CudaCall &c) {
  using In = kinds::MultiTensorAdamWUpdate::In;
  const auto &a = c.attrs<kinds::MultiTensorAdamWUpdate>();
  MultiTensorOperands t = c.multiTensor(3, 3);
  cuda::multiTensorAdamwUpdate(c.ctx, t.grads, c.in(In::step), c.in(In::lr), c.in(In::norm),
                               adamwHyper(a), t.lists[0], t.lists[1], t.lists[2], t.masters);
}

void launch(kinds::MultiTensorSGDUpdate, const CudaCall &c) {
  using In = kinds::MultiTensorSGDUpdate::In;
  const auto &a = c.attrs<kinds::MultiTensorSGDUpdate>();
  MultiTensorOperands t = c.multiTensor(2, 2);
  cuda::multiTensorSgdUpdate(c.ctx, t.grads, c.in(In::lr), c.in(In::norm), sgdHyper(a), t.lists[0],
                             t.lists[1], t.masters);
}
void launch(kinds::LinearGeLU, const CudaCall &c) {
  using In = kinds::LinearGeLU::In;
  using Out = kinds::LinearGeLU::Out;
  cuda::linearGelu(c.ctx, c.in(In::x), c.in(In::w), c.optionalIn(In::bias), c.out(Out::y),
                   c.out(Out::pre));
}

void launch(kinds::LinearAdd, const CudaCall &c) {
  using In = kinds::LinearAdd::In;
  using Out = kinds::LinearAdd::Out;
  cuda::linearAdd(c.ctx, c.in(In::x), c.in(In::w), c.in(In::addend), c.out(Out::y));
}

void launch(kinds::LinearGradWeightAccumulate, const CudaCall &c) {
  using In = kinds::LinearGradWeightAccumulate::In;
  using Out = kinds::LinearGradWeightAccumulate::Out;
  cuda::linearGradWeightAccumulate(c.ctx, c.in(In::dy), c.in(In::x), c.out(Out::acc));
}

void launch(kinds::Fp8Linear, const CudaCall &c) {
  using In = kinds::Fp8Linear::In;
  using Out = kinds::Fp8Linear::Out;
  const auto &a = c.attrs<kinds::Fp8Linear>();
  cuda::fp8Linear(c.ctx, c.in(In::x), c.in(In::w), c.in(In::state), c.optionalIn(In::bias),
                  a.current, a.margin, c.out(Out::y), c.out(Out::stats), c.out(Out::workspace),
                  a.fastAccumulation);
}

void launch(kinds::Fp8LinearGradInput, const CudaCall &c) {
  using In = kinds::Fp8LinearGradInput::In;
  using Out = kinds::Fp8LinearGradInput::Out;
  const auto &a = c.attrs<kinds::Fp8LinearGradInput>();
  cuda::fp8LinearGradInput(c.ctx, c.in(In::dy), c.in(In::w), c.in(In::state), a.current, a.margin,
                           c.out(Out::dx), c.out(Out::stats), c.out(Out::workspace));
}

void launch(kinds::Fp8LinearGradWeight, const CudaCall &c) {
  using In = kinds::Fp8LinearGradWeight::In;
  using Out = kinds::Fp8LinearGradWeight::Out;
  const auto &a = c.attrs<kinds::Fp8LinearGradWeight>();
  cuda::fp8LinearGradWeight(c.ctx, c.in(In::dy), c.in(In::x), c.in(In::state), a.current, a.margin,
                            c.out(Out::dw), c.out(Out::stats), c.out(Out::workspace));
}

void launch(kinds::Fp8LinearGradWeightAccumulate, const CudaCall &c) {
  using In = kinds::Fp8LinearGradWeightAccumulate::In;
  using Out = kinds::Fp8LinearGradWeightAccumulate::Out;
  const auto &a = c.attrs<kinds::Fp8LinearGradWeightAccumulate>();
  cuda::fp8LinearGradWeightAccumulate(c.ctx, c.in(In::dy), c.in(In::x), c.in(In::state), a.current,
                                      a.margin, c.out(Out::stats), c.out(Out::workspace),
                                      c.out(Out::acc));
}

void launch(kinds::Fp8LinearBackward, const CudaCall &c) {
  using In = kinds::Fp8LinearBackward::In;
  using Out = kinds::Fp8LinearBackward::Out;
  const auto &a = c.attrs<kinds::Fp8LinearBackward>();
  cuda::fp8LinearBackward(c.ctx, c.in(In::dy), c.in(In::w), c.in(In::x), c.in(In::state), a.current,
                          a.margin, c.out(Out::dx), c.out(Out::input_grad_stats),
                          c.out(Out::weight_grad_stats), c.out(Out::workspace), c.out(Out::acc));
}

void launch(kinds::Fp8LinearSharedInput, const CudaCall &c) {
  using In = kinds::Fp8LinearSharedInput::In;
  using Out = kinds::Fp8LinearSharedInput::Out;
  const auto &a = c.attrs<kinds::Fp8LinearSharedInput>();
  cuda::fp8LinearSharedInput(c.ctx, c.in(In::input_cast), c.in(In::input_stats), c.in(In::w),
                             c.in(In::state), c.optionalIn(In::bias), a.current, a.margin,
                             c.out(Out::y), c.out(Out::stats), c.out(Out::workspace),
                             a.fastAccumulation);
}

void launch(kinds::Fp8LinearBackwardSharedInput, const CudaCall &c) {
  using In = kinds::Fp8LinearBackwardSharedInput::In;
  using Out = kinds::Fp8LinearBackwardSharedInput::Out;
  const auto &a = c.attrs<kinds::Fp8LinearBackwardSharedInput>();
  cuda::fp8LinearBackwardSharedInput(
      c.ctx, c.in(In::dy), c.in(In::w), c.in(In::input_cast), c.in(In::input_stats),
      c.in(In::state), a.current, a.margin, c.out(Out::dx), c.out(Out::input_grad_stats),
      c.out(Out::weight_grad_stats), c.out(Out::workspace), c.out(Out::acc));
}

void launch(kinds::Fp8LinearWithInputCast, const CudaCall &c) {
  using In = kinds::Fp8LinearWithInputCast::In;
  using Out = kinds::Fp8LinearWithInputCast::Out;
  const auto &a = c.attrs<kinds::Fp8LinearWithInputCast>();
  cuda::fp8LinearWithInputCast(c.ctx, c.in(In::x), c.in(In::w), c.in(In::state),
                               c.optionalIn(In::bias), a.current, a.margin, c.out(Out::y),
                               c.out(Out::stats), c.out(Out::input_cast), c.out(Out::workspace),
                               a.fastAccumulation);
}

void launch(kinds::Fp8LinearBackwardFromInputCast, const CudaCall &c) {
  using In = kinds::Fp8LinearBackwardFromInputCast::In;
  using Out = kinds::Fp8LinearBackwardFromInputCast::Out;
  const auto &a = c.attrs<kinds::Fp8LinearBackwardFromInputCast>();
  cuda::fp8LinearBackwardFromInputCast(
      c.ctx, c.in(In::dy), c.in(In::w), c.in(In::input_cast), c.in(In::input_stats),
      c.in(In::state), a.current, a.margin, c.out(Out::dx), c.out(Out::input_grad_stats),
      c.out(Out::weight_grad_stats), c.out(Out::workspace), c.out(Out::acc));
}

void launch(kinds::Fp8UpdateScales, const CudaCall &c) {
  using In = kinds::Fp8UpdateScales::In;
  using Out = kinds::Fp8UpdateScales::Out;
  const auto &a = c.attrs<kinds::Fp8UpdateScales>();
  cuda::fp8UpdateScales(c.ctx, c.in(In::step), c.in(In::forward_stats),
                        c.optionalIn(In::backward_stats), a.margin, c.out(Out::state));
}

void launch(kinds::FusedElementwise, const CudaCall &c) {
  const auto &a = c.attrs<kinds::FusedElementwise>();
  c.generated->launch(c.ctx, a.kernel, c.inputPointers(), c.outputPointers());
}

// The collectives (docs/sharding.md) go through NCCL on the kernel's stream (the compute
// stream for now: a stream of their own, ordered by events, is later work). An NCCL call made
// while the backend captures a phase becomes a node of its graph.

/// The backend's NCCL communicator; its presence for a plan with collectives was checked when
/// the backend started (a build without NCCL refuses such a plan there).
NcclCommunicator &nccl(const CudaCall &c) {
#ifdef BONSAI_HAVE_NCCL
  if (c.nccl)
    return *c.nccl;
  throw Error("internal error: a collective kernel ran without an NCCL communicator");
#else
  (void)c;
  throw Error("this build has no NCCL: the CUDA backend cannot run collectives (build with "
              "NCCL in the CUDA toolkit, or run the plan with --backend=cpu)");
#endif
}

void launch(kinds::ShardSlice, const CudaCall &c) {
  using In = kinds::ShardSlice::In;
  using Out = kinds::ShardSlice::Out;
  const TensorView &shard = c.out(Out::shard);
  size_t bytes = shard.bytes();
  cudaError_t status = cudaMemcpyAsync(
      shard.data, static_cast<const char *>(c.in(In::full).data) + c.ranks().rank * bytes, bytes,
      cudaMemcpyDeviceToDevice, c.ctx.stream);
  if (status != cudaSuccess)
    throw Error(c.collectiveContext(c.kernel().outputs[Out::shard]) +
                ": cudaMemcpyAsync failed: " + cudaGetErrorString(status));
}

#ifdef BONSAI_HAVE_NCCL

void launch(kinds::ReduceScatter, const CudaCall &c) {
  using In = kinds::ReduceScatter::In;
  using Out = kinds::ReduceScatter::Out;
  const TensorView &shard = c.out(Out::shard);
  nccl(c).reduceScatterSum(c.in(In::full).data, shard.data, size_t(shard.numel()), shard.dtype,
                           c.ctx.stream, c.collectiveContext(c.kernel().outputs[Out::shard]));
}

void launch(kinds::AllGather, const CudaCall &c) {
  using In = kinds::AllGather::In;
  using Out = kinds::AllGather::Out;
  const TensorView &shard = c.in(In::shard);
  nccl(c).allGather(shard.data, c.out(Out::full).data, size_t(shard.numel()), shard.dtype,
                    c.ctx.stream, c.collectiveContext(c.kernel().outputs[Out::full]));
}

void launch(kinds::AllReduce, const CudaCall &c) {
  using In = kinds::AllReduce::In;
  using Out = kinds::AllReduce::Out;
  const TensorView &x = c.in(In::x), &y = c.out(Out::y);
  std::string context = c.collectiveContext(c.kernel().outputs[Out::y]);
  CollectiveReduction reduction = c.attrs<kinds::AllReduce>().reduction;
  if (reduction == CollectiveReduction::Sum) {
    nccl(c).allReduceSum(x.data, y.data, size_t(x.numel()), x.dtype, c.ctx.stream, context);
    return;
  }
  if (reduction == CollectiveReduction::Max) {
    nccl(c).allReduceMax(x.data, y.data, size_t(x.numel()), x.dtype, c.ctx.stream, context);
    return;
  }
  // L2Norm (f32): the squares in y, their sum over ranks in place, then the root.
  cuda::square(c.ctx, x, y);
  nccl(c).allReduceSum(y.data, y.data, size_t(y.numel()), DType::F32, c.ctx.stream, context);
  cuda::squareRoot(c.ctx, y, y);
}

#else // !BONSAI_HAVE_NCCL

void launch(kinds::ReduceScatter, const CudaCall &c) { nccl(c); }
void launch(kinds::AllGather, const CudaCall &c) { nccl(c); }
void launch(kinds::AllReduce, const CudaCall &c) { nccl(c); }

#endif // BONSAI_HAVE_NCCL

using CudaHandler = void (*)(const CudaCall &);

/// One handler per kind, in kernel-table order.
const CudaHandler kCudaHandlers[] = {
#define BONSAI_KERNEL_KIND(Name, ...) [](const CudaCall &c) { launch(kinds::Name{}, c); },
#include "bonsai/runtime/KernelKinds.def"
};
static_assert(sizeof kCudaHandlers / sizeof kCudaHandlers[0] == kKernelKindCount);

} // namespace

void launchOnCuda(const CudaCall &call) {
  kCudaHandlers[kernelKindIndex(call.kernel().kind)](call);
}

} // namespace bonsai::rt

#endif // BONSAI_HAVE_CUDA
