//===- bonsai-run.cpp - Run and train a compiled Bonsai plan --------------===//
//
// Loads and verifies a plan, binds its parameters (safetensors weights, a checkpoint to resume,
// or random init from the seed), and runs N steps on the CPU backend: each step runs the plan's
// Forward and Backward kernels once per micro-batch and its Update kernels once (a plan without
// Update kernels just computes the loss). It reports every step, writes JSON-line metrics and
// crash-safe checkpoints when asked, evaluates on held-out data (forward only) every N steps, can
// dump one micro-batch's gradients, and can generate text byte by byte from the trained model.
// Every failure is one line, "bonsai-run: error: <cause>" (followed by the usage synopsis for a
// command-line mistake), and exit status 1: a bad plan, bad weights, bad data or a corrupt
// checkpoint is reported, never a crash. The memory lines come after the steps because "measured"
// is what the steps touched.
//
// Output (stdout), in this order:
//   plan <path>: model <name>, target <arch>, <K> kernels, <T> tensors, <A> arenas, <N> tokens/step
//                [ (<m> micro-batches of <n>)]
//   resume: <dir> (step <n>, micro-batch <p>)                  with --resume
//   step <n> loss <%.9g>[ grad_norm <%.6g>][ lr <%.6g>][ val_loss <%.9g>]
//                                                              once per step (not a terminal);
//                                                              val_loss at --eval-every steps
//   eval: step <n> val_loss <%.9g> (<k> batches)               --eval-data with no steps
//   checkpoint: step <n> saved to <dir>                        with --save-every
//   gradients: <n> tensors of micro-batch <p> written to <file> with --dump-gradients
//   adapter: <n> adapters (<n> tensors, LoRA|DoRA r<r> alpha <a>) written to <dir>
//                                                              with --export-adapter
//   merged: <n> tensors (<m> adapted weights merged) written to <file> with --export-merged
//   prompt: <escaped>                                          with --generate
//   generated: <escaped>
//   memory: arena <i> '<name>' (<lifetime>, <space>): planned <X> MiB (<x> B), measured <Y> MiB
//   (<y> B) memory: planned <X> MiB (weights .., gradients .., optimizer state .., activations ..,
//           workspace .., inputs ..) measured <Y> MiB
//   time: <n> steps in <s> s, <r> tokens/s
// On a terminal the step lines are replaced by one line rewritten in place (docs/training.md).
// Warnings go to stderr: a GaLore projector refresh skipped, an FP8 operand whose underflow
// fraction exceeds --fp8-underflow-warn at a --fp8-stats-every step.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Checkpoint.h"
#include "bonsai/runtime/Data.h"
#include "bonsai/runtime/Executor.h"
#include "bonsai/runtime/Export.h"
#include "bonsai/runtime/Metrics.h"
#include "bonsai/runtime/Plan.h"
#include "bonsai/runtime/Safetensors.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <map>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

namespace rt = bonsai::rt;

