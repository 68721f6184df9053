//===- Optimizer.cu - grad_norm, learning_rate, adamw/sgd steps on CUDA ----===//
//
// The kernels of a training step's Update phase. grad_norm is multi-tensor and two-stage: the
// gradients are cut into fixed pieces of kPiece elements, one block per piece (up to kSetSize
// tensors per launch, their descriptors passed by value) sums its squares, and one block adds
// the pieces' sums in fp64 in piece order, so the norm is the same on every run.
// learning_rate and step_increment are single-thread kernels on device scalars. adamw_update
// and sgd_update are grid-stride elementwise kernels (16-byte accesses when every operand is
// aligned) reading the step, the learning rate and the gradient norm from device memory; each
// block derives the step's scalars (bias corrections, clipping factor) once in fp64, then every
// element is updated in fp32 and rounded once into each tensor written. Semantics are the CPU
// kernels' (PyTorch's AdamW and SGD with global-norm clipping).
//
// The multi-tensor forms (the `optimizer` fusion family) update every parameter of a plan in
// one launch: a table of the tensors' pointers, sizes and first chunks goes to the kernel by
// value (CUDA 12.1+ kernel parameters up to 32 KB on sm_70+, so a CUDA Graph captures it with
// the launch and nothing is copied to the device), each block takes fixed chunks of
// kMultiChunk elements, finds its tensor by binary search over the table and applies the same
// __device__ element update as the per-tensor kernel: results are bitwise the per-tensor
// kernel's, whatever the vector width of either.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"

#include "CudaCheck.h"
#include "DeviceUtil.cuh"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {

constexpr int kThreads = 256;
/// Elements per piece of grad_norm's first stage.
constexpr int64_t kPiece = 16384;
/// Tensors per launch of grad_norm's first stage (keeps the parameters under 4 KB).
constexpr int kSetSize = 96;
/// What PyTorch's clip_grad_norm_ adds to the norm before dividing by it.
constexpr double kClipEpsilon = 1e-6;

struct TensorSet {
  int count;
  const void *ptr[kSetSize];
  int64_t numel[kSetSize];
  int64_t firstPiece[kSetSize + 1]; ///< pieces before each tensor, within the set
  DType dtype[kSetSize];
};

template <typename T> __device__ float sumSquares(const T *p, int64_t count) {
  float sum = 0.0f;
  forRow<kVec<T>>(p, count, threadIdx.x, blockDim.x, [&](int64_t i, auto width) {
    constexpr int N = decltype(width)::value;
    float v[N];
    loadF<N>(p + i, v);
#pragma unroll
    for (int e = 0; e < N; ++e)
      sum += v[e] * v[e];
  });
  return sum;
}

/// partial[pieceBase + piece] = the sum of squares of one piece (fp32 within the block).
__global__ void __launch_bounds__(kThreads)
    squaresKernel(TensorSet set, int64_t pieceBase, double *partial) {
  __shared__ float scratch[32];
  int64_t piece = blockIdx.x;
  int lo = 0, hi = set.count - 1;
  while (lo < hi) { // the last tensor whose first piece is not after this one
    int mid = (lo + hi + 1) / 2;
    if (set.firstPiece[mid] <= piece)
      lo = mid;
    else
      hi = mid - 1;
  }
  int64_t offset = (piece - set.firstPiece[lo]) * kPiece;
  int64_t count = set.numel[lo] - offset < kPiece ? set.numel[lo] - offset : kPiece;
  float sum;
  switch (set.dtype[lo]) {
  case DType::F16:
    sum = sumSquares(static_cast<const __half *>(set.ptr[lo]) + offset, count);
    break;
  case DType::BF16:
    sum = sumSquares(static_cast<const __nv_bfloat16 *>(set.ptr[lo]) + offset, count);
    break;
  default:
    sum = sumSquares(static_cast<const float *>(set.ptr[lo]) + offset, count);
    break;
  }
  sum = rowReduce(sum, scratch, SumOp{});
  if (threadIdx.x == 0)
    partial[pieceBase + piece] = double(sum);
}

/// norm = sqrt(sum of the partials), added in fp64 in a fixed order by one block.
__global__ void normFinishKernel(const double *partial, int64_t pieces, void *norm,
                                 DType normType) {
  __shared__ double sums[1024];
  double sum = 0.0;
  for (int64_t p = threadIdx.x; p < pieces; p += blockDim.x)
    sum += partial[p];
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half)
      sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    storeScalar(norm, normType, float(sqrt(sums[0])));
}

