//===- HostOptimizer.cpp - AdamW and SGD steps on host memory, the GPU's bits ===//
//
// Implements HostOptimizer.h. The element loops are plain fp32 C++ written operation for
// operation as runtime/cuda/Optimizer.cu's adamwElements and sgdElements; this file is compiled
// with -ffp-contract=off (no FMA contraction: the GPU kernels round every product and sum on its
// own with __fmul_rn/__fadd_rn) and -fno-math-errno (so that sqrtf is one vsqrtps, which is
// correctly rounded like the GPU's IEEE sqrtf, and the loops vectorise). Each loop is
// instantiated three times, for AVX-512, AVX2 and baseline x86-64, and the widest the CPU
// supports is picked once. The threads set the default SSE environment (round to nearest, no
// flush-to-zero, no denormals-are-zero) for the step, as the GPU kernels keep subnormals: a
// caller that runs with FTZ/DAZ (some BLAS and PyTorch settings) would otherwise get other bits.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/HostOptimizer.h"

#include "bonsai/runtime/HostThreads.h"

#include "OperandChecks.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>

#if defined(__x86_64__)
#include <xmmintrin.h>
#define BONSAI_HOST_X86 1
#endif

namespace bonsai::rt::host {

namespace {
BONSAI_BIND_OPERAND_CHECKS("host")
} // namespace

//===----------------------------------------------------------------------===//
// ThreadPool
//===----------------------------------------------------------------------===//

struct ThreadPool::Impl {
  std::mutex mutex;
  std::condition_variable wake, finished;
  const std::function<void(int)> *task = nullptr;
  uint64_t generation = 0; ///< bumped by every run; a worker runs each generation once
  int pending = 0;         ///< workers (not the caller) still running this generation
  bool stop = false;
  std::vector<std::exception_ptr> errors;
  std::vector<std::thread> threads;

  void work(int worker) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)> *fn;
      {
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait(lock, [&] { return stop || generation != seen; });
        if (stop)
          return;
        seen = generation;
        fn = task;
      }
      std::exception_ptr error;
      try {
        (*fn)(worker);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex);
      errors[size_t(worker)] = error;
      if (--pending == 0)
        finished.notify_one();
    }
  }
};

