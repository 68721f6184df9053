//===- bonsai-run.cpp - Run a compiled Bonsai training-step plan ----------===//
//
// Loads and verifies a plan, binds its parameters from safetensors weights (or initializes them
// from the seed), feeds it batches from a token file (or random tokens), runs N steps on the CPU
// backend and prints the loss of each step, then the planned and measured memory per arena.
// Every failure is one line, "bonsai-run: error: <cause>" (followed by the usage synopsis for a
// command-line mistake), and exit status 1: a bad plan, bad weights or bad data is reported,
// never a crash. The memory lines come after the steps because "measured" is what the steps
// actually touched.
//
// Output (stdout), in this order:
//   plan <path>: model <name>, target <arch>, <K> kernels, <T> tensors, <A> arenas, <N> tokens/step
//   step <n> loss <%.9g>                  once per step, n from 1
//   memory: arena <i> '<name>' (<lifetime>, <space>): planned <X> MiB (<x> B), measured <Y> MiB (<y> B)
//   memory: planned <X> MiB (weights .., gradients .., optimizer state .., activations ..,
//           workspace .., inputs ..) measured <Y> MiB
//   time: <n> steps in <s> s, <r> tokens/s
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Data.h"
#include "bonsai/runtime/Executor.h"
#include "bonsai/runtime/Plan.h"
#include "bonsai/runtime/Safetensors.h"

#include <chrono>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <optional>
#include <string>

namespace rt = bonsai::rt;

namespace {

const char *const kSynopsis =
    "usage: bonsai-run PLAN [--weights FILE.safetensors | FILE.safetensors.index.json]\n"
    "                       [--data TOKENS.bin] [--seed N] [--steps N] [--backend=cpu]\n";

const char *const kHelp =
    "\n"
    "Runs N training steps (default 1) of a plan compiled by bonsai-compile and prints the loss\n"
    "of each step and the planned and measured memory of each arena.\n"
    "\n"
    "  --weights FILE   parameters by name from a .safetensors file or a sharded checkpoint's\n"
    "                   .safetensors.index.json (default: random init from the seed)\n"
    "  --data FILE      a Bonsai token file (docs/data-format.md) (default: random tokens)\n"
    "  --seed N         seed of random init and random tokens (default 0)\n"
    "  --steps N        number of steps (default 1)\n"
    "  --backend NAME   cpu (default); cuda is not in this build\n"
    "  --help           this text\n";

/// A command-line mistake: reported with the usage.
struct UsageError {
  std::string message;
};

struct Options {
  std::string plan;
  std::string weights;
  std::string data;
  uint64_t seed = 0;
  uint64_t steps = 1;
  std::string backend = "cpu";
  bool help = false;
};

uint64_t parseCount(const std::string &flag, const std::string &text) {
  // strtoull accepts "-1" (wrapping it) and leading spaces: allow digits only.
  if (text.empty() || text.size() > 20 || text.find_first_not_of("0123456789") != std::string::npos)
    throw UsageError{flag + " expects a non-negative integer, got '" + text + "'"};
  errno = 0;
  unsigned long long value = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE)
    throw UsageError{flag + " value '" + text + "' is too large"};
  return value;
}

Options parseOptions(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      o.help = true;
      continue;
    }
    if (arg.size() > 1 && arg[0] == '-') {
      std::string flag = arg, value;
      bool hasValue = false;
      if (size_t eq = arg.find('='); eq != std::string::npos) {
        flag = arg.substr(0, eq);
        value = arg.substr(eq + 1);
        hasValue = true;
      }
      auto takeValue = [&]() {
        if (hasValue)
          return value;
        if (i + 1 >= argc)
          throw UsageError{flag + " needs a value"};
        return std::string(argv[++i]);
      };
      if (flag == "--weights")
        o.weights = takeValue();
      else if (flag == "--data")
        o.data = takeValue();
      else if (flag == "--seed")
        o.seed = parseCount(flag, takeValue());
      else if (flag == "--steps")
        o.steps = parseCount(flag, takeValue());
      else if (flag == "--backend")
        o.backend = takeValue();
      else
        throw UsageError{"unknown option '" + arg + "'"};
      continue;
    }
    if (!o.plan.empty())
      throw UsageError{"more than one plan given ('" + o.plan + "' and '" + arg + "')"};
    o.plan = arg;
  }
  if (o.help)
    return o;
  if (o.plan.empty())
    throw UsageError{"no plan file given"};
  if (o.backend != "cpu" && o.backend != "cuda")
    throw UsageError{"unknown backend '" + o.backend + "' (expected cpu or cuda)"};
  return o;
}