__global__ void learningRateKernel(const int64_t *step, cpu::LearningRateSchedule schedule,
                                   void *lr, DType lrType) {
  // The update about to run is the t-th: the counter holds the updates already done.
  double t = double(*step) + 1.0, value;
  int64_t warmup = schedule.warmupSteps, total = schedule.totalSteps;
  if (warmup > 0 && t <= double(warmup)) {
    value = schedule.lr * t / double(warmup);
  } else if (!schedule.cosine) {
    value = schedule.lr;
  } else {
    double progress = fmin(1.0, (t - double(warmup)) / double(total - warmup));
    double r = schedule.minLrRatio;
    const double pi = 3.14159265358979323846;
    value = schedule.lr * (r + (1.0 - r) * 0.5 * (1.0 + cos(pi * progress)));
  }
  storeScalar(lr, lrType, float(value));
}

__global__ void stepIncrementKernel(int64_t *step) { *step += 1; }

/// The scalars of one optimizer step, derived once per block from the device scalars.
struct StepScalars {
  float clip, decay, stepSize, bc2Sqrt;
};

struct AdamWArgs {
  const int64_t *step;
  const void *lr, *gradNorm;
  DType lrType, normType;
  double beta1, beta2, eps, weightDecay, gradClip;
};

__device__ __forceinline__ double clipCoefficient(double gradClip, double norm) {
  if (!(gradClip > 0.0))
    return 1.0;
  return fmin(1.0, gradClip / (norm + kClipEpsilon));
}

/// The step's AdamW scalars, derived in fp64 from the device scalars.
__device__ StepScalars adamwScalars(const AdamWArgs &a) {
  StepScalars sc;
  double t = double(*a.step) + 1.0;
  double rate = double(loadScalar(a.lr, a.lrType));
  sc.clip = float(clipCoefficient(a.gradClip, double(loadScalar(a.gradNorm, a.normType))));
  sc.decay = float(1.0 - rate * a.weightDecay);
  sc.stepSize = float(rate / (1.0 - pow(a.beta1, t)));
  sc.bc2Sqrt = float(sqrt(1.0 - pow(a.beta2, t)));
  return sc;
}

/// AdamW on N elements at `i` of one parameter: the one element formula of both the
/// per-tensor and the multi-tensor kernel.
template <int N, typename G, typename P>
__device__ __forceinline__ void adamwElements(const G *grad, P *param, float *m, float *v,
                                              float *master, int64_t i, const StepScalars &s,
                                              const AdamWArgs &a) {
  const float b1 = float(a.beta1), b2 = float(a.beta2), eps = float(a.eps);
  const float c1 = float(1.0 - a.beta1), c2 = float(1.0 - a.beta2);
  float g[N], p[N], mi[N], vi[N];
  loadF<N>(grad + i, g);
  if (master)
    loadF<N>(master + i, p);
  else
    loadF<N>(param + i, p);
  loadF<N>(m + i, mi);
  loadF<N>(v + i, vi);
  // Every product and sum is rounded on its own (__fmul_rn, __fadd_rn are never contracted
  // into FMAs): nvcc would otherwise contract each instantiation of this function as it sees
  // fit, and the per-tensor and multi-tensor kernels would round differently.
#pragma unroll
  for (int e = 0; e < N; ++e) {
    float gi = __fmul_rn(g[e], s.clip);
    mi[e] = __fadd_rn(__fmul_rn(b1, mi[e]), __fmul_rn(c1, gi));
    vi[e] = __fadd_rn(__fmul_rn(b2, vi[e]), __fmul_rn(__fmul_rn(c2, gi), gi));
    // Decoupled weight decay first, then the Adam step, as PyTorch orders them.
    float denom = __fadd_rn(sqrtf(vi[e]) / s.bc2Sqrt, eps);
    p[e] = __fsub_rn(__fmul_rn(p[e], s.decay), __fmul_rn(s.stepSize, mi[e]) / denom);
  }
  storeF<N>(m + i, mi);
  storeF<N>(v + i, vi);
  if (master)
    storeF<N>(master + i, p);
  storeF<N>(param + i, p);
}

