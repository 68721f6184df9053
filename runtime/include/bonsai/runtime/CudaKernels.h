//===- CudaKernels.h - The CUDA backend's kernels --------------------------===//
//
// One function per plan kernel kind, as in CpuKernels.h (same operands, same semantics, same
// storage types: f32, f16, bf16 storage with fp32 compute), for tensors in device memory. Every
// function enqueues its work on `ctx.stream` and returns without synchronising; launch errors
// are checked at once (rt::Error naming the kernel and the CUDA error). Data-dependent errors
// (an id or label out of range) cannot throw from the device: the kernel records the first one
// in `ctx.deviceError` and the executor reports it after the step (see DeviceError).
//
// GEMMs go through cuBLASLt (fp32 accumulation, bf16/f16/f32 storage). The CPU kernels are the
// reference every function here is tested against.
//
// This header has no CUDA include: cudaStream_t is forward-declared so that the executor's
// headers stay plain C++.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_CUDAKERNELS_H
#define BONSAI_RUNTIME_CUDAKERNELS_H

#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/Tensor.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

struct CUstream_st;

namespace bonsai::rt::cuda {

using Stream = CUstream_st *;

/// Codes a kernel stores in DeviceError::code (the first error of a step wins).
enum DeviceErrorCode : int32_t {
  kNoDeviceError = 0,
  kIdOutOfRange = 1,    ///< embedding: ids[index] = value is not below the vocabulary size
  kLabelOutOfRange = 2, ///< cross-entropy: labels[index] = value is neither ignored nor valid
  kZeroNorm = 3,        ///< dora_scale: row `index` of w + s·b·a has norm 0
  kZeroMagnitude = 4,   ///< dora_grad: magnitude[index] is 0
};

/// A device-side error record: the executor zeroes it, kernels fill it, the executor reads it
/// back after the step and throws rt::Error naming the kernel.
struct DeviceError {
  int32_t code;
  int32_t kernel; ///< plan kernel index, set by the executor through Context::kernelIndex
  int64_t index;  ///< flat position of the offending element
  int64_t value;  ///< its value
};

/// cuBLASLt handle, workspace and cached matmul descriptors; one per device and stream.
class GemmEngine {
public:
  /// Creates the handle and a `workspaceBytes` device workspace. Throws rt::Error on failure.
  explicit GemmEngine(size_t workspaceBytes = size_t(32) << 20);
  ~GemmEngine();
  GemmEngine(const GemmEngine &) = delete;
  GemmEngine &operator=(const GemmEngine &) = delete;

  /// Row-major C[m, n] = alpha * op(A) * op(B) + beta * C with op = transpose when the flag is
  /// set; A is [m, k] (or [k, m] transposed), B is [k, n] (or [n, k] transposed). All three
  /// share one storage dtype (f32, f16 or bf16); accumulation is fp32. `batch` matrices at
  /// the given element strides (0 = the same matrix for every batch).
  void gemm(Stream stream, DType dtype, bool transA, bool transB, int64_t m, int64_t n,
            int64_t k, float alpha, const void *a, int64_t strideA, const void *b,
            int64_t strideB, float beta, void *c, int64_t strideC, int64_t batch = 1);

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Device memory for the scratch of kernels captured into a conditional graph node's body.
///
/// A kernel's scratch is normally stream-ordered (cudaMallocAsync), which a captured graph
/// records as memory-allocation nodes; a conditional node's body may not contain those, and
/// cudaGraphInstantiate refuses the graph ("invalid argument"). Inside a BodyScope, while an
/// arena is lent to the thread, scratch is carved from the arena instead. The kernels of a
/// body run one after another in the body's stream order, so each one (each scope) reuses the
/// arena from the offset its scope began at: the arena needs the largest scope, not the sum.
/// It cannot grow while a capture is open (cudaMalloc is not capturable): a request that does
/// not fit throws, the arena remembers the size asked for, and the backend grows it with
/// growToNeeded() after ending the capture and captures again.
class ScratchArena {
public:
  ScratchArena() = default;
  ~ScratchArena();
  ScratchArena(const ScratchArena &) = delete;
  ScratchArena &operator=(const ScratchArena &) = delete;

  /// Bytes held now.
  size_t capacity() const { return capacity_; }
  /// The most bytes any capture asked for (more than capacity() after a request that failed).
  size_t needed() const { return needed_; }
  /// Reallocates the buffer to needed() bytes when it holds less; not while capturing.
  void growToNeeded();