ThreadPool::ThreadPool(int threads) : impl_(std::make_unique<Impl>()) {
  if (threads <= 0)
    threads = int(hostThreads());
  impl_->errors.resize(size_t(threads));
  impl_->threads.reserve(size_t(threads - 1));
  for (int w = 1; w < threads; ++w)
    impl_->threads.emplace_back([this, w] { impl_->work(w); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stop = true;
  }
  impl_->wake.notify_all();
  for (std::thread &t : impl_->threads)
    t.join();
}

int ThreadPool::size() const { return int(impl_->threads.size()) + 1; }

void ThreadPool::run(const std::function<void(int)> &fn) {
  Impl &p = *impl_;
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    p.task = &fn;
    p.pending = int(p.threads.size());
    std::fill(p.errors.begin(), p.errors.end(), nullptr);
    ++p.generation;
  }
  p.wake.notify_all();
  std::exception_ptr own;
  try {
    fn(0);
  } catch (...) {
    own = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(p.mutex);
  p.finished.wait(lock, [&] { return p.pending == 0; });
  p.errors[0] = own;
  for (std::exception_ptr &e : p.errors)
    if (e)
      std::rethrow_exception(e);
}

namespace {

//===----------------------------------------------------------------------===//
// Element loops
//===----------------------------------------------------------------------===//

/// What PyTorch's clip_grad_norm_ adds to the norm before dividing by it.
constexpr double kClipEpsilon = 1e-6;

/// Elements per work item: a multiple of every vector width (so that each item of an aligned
/// tensor starts aligned), large enough that taking an item costs nothing next to updating it.
constexpr int64_t kChunk = 1 << 16;

/// The storage of one element of a float dtype: float, or the bits of a 16-bit float.
template <DType D> using StorageOf = std::conditional_t<D == DType::F32, float, uint16_t>;

/// Element i of a float array as fp32 (exact). Inline and branch-free for bf16 so that the
/// loops vectorise; f16 takes Tensor.h's exact scalar conversion (rarely an optimizer's dtype).
template <DType D> inline float loadElement(const StorageOf<D> *p, int64_t i) {
  if constexpr (D == DType::F32) {
    return p[i];
  } else if constexpr (D == DType::BF16) {
    uint32_t u = uint32_t(p[i]) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  } else {
    return f16ToF32(p[i]);
  }
}

/// Stores x rounded to nearest even into element i (__float2bfloat16_rn, __float2half_rn on
/// the GPU; the same bits but for the payload of a NaN).
template <DType D> inline void storeElement(StorageOf<D> *p, int64_t i, float x) {
  if constexpr (D == DType::F32) {
    p[i] = x;
  } else if constexpr (D == DType::BF16) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    // No NaN test: every value stored comes out of an fp32 operation, and a NaN out of one is
    // quiet (bit 22 set), which rounding cannot carry into infinity.
    p[i] = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  } else {
    p[i] = f32ToF16(x);
  }
}

/// The fp32 constants of one AdamW step: the hyperparameters rounded as the CUDA kernel rounds
/// them (float(beta1), float(1 - beta1), ...) and the step's scalars.
struct AdamWConsts {
  float b1, b2, c1, c2, eps;
  AdamWScalars s;
};

/// adamwElements of runtime/cuda/Optimizer.cu on elements [0, n): the same fp32 operations in
/// the same order. __restrict: the step's check makes every written tensor disjoint from every
/// other operand, and without it the vectoriser would add overlap tests.
template <DType G, DType P, bool Master>
__attribute__((always_inline)) inline void adamwLoop(const void *gv, void *pv, float *__restrict m,
                                                     float *__restrict v, float *__restrict master,
                                                     int64_t n, const AdamWConsts &c) {
  const StorageOf<G> *__restrict g = static_cast<const StorageOf<G> *>(gv);
  StorageOf<P> *__restrict p = static_cast<StorageOf<P> *>(pv);
  const float b1 = c.b1, b2 = c.b2, c1 = c.c1, c2 = c.c2, eps = c.eps;
  const float clip = c.s.clip, decay = c.s.decay, stepSize = c.s.stepSize, bc2Sqrt = c.s.bc2Sqrt;
  for (int64_t i = 0; i < n; ++i) {
    float gi = loadElement<G>(g, i) * clip;
    float mi = b1 * m[i] + c1 * gi;
    float vi = b2 * v[i] + (c2 * gi) * gi;
    // Decoupled weight decay first, then the Adam step, as PyTorch orders them.
    float denom = std::sqrt(vi) / bc2Sqrt + eps;
    float x = Master ? master[i] : loadElement<P>(p, i);
    x = x * decay - (stepSize * mi) / denom;
    m[i] = mi;
    v[i] = vi;
    if (Master)
      master[i] = x;
    storeElement<P>(p, i, x);
  }
}

/// The fp32 constants of one SGD step, as the CUDA kernel's sgdElements rounds them.
struct SGDConsts {
  float clip, rate, weightDecay, momentum;
};

/// sgdElements of runtime/cuda/Optimizer.cu on elements [0, n). Without momentum the buffer
/// is not read but still written (with the gradient), as the CUDA kernel writes it.
template <DType G, DType P, bool Master, bool Momentum>
__attribute__((always_inline)) inline void sgdLoop(const void *gv, void *pv, float *__restrict buf,
                                                   float *__restrict master, int64_t n,
                                                   const SGDConsts &c) {
  const StorageOf<G> *__restrict g = static_cast<const StorageOf<G> *>(gv);
  StorageOf<P> *__restrict p = static_cast<StorageOf<P> *>(pv);
  const float clip = c.clip, rate = c.rate, wd = c.weightDecay, mom = c.momentum;
  for (int64_t i = 0; i < n; ++i) {
    float x = Master ? master[i] : loadElement<P>(p, i);
    float gi = loadElement<G>(g, i) * clip + wd * x;
    float b = Momentum ? mom * buf[i] + gi : gi;
    x = x - rate * b;
    buf[i] = b;
    if (Master)
      master[i] = x;
    storeElement<P>(p, i, x);
  }
}

using AdamwFn = void (*)(const void *, void *, float *, float *, float *, int64_t,
                         const AdamWConsts &);
using SgdFn = void (*)(const void *, void *, float *, float *, int64_t, const SGDConsts &);

// One instantiation of each loop per instruction set. The loops are always_inline with the
// default target, which GCC inlines into a caller whose target is a superset: each wrapper's
// copy is then vectorised for its own target.
#define BONSAI_HOST_LOOPS(Suffix, Target)                                                          \
  template <DType G, DType P, bool Master>                                                         \
  Target void adamw##Suffix(const void *g, void *p, float *m, float *v, float *master, int64_t n,  \
                            const AdamWConsts &c) {                                                \
    adamwLoop<G, P, Master>(g, p, m, v, master, n, c);                                             \
  }                                                                                                \
  template <DType G, DType P, bool Master, bool Momentum>                                          \
  Target void sgd##Suffix(const void *g, void *p, float *buf, float *master, int64_t n,            \
                          const SGDConsts &c) {                                                    \
    sgdLoop<G, P, Master, Momentum>(g, p, buf, master, n, c);                                      \
  }