template <typename G, typename P, int VW>
__global__ void __launch_bounds__(kThreads)
    adamwKernel(const G *grad, P *param, float *m, float *v, float *master, int64_t n,
                AdamWArgs a) {
  // Every thread derives the step's scalars (a few fp64 operations on three broadcast loads):
  // no shared copy, so no barrier after a thread-0 branch.
  const StepScalars s = adamwScalars(a);
  auto update = [&](int64_t i, auto width) {
    constexpr int N = decltype(width)::value;
    adamwElements<N>(grad, param, m, v, master, i, s, a);
  };
  const int64_t vectors = n / VW;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors;
       i += int64_t(gridDim.x) * blockDim.x)
    update(i * VW, Width<VW>{});
  int64_t i = vectors * VW + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (blockIdx.x == 0 && i < n)
    update(i, Width<1>{});
}

struct SGDArgs {
  const void *lr, *gradNorm;
  DType lrType, normType;
  double momentum, weightDecay, gradClip;
};

/// SGD on N elements at `i` of one parameter (clip and rate: the step's scalars): the one
/// element formula of both the per-tensor and the multi-tensor kernel.
template <int N, typename G, typename P>
__device__ __forceinline__ void sgdElements(const G *grad, P *param, float *buf, float *master,
                                            int64_t i, float clip, float rate,
                                            const SGDArgs &a) {
  const float wd = float(a.weightDecay), mom = float(a.momentum);
  const bool useMomentum = a.momentum != 0.0;
  float g[N], p[N], b[N];
  loadF<N>(grad + i, g);
  if (master)
    loadF<N>(master + i, p);
  else
    loadF<N>(param + i, p);
  // Without momentum the buffer is not read: it may hold anything.
  if (useMomentum)
    loadF<N>(buf + i, b);
#pragma unroll
  for (int e = 0; e < N; ++e) { // rounded op by op, as adamwElements says why
    float gi = __fadd_rn(__fmul_rn(g[e], clip), __fmul_rn(wd, p[e]));
    b[e] = useMomentum ? __fadd_rn(__fmul_rn(mom, b[e]), gi) : gi;
    p[e] = __fsub_rn(p[e], __fmul_rn(rate, b[e]));
  }
  storeF<N>(buf + i, b);
  if (master)
    storeF<N>(master + i, p);
  storeF<N>(param + i, p);
}

template <typename G, typename P, int VW>
__global__ void __launch_bounds__(kThreads)
    sgdKernel(const G *grad, P *param, float *buf, float *master, int64_t n, SGDArgs a) {
  // Every thread derives the step's scalars, as in the AdamW kernels.
  const float clip = float(clipCoefficient(a.gradClip, double(loadScalar(a.gradNorm, a.normType))));
  const float rate = loadScalar(a.lr, a.lrType);
  auto update = [&](int64_t i, auto width) {
    constexpr int N = decltype(width)::value;
    sgdElements<N>(grad, param, buf, master, i, clip, rate, a);
  };
  const int64_t vectors = n / VW;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors;
       i += int64_t(gridDim.x) * blockDim.x)
    update(i * VW, Width<VW>{});
  int64_t i = vectors * VW + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (blockIdx.x == 0 && i < n)
    update(i, Width<1>{});
}

/// Elements per chunk of the multi-tensor kernels (a multiple of every vector width, so a
/// chunk of an aligned tensor starts aligned).
constexpr int64_t kMultiChunk = 8192;
/// Tensors per launch of the multi-tensor kernels: the table below stays under 30 KB of
/// kernel parameters (the limit is 32764 bytes since CUDA 12.1 on sm_70+).
constexpr int kMultiMax = 512;

/// The tensors of one multi-tensor launch. ptr[0] are the gradients, ptr[1] the parameters,
/// then the f32 states and last the masters (null without). Tensor t has chunks
/// [firstChunk[t], firstChunk[t + 1]); `vector` says whether all its pointers are 16-byte
/// aligned.
template <int Lists> struct MultiTensorTable {
  int count;
  int64_t firstChunk[kMultiMax + 1];
  int64_t numel[kMultiMax];
  void *ptr[Lists][kMultiMax];
  bool vector[kMultiMax];
};
static_assert(sizeof(MultiTensorTable<5>) + sizeof(AdamWArgs) < 32000,
              "the multi-tensor table must fit CUDA's kernel parameter limit");

