//===- Optimizer.cpp - Gradient norm, schedules and optimizer steps --------===//
//
// The kernels of a training step's Update phase: grad_norm (the global L2 norm of every gradient,
// for clipping and reporting), learning_rate (warmup, then constant or cosine), adamw_update and
// sgd_update (PyTorch's torch.optim.AdamW and SGD with global-norm clipping, see AdamWAttrs and
// SGDAttrs in plan.fbs), step_increment, accumulate (gradient accumulation across micro-batches)
// and zero. Optimizer state (moments, momentum, fp32 master weights) is f32; each element's update
// is computed in fp64 from it and rounded once into each tensor it writes. Elements are processed
// in fixed chunks; the norm's chunk sums are added in chunk order, so no result depends on the
// number of threads.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"

#include "KernelUtil.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

namespace bonsai::rt::cpu {

using namespace detail;

namespace {

/// Elements per chunk: large enough to amortise the conversions, small enough for the cache.
constexpr int64_t kChunk = 16384;
/// Chunks per thread below which threading costs more than it saves.
constexpr int64_t kChunkGrain = 4;

/// What PyTorch's clip_grad_norm_ adds to the norm before dividing by it.
constexpr double kClipEpsilon = 1e-6;

constexpr double kPi = 3.14159265358979323846;

/// Runs fn(offset, count) over `n` elements in fixed chunks, on several threads.
template <typename F> void forChunks(int64_t n, F fn) {
  int64_t chunks = (n + kChunk - 1) / kChunk;
  parallelFor(chunks, kChunkGrain, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int64_t offset = c * kChunk;
      fn(offset, std::min(kChunk, n - offset));
    }
  });
}


/// Checks that `t` is a float scalar to be written.
void checkScalarOutput(const char *kernel, const char *operand, const TensorView &t) {
  checkFloat(kernel, operand, t);
  if (t.numel() != 1)
    fail(kernel, std::string(operand) + " shape " + formatShape(t.shape) + " is not a scalar");
}


/// Checks that optimizer state `t` is f32 and shaped like `param`.
void checkState(const char *kernel, const char *operand, const TensorView &t,
                const TensorView &param) {
  checkView(kernel, operand, t);
  if (t.dtype != DType::F32)
    fail(kernel, std::string(operand) + " must be f32, not " + dtypeName(t.dtype));
  checkSameShape(kernel, operand, t, "param", param);
}

/// The factor every gradient is scaled by: min(1, clip / (norm + 1e-6)), or 1 without clipping.
double clipCoefficient(double gradClip, double norm) {
  if (!(gradClip > 0.0))
    return 1.0;
  return std::min(1.0, gradClip / (norm + kClipEpsilon));
}

/// Runs an in-place update of one chunk of param (through master when given): update(offset,
/// g, p) receives the chunk's first element index, its gradients and its fp32 parameter values
/// (master's when given) and rewrites p, which is then stored into master and param.
template <typename F>
void updateChunk(const TensorView &grad, const TensorView &param, const TensorView *master,
                 int64_t offset, int64_t count, F update) {
  std::vector<float> g(static_cast<size_t>(count)), p(static_cast<size_t>(count));
  loadF32(subView(grad, offset, count), g.data());
  loadF32(subView(master ? *master : param, offset, count), p.data());
  update(offset, g, p);
  if (master)
    storeF32(p.data(), subView(*master, offset, count));
  // The parameter is the fp32 value rounded once to its dtype.
  storeF32(p.data(), subView(param, offset, count));
}

/// Runs fn(tensor, offset, count) over the fixed chunks of every tensor (numels[i] elements),
/// the chunks of all tensors spread over the threads together.
template <typename F> void forChunksOfAll(const std::vector<int64_t> &numels, F fn) {
  struct Piece {
    size_t tensor;
    int64_t offset, count;
  };
  std::vector<Piece> pieces;
  for (size_t i = 0; i < numels.size(); ++i)
    for (int64_t offset = 0; offset < numels[i]; offset += kChunk)
      pieces.push_back({i, offset, std::min(kChunk, numels[i] - offset)});
  parallelFor(int64_t(pieces.size()), kChunkGrain, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      fn(pieces[size_t(p)].tensor, pieces[size_t(p)].offset, pieces[size_t(p)].count);
  });
}

/// "name" for the per-tensor kernels, "name[i]" for tensor i of a multi-tensor one.
std::string operandName(const char *name, int index) {
  return index < 0 ? std::string(name) : std::string(name) + "[" + std::to_string(index) + "]";
}