namespace {

const char *const kSynopsis =
    "usage: bonsai-run PLAN [--weights FILE | --resume [CKPT]] [--data TOKENS.bin] [--seed N]\n"
    "                       [--steps N] [--micro-batches K] [--lr X] [--metrics FILE.jsonl]\n"
    "                       [--save-every N --ckpt-dir DIR] [--dump-gradients FILE.safetensors]\n"
    "                       [--export-adapter DIR [--base-model NAME]]\n"
    "                       [--export-merged FILE.safetensors]\n"
    "                       [--generate TEXT [--max-new-bytes N]] [--backend=cuda|cpu] [--device N]\n"
    "                       [--fp8-stats-every N] [--fp8-underflow-warn F]\n"
    "                       [--eval-data TOKENS.bin --eval-every N [--eval-batches K]]\n";

const char *const kHelp =
    "\n"
    "Runs N steps of a plan compiled by bonsai-compile: for a training plan each step runs the\n"
    "forward and backward pass once per micro-batch and the optimizer update once; for a\n"
    "forward-only plan it computes the loss. Prints each step's loss, then the planned and\n"
    "measured memory of each arena. See docs/training.md and docs/checkpoints.md.\n"
    "\n"
    "  --weights FILE        parameters by name from a .safetensors file or a sharded\n"
    "                        checkpoint's .safetensors.index.json (default: random init)\n"
    "  --resume [CKPT]       continue from a checkpoint: CKPT is a checkpoint directory or a\n"
    "                        --ckpt-dir whose 'latest' names one (default: --ckpt-dir)\n"
    "  --data FILE           a Bonsai token file (docs/data-format.md) (default: random tokens);\n"
    "                        a version-2 file's documents are packed into rows, in an order\n"
    "                        shuffled each epoch from --seed\n"
    "  --no-shuffle          read a version-2 file's documents in file order every epoch\n"
    "  --seed N              seed of random init and random tokens (default 0)\n"
    "  --steps N             steps to run (default 1; 0 with --generate, --dump-gradients or\n"
    "                        an export)\n"
    "  --micro-batches K     forward+backward runs per update (default: the plan's)\n"
    "  --lr X                peak learning rate of every LearningRate kernel\n"
    "  --metrics FILE        one JSON object per step (appended to when resuming)\n"
    "  --save-every N        checkpoint every N steps into --ckpt-dir\n"
    "  --ckpt-dir DIR        where checkpoints go (DIR/step-NNNNNNNN, DIR/latest)\n"
    "  --dump-gradients FILE after the steps, run forward+backward on the next micro-batch\n"
    "                        without updating and write every gradient tensor to FILE\n"
    "  --export-adapter DIR  after the steps, write the LoRA/DoRA adapters as a PEFT adapter\n"
    "                        directory (adapter_config.json, adapter_model.safetensors)\n"
    "  --base-model NAME     base_model_name_or_path of the adapter's config (default empty)\n"
    "  --export-merged FILE  after the steps, write every model weight with the adapters\n"
    "                        merged into their base weights (docs/import-export.md)\n"
    "  --generate TEXT       after the steps, greedily generate bytes after TEXT\n"
    "  --max-new-bytes N     bytes to generate (default 64)\n"
    "  --backend NAME        cuda or cpu (default: cuda when a GPU is present)\n"
    "  --device N            CUDA device ordinal (default 0)\n"
    "  --no-cuda-graphs      launch kernels one by one instead of replaying CUDA Graphs\n"
    "  --profile             time every kernel of the last step and print where the time goes\n"
    "  --fp8-stats-every N   FP8 plans: every N steps, read each FP8 tensor's scale, amax,\n"
    "                        underflow and saturation fractions into the --metrics line\n"
    "                        (\"fp8\") and check the underflow (default 10; 0: never)\n"
    "  --fp8-underflow-warn F warn (stderr) when an FP8 operand's underflow fraction exceeds F\n"
    "                        at a stats step (default 0.01)\n"
    "  --eval-data FILE      a token file of held-out data: every --eval-every steps and\n"
    "                        after the last, the forward pass alone on its batches gives\n"
    "                        val_loss (step line, --metrics); training is unchanged\n"
    "  --eval-every N        steps between evaluations (those whose number is a multiple)\n"
    "  --eval-batches K      batches per evaluation, from the file's start (default: all)\n"
    "  --help                this text\n";

/// A command-line mistake: reported with the usage.
struct UsageError {
  std::string message;
};

struct Options {
  std::string plan;
  std::string weights;
  std::string data;
  std::optional<uint64_t> seed;
  bool noShuffle = false;
  std::optional<uint64_t> steps;
  std::optional<uint64_t> microBatches;
  std::optional<double> lr;
  std::string metrics;
  uint64_t saveEvery = 0;
  std::string ckptDir;
  bool resume = false;
  std::string resumePath;
  std::string dumpGradients;
  std::string exportAdapter;
  std::optional<std::string> baseModel;
  std::string exportMerged;
  std::optional<std::string> generate;
  std::optional<uint64_t> maxNewBytes;
  std::string backend;       ///< empty: cuda when a GPU is present, else cpu
  int device = 0;
  bool noCudaGraphs = false;
  bool profile = false;
  uint64_t fp8StatsEvery = 10;
  double fp8UnderflowWarn = 0.01;
  std::string evalData;
  std::optional<uint64_t> evalEvery;
  std::optional<uint64_t> evalBatches;
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

uint64_t parsePositive(const std::string &flag, const std::string &text) {
  if (text.empty() || text.size() > 20 ||
      text.find_first_not_of("0123456789") != std::string::npos ||
      text.find_first_not_of('0') == std::string::npos)
    throw UsageError{flag + " expects a positive integer, got '" + text + "'"};
  return parseCount(flag, text);
}

double parseRate(const std::string &flag, const std::string &text) {
  char *end = nullptr;
  errno = 0;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE ||
      !std::isfinite(value) || value < 0 || std::isspace(static_cast<unsigned char>(text[0])))
    throw UsageError{flag + " expects a finite non-negative number, got '" + text + "'"};
  return value;
}

bool isDirectory(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
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
      // A switch given a value (--profile=false) is a mistake, not a yes: bonsai-tokenize and
      // bonsai-compile refuse or honour it too.
      auto noValue = [&]() {
        if (hasValue)
          throw UsageError{flag + " takes no value"};
        return true;
      };
      if (flag == "--weights")
        o.weights = takeValue();
      else if (flag == "--data")
        o.data = takeValue();
      else if (flag == "--seed")
        o.seed = parseCount(flag, takeValue());
      else if (flag == "--no-shuffle")
        o.noShuffle = noValue();
      else if (flag == "--steps")
        o.steps = parseCount(flag, takeValue());
      else if (flag == "--micro-batches")
        o.microBatches = parseCount(flag, takeValue());
      else if (flag == "--lr")
        o.lr = parseRate(flag, takeValue());
      else if (flag == "--metrics")
        o.metrics = takeValue();
      else if (flag == "--save-every")
        o.saveEvery = parseCount(flag, takeValue());
      else if (flag == "--ckpt-dir")
        o.ckptDir = takeValue();
      else if (flag == "--dump-gradients")
        o.dumpGradients = takeValue();
      else if (flag == "--export-adapter")
        o.exportAdapter = takeValue();
      else if (flag == "--base-model")
        o.baseModel = takeValue();
      else if (flag == "--export-merged")
        o.exportMerged = takeValue();
      else if (flag == "--generate")
        o.generate = takeValue();
      else if (flag == "--max-new-bytes")
        o.maxNewBytes = parseCount(flag, takeValue());
      else if (flag == "--backend")
        o.backend = takeValue();
      else if (flag == "--device")
        o.device = int(parseCount(flag, takeValue()));
      else if (flag == "--no-cuda-graphs")
        o.noCudaGraphs = noValue();
      else if (flag == "--profile")
        o.profile = noValue();
      else if (flag == "--fp8-stats-every")
        o.fp8StatsEvery = parseCount(flag, takeValue());
      else if (flag == "--eval-data") {
        o.evalData = takeValue();
        if (o.evalData.empty())
          throw UsageError{"--eval-data needs a token file"};
      } else if (flag == "--eval-every")
        o.evalEvery = parsePositive(flag, takeValue());
      else if (flag == "--eval-batches")
        o.evalBatches = parsePositive(flag, takeValue());
      else if (flag == "--fp8-underflow-warn") {
        std::string text = takeValue();
        o.fp8UnderflowWarn = parseRate(flag, text);
        if (o.fp8UnderflowWarn > 1)
          throw UsageError{"--fp8-underflow-warn is a fraction in [0, 1], got " + text};
      }
      else if (flag == "--resume") {
        o.resume = true;
        // The path is optional: a following argument is taken as it when it is a directory
        // (checkpoints are directories, plans are files) or when the plan is already given.
        if (hasValue)
          o.resumePath = value;
        else if (i + 1 < argc && argv[i + 1][0] != '-' &&
                 (isDirectory(argv[i + 1]) || !o.plan.empty()))
          o.resumePath = argv[++i];
        if (hasValue && value.empty())
          throw UsageError{"--resume= needs a path"};
      } else
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
  if (!o.backend.empty() && o.backend != "cpu" && o.backend != "cuda")
    throw UsageError{"unknown backend '" + o.backend + "' (expected cpu or cuda)"};
  if (o.microBatches && (*o.microBatches == 0 || *o.microBatches > (uint64_t(1) << 20)))
    throw UsageError{"--micro-batches must be between 1 and 1048576"};
  if (o.saveEvery > 0 && o.ckptDir.empty())
    throw UsageError{"--save-every needs --ckpt-dir"};
  if (o.resume && o.resumePath.empty() && o.ckptDir.empty())
    throw UsageError{"--resume without a path needs --ckpt-dir"};
  if (o.resume && !o.weights.empty())
    throw UsageError{"--resume and --weights both give the parameters: use one"};
  if (o.baseModel && o.exportAdapter.empty())
    throw UsageError{"--base-model needs --export-adapter"};
  if (o.maxNewBytes && !o.generate)
    throw UsageError{"--max-new-bytes needs --generate"};
  if (o.generate && o.generate->empty())
    throw UsageError{"--generate needs a non-empty prompt"};
  if (o.evalEvery && o.evalData.empty())
    throw UsageError{"--eval-every needs --eval-data"};
  if (o.evalBatches && o.evalData.empty())
    throw UsageError{"--eval-batches needs --eval-data"};
  if (!o.evalData.empty() && !o.evalEvery)
    throw UsageError{"--eval-data needs --eval-every"};
  return o;
}

double mib(uint64_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

/// `bytes` with printable ASCII as is and everything else escaped (\n, \t, \r, \\, \xHH).
std::string escapeBytes(const std::string &bytes) {
  std::string out;
  for (char c : bytes) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (u >= 0x20 && u < 0x7f)
      out += c;
    else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    }
  }
  return out;
}