/// The tensor that chunk `chunk` belongs to: the last whose first chunk is not after it.
template <int Lists>
__device__ __forceinline__ int tensorOfChunk(const MultiTensorTable<Lists> &table,
                                             int64_t chunk) {
  int lo = 0, hi = table.count - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (table.firstChunk[mid] <= chunk)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

/// Calls f(t, offset, i, Width) over the chunks of a table, block by block: the elements
/// [offset, offset + count) of tensor t in vectors of 4 where the tensor is aligned (and
/// singly after the last whole vector), else one by one.
template <int Lists, typename F>
__device__ __forceinline__ void forMultiTensorChunks(const MultiTensorTable<Lists> &table,
                                                     F &&f) {
  const int64_t chunks = table.firstChunk[table.count];
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    int t = tensorOfChunk(table, chunk);
    int64_t offset = (chunk - table.firstChunk[t]) * kMultiChunk;
    int64_t count = min(kMultiChunk, table.numel[t] - offset);
    if (table.vector[t]) {
      int64_t vectors = count / 4;
      for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x)
        f(t, offset + v * 4, Width<4>{});
      for (int64_t i = vectors * 4 + threadIdx.x; i < count; i += blockDim.x)
        f(t, offset + i, Width<1>{});
    } else {
      for (int64_t i = threadIdx.x; i < count; i += blockDim.x)
        f(t, offset + i, Width<1>{});
    }
  }
}

template <typename G, typename P>
__global__ void __launch_bounds__(kThreads)
    multiAdamwKernel(const MultiTensorTable<5> table, AdamWArgs a) {
  // Every thread derives the step's scalars (a few fp64 operations on three broadcast loads):
  // no shared copy, so no barrier after a thread-0 branch.
  const StepScalars s = adamwScalars(a);
  forMultiTensorChunks(table, [&](int t, int64_t i, auto width) {
    constexpr int N = decltype(width)::value;
    adamwElements<N>(static_cast<const G *>(table.ptr[0][t]), static_cast<P *>(table.ptr[1][t]),
                     static_cast<float *>(table.ptr[2][t]), static_cast<float *>(table.ptr[3][t]),
                     static_cast<float *>(table.ptr[4][t]), i, s, a);
  });
}

template <typename G, typename P>
__global__ void __launch_bounds__(kThreads)
    multiSgdKernel(const MultiTensorTable<4> table, SGDArgs a) {
  // Every thread derives the step's scalars, as in the AdamW kernels.
  const float clip = float(clipCoefficient(a.gradClip, double(loadScalar(a.gradNorm, a.normType))));
  const float rate = loadScalar(a.lr, a.lrType);
  forMultiTensorChunks(table, [&](int t, int64_t i, auto width) {
    constexpr int N = decltype(width)::value;
    sgdElements<N>(static_cast<const G *>(table.ptr[0][t]), static_cast<P *>(table.ptr[1][t]),
                   static_cast<float *>(table.ptr[2][t]), static_cast<float *>(table.ptr[3][t]),
                   i, clip, rate, a);
  });
}

/// Fills tables of at most kMultiMax tensors from per-tensor pointer lists (lists[l][t]; the
/// last list may be empty: no masters) and calls launch(table) for each.
template <int Lists, typename Launch>
void forEachTable(const std::vector<const TensorView *> (&lists)[Lists], Launch &&launch) {
  size_t n = lists[0].size();
  // Large tables live on the heap: the host stack need not hold 30 KB.
  auto table = std::make_unique<MultiTensorTable<Lists>>();
  auto flush = [&]() {
    if (table->count > 0 && table->firstChunk[table->count] > 0)
      launch(*table);
    *table = MultiTensorTable<Lists>{};
  };
  *table = MultiTensorTable<Lists>{};
  for (size_t t = 0; t < n; ++t) {
    int64_t numel = lists[1][t]->numel();
    if (numel == 0)
      continue;
    int c = table->count;
    bool vector = true;
    for (int l = 0; l < Lists; ++l) {
      void *p = lists[l].empty() ? nullptr : lists[l][t]->data;
      table->ptr[l][c] = p;
      vector = vector && (!p || aligned16(p));
    }
    table->numel[c] = numel;
    table->vector[c] = vector;
    table->firstChunk[c + 1] = table->firstChunk[c] + (numel + kMultiChunk - 1) / kMultiChunk;
    if (++table->count == kMultiMax)
      flush();
  }
  flush();
}

