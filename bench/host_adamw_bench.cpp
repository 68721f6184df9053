//===- host_adamw_bench.cpp - Timings of the host AdamW step -------------------===//
//
// Times host::adamwStep (runtime/include/bonsai/runtime/HostOptimizer.h) on Llama-shaped
// tensors in host memory: `--layers` decoder layers of hidden size `--hidden` and MLP size
// `--ffn` (q, k, v, o, gate, up, down and two norm weights each; 5 layers of Llama-2-7B's
// shapes are 1.01 G parameters), on `--threads` threads, `--steps` timed steps after
// `--warmup` untimed ones. `--dtype f32`: f32 gradients, parameters and moments; `--dtype
// bf16`: bf16 gradients and parameters with f32 masters and moments (the mixed-precision
// recipe). `--isa` picks the loops of a narrower instruction set than the CPU's widest. Prints
// the median and best step, parameters per second and the bytes the step moves per second
// (each operand read once and each result written once), as text or, with --json, as one JSON
// object for bench/host_adamw_bench.py. Needs no GPU.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/HostOptimizer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace bonsai::rt;
namespace host = bonsai::rt::host;

namespace {

struct Options {
  int threads = int(std::thread::hardware_concurrency());
  int64_t layers = 5, hidden = 4096, ffn = 11008;
  int steps = 10, warmup = 2;
  DType dtype = DType::F32;
  std::string isa; ///< empty: the widest the CPU supports
  bool json = false;
};

[[noreturn]] void usage(const char *why) {
  std::fprintf(stderr,
               "host_adamw_bench: %s\nusage: host_adamw_bench [--threads N] [--layers L] "
               "[--hidden H] [--ffn F] [--steps S] [--warmup W] [--dtype f32|bf16] [--isa "
               "avx512|avx2|baseline] [--json]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc)
        usage((a + " needs a value").c_str());
      return argv[++i];
    };
    auto integer = [&](int64_t least = 1) -> int64_t {
      std::string v = value();
      char *end = nullptr;
      long long n = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end || n < least)
        usage((a + " takes an integer of at least " + std::to_string(least) + ", not '" + v + "'")
                  .c_str());
      return n;
    };
    if (a == "--threads")
      o.threads = int(integer());
    else if (a == "--layers")
      o.layers = integer();
    else if (a == "--hidden")
      o.hidden = integer();
    else if (a == "--ffn")
      o.ffn = integer();
    else if (a == "--steps")
      o.steps = int(integer());
    else if (a == "--warmup")
      o.warmup = int(integer(0));
    else if (a == "--dtype") {
      std::string d = value();
      if (d == "f32")
        o.dtype = DType::F32;
      else if (d == "bf16")
        o.dtype = DType::BF16;
      else
        usage(("--dtype takes f32 or bf16, not '" + d + "'").c_str());
    } else if (a == "--isa")
      o.isa = value();
    else if (a == "--json")
      o.json = true;
    else
      usage(("unknown argument '" + a + "'").c_str());
  }
  return o;
}

/// 64-byte-aligned host storage (what PyTorch's CPU allocator gives its tensors).
struct Storage {
  explicit Storage(size_t bytes)
      : data(std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64))) {
    if (!data)
      throw std::runtime_error("out of memory allocating " + std::to_string(bytes) + " bytes");
  }
  ~Storage() { std::free(data); }
  Storage(const Storage &) = delete;
  Storage &operator=(const Storage &) = delete;
  void *data;
};

/// Fills [begin, end) of an f32 or bf16 array with small values that differ by element, so
/// that nothing in the step is a constant the hardware could shortcut.
void fill(void *data, DType dtype, int64_t begin, int64_t end, float scale, float bias) {
  for (int64_t i = begin; i < end; ++i) {
    float x = bias + scale * float(int64_t((i * 2654435761u) % 2001) - 1000) / 1000.0f;
    if (dtype == DType::F32)
      static_cast<float *>(data)[i] = x;
    else
      static_cast<uint16_t *>(data)[i] = f32ToBf16(x);
  }
}

} // namespace