#ifdef BONSAI_HOST_X86
BONSAI_HOST_LOOPS(Avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))))
BONSAI_HOST_LOOPS(Avx2, __attribute__((target("avx2"))))
#endif
BONSAI_HOST_LOOPS(Baseline, )
#undef BONSAI_HOST_LOOPS

enum class Isa { Avx512, Avx2, Baseline };

Isa detectIsa() {
#ifdef BONSAI_HOST_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return Isa::Avx512;
  if (__builtin_cpu_supports("avx2"))
    return Isa::Avx2;
#endif
  return Isa::Baseline;
}

/// The loops in use: the widest the CPU supports unless useVectorIsa chose others.
std::atomic<Isa> &currentIsa() {
  static std::atomic<Isa> current{detectIsa()};
  return current;
}

Isa isa() { return currentIsa().load(std::memory_order_relaxed); }

/// Calls f(std::integral_constant<DType, D>) for the float dtype `d` (checked before).
template <typename F> auto withDType(DType d, F &&f) {
  switch (d) {
  case DType::F16:
    return f(std::integral_constant<DType, DType::F16>{});
  case DType::BF16:
    return f(std::integral_constant<DType, DType::BF16>{});
  default:
    return f(std::integral_constant<DType, DType::F32>{});
  }
}

template <typename F> auto withBool(bool b, F &&f) {
  return b ? f(std::true_type{}) : f(std::false_type{});
}

AdamwFn pickAdamw(DType g, DType p, bool master) {
  return withDType(g, [&](auto gc) {
    return withDType(p, [&](auto pc) {
      return withBool(master, [&](auto mc) -> AdamwFn {
        constexpr DType G = decltype(gc)::value, P = decltype(pc)::value;
        constexpr bool M = decltype(mc)::value;
        switch (isa()) {
#ifdef BONSAI_HOST_X86
        case Isa::Avx512:
          return adamwAvx512<G, P, M>;
        case Isa::Avx2:
          return adamwAvx2<G, P, M>;
#endif
        default:
          return adamwBaseline<G, P, M>;
        }
      });
    });
  });
}

SgdFn pickSgd(DType g, DType p, bool master, bool momentum) {
  return withDType(g, [&](auto gc) {
    return withDType(p, [&](auto pc) {
      return withBool(master, [&](auto mc) {
        return withBool(momentum, [&](auto bc) -> SgdFn {
          constexpr DType G = decltype(gc)::value, P = decltype(pc)::value;
          constexpr bool M = decltype(mc)::value, B = decltype(bc)::value;
          switch (isa()) {
#ifdef BONSAI_HOST_X86
          case Isa::Avx512:
            return sgdAvx512<G, P, M, B>;
          case Isa::Avx2:
            return sgdAvx2<G, P, M, B>;
#endif
          default:
            return sgdBaseline<G, P, M, B>;
          }
        });
      });
    });
  });
}

//===----------------------------------------------------------------------===//
// Checks and the parallel sweep
//===----------------------------------------------------------------------===//

/// The SSE control word of IEEE arithmetic: round to nearest even, every exception masked,
/// no flush-to-zero (bit 15) and no denormals-are-zero (bit 6).
constexpr unsigned kIeeeMxcsr = 0x1f80;

/// Sets the IEEE SSE environment on this thread for its lifetime (the GPU kernels keep
/// subnormals; a caller's FTZ/DAZ would change the bits), then restores the caller's.
class IeeeScope {
public:
#ifdef BONSAI_HOST_X86
  IeeeScope() : saved_(_mm_getcsr()) { _mm_setcsr(kIeeeMxcsr | (saved_ & 0x3f)); }
  ~IeeeScope() { _mm_setcsr(saved_); }

private:
  unsigned saved_;
#endif
};

/// "name[i]".
std::string indexed(const char *name, size_t i) {
  return std::string(name) + "[" + std::to_string(i) + "]";
}

/// Checks that optimizer state `t` is f32 and shaped like `param` (the CUDA kernels' rule).
void checkState(const char *k, const std::string &name, const TensorView &t,
                const std::string &paramName, const TensorView &param) {
  checkView(k, name.c_str(), t);
  if (t.dtype != DType::F32)
    fail(k, name + " must be f32, not " + dtypeName(t.dtype));
  checkSameShape(k, name.c_str(), t, paramName.c_str(), param);
}