/// Checks that optimizer state `t` is f32 and shaped like `param`.
void checkState(const char *kernel, const char *operand, const TensorView &t,
                const TensorView &param) {
  checkView(kernel, operand, t);
  if (t.dtype != DType::F32)
    fail(kernel, std::string(operand) + " must be f32, not " + dtypeName(t.dtype));
  checkSameShape(kernel, operand, t, "param", param);
}

/// Checks that the tensors an in-place update writes are disjoint from each other and from what
/// it reads (the update reads and writes each element in one thread, but distinct tensors
/// sharing bytes would be read after another tensor's write).
void checkDisjoint(const char *kernel,
                   std::initializer_list<std::pair<const char *, const TensorView *>> ts) {
  for (auto i = ts.begin(); i != ts.end(); ++i)
    for (auto j = i + 1; j != ts.end(); ++j)
      if (i->second && j->second && overlaps(*i->second, *j->second))
        fail(kernel, std::string(i->first) + " and " + j->first + " overlap");
}

/// Calls f(G{}, P{}) for the storage types of grad and param.
template <typename F> void dispatchPair(DType g, DType p, F &&f) {
  dispatchFloat(g, [&](auto gTag) { dispatchFloat(p, [&](auto pTag) { f(gTag, pTag); }); });
}

/// Checks the lists of a multi-tensor update as the per-tensor kernel checks one tensor (names
/// indexed: "param[3]"), that all gradients share a dtype and all parameters another, and that
/// no tensor written overlaps another operand.
void checkMultiTensor(const char *k, size_t n,
                      const std::vector<std::pair<std::string, const std::vector<TensorView> *>>
                          &states,
                      const std::vector<TensorView> &grads, const std::vector<TensorView> &params,
                      const std::vector<TensorView> &masters,
                      std::initializer_list<std::pair<const char *, const TensorView *>> scalars) {
  if (n == 0)
    fail(k, "needs at least one gradient");
  if (params.size() != n)
    fail(k, std::to_string(n) + " gradients but " + std::to_string(params.size()) + " params");
  for (const auto &[name, list] : states)
    if (list->size() != n)
      fail(k, std::to_string(n) + " gradients but " + std::to_string(list->size()) + " " + name);
  if (!masters.empty() && masters.size() != n)
    fail(k, std::to_string(n) + " gradients but " + std::to_string(masters.size()) +
                " masters (expected none or one per parameter)");
  auto indexed = [](const std::string &name, size_t i) {
    return name + "[" + std::to_string(i) + "]";
  };
  std::vector<std::pair<std::string, const TensorView *>> written;
  for (size_t i = 0; i < n; ++i) {
    std::string g = indexed("grad", i), p = indexed("param", i);
    checkFloat(k, g.c_str(), grads[i]);
    checkFloat(k, p.c_str(), params[i]);
    checkSameShape(k, g.c_str(), grads[i], p.c_str(), params[i]);
    if (grads[i].dtype != grads[0].dtype || params[i].dtype != params[0].dtype)
      fail(k, "tensor " + std::to_string(i) + " stores " + dtypeName(grads[i].dtype) + " / " +
                  dtypeName(params[i].dtype) + ", tensor 0 " + dtypeName(grads[0].dtype) + " / " +
                  dtypeName(params[0].dtype) + " (gradient / parameter): one launch has one of each");
    written.emplace_back(p, &params[i]);
    for (const auto &[name, list] : states) {
      std::string s = indexed(name, i);
      checkState(k, s.c_str(), (*list)[i], params[i]);
      written.emplace_back(s, &(*list)[i]);
    }
    if (!masters.empty()) {
      std::string m = indexed("master", i);
      checkState(k, m.c_str(), masters[i], params[i]);
      written.emplace_back(m, &masters[i]);
    }
  }
  // Every written tensor is disjoint from every other operand; read-only operands may share
  // bytes. One sweep over the tensors sorted by address: a tensor overlaps an earlier one iff
  // it starts before the furthest end of the earlier ones.
  struct Range {
    std::string name;
    const char *begin, *end;
    bool written;
  };
  std::vector<Range> ranges;
  auto add = [&](const std::string &name, const TensorView &t, bool isWritten) {
    if (t.bytes() == 0)
      return;
    const char *b = static_cast<const char *>(t.data);
    ranges.push_back({name, b, b + t.bytes(), isWritten});
  };
  for (const auto &[name, t] : written)
    add(name, *t, true);
  for (size_t i = 0; i < n; ++i)
    add(indexed("grad", i), grads[i], false);
  for (const auto &[name, t] : scalars)
    add(name, *t, false);
  std::sort(ranges.begin(), ranges.end(),
            [](const Range &a, const Range &b) { return a.begin < b.begin; });
  const Range *furthest = nullptr, *furthestWritten = nullptr;
  for (const Range &r : ranges) {
    const Range *hit = r.written ? furthest : furthestWritten;
    if (hit && r.begin < hit->end)
      fail(k, hit->name + " and " + r.name + " overlap");
    if (!furthest || r.end > furthest->end)
      furthest = &r;
    if (r.written && (!furthestWritten || r.end > furthestWritten->end))
      furthestWritten = &r;
  }
}

} // namespace