/// The logits generation reads from the plan: a float tensor named "logits" of [B, T, vocab],
/// or, in a training plan whose LM head is fused with its loss (bonsai-fuse's
/// linear-cross-entropy: no logits are stored), that kernel's x [B, T, D] and W [vocab, D],
/// from which generation computes the last position's logits itself.
struct LogitsSource {
  std::optional<uint32_t> logits;
  std::optional<size_t> fusedHead; ///< the LinearCrossEntropy kernel
  uint32_t x = 0, w = 0;
  int64_t vocab = 0;
};

LogitsSource findLogits(const rt::LoadedPlan &plan, int64_t B, int64_t T) {
  LogitsSource source;
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    const rt::TensorInfo &t = plan.tensors[i];
    if (t.name == "logits" && t.shape.size() == 3 && t.shape[0] == B && t.shape[1] == T &&
        rt::isComputeFloat(t.dtype)) {
      source.logits = i;
      source.vocab = t.shape[2];
      return source;
    }
  }
  for (size_t k = 0; k < plan.kernels.size(); ++k) {
    const rt::KernelInfo &kernel = plan.kernels[k];
    if (kernel.kind != rt::KernelKind::LinearCrossEntropy || kernel.phase != rt::Phase::Forward)
      continue;
    const rt::TensorInfo &x = plan.tensors[kernel.inputs[0]];
    const rt::TensorInfo &w = plan.tensors[kernel.inputs[1]];
    if (x.shape.size() == 3 && x.shape[0] == B && x.shape[1] == T && w.shape.size() == 2 &&
        w.shape[1] == x.shape[2] && rt::isComputeFloat(x.dtype) &&
        rt::isComputeFloat(w.dtype)) {
      source.fusedHead = k;
      source.x = kernel.inputs[0];
      source.w = kernel.inputs[1];
      source.vocab = w.shape[0];
      return source;
    }
  }
  throw rt::Error("--generate reads a float tensor named 'logits' of shape [" +
                  std::to_string(B) + ", " + std::to_string(T) +
                  ", vocab] or the operands of a fused LM head, and plan '" + plan.path +
                  "' has neither");
}