/// The per-tensor checks of an update: a float gradient of the parameter's shape, f32 states
/// (and master) of that shape. `index` numbers the tensor of a multi-tensor update (-1: none).
void checkUpdateTensors(const char *k, int index, const TensorView &grad, const TensorView &param,
                        std::initializer_list<std::pair<const char *, const TensorView *>> states) {
  std::string g = operandName("grad", index), p = operandName("param", index);
  checkFloat(k, g.c_str(), grad);
  checkFloat(k, p.c_str(), param);
  checkSameShape(k, g.c_str(), grad, p.c_str(), param);
  for (const auto &[name, state] : states)
    if (state)
      checkState(k, operandName(name, index).c_str(), *state, param);
}

void checkBetas(const char *k, const AdamWHyper &hyper) {
  if (!(hyper.beta1 >= 0.0 && hyper.beta1 < 1.0 && hyper.beta2 >= 0.0 && hyper.beta2 < 1.0))
    fail(k, "betas (" + std::to_string(hyper.beta1) + ", " + std::to_string(hyper.beta2) +
                ") are not in [0, 1)");
}

/// The scalars of one AdamW step, t = the update being done (1 for the first).
struct AdamWStep {
  AdamWHyper hyper;
  double clip, decay, stepSize, bc2Sqrt;
};

AdamWStep adamwStep(const AdamWHyper &hyper, int64_t done, double rate, double norm) {
  double t = double(done) + 1.0;
  return {hyper, clipCoefficient(hyper.gradClip, norm), 1.0 - rate * hyper.weightDecay,
          rate / (1.0 - std::pow(hyper.beta1, t)), std::sqrt(1.0 - std::pow(hyper.beta2, t))};
}

/// torch.optim.AdamW's single-tensor step on elements [offset, offset + count).
void adamwChunk(const AdamWStep &s, const TensorView &grad, const TensorView &param,
                const TensorView &m, const TensorView &v, const TensorView *master,
                int64_t offset, int64_t count) {
  const AdamWHyper &hyper = s.hyper;
  float *mp = static_cast<float *>(m.data), *vp = static_cast<float *>(v.data);
  updateChunk(grad, param, master, offset, count,
              [&](int64_t offset, const std::vector<float> &g, std::vector<float> &p) {
                for (size_t i = 0; i < p.size(); ++i) {
                  double gi = double(g[i]) * s.clip;
                  double mi = hyper.beta1 * double(mp[offset + int64_t(i)]) +
                              (1.0 - hyper.beta1) * gi;
                  double vi = hyper.beta2 * double(vp[offset + int64_t(i)]) +
                              (1.0 - hyper.beta2) * gi * gi;
                  mp[offset + int64_t(i)] = float(mi);
                  vp[offset + int64_t(i)] = float(vi);
                  // Decoupled weight decay first, then the Adam step, as PyTorch orders them.
                  double pi = double(p[i]) * s.decay;
                  p[i] = float(pi - s.stepSize * mi / (std::sqrt(vi) / s.bc2Sqrt + hyper.eps));
                }
              });
}

/// torch.optim.SGD's step on elements [offset, offset + count).
void sgdChunk(const SGDHyper &hyper, double clip, double rate, const TensorView &grad,
              const TensorView &param, const TensorView &momentum, const TensorView *master,
              int64_t offset, int64_t count) {
  float *bp = static_cast<float *>(momentum.data);
  updateChunk(grad, param, master, offset, count,
              [&](int64_t offset, const std::vector<float> &g, std::vector<float> &p) {
                for (size_t i = 0; i < p.size(); ++i) {
                  double gi = double(g[i]) * clip + hyper.weightDecay * double(p[i]);
                  // Without momentum the buffer is not read: it may hold anything.
                  double buf = hyper.momentum != 0.0
                                   ? hyper.momentum * double(bp[offset + int64_t(i)]) + gi
                                   : gi;
                  bp[offset + int64_t(i)] = float(buf);
                  p[i] = float(double(p[i]) - rate * buf);
                }
              });
}

/// Checks that the lists of a multi-tensor update have one tensor per gradient (masters: none
/// or one per gradient).
void checkCounts(const char *k, size_t n,
                 std::initializer_list<std::pair<const char *, size_t>> lists, size_t masters) {
  if (n == 0)
    fail(k, "needs at least one gradient");
  for (const auto &[name, count] : lists)
    if (count != n)
      fail(k, std::to_string(n) + " gradients but " + std::to_string(count) + " " + name);
  if (masters != 0 && masters != n)
    fail(k, std::to_string(n) + " gradients but " + std::to_string(masters) +
                " masters (expected none or one per parameter)");
}

} // namespace