void gradNorm(const Context &ctx, const std::vector<TensorView> &grads, const TensorView &norm) {
  const char *k = "grad_norm";
  for (size_t i = 0; i < grads.size(); ++i)
    checkFloat(k, ("grads[" + std::to_string(i) + "]").c_str(), grads[i]);
  checkScalar(k, "norm", norm);
  int64_t pieces = 0;
  for (const TensorView &g : grads)
    pieces += (g.numel() + kPiece - 1) / kPiece;
  Scratch partial(k, ctx.stream, size_t(std::max<int64_t>(pieces, 1)) * sizeof(double));
  // The norm is written last: it may alias a gradient.
  int64_t base = 0;
  TensorSet set{};
  auto flush = [&]() {
    int64_t setPieces = set.firstPiece[set.count];
    if (setPieces > 0) {
      squaresKernel<<<unsigned(setPieces), kThreads, 0, ctx.stream>>>(set, base,
                                                                      partial.as<double>());
      checkLaunch(k, "squaresKernel");
    }
    base += setPieces;
    set = TensorSet{};
  };
  for (const TensorView &g : grads) {
    int64_t n = g.numel();
    if (n == 0)
      continue;
    set.ptr[set.count] = g.data;
    set.numel[set.count] = n;
    set.dtype[set.count] = g.dtype;
    set.firstPiece[set.count + 1] = set.firstPiece[set.count] + (n + kPiece - 1) / kPiece;
    if (++set.count == kSetSize)
      flush();
  }
  if (set.count > 0)
    flush();
  normFinishKernel<<<1, 1024, 0, ctx.stream>>>(partial.as<double>(), pieces, norm.data,
                                               norm.dtype);
  checkLaunch(k, "normFinishKernel");
}

void learningRate(const Context &ctx, const TensorView &step,
                  const cpu::LearningRateSchedule &schedule, const TensorView &lr) {
  const char *k = "learning_rate";
  checkStep(k, step);
  checkScalar(k, "lr", lr);
  if (schedule.warmupSteps < 0)
    fail(k, "warmup_steps " + std::to_string(schedule.warmupSteps) + " is negative");
  if (schedule.cosine && schedule.totalSteps <= schedule.warmupSteps)
    fail(k, "total_steps " + std::to_string(schedule.totalSteps) +
                " of a cosine schedule is not above warmup_steps " +
                std::to_string(schedule.warmupSteps));
  learningRateKernel<<<1, 1, 0, ctx.stream>>>(static_cast<const int64_t *>(step.data), schedule,
                                              lr.data, lr.dtype);
  checkLaunch(k, "learningRateKernel");
}