/// Greedy byte-level generation: the context (the last T bytes of prompt and output) goes into
/// row 0 of the ids, the Forward phase runs, and the argmax of the logits at the context's last
/// position, over ids below min(vocab, 256), is the next byte. With a fused LM head the Forward
/// kernels before it run and the logits of those ids are x's last row times W's rows, summed
/// in f32 here.
std::string generate(rt::Executor &executor, const std::string &prompt, uint64_t count) {
  const rt::LoadedPlan &plan = executor.plan();
  std::vector<int64_t> shape = executor.inputShape();
  int64_t B = shape[0], T = shape[1];
  LogitsSource source = findLogits(plan, B, T);
  int64_t V = source.vocab;
  int64_t limit = std::min<int64_t>({V, plan.vocabularySize(), 256});
  std::vector<int64_t> context;
  for (size_t i = 0; i < prompt.size(); ++i) {
    int64_t id = static_cast<unsigned char>(prompt[i]);
    if (id >= plan.vocabularySize())
      throw rt::Error("--generate: prompt byte " + std::to_string(i) + " is " + std::to_string(id) +
                      ", not below the plan's vocabulary size " +
                      std::to_string(plan.vocabularySize()));
    context.push_back(id);
  }
  rt::TokenBatch batch;
  batch.batch = B;
  batch.seq = T;
  batch.inputs.assign(size_t(B * T), 0);
  batch.labels.assign(size_t(B * T), 0);
  // W of a fused head does not change while generating: its first `limit` rows, once.
  int64_t D = 0;
  std::vector<float> head;
  if (source.fusedHead) {
    D = plan.tensors[source.x].shape[2];
    const rt::TensorView &w = executor.view(source.w);
    rt::TensorView rows = w;
    rows.shape = {limit, D};
    head.resize(size_t(limit * D));
    rt::loadF32(rows, head.data());
  }
  std::vector<float> row(static_cast<size_t>(source.fusedHead ? limit : V));
  std::vector<float> xRow(static_cast<size_t>(D));
  // Views are taken once (taking one copies every arena back); each step fetches one tensor.
  const rt::TensorView &view = executor.view(source.fusedHead ? source.x : *source.logits);
  std::string out;
  for (uint64_t n = 0; n < count; ++n) {
    size_t start = context.size() > size_t(T) ? context.size() - size_t(T) : 0;
    size_t length = context.size() - start;
    for (int64_t t = 0; t < T; ++t)
      batch.inputs[size_t(t)] = size_t(t) < length ? context[start + size_t(t)] : 0;
    if (source.fusedHead) {
      executor.forwardPrefix(batch, *source.fusedHead);
      executor.fetch(source.x);
      rt::TensorView last;
      last.dtype = view.dtype;
      last.shape = {D};
      last.data =
          static_cast<char *>(view.data) + (length - 1) * size_t(D) * rt::dtypeSize(view.dtype);
      rt::loadF32(last, xRow.data());
      for (int64_t v = 0; v < limit; ++v) {
        float sum = 0.0f;
        for (int64_t d = 0; d < D; ++d)
          sum += xRow[size_t(d)] * head[size_t(v * D + d)];
        row[size_t(v)] = sum;
      }
    } else {
      executor.forward(batch);
      executor.fetch(*source.logits);
      rt::TensorView last;
      last.dtype = view.dtype;
      last.shape = {V};
      last.data =
          static_cast<char *>(view.data) + (length - 1) * size_t(V) * rt::dtypeSize(view.dtype);
      rt::loadF32(last, row.data());
    }
    int64_t best = 0;
    for (int64_t v = 1; v < limit; ++v)
      if (row[size_t(v)] > row[size_t(best)] || std::isnan(row[size_t(best)]))
        best = v;
    context.push_back(best);
    out += char(best);
  }
  return out;
}