void gradNorm(const std::vector<TensorView> &grads, const TensorView &norm) {
  const char *k = "grad_norm";
  for (size_t i = 0; i < grads.size(); ++i)
    checkFloat(k, ("grads[" + std::to_string(i) + "]").c_str(), grads[i]);
  checkScalarOutput(k, "norm", norm);
  struct Piece {
    size_t tensor;
    int64_t offset, count;
  };
  std::vector<Piece> pieces;
  for (size_t i = 0; i < grads.size(); ++i)
    for (int64_t offset = 0, n = grads[i].numel(); offset < n; offset += kChunk)
      pieces.push_back({i, offset, std::min(kChunk, n - offset)});
  // Fixed pieces summed in parallel, then added in order: the same sum on any number of threads.
  std::vector<double> partial(pieces.size(), 0.0);
  parallelFor(int64_t(pieces.size()), kChunkGrain, [&](int64_t p0, int64_t p1) {
    std::vector<float> v(static_cast<size_t>(kChunk));
    for (int64_t p = p0; p < p1; ++p) {
      const Piece &piece = pieces[size_t(p)];
      loadF32(subView(grads[piece.tensor], piece.offset, piece.count), v.data());
      double sum = 0.0;
      for (int64_t e = 0; e < piece.count; ++e)
        sum += double(v[size_t(e)]) * double(v[size_t(e)]);
      partial[size_t(p)] = sum;
    }
  });
  double total = 0.0;
  for (double s : partial)
    total += s;
  float result = float(std::sqrt(total));
  storeF32(&result, norm);
}

void learningRate(const TensorView &step, const LearningRateSchedule &schedule,
                  const TensorView &lr) {
  const char *k = "learning_rate";
  int64_t done = loadStep(k, step);
  checkScalarOutput(k, "lr", lr);
  int64_t warmup = schedule.warmupSteps, total = schedule.totalSteps;
  if (warmup < 0)
    fail(k, "warmup_steps " + std::to_string(warmup) + " is negative");
  if (schedule.cosine && total <= warmup)
    fail(k, "total_steps " + std::to_string(total) + " of a cosine schedule is not above " +
                "warmup_steps " + std::to_string(warmup));
  // The update about to run is the t-th: the counter holds the updates already done.
  double t = double(done) + 1.0, value;
  if (warmup > 0 && t <= double(warmup)) {
    value = schedule.lr * t / double(warmup);
  } else if (!schedule.cosine) {
    value = schedule.lr;
  } else {
    double progress = std::min(1.0, (t - double(warmup)) / double(total - warmup));
    double r = schedule.minLrRatio;
    value = schedule.lr * (r + (1.0 - r) * 0.5 * (1.0 + std::cos(kPi * progress)));
  }
  float result = float(value);
  storeF32(&result, lr);
}

void adamwUpdate(const TensorView &grad, const TensorView &step, const TensorView &lr,
                 const TensorView &gradNorm, const AdamWHyper &hyper, const TensorView &param,
                 const TensorView &m, const TensorView &v, const TensorView *master) {
  const char *k = "adamw_update";
  checkUpdateTensors(k, -1, grad, param, {{"m", &m}, {"v", &v}, {"master", master}});
  int64_t done = loadStep(k, step);
  double rate = loadScalar(k, "lr", lr), norm = loadScalar(k, "grad_norm", gradNorm);
  checkBetas(k, hyper);
  AdamWStep s = adamwStep(hyper, done, rate, norm);
  forChunks(param.numel(), [&](int64_t offset, int64_t count) {
    adamwChunk(s, grad, param, m, v, master, offset, count);
  });
}