void adamwUpdate(const Context &ctx, const TensorView &grad, const TensorView &step,
                 const TensorView &lr, const TensorView &gradNormT, const cpu::AdamWHyper &hyper,
                 const TensorView &param, const TensorView &m, const TensorView &v,
                 const TensorView *master) {
  const char *k = "adamw_update";
  checkFloat(k, "grad", grad);
  checkFloat(k, "param", param);
  checkSameShape(k, "grad", grad, "param", param);
  checkState(k, "m", m, param);
  checkState(k, "v", v, param);
  if (master)
    checkState(k, "master", *master, param);
  checkStep(k, step);
  checkScalar(k, "lr", lr);
  checkScalar(k, "grad_norm", gradNormT);
  if (!(hyper.beta1 >= 0.0 && hyper.beta1 < 1.0 && hyper.beta2 >= 0.0 && hyper.beta2 < 1.0))
    fail(k, "betas (" + std::to_string(hyper.beta1) + ", " + std::to_string(hyper.beta2) +
                ") are not in [0, 1)");
  checkDisjoint(k, {{"grad", &grad}, {"param", &param}, {"m", &m}, {"v", &v}, {"master", master},
                    {"lr", &lr}, {"grad_norm", &gradNormT}, {"step", &step}});
  int64_t n = param.numel();
  if (n == 0)
    return;
  AdamWArgs a{static_cast<const int64_t *>(step.data), lr.data, gradNormT.data, lr.dtype,
              gradNormT.dtype, hyper.beta1, hyper.beta2, hyper.eps, hyper.weightDecay,
              hyper.gradClip};
  float *mp = static_cast<float *>(m.data), *vp = static_cast<float *>(v.data);
  float *masterp = master ? static_cast<float *>(master->data) : nullptr;
  bool vector = aligned16(grad.data) && aligned16(param.data) && aligned16(mp) &&
                aligned16(vp) && (!masterp || aligned16(masterp));
  dispatchPair(grad.dtype, param.dtype, [&](auto gTag, auto pTag) {
    using G = decltype(gTag);
    using P = decltype(pTag);
    auto gp = static_cast<const G *>(grad.data);
    auto pp = static_cast<P *>(param.data);
    if (vector)
      adamwKernel<G, P, 4><<<gridFor(k, std::max<int64_t>(n / 4, 1), kThreads), kThreads, 0,
                             ctx.stream>>>(gp, pp, mp, vp, masterp, n, a);
    else
      adamwKernel<G, P, 1><<<gridFor(k, n, kThreads), kThreads, 0, ctx.stream>>>(
          gp, pp, mp, vp, masterp, n, a);
    checkLaunch(k, "adamwKernel");
  });
}

void sgdUpdate(const Context &ctx, const TensorView &grad, const TensorView &lr,
               const TensorView &gradNormT, const cpu::SGDHyper &hyper, const TensorView &param,
               const TensorView &momentum, const TensorView *master) {
  const char *k = "sgd_update";
  checkFloat(k, "grad", grad);
  checkFloat(k, "param", param);
  checkSameShape(k, "grad", grad, "param", param);
  checkState(k, "momentum", momentum, param);
  if (master)
    checkState(k, "master", *master, param);
  checkScalar(k, "lr", lr);
  checkScalar(k, "grad_norm", gradNormT);
  checkDisjoint(k, {{"grad", &grad}, {"param", &param}, {"momentum", &momentum},
                    {"master", master}, {"lr", &lr}, {"grad_norm", &gradNormT}});
  int64_t n = param.numel();
  if (n == 0)
    return;
  SGDArgs a{lr.data, gradNormT.data, lr.dtype, gradNormT.dtype, hyper.momentum,
            hyper.weightDecay, hyper.gradClip};
  float *bp = static_cast<float *>(momentum.data);
  float *masterp = master ? static_cast<float *>(master->data) : nullptr;
  bool vector = aligned16(grad.data) && aligned16(param.data) && aligned16(bp) &&
                (!masterp || aligned16(masterp));
  dispatchPair(grad.dtype, param.dtype, [&](auto gTag, auto pTag) {
    using G = decltype(gTag);
    using P = decltype(pTag);
    auto gp = static_cast<const G *>(grad.data);
    auto pp = static_cast<P *>(param.data);
    if (vector)
      sgdKernel<G, P, 4><<<gridFor(k, std::max<int64_t>(n / 4, 1), kThreads), kThreads, 0,
                           ctx.stream>>>(gp, pp, bp, masterp, n, a);
    else
      sgdKernel<G, P, 1>
          <<<gridFor(k, n, kThreads), kThreads, 0, ctx.stream>>>(gp, pp, bp, masterp, n, a);
    checkLaunch(k, "sgdKernel");
  });
}