/// Where the profiled step's time went (`ms`, per plan kernel): by kernel kind and phase, then
/// the slowest kernels.
void printProfile(const rt::LoadedPlan &plan, const std::vector<double> &ms) {
  double total = 0;
  for (double t : ms)
    total += t;
  if (total <= 0)
    return;
  static const char *phases[] = {"forward", "backward", "update"};
  std::map<std::pair<std::string, int>, std::pair<double, int>> byKind;
  for (size_t i = 0; i < ms.size(); ++i) {
    auto &entry = byKind[{rt::kernelKindName(plan.kernels[i].kind), int(plan.kernels[i].phase)}];
    entry.first += ms[i];
    entry.second += 1;
  }
  std::vector<std::pair<double, std::string>> rows;
  for (auto &[key, value] : byKind) {
    char line[160];
    std::snprintf(line, sizeof line, "profile: %-18s %-8s %6d kernels %9.3f ms %5.1f%%",
                  key.first.c_str(), phases[key.second], value.second, value.first,
                  100.0 * value.first / total);
    rows.push_back({value.first, line});
  }
  std::sort(rows.rbegin(), rows.rend());
  std::printf("profile: one step, %.3f ms in kernels (timed one by one, without CUDA Graphs)\n",
              total);
  for (auto &row : rows)
    std::printf("%s\n", row.second.c_str());
  std::vector<size_t> order(ms.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ms[a] > ms[b]; });
  for (size_t j = 0; j < std::min<size_t>(8, order.size()); ++j)
    std::printf("profile: slowest %zu: %.3f ms %s\n", j + 1, ms[order[j]],
                plan.describeKernel(order[j]).c_str());
  std::fflush(stdout);
}