  /// While alive, this thread's scratch inside a BodyScope comes from `arena`.
  class Lend {
  public:
    explicit Lend(ScratchArena &arena);
    ~Lend();
    Lend(const Lend &) = delete;
    Lend &operator=(const Lend &) = delete;

  private:
    ScratchArena *previous_;
  };

  /// A conditional body, or one kernel of it: the scratch taken inside comes from the lent
  /// arena (when one is lent) and is free again at the end of the scope. Scopes nest.
  class BodyScope {
  public:
    BodyScope();
    ~BodyScope();
    BodyScope(const BodyScope &) = delete;
    BodyScope &operator=(const BodyScope &) = delete;

  private:
    ScratchArena *arena_; ///< the arena lent when the scope began, if any
    size_t begin_ = 0;
  };

  /// `bytes` from the arena lent to this thread when inside a BodyScope (aligned to 256
  /// bytes), null when scratch should come from the stream-ordered allocator instead; throws
  /// "cuda <kernel>: ..." when the arena is too small. Used by the kernels' Scratch.
  static void *takeInBody(const char *kernel, size_t bytes);

private:
  void *data_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
  size_t needed_ = 0;
  int depth_ = 0;
};

/// What every kernel needs besides its tensors.
struct Context {
  Stream stream = nullptr;
  GemmEngine *gemm = nullptr;
  DeviceError *deviceError = nullptr; ///< device memory
  int32_t kernelIndex = 0;            ///< recorded with a device error
  /// Off: kernels may add partial results in the order their blocks run, which is faster but
  /// not bit-reproducible from run to run (attention's backward on Hopper then forms dq in its
  /// dk/dv pass, docs/cuda.md). On by default: every result is summed in a fixed order.
  bool deterministic = true;
};

// Forward kernels (see CpuKernels.h for the semantics of each).
void embedding(const Context &ctx, const TensorView &table, const TensorView &ids,
               const TensorView &out);
void linear(const Context &ctx, const TensorView &x, const TensorView &w,
            const TensorView *bias, const TensorView &y);
void matmul(const Context &ctx, const TensorView &a, const TensorView &b, const TensorView &c);
void add(const Context &ctx, const TensorView &lhs, const TensorView &rhs,
         const TensorView &out);
void mul(const Context &ctx, const TensorView &lhs, const TensorView &rhs,
         const TensorView &out);
void rmsNorm(const Context &ctx, const TensorView &x, const TensorView &w, double eps,
             const TensorView &y);
void layerNorm(const Context &ctx, const TensorView &x, const TensorView &w,
               const TensorView &b, double eps, const TensorView &y);
void rope(const Context &ctx, const TensorView &x, double theta, const TensorView &y);
/// rope with llama3 scaling and optional positions (i32/i64 [B, S]), as cpu::rope.
void rope(const Context &ctx, const TensorView &x, const RoPEAttrs &a,
          const TensorView *positions, const TensorView &y);
/// With `segmentIds` (i32/i64 [B, S], packed rows) query i reads key j only where the ids are
/// equal, as cpu::attention; such calls run the generic kernels (docs/cuda.md).
void attention(const Context &ctx, const TensorView &q, const TensorView &k,
               const TensorView &v, bool causal, double scale, const TensorView &o,
               const TensorView *segmentIds = nullptr);
/// attention that also writes lse [B, H, S] (f32, natural log), as cpu::flashAttention.
void flashAttention(const Context &ctx, const TensorView &q, const TensorView &k,
                    const TensorView &v, bool causal, double scale, const TensorView &o,
                    const TensorView &lse, const TensorView *segmentIds = nullptr);
/// flashAttention of q, k and v packed in qkv [B, S, H + 2 KV, D] (H = o.dim(2); heads 0..H-1
/// are q, then KV of k, then KV of v), read in place: the kernels read each operand's positions
/// (H + 2 KV) D elements apart. As cpu::flashAttentionQkv.
void flashAttentionQkv(const Context &ctx, const TensorView &qkv, bool causal, double scale,
                       const TensorView &o, const TensorView &lse,
                       const TensorView *segmentIds = nullptr);
void silu(const Context &ctx, const TensorView &x, const TensorView &y);
void gelu(const Context &ctx, const TensorView &x, bool tanh, const TensorView &y);
void swiglu(const Context &ctx, const TensorView &gate, const TensorView &up,
            const TensorView &y);
void softmax(const Context &ctx, const TensorView &x, int axis, const TensorView &y);
void crossEntropy(const Context &ctx, const TensorView &logits, const TensorView &labels,
                  int64_t ignoreIndex, const TensorView &loss);
void transpose(const Context &ctx, const TensorView &x, const std::vector<int64_t> &perm,
               const TensorView &y);
/// y = the inputs joined along `axis` (equal elsewhere, one dtype).
void concat(const Context &ctx, const std::vector<TensorView> &xs, int axis, const TensorView &y);
void slice(const Context &ctx, const TensorView &x, int axis, int64_t start,
           const TensorView &y);
void cast(const Context &ctx, const TensorView &x, const TensorView &y);
void copy(const Context &ctx, const TensorView &x, const TensorView &y);
/// y = x * x and y = sqrt(x), elementwise (in place allowed): the two ends of an L2Norm
/// all-reduce (docs/sharding.md), whose sum NCCL does in between.
void square(const Context &ctx, const TensorView &x, const TensorView &y);
void squareRoot(const Context &ctx, const TensorView &x, const TensorView &y);
/// Byte copies over PCIe between a pinned host tensor and a device tensor of equal size
/// (Offload.cpp): asynchronous on ctx.stream, capturable into a CUDA Graph.
void copyHostToDevice(const Context &ctx, const TensorView &x, const TensorView &y);
void copyDeviceToHost(const Context &ctx, const TensorView &x, const TensorView &y);
/// NF4 -> f32/f16/bf16, vectorised (Nf4.cu); f32 results are bit-identical to the CPU's.
void dequantize(const Context &ctx, const TensorView &q, const TensorView &y);
/// y[..., out] = x[..., in] · Wᵀ with W an NF4 [out, in] weight dequantized tile by tile in
/// shared memory, never in device memory (Nf4Gemm.cu): bf16 x and y, fp32 accumulation. Not
/// yet emitted by plans; bench/nf4_gemm_bench.cu measures it.
void nf4Linear(const Context &ctx, const TensorView &x, const TensorView &q, const TensorView &y);
/// Why nf4Linear cannot take these operands ("" when it can): bf16 x and y, an NF4 weight
/// with block 64, out % 128 == 0, in % 64 == 0, 16-byte aligned x and weight.
std::string nf4LinearProblem(const TensorView &x, const TensorView &q, const TensorView &y);

// Backward kernels.
void fill(const Context &ctx, double value, const TensorView &y);
void embeddingGrad(const Context &ctx, const TensorView &dy, const TensorView &ids,
                   const TensorView &dtable);
void linearGradInput(const Context &ctx, const TensorView &dy, const TensorView &w,
                     const TensorView &dx);
void linearGradWeight(const Context &ctx, const TensorView &dy, const TensorView &x,
                      const TensorView &dw);
void reduceTo(const Context &ctx, const TensorView &x, const TensorView &y);
void rmsNormGrad(const Context &ctx, const TensorView &dy, const TensorView &x,
                 const TensorView &w, double eps, const TensorView &dx, const TensorView &dw);
void layerNormGrad(const Context &ctx, const TensorView &dy, const TensorView &x,
                   const TensorView &w, double eps, const TensorView &dx, const TensorView &dw,
                   const TensorView &db);
void ropeGrad(const Context &ctx, const TensorView &dy, double theta, const TensorView &dx);
void ropeGrad(const Context &ctx, const TensorView &dy, const RoPEAttrs &a,
              const TensorView *positions, const TensorView &dx);
void attentionGrad(const Context &ctx, const TensorView &dout, const TensorView &q,
                   const TensorView &k, const TensorView &v, const TensorView &o, bool causal,
                   double scale, const TensorView &dq, const TensorView &dk,
                   const TensorView &dv, const TensorView *segmentIds = nullptr);
/// attentionGrad from the forward's log-sum-exp (flashAttention): no statistics pass.
void flashAttentionGrad(const Context &ctx, const TensorView &dout, const TensorView &q,
                        const TensorView &k, const TensorView &v, const TensorView &o,
                        const TensorView &lse, bool causal, double scale, const TensorView &dq,
                        const TensorView &dk, const TensorView &dv,
                        const TensorView *segmentIds = nullptr);
/// flashAttentionGrad of flashAttentionQkv: dq, dk and dv written in place into dqkv (qkv's
/// shape and layout).
void flashAttentionQkvGrad(const Context &ctx, const TensorView &dout, const TensorView &qkv,
                           const TensorView &o, const TensorView &lse, bool causal, double scale,
                           const TensorView &dqkv, const TensorView *segmentIds = nullptr);

// Ring attention's block steps (docs/ring-attention.md), the CUDA side of
// cpu::ringAttentionBlock: this rank's zigzag share of queries against one rank's key/value
// block. The local sequence S is two chunks of C = S/2 tokens, chunks `rank` and
// 2·ranks-1-rank of the whole row. With the causal mask a step pairs what the zigzag layout
// allows: its own block (the first step) causally, an earlier rank's block (holder < rank)
// every query against the block's first chunk, a later rank's (holder > rank) the second
// chunk's queries against the whole block; without it every query against every key. Each
// step runs the flash kernels on those rows (k and v in their grouped-query form).

/// Where a block step stands: this rank, the rank whose block it holds, the ring's size.
struct RingBlockStep {
  int64_t ranks = 0, rank = 0, holder = 0;
};

/// Adds one key/value block to this rank's attention: acc (f32 [B, S, H, D], the normalised
/// output so far) and lse (f32 [B, H, S], natural log) take the block's output and
/// log-sum-exp, merged in fp32. The own block (holder == rank) comes first and writes them;
/// every other block merges into them. `querySegments` and `keySegments` (i32/i64 [B, S],
/// the block's travelling with it) mask packed rows; both or neither. Finish with
/// cuda::cast(acc, o).
void ringAttentionBlock(const Context &ctx, const TensorView &q, const TensorView &k,
                        const TensorView &v, const TensorView *querySegments,
                        const TensorView *keySegments, bool causal, double scale,
                        const RingBlockStep &step, const TensorView &acc, const TensorView &lse);
/// One block step of the backward pass from the final o and lse (ringAttentionBlock's):
/// adds the block's part of dq to `dq` (f32 [B, S, H, D]; written by the own block, the first
/// step) and writes its part of the block's dk and dv into `dkBlock`, `dvBlock` (f32 [B, S,
/// kvHeads, D], zeros where it pairs no query), which the caller adds to the accumulators
/// that travel with the block.
void ringAttentionBlockGrad(const Context &ctx, const TensorView &dout, const TensorView &q,
                            const TensorView &k, const TensorView &v, const TensorView &o,
                            const TensorView &lse, const TensorView *querySegments,
                            const TensorView *keySegments, bool causal, double scale,
                            const RingBlockStep &step, const TensorView &dq,
                            const TensorView &dkBlock, const TensorView &dvBlock);

/// How ring attention's key/value blocks travel between the ranks of a ring: `shift` passes
/// `count` elements of `send` to the next rank and receives the previous rank's into `recv` (a
/// distinct buffer), enqueued on `stream`, a stream beside the compute stream so that the
/// transfers overlap the block kernels. On the CUDA backend NCCL's ringShift; in a test, copies
/// between virtual ranks. `what` names the transfer in errors.
struct RingTransport {
  int64_t ranks = 0, rank = 0;
  Stream stream = nullptr;
  std::function<void(const void *send, void *recv, size_t count, DType dtype,
                     const std::string &what)>
      shift;
};

/// o (and lse, when non-null) of ring attention of this rank's queries against every rank's
/// keys: `ring.ranks` block steps (ringAttentionBlock) on ctx.stream, each while the next
/// block travels on the transport's stream into the other of two buffers; fp32 state, cast
/// into o at the end.
void ringAttention(const Context &ctx, const RingTransport &ring, const TensorView &q,
                   const TensorView &k, const TensorView &v, const TensorView *segmentIds,
                   bool causal, double scale, const TensorView &o, const TensorView *lse);
/// dq, dk, dv of ring attention from the forward's o and lse (null: recomputed around the ring
/// first). The key/value blocks travel as in the forward pass; each block's dk and dv
/// accumulators (fp32) follow one step behind, their transfer overlapping the next block's
/// kernels, and are home after `ring.ranks` shifts.
void ringAttentionGrad(const Context &ctx, const RingTransport &ring, const TensorView &dout,
                       const TensorView &q, const TensorView &k, const TensorView &v,
                       const TensorView &o, const TensorView *lse, const TensorView *segmentIds,
                       bool causal, double scale, const TensorView &dq, const TensorView &dk,
                       const TensorView &dv);

void siluGrad(const Context &ctx, const TensorView &dy, const TensorView &x,
              const TensorView &dx);
void geluGrad(const Context &ctx, const TensorView &dy, const TensorView &x, bool tanh,
              const TensorView &dx);
void swigluGrad(const Context &ctx, const TensorView &dy, const TensorView &gate,
                const TensorView &up, const TensorView &dgate, const TensorView &dup);
void softmaxGrad(const Context &ctx, const TensorView &dy, const TensorView &y, int axis,
                 const TensorView &dx);
void crossEntropyGrad(const Context &ctx, const TensorView &dloss, const TensorView &logits,
                      const TensorView &labels, int64_t ignoreIndex,
                      const TensorView &dlogits);
void sliceGrad(const Context &ctx, const TensorView &dy, int axis, int64_t start,
               const TensorView &dx);

// Optimizer kernels (the multi-tensor forms take every parameter of one update at once).
void gradNorm(const Context &ctx, const std::vector<TensorView> &grads,
              const TensorView &norm);
void learningRate(const Context &ctx, const TensorView &step,
                  const cpu::LearningRateSchedule &schedule, const TensorView &lr);
void adamwUpdate(const Context &ctx, const TensorView &grad, const TensorView &step,
                 const TensorView &lr, const TensorView &gradNorm, const cpu::AdamWHyper &hyper,
                 const TensorView &param, const TensorView &m, const TensorView &v,
                 const TensorView *master);
void sgdUpdate(const Context &ctx, const TensorView &grad, const TensorView &lr,
               const TensorView &gradNorm, const cpu::SGDHyper &hyper, const TensorView &param,
               const TensorView &momentum, const TensorView *master);
void stepIncrement(const Context &ctx, const TensorView &step);
void accumulate(const Context &ctx, const TensorView &g, const TensorView &acc);
void zero(const Context &ctx, const TensorView &x);
void accumulateMax(const Context &ctx, const TensorView &x, const TensorView &acc);

// Fused kernels (docs/fusion.md; semantics in CpuKernels.h).
/// AdamW of every parameter in one launch (multi-tensor apply): a table of the tensors'
/// pointers and sizes is passed by value (tensors past the table's capacity go to further
/// launches), each block updates fixed chunks of one tensor with adamwUpdate's per-element
/// formula, so the results are bitwise the per-tensor kernel's. Capturable in a CUDA Graph.
void multiTensorAdamwUpdate(const Context &ctx, const std::vector<TensorView> &grads,
                            const TensorView &step, const TensorView &lr,
                            const TensorView &gradNorm, const cpu::AdamWHyper &hyper,
                            const std::vector<TensorView> &params,
                            const std::vector<TensorView> &m, const std::vector<TensorView> &v,
                            const std::vector<TensorView> &masters);
/// SGD of every parameter in one launch, as multiTensorAdamwUpdate.
void multiTensorSgdUpdate(const Context &ctx, const std::vector<TensorView> &grads,
                          const TensorView &lr, const TensorView &gradNorm,
                          const cpu::SGDHyper &hyper, const std::vector<TensorView> &params,
                          const std::vector<TensorView> &momentum,
                          const std::vector<TensorView> &masters);
/// linear + tanh GELU as one cuBLASLt GEMM with the GELU_AUX(_BIAS) epilogue: pre = x wᵀ + b
/// and y = gelu(fp32 pre) rounded once each (the CPU computes y from the rounded pre: equal
/// for f32, within one rounding for bf16/f16).
void linearGelu(const Context &ctx, const TensorView &x, const TensorView &w,
                const TensorView *bias, const TensorView &y, const TensorView &pre);
/// y = addend + x wᵀ as one cuBLASLt GEMM with beta = 1 and the addend as C: the product and
/// the sum in fp32, rounded once (the CPU rounds the product first: equal for f32, within one
/// rounding for bf16/f16). y may be the addend's storage.
void linearAdd(const Context &ctx, const TensorView &x, const TensorView &w,
               const TensorView &addend, const TensorView &y);
/// acc += dyᵀ x as one cuBLASLt GEMM with beta = 1 (fp32 accumulation, one rounding into acc).
void linearGradWeightAccumulate(const Context &ctx, const TensorView &dy, const TensorView &x,
                                const TensorView &acc);

// LoRA / DoRA (docs/lora.md).
void doraScale(const Context &ctx, const TensorView &m, const TensorView &w, const TensorView &a,
               const TensorView &b, double scale, const TensorView &y);
/// cpu::doraGrad's dx and dm: one pass over dy and y writing dx and fp32 partial column sums of
/// dy · y per chunk of rows, then the chunks added in a fixed order and divided by m (no
/// atomics). A zero m[o] is recorded as a device error (kZeroMagnitude) and dm[o] left at 0.
void doraGrad(const Context &ctx, const TensorView &dy, const TensorView &y,
              const TensorView &scale, const TensorView &m, const TensorView &dx,
              const TensorView &dm);

//===----------------------------------------------------------------------===//
// Fused kernels (bonsai-fuse; docs/fusion.md): the CPU kernels of the same names say what
// each computes.
//===----------------------------------------------------------------------===//

void linearCrossEntropy(const Context &ctx, const TensorView &x, const TensorView &w,
                        const TensorView &labels, const TensorView &dloss, int64_t ignoreIndex,
                        int64_t chunkRows, const TensorView &loss, const TensorView &dx,
                        const TensorView &workspace, const TensorView *dw);
void addRmsNorm(const Context &ctx, const TensorView &lhs, const TensorView &rhs,
                const TensorView &w, double eps, const TensorView &sum, const TensorView &y);
void addLayerNorm(const Context &ctx, const TensorView &lhs, const TensorView &rhs,
                  const TensorView &w, const TensorView &b, double eps, const TensorView &sum,
                  const TensorView &y);
void rmsNormGradAdd(const Context &ctx, const TensorView &dy, const TensorView &x,
                    const TensorView &w, const TensorView &addend, double eps,
                    const TensorView &dx, const TensorView &dw);
void layerNormGradAdd(const Context &ctx, const TensorView &dy, const TensorView &x,
                      const TensorView &w, const TensorView &addend, double eps,
                      const TensorView &dx, const TensorView &dw, const TensorView &db);

// Generated kernels (docs/fusion.md, "Generated elementwise kernels").

/// The generated kernels of a plan, loaded once when the plan is: the driver JIT-compiles each
/// kernel's PTX for the current device (cudaLibraryLoadData). A kernel without PTX (a plan
/// compiled for the CPU) runs its program on a device interpreter instead. Launches are
/// ordinary kernel launches on the context's stream, so they are captured into CUDA Graphs
/// like any other.
class GeneratedKernels {
public:
  /// Loads every kernel; throws rt::Error naming the kernel whose PTX the driver rejects
  /// (with the JIT's log), or whose program, without PTX, exceeds the interpreter's limits.
  explicit GeneratedKernels(const std::vector<GeneratedKernelInfo> &kernels);
  ~GeneratedKernels();
  GeneratedKernels(const GeneratedKernels &) = delete;
  GeneratedKernels &operator=(const GeneratedKernels &) = delete;