double mib(uint64_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

int run(const Options &o) {
  if (o.backend == "cuda")
    throw rt::Error("this build has no CUDA backend (use --backend=cpu)");

  rt::LoadedPlan plan = rt::loadPlanFile(o.plan);
  std::printf("plan %s: model %s, target %s, %zu kernels, %zu tensors, %zu arenas, %" PRIu64
              " tokens/step\n",
              o.plan.c_str(), plan.model.empty() ? "(unnamed)" : plan.model.c_str(),
              plan.targetArch.empty() ? "(none)" : plan.targetArch.c_str(), plan.kernels.size(),
              plan.tensors.size(), plan.arenas.size(), plan.tokensPerStep);
  std::fflush(stdout);

  rt::Executor executor(plan);
  if (!o.weights.empty())
    executor.bindWeights(rt::Checkpoint::open(o.weights));
  else
    executor.initWeights(o.seed);

  std::vector<int64_t> shape = executor.inputShape();
  int64_t vocab = plan.vocabularySize().value_or(0);
  rt::TokenLoader loader(o.data, shape[0], shape[1], vocab, o.seed);

  auto start = std::chrono::steady_clock::now();
  for (uint64_t s = 0; s < o.steps; ++s) {
    executor.setInputs(loader.batch(s));
    float loss = executor.runStep();
    std::printf("step %" PRIu64 " loss %.9g\n", s + 1, double(loss));
    std::fflush(stdout);
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  uint64_t planned = 0, measured = 0;
  size_t index = 0;
  for (const rt::ArenaUsage &u : executor.memoryUsage()) {
    std::printf("memory: arena %zu '%s' (%s, %s): planned %.2f MiB (%" PRIu64
                " B), measured %.2f MiB (%" PRIu64 " B)\n",
                index++, u.arena->name.c_str(),
                u.arena->lifetime == rt::Lifetime::Persistent ? "persistent" : "step",
                u.arena->space == rt::MemorySpace::Device ? "device" : "pinned host",
                mib(u.planned), u.planned, mib(u.measured), u.measured);
    planned += u.planned;
    measured += u.measured;
  }
  const rt::MemorySummaryInfo &m = plan.memory;
  std::printf("memory: planned %.2f MiB (weights %.2f MiB, gradients %.2f MiB, optimizer state "
              "%.2f MiB, activations %.2f MiB, workspace %.2f MiB, inputs %.2f MiB) measured "
              "%.2f MiB\n",
              mib(planned), mib(m.weights), mib(m.gradients), mib(m.optimizerState),
              mib(m.activations), mib(m.workspace), mib(m.inputs), mib(measured));
  double tokens = double(o.steps) * double(shape[0] * shape[1]);
  std::printf("time: %" PRIu64 " steps in %.3f s, %.0f tokens/s\n", o.steps, seconds,
              seconds > 0 ? tokens / seconds : 0.0);
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  try {
    Options options = parseOptions(argc, argv);
    if (options.help) {
      std::fputs(kSynopsis, stdout);
      std::fputs(kHelp, stdout);
      return 0;
    }
    return run(options);
  } catch (const UsageError &e) {
    std::fflush(stdout);
    std::fprintf(stderr, "bonsai-run: error: %s\n%s", e.message.c_str(), kSynopsis);
  } catch (const rt::Error &e) {
    std::fflush(stdout);
    std::fprintf(stderr, "bonsai-run: error: %s\n", e.what());
  } catch (const std::bad_alloc &) {
    std::fflush(stdout);
    std::fprintf(stderr, "bonsai-run: error: out of memory\n");
  } catch (const std::exception &e) {
    std::fflush(stdout);
    std::fprintf(stderr, "bonsai-run: error: %s\n", e.what());
  }
  return 1;
}