void multiTensorAdamwUpdate(const std::vector<TensorView> &grads, const TensorView &step,
                            const TensorView &lr, const TensorView &gradNorm,
                            const AdamWHyper &hyper, const std::vector<TensorView> &params,
                            const std::vector<TensorView> &m, const std::vector<TensorView> &v,
                            const std::vector<TensorView> &masters) {
  const char *k = "multi_tensor_adamw_update";
  size_t n = grads.size();
  checkCounts(k, n, {{"params", params.size()}, {"m", m.size()}, {"v", v.size()}},
              masters.size());
  std::vector<int64_t> numels(n);
  for (size_t i = 0; i < n; ++i) {
    checkUpdateTensors(k, int(i), grads[i], params[i],
                       {{"m", &m[i]}, {"v", &v[i]}, {"master", masters.empty() ? nullptr : &masters[i]}});
    numels[i] = params[i].numel();
  }
  int64_t done = loadStep(k, step);
  double rate = loadScalar(k, "lr", lr), norm = loadScalar(k, "grad_norm", gradNorm);
  checkBetas(k, hyper);
  AdamWStep s = adamwStep(hyper, done, rate, norm);
  forChunksOfAll(numels, [&](size_t i, int64_t offset, int64_t count) {
    adamwChunk(s, grads[i], params[i], m[i], v[i], masters.empty() ? nullptr : &masters[i],
               offset, count);
  });
}

void sgdUpdate(const TensorView &grad, const TensorView &lr, const TensorView &gradNorm,
               const SGDHyper &hyper, const TensorView &param, const TensorView &momentum,
               const TensorView *master) {
  const char *k = "sgd_update";
  checkUpdateTensors(k, -1, grad, param, {{"momentum", &momentum}, {"master", master}});
  double rate = loadScalar(k, "lr", lr), norm = loadScalar(k, "grad_norm", gradNorm);
  double clip = clipCoefficient(hyper.gradClip, norm);
  forChunks(param.numel(), [&](int64_t offset, int64_t count) {
    sgdChunk(hyper, clip, rate, grad, param, momentum, master, offset, count);
  });
}

void multiTensorSgdUpdate(const std::vector<TensorView> &grads, const TensorView &lr,
                          const TensorView &gradNorm, const SGDHyper &hyper,
                          const std::vector<TensorView> &params,
                          const std::vector<TensorView> &momentum,
                          const std::vector<TensorView> &masters) {
  const char *k = "multi_tensor_sgd_update";
  size_t n = grads.size();
  checkCounts(k, n, {{"params", params.size()}, {"momentum", momentum.size()}}, masters.size());
  std::vector<int64_t> numels(n);
  for (size_t i = 0; i < n; ++i) {
    checkUpdateTensors(k, int(i), grads[i], params[i],
                       {{"momentum", &momentum[i]},
                        {"master", masters.empty() ? nullptr : &masters[i]}});
    numels[i] = params[i].numel();
  }
  double rate = loadScalar(k, "lr", lr), norm = loadScalar(k, "grad_norm", gradNorm);
  double clip = clipCoefficient(hyper.gradClip, norm);
  forChunksOfAll(numels, [&](size_t i, int64_t offset, int64_t count) {
    sgdChunk(hyper, clip, rate, grads[i], params[i], momentum[i],
             masters.empty() ? nullptr : &masters[i], offset, count);
  });
}

void stepIncrement(const TensorView &step) {
  const char *k = "step_increment";
  int64_t value = loadStep(k, step);
  if (value == std::numeric_limits<int64_t>::max())
    fail(k, "step " + std::to_string(value) + " cannot be incremented");
  ++value;
  std::memcpy(step.data, &value, sizeof value);
}

void accumulate(const TensorView &g, const TensorView &acc) {
  const char *k = "accumulate";
  checkFloat(k, "g", g);
  checkFloat(k, "acc", acc);
  checkSameShape(k, "g", g, "acc", acc);
  forChunks(acc.numel(), [&](int64_t offset, int64_t count) {
    std::vector<float> a(static_cast<size_t>(count)), b(static_cast<size_t>(count));
    loadF32(subView(acc, offset, count), a.data());
    loadF32(subView(g, offset, count), b.data());
    // An fp32 sum of two floats is correctly rounded; storing rounds once more for f16/bf16.
    for (size_t i = 0; i < a.size(); ++i)
      a[i] += b[i];
    storeF32(a.data(), subView(acc, offset, count));
  });
}

void accumulateMax(const TensorView &x, const TensorView &acc) {
  const char *k = "accumulate_max";
  checkF32(k, "x", x, x.shape);
  checkF32(k, "acc", acc, x.shape);
  const auto *in = static_cast<const float *>(x.data);
  auto *out = static_cast<float *>(acc.data);
  for (int64_t i = 0; i < acc.numel(); ++i)
    out[i] = std::isnan(in[i]) || in[i] > out[i] ? in[i] : out[i];
}

void zero(const TensorView &x) {
  checkView("zero", "x", x);
  // All-zero bytes are 0 in every dtype.
  if (x.bytes())
    std::memset(x.data, 0, x.bytes());
}

} // namespace bonsai::rt::cpu