void stepIncrement(const Context &ctx, const TensorView &step) {
  const char *k = "step_increment";
  checkStep(k, step);
  stepIncrementKernel<<<1, 1, 0, ctx.stream>>>(static_cast<int64_t *>(step.data));
  checkLaunch(k, "stepIncrementKernel");
}

} // namespace bonsai::rt::cuda

namespace bonsai::rt::cuda {

void multiTensorAdamwUpdate(const Context &ctx, const std::vector<TensorView> &grads,
                            const TensorView &step, const TensorView &lr,
                            const TensorView &gradNormT, const cpu::AdamWHyper &hyper,
                            const std::vector<TensorView> &params,
                            const std::vector<TensorView> &m, const std::vector<TensorView> &v,
                            const std::vector<TensorView> &masters) {
  const char *k = "multi_tensor_adamw_update";
  size_t n = grads.size();
  checkMultiTensor(k, n, {{"m", &m}, {"v", &v}}, grads, params, masters,
                   {{"step", &step}, {"lr", &lr}, {"grad_norm", &gradNormT}});
  checkStep(k, step);
  checkScalar(k, "lr", lr);
  checkScalar(k, "grad_norm", gradNormT);
  if (!(hyper.beta1 >= 0.0 && hyper.beta1 < 1.0 && hyper.beta2 >= 0.0 && hyper.beta2 < 1.0))
    fail(k, "betas (" + std::to_string(hyper.beta1) + ", " + std::to_string(hyper.beta2) +
                ") are not in [0, 1)");
  AdamWArgs a{static_cast<const int64_t *>(step.data), lr.data, gradNormT.data, lr.dtype,
              gradNormT.dtype, hyper.beta1, hyper.beta2, hyper.eps, hyper.weightDecay,
              hyper.gradClip};
  std::vector<const TensorView *> lists[5];
  for (size_t i = 0; i < n; ++i) {
    lists[0].push_back(&grads[i]);
    lists[1].push_back(&params[i]);
    lists[2].push_back(&m[i]);
    lists[3].push_back(&v[i]);
    if (!masters.empty())
      lists[4].push_back(&masters[i]);
  }
  dispatchPair(grads[0].dtype, params[0].dtype, [&](auto gTag, auto pTag) {
    using G = decltype(gTag);
    using P = decltype(pTag);
    forEachTable(lists, [&](const MultiTensorTable<5> &table) {
      int64_t chunks = table.firstChunk[table.count];
      multiAdamwKernel<G, P><<<gridFor(k, chunks, 1), kThreads, 0, ctx.stream>>>(table, a);
      checkLaunch(k, "multiAdamwKernel");
    });
  });
}

void multiTensorSgdUpdate(const Context &ctx, const std::vector<TensorView> &grads,
                          const TensorView &lr, const TensorView &gradNormT,
                          const cpu::SGDHyper &hyper, const std::vector<TensorView> &params,
                          const std::vector<TensorView> &momentum,
                          const std::vector<TensorView> &masters) {
  const char *k = "multi_tensor_sgd_update";
  size_t n = grads.size();
  checkMultiTensor(k, n, {{"momentum", &momentum}}, grads, params, masters,
                   {{"lr", &lr}, {"grad_norm", &gradNormT}});
  checkScalar(k, "lr", lr);
  checkScalar(k, "grad_norm", gradNormT);
  SGDArgs a{lr.data, gradNormT.data, lr.dtype, gradNormT.dtype, hyper.momentum,
            hyper.weightDecay, hyper.gradClip};
  std::vector<const TensorView *> lists[4];
  for (size_t i = 0; i < n; ++i) {
    lists[0].push_back(&grads[i]);
    lists[1].push_back(&params[i]);
    lists[2].push_back(&momentum[i]);
    if (!masters.empty())
      lists[3].push_back(&masters[i]);
  }
  dispatchPair(grads[0].dtype, params[0].dtype, [&](auto gTag, auto pTag) {
    using G = decltype(gTag);
    using P = decltype(pTag);
    forEachTable(lists, [&](const MultiTensorTable<4> &table) {
      int64_t chunks = table.firstChunk[table.count];
      multiSgdKernel<G, P><<<gridFor(k, chunks, 1), kThreads, 0, ctx.stream>>>(table, a);
      checkLaunch(k, "multiSgdKernel");
    });
  });
}

} // namespace bonsai::rt::cuda