/// A float scalar's value as fp32 (what the CUDA kernels' loadScalar reads).
float loadScalarValue(const char *k, const char *name, const TensorView &t) {
  checkFloat(k, name, t);
  if (t.numel() != 1)
    fail(k, std::string(name) + " shape " + formatShape(t.shape) + " is not a scalar");
  float value;
  loadF32(t, &value);
  return value;
}

/// The step counter's value: the updates already done.
int64_t loadStepValue(const char *k, const TensorView &step) {
  checkStep(k, step);
  int64_t value;
  std::memcpy(&value, step.data, sizeof value);
  if (value < 0)
    fail(k, "step " + std::to_string(value) + " is negative");
  return value;
}

/// Checks the lists of a multi-tensor update as the CUDA kernels do: one of each per gradient
/// (masters: none or one per gradient), float gradients and parameters of the same shape, f32
/// states of that shape, and no written tensor sharing a byte with another operand.
void checkLists(const char *k, const std::vector<TensorView> &grads,
                const std::vector<TensorView> &params,
                const std::vector<std::pair<const char *, const std::vector<TensorView> *>> &states,
                const std::vector<TensorView> &masters,
                std::initializer_list<std::pair<const char *, const TensorView *>> scalars) {
  size_t n = grads.size();
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
  struct Range {
    std::string name;
    const char *begin, *end;
    bool written;
  };
  std::vector<Range> ranges;
  auto add = [&](std::string name, const TensorView &t, bool written) {
    if (t.bytes() == 0)
      return;
    const char *b = static_cast<const char *>(t.data);
    ranges.push_back({std::move(name), b, b + t.bytes(), written});
  };
  for (size_t i = 0; i < n; ++i) {
    std::string g = indexed("grad", i), p = indexed("param", i);
    checkFloat(k, g.c_str(), grads[i]);
    checkFloat(k, p.c_str(), params[i]);
    checkSameShape(k, g.c_str(), grads[i], p.c_str(), params[i]);
    add(g, grads[i], false);
    add(p, params[i], true);
    for (const auto &[name, list] : states) {
      std::string s = indexed(name, i);
      checkState(k, s, (*list)[i], p, params[i]);
      add(s, (*list)[i], true);
    }
    if (!masters.empty()) {
      std::string m = indexed("master", i);
      checkState(k, m, masters[i], p, params[i]);
      add(m, masters[i], true);
    }
  }
  for (const auto &[name, t] : scalars)
    add(name, *t, false);
  // A tensor overlaps an earlier one (by address) iff it starts before the furthest end of the
  // earlier ones; read-only operands may share bytes with each other.
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

/// Runs fn(tensor, offset, count) over fixed chunks of every tensor (numels[i] elements) on
/// every worker of the pool: each worker takes the next chunk until none is left, so a
/// worker slowed by another process leaves its share to the others. Each element is updated by
/// one worker with the same operations whatever the split: the bits do not depend on it.
template <typename F> void forChunks(ThreadPool &pool, const std::vector<int64_t> &numels, F &&fn) {
  struct Item {
    size_t tensor;
    int64_t offset, count;
  };
  std::vector<Item> items;
  for (size_t t = 0; t < numels.size(); ++t)
    for (int64_t offset = 0; offset < numels[t]; offset += kChunk)
      items.push_back({t, offset, std::min(kChunk, numels[t] - offset)});
  std::atomic<size_t> next{0};
  pool.run([&](int) {
    IeeeScope ieee;
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < items.size();
         i = next.fetch_add(1, std::memory_order_relaxed))
      fn(items[i].tensor, items[i].offset, items[i].count);
  });
}

/// The address of element `offset` of `t`.
void *at(const TensorView &t, int64_t offset) {
  return static_cast<char *>(t.data) + size_t(offset) * dtypeSize(t.dtype);
}

float *f32At(const TensorView &t, int64_t offset) { return static_cast<float *>(t.data) + offset; }

const char *isaName(Isa i) {
  switch (i) {
  case Isa::Avx512:
    return "avx512";
  case Isa::Avx2:
    return "avx2";
  default:
    return "baseline";
  }
}

} // namespace

const char *vectorIsa() { return isaName(isa()); }

void useVectorIsa(const std::string &name) {
  Isa want;
  if (name == "avx512")
    want = Isa::Avx512;
  else if (name == "avx2")
    want = Isa::Avx2;
  else if (name == "baseline")
    want = Isa::Baseline;
  else
    throw Error("host optimizer: unknown instruction set '" + name +
                "' (expected avx512, avx2 or baseline)");
  // The order of Isa is widest first: each supports the ones after it.
  if (int(want) < int(detectIsa()))
    throw Error("host optimizer: this CPU does not support " + name + " (the widest it runs is " +
                isaName(detectIsa()) + ")");
  currentIsa().store(want, std::memory_order_relaxed);
}