  /// Runs kernel `index` over the outputs' elements (one thread per element, grid-stride):
  /// its parameters are the inputs' and outputs' device pointers and the element count.
  void launch(const Context &ctx, size_t index, const std::vector<const TensorView *> &inputs,
              const std::vector<const TensorView *> &outputs) const;

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The non-finite guard (docs/training.md, "Non-finite steps").

/// The guard's device scalars: the limit the host writes before a step and the verdict.
struct GuardState {
  int32_t verdict; ///< an UpdateVerdict: 0 ran, 1 a non-finite norm, 2 the norm over the limit
  float normLimit; ///< the global gradient norm's limit (+inf: none)
};

/// One thread: state->verdict = 1 when any of the `count` f32 scalars `norms[i]` (a device
/// array of device pointers) is not finite, else 2 when `norms[limitedNorm]` (limitedNorm >= 0)
/// exceeds state->normLimit, else 0; with `setHandle`, also sets the conditional graph node
/// handle `handle` (a cudaGraphConditionalHandle) to 1 when the verdict is 0, so that the
/// node's body (the guarded update) runs, and to 0 otherwise.
void guardCheck(const float *const *norms, int count, int limitedNorm, GuardState *state,
                unsigned long long handle, bool setHandle, CUstream_st *stream);

// The offload telemetry (docs/offload.md, "Telemetry").

/// One thread writes the GPU's global timer (nanoseconds, one clock for all streams) into
/// `*slot` when `stream` reaches it: in stream order, in a CUDA Graph (a conditional body
/// included) as on a plain stream.
void stampTime(unsigned long long *slot, CUstream_st *stream);

} // namespace bonsai::rt::cuda

#endif // BONSAI_RUNTIME_CUDAKERNELS_H