int run(const Options &o) {
  rt::ExecutorOptions executorOptions;
  executorOptions.device = o.device;
  executorOptions.cudaGraphs = !o.noCudaGraphs;
  std::string backend = o.backend.empty() ? (rt::cudaDeviceAvailable() ? "cuda" : "cpu")
                                          : o.backend;
  executorOptions.backend = backend == "cuda" ? rt::Backend::Cuda : rt::Backend::Cpu;

  rt::LoadedPlan plan = rt::loadPlanFile(o.plan);
  // An export that cannot happen is reported before the steps, not after them.
  if (!o.exportAdapter.empty()) {
    rt::checkPeftExportable(plan);
    rt::checkExportDestination(o.exportAdapter, "--export-adapter", /*directory=*/true);
  }
  if (!o.exportMerged.empty())
    rt::checkExportDestination(o.exportMerged, "--export-merged", /*directory=*/false);
  uint32_t microBatches = uint32_t(o.microBatches.value_or(plan.microBatches));
  const std::vector<int64_t> &inputShape = plan.tensors[plan.inputs[0]].shape;
  uint64_t tokensPerMicroBatch = uint64_t(inputShape[0] * inputShape[1]);
  std::string perStep = std::to_string(tokensPerMicroBatch * microBatches) + " tokens/step";
  if (microBatches > 1)
    perStep += " (" + std::to_string(microBatches) + " micro-batches of " +
               std::to_string(tokensPerMicroBatch) + ")";
  std::printf("plan %s: model %s, target %s, %zu kernels, %zu tensors, %zu arenas, %s\n",
              o.plan.c_str(), plan.model.empty() ? "(unnamed)" : plan.model.c_str(),
              plan.targetArch.empty() ? "(none)" : plan.targetArch.c_str(), plan.kernels.size(),
              plan.tensors.size(), plan.arenas.size(), perStep.c_str());
  std::fflush(stdout);

  rt::Executor executor(plan, executorOptions);
  std::printf("backend: %s\n", executor.describeBackend().c_str());
  std::fflush(stdout);
  executor.checkMicroBatches(microBatches);
  if (!o.dumpGradients.empty())
    if (std::optional<size_t> update = plan.updateInBackward())
      throw rt::Error("--dump-gradients: plan '" + plan.path + "' keeps no gradients: " +
                      plan.describeKernel(*update) +
                      " applies its update in the backward pass (the recipe's "
                      "update_in_backward)");
  if (o.lr)
    executor.overrideLearningRate(*o.lr);

  rt::TrainingPosition position;
  position.seed = o.seed.value_or(0);
  if (o.resume) {
    std::string dir = rt::resolveCheckpoint(o.resumePath.empty() ? o.ckptDir : o.resumePath);
    rt::CheckpointManifest manifest = rt::loadCheckpoint(dir, executor);
    if (o.seed && *o.seed != manifest.position.seed)
      throw rt::Error("--seed " + std::to_string(*o.seed) + " differs from the seed " +
                      std::to_string(manifest.position.seed) + " of checkpoint '" + dir +
                      "' (a resumed run continues the checkpoint's streams)");
    position = manifest.position;
    std::printf("resume: %s (step %" PRIu64 ", micro-batch %" PRIu64 ")\n", dir.c_str(),
                position.step, position.dataPosition);
    std::fflush(stdout);
  } else if (!o.weights.empty()) {
    executor.bindWeights(rt::Checkpoint::open(o.weights), position.seed);
  } else {
    executor.initWeights(position.seed);
  }

  std::vector<int64_t> shape = executor.inputShape();
  rt::TokenLoader loader(o.data, shape[0], shape[1], plan.vocabularySize(), position.seed,
                         !o.noShuffle);
  // The held-out data is checked whole before the first step: a file of another vocabulary
  // or too short is an error now, not after N steps of training.
  std::unique_ptr<rt::TokenLoader> evalLoader;
  uint64_t evalBatches = 0;
  if (!o.evalData.empty()) {
    try {
      // Held-out data is read in file order: every evaluation sees the same batches.
      evalLoader = std::make_unique<rt::TokenLoader>(o.evalData, shape[0], shape[1],
                                                     plan.vocabularySize(), position.seed,
                                                     /*shuffle=*/false);
      if (loader.file())
        rt::checkSameTokenizer(*loader.file(), *evalLoader->file());
    } catch (const rt::Error &e) {
      throw rt::Error(std::string("--eval-data: ") + e.what());
    }
    uint64_t available = evalLoader->fileBatches();
    evalBatches = o.evalBatches.value_or(available);
    if (evalBatches > available)
      throw rt::Error("--eval-batches " + std::to_string(evalBatches) + ": token file '" +
                      o.evalData + "' holds " + std::to_string(available) + " batch" +
                      (available == 1 ? "" : "es") + " of " + std::to_string(shape[0]) + " x " +
                      std::to_string(shape[1]) +
                      " (batch m reads tokens m*B*T to (m+1)*B*T, B*T + 1 of them)");
    try {
      for (uint64_t m = 0; m < evalBatches; ++m)
        evalLoader->batch(m);
    } catch (const rt::Error &e) {
      throw rt::Error(std::string("--eval-data: ") + e.what());
    }
  }
  bool exports = !o.exportAdapter.empty() || !o.exportMerged.empty();
  uint64_t steps =
      o.steps.value_or(o.generate || !o.dumpGradients.empty() || exports ? 0 : 1);
  uint64_t tokensPerStep = uint64_t(microBatches) * uint64_t(shape[0] * shape[1]);
  std::unique_ptr<rt::MetricsFile> metrics;
  if (!o.metrics.empty())
    metrics = std::make_unique<rt::MetricsFile>(o.metrics, o.resume);
  rt::Progress progress(stdout, ::isatty(::fileno(stdout)) == 1);

  uint64_t firstStep = position.step + 1;
  uint64_t plannedBytes = 0;
  for (const rt::ArenaInfo &a : plan.arenas)
    plannedBytes += a.size;
  std::vector<double> profiled;
  double evalSeconds = 0; // not training: left out of the time line's throughput
  auto start = std::chrono::steady_clock::now();
  try {
    for (uint64_t s = 0; s < steps; ++s) {
      // The last step is the profiled one: earlier steps warm caches, graphs and plans up.
      if (o.profile && s + 1 == steps)
        executor.setProfiling(true);
      auto stepStart = std::chrono::steady_clock::now();
      rt::StepResult result = executor.trainStep(loader, position.dataPosition, microBatches);
      auto now = std::chrono::steady_clock::now();
      position.step += 1;
      position.dataPosition += microBatches;
      // Read before an evaluation, whose forward passes the profile must not count.
      if (o.profile && s + 1 == steps)
        profiled = executor.kernelMilliseconds();
      std::optional<float> valLoss;
      if (evalLoader && (position.step % *o.evalEvery == 0 || s + 1 == steps)) {
        auto evalStart = std::chrono::steady_clock::now();
        valLoss = executor.evaluate(*evalLoader, evalBatches);
        evalSeconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - evalStart).count();
      }
      for (const auto &[name, why] : result.galoreSkipped)
        std::fprintf(stderr,
                     "warning: step %" PRIu64 ": GaLore projector of '%s' not refreshed: %s\n",
                     position.step, name.c_str(),
                     why == 1 ? "non-finite gradient" : "rank-deficient gradient sketch");

      rt::StepReport report;
      report.step = position.step;
      report.lastStep = firstStep + steps - 1;
      report.loss = result.loss;
      report.gradNorm = result.gradNorm;
      report.lr = result.lr;
      report.valLoss = valLoss;
      report.microBatches = microBatches;
      report.tokens = tokensPerStep;
      report.stepSeconds = std::chrono::duration<double>(now - stepStart).count();
      report.elapsedSeconds = std::chrono::duration<double>(now - start).count();
      report.plannedBytes = plannedBytes;
      for (const rt::ArenaUsage &u : executor.memoryUsage())
        report.measuredBytes += u.measured;
      // FP8 telemetry (docs/fp8.md): a small read of each FP8 state every N steps.
      std::string fp8Warning;
      if (o.fp8StatsEvery > 0 && position.step % o.fp8StatsEvery == 0) {
        report.fp8 = executor.fp8Summary();
        if (report.fp8)
          fp8Warning =
              rt::formatFp8UnderflowWarning(*report.fp8, position.step, o.fp8UnderflowWarn);
      }
      progress.step(report, firstStep);
      if (!fp8Warning.empty())
        progress.note(fp8Warning, stderr);
      if (metrics)
        metrics->write(report);
      if (o.saveEvery > 0 && position.step % o.saveEvery == 0) {
        std::string dir = rt::saveCheckpoint(o.ckptDir, executor, position);
        progress.note("checkpoint: step " + std::to_string(position.step) + " saved to " + dir);
      }
    }
  } catch (...) {
    progress.finish(); // an error line starts on a line of its own
    throw;
  }
  progress.finish();
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() - evalSeconds;
  if (evalLoader && steps == 0) {
    // No step to attach it to: evaluate the weights as loaded (a checkpoint, --weights).
    float value = executor.evaluate(*evalLoader, evalBatches);
    std::printf("eval: step %" PRIu64 " val_loss %.9g (%" PRIu64 " batches)\n", position.step,
                double(value), evalBatches);
    std::fflush(stdout);
  }

  // Exports read the trained parameters; nothing after this point changes them.
  if (!o.exportAdapter.empty()) {
    rt::ExportSummary written =
        rt::exportPeftAdapter(o.exportAdapter, executor, o.baseModel.value_or(""));
    const rt::AdapterInfo &a = plan.adapters.front();
    std::printf("adapter: %zu adapters (%zu tensors, %s r%u alpha %g) written to %s\n",
                plan.adapters.size(), written.tensors, a.magnitude ? "DoRA" : "LoRA", a.rank,
                a.alpha, o.exportAdapter.c_str());
    std::fflush(stdout);
  }
  if (!o.exportMerged.empty()) {
    rt::ExportSummary written = rt::exportMergedWeights(o.exportMerged, executor);
    std::printf("merged: %zu tensors (%zu adapted weights merged) written to %s\n",
                written.tensors, written.merged, o.exportMerged.c_str());
    std::fflush(stdout);
  }
  if (!o.dumpGradients.empty()) {
    if (!plan.hasBackward())
      throw rt::Error("--dump-gradients: plan '" + plan.path + "' has no backward phase");
    // One micro-batch's gradient of its own loss: LossScale 1, accumulators zero between steps.
    executor.forwardBackward(loader.batch(position.dataPosition), 1.0f);
    size_t count = rt::writeGradients(o.dumpGradients, executor);
    std::printf("gradients: %zu tensors of micro-batch %" PRIu64 " written to %s\n", count,
                position.dataPosition, o.dumpGradients.c_str());
    std::fflush(stdout);
  }
  if (o.profile && steps > 0)
    printProfile(plan, profiled);
  if (o.generate) {
    std::string text = generate(executor, *o.generate, o.maxNewBytes.value_or(64));
    std::printf("prompt: %s\ngenerated: %s\n", escapeBytes(*o.generate).c_str(),
                escapeBytes(text).c_str());
    std::fflush(stdout);
  }

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
  if (uint64_t device = executor.measuredDeviceBytes())
    // The driver's count (cudaMemGetInfo at start and at every synchronisation): the arenas
    // plus what the CUDA runtime holds for the kernels (cuBLASLt workspace, scratch pools).
    std::printf("device memory: measured peak %" PRIu64 " bytes (%.2f MiB, driver), planned %.2f MiB, "
                "%+.2f%%\n",
                device, mib(device), mib(planned),
                planned ? 100.0 * (double(device) - double(planned)) / double(planned) : 0.0);
  double tokens = double(steps) * double(tokensPerStep);
  std::printf("time: %" PRIu64 " steps in %.3f s, %.0f tokens/s", steps, seconds,
              seconds > 0 ? tokens / seconds : 0.0);
  if (evalSeconds > 0)
    std::printf(" (evaluation: %.3f s more)", evalSeconds);
  std::printf("\n");
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