AdamWScalars adamwScalars(const cpu::AdamWHyper &hyper, int64_t done, float lr, float gradNorm) {
  // adamwScalars and clipCoefficient of runtime/cuda/Optimizer.cu, line for line.
  double t = double(done) + 1.0;
  double rate = double(lr);
  double clip = 1.0;
  if (hyper.gradClip > 0.0)
    clip = std::fmin(1.0, hyper.gradClip / (double(gradNorm) + kClipEpsilon));
  AdamWScalars s;
  s.clip = float(clip);
  s.decay = float(1.0 - rate * hyper.weightDecay);
  s.stepSize = float(rate / (1.0 - std::pow(hyper.beta1, t)));
  s.bc2Sqrt = float(std::sqrt(1.0 - std::pow(hyper.beta2, t)));
  return s;
}

void adamwStep(ThreadPool &pool, const std::vector<TensorView> &grads, const TensorView &step,
               const TensorView &lr, const TensorView &gradNorm, const cpu::AdamWHyper &hyper,
               const std::vector<TensorView> &params, const std::vector<TensorView> &m,
               const std::vector<TensorView> &v, const std::vector<TensorView> &masters) {
  const char *k = "adamw_step";
  checkLists(k, grads, params, {{"m", &m}, {"v", &v}}, masters,
             {{"step", &step}, {"lr", &lr}, {"grad_norm", &gradNorm}});
  int64_t done = loadStepValue(k, step);
  float rate = loadScalarValue(k, "lr", lr), norm = loadScalarValue(k, "grad_norm", gradNorm);
  if (!(hyper.beta1 >= 0.0 && hyper.beta1 < 1.0 && hyper.beta2 >= 0.0 && hyper.beta2 < 1.0))
    fail(k, "betas (" + std::to_string(hyper.beta1) + ", " + std::to_string(hyper.beta2) +
                ") are not in [0, 1)");
  AdamWConsts c{float(hyper.beta1),       float(hyper.beta2),
                float(1.0 - hyper.beta1), float(1.0 - hyper.beta2),
                float(hyper.eps),         adamwScalars(hyper, done, rate, norm)};
  std::vector<int64_t> numels;
  std::vector<AdamwFn> fns;
  for (size_t i = 0; i < grads.size(); ++i) {
    numels.push_back(params[i].numel());
    fns.push_back(pickAdamw(grads[i].dtype, params[i].dtype, !masters.empty()));
  }
  forChunks(pool, numels, [&](size_t i, int64_t offset, int64_t count) {
    fns[i](at(grads[i], offset), at(params[i], offset), f32At(m[i], offset), f32At(v[i], offset),
           masters.empty() ? nullptr : f32At(masters[i], offset), count, c);
  });
}

void sgdStep(ThreadPool &pool, const std::vector<TensorView> &grads, const TensorView &lr,
             const TensorView &gradNorm, const cpu::SGDHyper &hyper,
             const std::vector<TensorView> &params, const std::vector<TensorView> &momentum,
             const std::vector<TensorView> &masters) {
  const char *k = "sgd_step";
  checkLists(k, grads, params, {{"momentum", &momentum}}, masters,
             {{"lr", &lr}, {"grad_norm", &gradNorm}});
  float rate = loadScalarValue(k, "lr", lr), norm = loadScalarValue(k, "grad_norm", gradNorm);
  // The CUDA kernel's scalars: the clip coefficient in fp64 rounded once, the rate as loaded.
  double clip = 1.0;
  if (hyper.gradClip > 0.0)
    clip = std::fmin(1.0, hyper.gradClip / (double(norm) + kClipEpsilon));
  SGDConsts c{float(clip), rate, float(hyper.weightDecay), float(hyper.momentum)};
  bool useMomentum = hyper.momentum != 0.0;
  std::vector<int64_t> numels;
  std::vector<SgdFn> fns;
  for (size_t i = 0; i < grads.size(); ++i) {
    numels.push_back(params[i].numel());
    fns.push_back(pickSgd(grads[i].dtype, params[i].dtype, !masters.empty(), useMomentum));
  }
  forChunks(pool, numels, [&](size_t i, int64_t offset, int64_t count) {
    fns[i](at(grads[i], offset), at(params[i], offset), f32At(momentum[i], offset),
           masters.empty() ? nullptr : f32At(masters[i], offset), count, c);
  });
}

} // namespace bonsai::rt::host