int main(int argc, char **argv) {
  Options o = parse(argc, argv);
  if (!o.isa.empty()) {
    try {
      host::useVectorIsa(o.isa);
    } catch (const Error &e) {
      usage(e.what());
    }
  }
  std::vector<std::vector<int64_t>> shapes;
  for (int64_t l = 0; l < o.layers; ++l) {
    for (int q = 0; q < 4; ++q)
      shapes.push_back({o.hidden, o.hidden});
    shapes.push_back({o.ffn, o.hidden});
    shapes.push_back({o.ffn, o.hidden});
    shapes.push_back({o.hidden, o.ffn});
    shapes.push_back({o.hidden});
    shapes.push_back({o.hidden});
  }
  const bool masters = o.dtype == DType::BF16;
  const size_t el = dtypeSize(o.dtype);
  host::ThreadPool pool(o.threads);
  std::vector<std::unique_ptr<Storage>> keep;
  std::vector<TensorView> grads, params, m, v, ms;
  int64_t total = 0;
  for (const auto &shape : shapes) {
    TensorView t{nullptr, o.dtype, shape};
    int64_t n = t.numel();
    total += n;
    auto make = [&](DType d, float scale, float bias, std::vector<TensorView> &list) {
      keep.push_back(std::make_unique<Storage>(size_t(n) * dtypeSize(d)));
      void *data = keep.back()->data;
      // First touch on the pool's threads, as a runtime's arena would be filled.
      pool.run([&](int w) {
        int64_t k = pool.size();
        fill(data, d, n * w / k, n * (w + 1) / k, scale, bias);
      });
      list.push_back(TensorView{data, d, shape});
    };
    make(o.dtype, 1e-2f, 0.0f, grads);
    make(o.dtype, 1.0f, 0.0f, params);
    make(DType::F32, 1e-3f, 0.0f, m);
    make(DType::F32, 1e-6f, 2e-6f, v);
    if (masters)
      make(DType::F32, 1.0f, 0.0f, ms);
  }
  int64_t stepCount = 0;
  float lrValue = 1e-4f, normValue = 1.0f;
  TensorView step{&stepCount, DType::I64, {}}, lr{&lrValue, DType::F32, {}},
      norm{&normValue, DType::F32, {}};
  cpu::AdamWHyper hyper{0.9, 0.95, 1e-8, 0.1, 1.0};
  std::vector<double> times;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    host::adamwStep(pool, grads, step, lr, norm, hyper, params, m, v, ms);
    auto t1 = std::chrono::steady_clock::now();
    ++stepCount;
    if (s >= o.warmup)
      times.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  std::sort(times.begin(), times.end());
  double median = times[times.size() / 2], best = times.front();
  // Read: gradient, m, v and the master or the parameter; written: m, v, the parameter and
  // the master.
  double bytesPerParam = double(el) + 16.0 + (masters ? 4.0 + 4.0 + double(el) : 2.0 * double(el));
  double params_s = double(total) / median, gbps = double(total) * bytesPerParam / median / 1e9;
  if (o.json) {
    std::printf("{\"name\": \"bonsai\", \"isa\": \"%s\", \"threads\": %d, \"dtype\": \"%s\", "
                "\"masters\": %s, \"tensors\": %zu, \"params\": %lld, \"steps\": %d, "
                "\"median_s\": %.6f, \"best_s\": %.6f, \"params_per_s\": %.6e, "
                "\"bytes_per_param\": %.1f, \"gb_per_s\": %.3f}\n",
                host::vectorIsa(), pool.size(), dtypeName(o.dtype), masters ? "true" : "false",
                shapes.size(), (long long)total, o.steps, median, best, params_s, bytesPerParam,
                gbps);
  } else {
    std::printf("host AdamW step (%s, %d threads): %lld params in %zu tensors, %s%s\n",
                host::vectorIsa(), pool.size(), (long long)total, shapes.size(), dtypeName(o.dtype),
                masters ? " with f32 masters" : "");
    std::printf("  median %.2f ms, best %.2f ms over %d steps: %.3f G params/s, %.1f GB/s "
                "(%.0f bytes per param)\n",
                median * 1e3, best * 1e3, o.steps, params_s / 1e9, gbps, bytesPerParam);
  }
  return 0;
}
