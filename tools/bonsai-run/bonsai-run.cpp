//===- bonsai-run.cpp - Run and train a compiled Bonsai plan --------------===//
//
// Loads and verifies a plan, binds its parameters (safetensors weights, a checkpoint to resume,
// or random init from the seed), and runs N steps on the CPU backend: each step runs the plan's
// Forward and Backward kernels once per micro-batch and its Update kernels once (a plan without
// Update kernels just computes the loss). It reports every step, writes JSON-line metrics and
// crash-safe checkpoints when asked, evaluates on held-out data (forward only) every N steps, can
// dump one micro-batch's gradients, export the fine-tune (a PEFT adapter, the merged weights as
// a Hugging Face model directory or one file), and generate text from the trained model, byte by
// byte or with the model's tokenizer. --print-plan prints the plan and runs nothing.
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
//   checkpoint: removed <dir> (--keep-last <n>)                with --keep-last
//   interrupted: SIGINT|SIGTERM, stopped after step <n>: checkpoint saved to <dir>|nothing
//           saved (no --ckpt-dir)                              a signal during the steps; then
//                                                              exit 0 (docs/checkpoints.md)
//   gradients: <n> tensors of micro-batch <p> written to <file> with --dump-gradients
//   adapter: <n> adapters (<n> tensors, LoRA|DoRA r<r> alpha <a>) written to <dir>
//                                                              with --export-adapter
//   merged: <n> tensors (<m> adapted weights merged) written to <file>
//                                                              --export-merged FILE.safetensors
//   merged: <n> tensors (<m> adapted weights merged) in <s> shard[s], config.json from <dir>|
//           rebuilt from the plan, <k> tokenizer file[s], written to <dir>  --export-merged DIR
//   tokenizer: <description>                                   with --generate --tokenizer
//   prompt: <escaped>                                          with --generate
//   generated: <escaped>
//   memory: arena <i> '<name>' (<lifetime>, <space>): planned <X> MiB (<x> B), measured <Y> MiB
//   (<y> B) memory: planned <X> MiB (weights .., gradients .., optimizer state .., activations ..,
//           workspace .., inputs ..) measured <Y> MiB
//   memory: pinned host arenas planned <X> MiB, measured <Y> MiB; device arenas planned ..
//           (a plan with offloaded state)
//   time: <n> steps in <s> s, <r> tokens/s
// On a terminal the step lines are replaced by one line rewritten in place (docs/training.md).
// Warnings go to stderr: a GaLore projector refresh skipped, an FP8 operand whose underflow
// fraction exceeds --fp8-underflow-warn at a --fp8-stats-every step; so does the note naming
// the Hugging Face tensors --weights skipped. --print-plan's output is rt::printPlan's
// (docs/plan-format.md).
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Checkpoint.h"
#include "bonsai/runtime/Communicator.h"
#include "bonsai/runtime/CrashReport.h"
#include "bonsai/runtime/Data.h"
#include "bonsai/runtime/Executor.h"
#include "bonsai/runtime/Export.h"
#include "bonsai/runtime/HostThreads.h"
#include "bonsai/runtime/Metrics.h"
#include "bonsai/runtime/Plan.h"
#include "bonsai/runtime/PlanPrinter.h"
#include "bonsai/runtime/Safetensors.h"
#include "bonsai/runtime/Sha256.h"
#include "bonsai/runtime/SpikeRule.h"
#include "bonsai/tokenizer/Tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

namespace rt = bonsai::rt;

namespace {

const char *const kSynopsis =
    "usage: bonsai-run PLAN [--weights FILE | --resume [CKPT]] [--data TOKENS.bin] [--seed N]\n"
    "                       [--steps N] [--micro-batches K] [--lr X] [--metrics FILE.jsonl]\n"
    "                       [--max-nonfinite N] [--find-nonfinite]\n"
    "                       [--spike-zscore Z [--spike-window N]]\n"
    "                       [--save-every N --ckpt-dir DIR [--keep-last N]]\n"
    "                       [--dump-gradients FILE.safetensors]\n"
    "                       [--export-adapter DIR [--base-model NAME]]\n"
    "                       [--export-merged DIR|FILE.safetensors [--hf-dir DIR]\n"
    "                        [--shard-size SIZE]]\n"
    "                       [--generate TEXT [--max-new-bytes N | --tokenizer PATH\n"
    "                        [--max-new-tokens N]]] [--backend=cuda|cpu] [--device N]\n"
    "                       [--nproc N]\n"
    "                       [--fp8-stats-every N] [--fp8-underflow-warn F]\n"
    "                       [--eval-data TOKENS.bin --eval-every N [--eval-batches K]]\n"
    "       bonsai-run PLAN --print-plan\n";

const char *const kHelp =
    "\n"
    "Runs N steps of a plan compiled by bonsai-compile: for a training plan each step runs the\n"
    "forward and backward pass once per micro-batch and the optimizer update once; for a\n"
    "forward-only plan it computes the loss. Prints each step's loss, then the planned and\n"
    "measured memory of each arena. See docs/training.md and docs/checkpoints.md.\n"
    "\n"
    "  --weights FILE|DIR    parameters by name from a .safetensors file, a sharded\n"
    "                        checkpoint's .safetensors.index.json or a Hugging Face model\n"
    "                        directory (default: random init); tensors HF keeps that no\n"
    "                        computation reads (rotary inv_freq, GPT-2's mask buffers, a\n"
    "                        tied lm_head) are skipped with a note\n"
    "  --resume [CKPT]       continue from a checkpoint: CKPT is a checkpoint directory or a\n"
    "                        --ckpt-dir whose 'latest' names one (default: --ckpt-dir); an\n"
    "                        adapter checkpoint needs the run's base: the same --weights\n"
    "                        (or none, for a base from random init)\n"
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
    "  --max-nonfinite N     a step whose loss or gradient norm is not finite skips its\n"
    "                        update; N such steps in a row stop the run (default 3; 0: no\n"
    "                        check, every update runs)\n"
    "  --find-nonfinite      after a skipped step, run it again kernel by kernel and name\n"
    "                        the first kernel and tensor that became non-finite (slow)\n"
    "  --spike-zscore Z      also skip the update of a step whose loss or gradient norm is\n"
    "                        more than Z standard deviations above the mean of the last\n"
    "                        --spike-window steps (off by default; counted with the\n"
    "                        non-finite steps by --max-nonfinite)\n"
    "  --spike-window N      steps in the spike rule's mean and deviation (default 100)\n"
    "  --save-every N        checkpoint every N steps into --ckpt-dir\n"
    "  --ckpt-dir DIR        where checkpoints go (DIR/step-NNNNNNNN, DIR/latest); SIGINT or\n"
    "                        SIGTERM during the steps finishes the step, saves it here and\n"
    "                        exits 0 (a second signal exits at once)\n"
    "  --keep-last N         after each save, remove all but the newest N checkpoints of\n"
    "                        --ckpt-dir (never the latest, which the new one has replaced)\n"
    "  --dump-gradients FILE after the steps, run forward+backward on the next micro-batch\n"
    "                        without updating and write every gradient tensor to FILE\n"
    "  --export-adapter DIR  after the steps, write the LoRA/DoRA adapters as a PEFT adapter\n"
    "                        directory (adapter_config.json, adapter_model.safetensors)\n"
    "  --base-model NAME     base_model_name_or_path of the adapter's config (default empty)\n"
    "  --export-merged DIR|FILE.safetensors\n"
    "                        after the steps, write every model weight with the adapters\n"
    "                        merged into their base weights (NF4 dequantized): DIR is a\n"
    "                        Hugging Face model directory (sharded safetensors, index,\n"
    "                        config.json, tokenizer files) in the source dtype; a\n"
    "                        .safetensors path one file (docs/import-export.md)\n"
    "  --hf-dir DIR          the model directory whose config.json and tokenizer files\n"
    "                        --export-merged DIR copies (default: --weights DIR; else the\n"
    "                        config is rebuilt from the plan, Llama and GPT-2 shapes)\n"
    "  --shard-size SIZE     largest shard of --export-merged DIR (default 5GB)\n"
    "  --generate TEXT       after the steps, greedily generate bytes after TEXT\n"
    "  --max-new-bytes N     bytes to generate (default 64)\n"
    "  --tokenizer PATH      generate with the model's tokenizer (a Hugging Face model\n"
    "                        directory, tokenizer.json or tokenizer.model): the prompt is\n"
    "                        encoded with it and the output decoded; its vocabulary must be\n"
    "                        the plan's (default: bytes, token id = byte value)\n"
    "  --max-new-tokens N    tokens to generate with --tokenizer (default 64; stops at EOS)\n"
    "  --backend NAME        cuda or cpu (default: cuda when a GPU is present)\n"
    "  --device N            CUDA device ordinal (default 0; a rank of several: its local\n"
    "                        rank)\n"
    "  --nproc N             start N ranks on this machine (mpirun -np N bonsai-run ...,\n"
    "                        for a plan compiled with bonsai.shard ... ranks N)\n"
    "  --no-cuda-graphs      launch kernels one by one instead of replaying CUDA Graphs\n"
    "  --nondeterministic    let CUDA kernels add partial results in the order their blocks\n"
    "                        run: faster (attention's backward on Hopper forms dq in its\n"
    "                        dk/dv pass), but losses differ in their last bits from run to\n"
    "                        run and a resumed run is no longer bit-identical (the CPU\n"
    "                        backend is deterministic either way)\n"
    "  --offload-timing      a plan with offloaded state: time its copies and the compute\n"
    "                        stream's waits for them, each step, into the metrics (times,\n"
    "                        GB/s each way, exposed time), a closing 'offload:' line and a\n"
    "                        warning when the link runs below half its rate (costs 3-20% of\n"
    "                        the step on a GPU; without, the metrics keep bytes and host time)\n"
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
    "  --print-plan          print the plan (tensors, kernels in order, memory, what a\n"
    "                        checkpoint holds) and exit\n"
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
  uint64_t maxNonFinite = 3; ///< 0: the guard is off
  bool findNonFinite = false;
  std::optional<double> spikeZscore;
  std::optional<uint64_t> spikeWindow;
  std::optional<uint64_t> keepLast;
  std::string ckptDir;
  bool resume = false;
  std::string resumePath;
  std::string dumpGradients;
  std::string exportAdapter;
  std::optional<std::string> baseModel;
  std::string exportMerged;
  std::string hfDir;
  std::optional<uint64_t> shardSize;
  std::optional<std::string> generate;
  std::optional<uint64_t> maxNewBytes;
  std::optional<uint64_t> maxNewTokens;
  std::string tokenizer;
  std::string backend;       ///< empty: cuda when a GPU is present, else cpu
  int device = 0;
  bool deviceGiven = false; ///< --device was given (else a rank takes its local rank's GPU)
  /// --nproc: the ranks to start on this machine through mpirun (0: none, run here).
  uint64_t nproc = 0;
  bool noCudaGraphs = false;
  bool nondeterministic = false;
  bool offloadTiming = false;
  bool profile = false;
  uint64_t fp8StatsEvery = 10;
  double fp8UnderflowWarn = 0.01;
  std::string evalData;
  std::optional<uint64_t> evalEvery;
  std::optional<uint64_t> evalBatches;
  bool printPlan = false;
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

/// A byte count: digits with an optional unit, decimal (KB, MB, GB) or binary (KiB, MiB, GiB),
/// as Hugging Face's max_shard_size spells them ("5GB").
uint64_t parseSize(const std::string &flag, const std::string &text) {
  size_t digits = text.find_first_not_of("0123456789");
  std::string unit = digits == std::string::npos ? "" : text.substr(digits);
  static const std::pair<const char *, uint64_t> units[] = {
      {"", 1},          {"B", 1},           {"KB", 1000},          {"MB", 1000000},
      {"GB", 1000000000}, {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30}};
  for (const auto &[name, scale] : units)
    if (unit == name) {
      uint64_t value = parsePositive(flag, text.substr(0, digits));
      if (value > UINT64_MAX / scale)
        break;
      return value * scale;
    }
  throw UsageError{flag + " expects a positive size such as 5GB, 500MB or 2GiB, got '" + text +
                   "'"};
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

bool endsWith(const std::string &text, const std::string &suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
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
      else if (flag == "--nproc")
        o.nproc = parseCount(flag, takeValue());
      else if (flag == "--micro-batches")
        o.microBatches = parseCount(flag, takeValue());
      else if (flag == "--lr")
        o.lr = parseRate(flag, takeValue());
      else if (flag == "--metrics")
        o.metrics = takeValue();
      else if (flag == "--save-every")
        o.saveEvery = parseCount(flag, takeValue());
      else if (flag == "--max-nonfinite")
        o.maxNonFinite = parseCount(flag, takeValue());
      else if (flag == "--spike-zscore") {
        std::string text = takeValue();
        o.spikeZscore = parseRate(flag, text);
        if (*o.spikeZscore == 0)
          throw UsageError{"--spike-zscore expects a positive number of standard deviations, "
                           "got " + text};
      } else if (flag == "--spike-window") {
        std::string text = takeValue();
        o.spikeWindow = parseCount(flag, text);
        if (*o.spikeWindow < 2 || *o.spikeWindow > rt::kMaxSpikeWindow)
          throw UsageError{"--spike-window is between 2 and " +
                           std::to_string(rt::kMaxSpikeWindow) + " steps, got " + text};
      }
      else if (flag == "--keep-last")
        o.keepLast = parsePositive(flag, takeValue());
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
      else if (flag == "--hf-dir")
        o.hfDir = takeValue();
      else if (flag == "--shard-size")
        o.shardSize = parseSize(flag, takeValue());
      else if (flag == "--generate")
        o.generate = takeValue();
      else if (flag == "--max-new-bytes")
        o.maxNewBytes = parseCount(flag, takeValue());
      else if (flag == "--max-new-tokens")
        o.maxNewTokens = parseCount(flag, takeValue());
      else if (flag == "--tokenizer")
        o.tokenizer = takeValue();
      else if (flag == "--backend")
        o.backend = takeValue();
      else if (flag == "--device") {
        o.device = int(parseCount(flag, takeValue()));
        o.deviceGiven = true;
      } else if (flag == "--find-nonfinite")
        o.findNonFinite = noValue();
      else if (flag == "--no-cuda-graphs")
        o.noCudaGraphs = noValue();
      else if (flag == "--nondeterministic")
        o.nondeterministic = noValue();
      else if (flag == "--offload-timing")
        o.offloadTiming = noValue();
      else if (flag == "--profile")
        o.profile = noValue();
      else if (flag == "--print-plan")
        o.printPlan = noValue();
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
  if (o.keepLast && o.saveEvery == 0)
    throw UsageError{"--keep-last needs --save-every and --ckpt-dir"};
  if (o.findNonFinite && o.maxNonFinite == 0)
    throw UsageError{"--find-nonfinite needs the non-finite guard (--max-nonfinite above 0)"};
  if (o.spikeZscore && o.maxNonFinite == 0)
    throw UsageError{"--spike-zscore needs the non-finite guard (--max-nonfinite above 0), "
                     "which skips the updates"};
  if (o.spikeWindow && !o.spikeZscore)
    throw UsageError{"--spike-window needs --spike-zscore"};
  if (!o.hfDir.empty() && o.exportMerged.empty())
    throw UsageError{"--hf-dir needs --export-merged"};
  if (o.shardSize && o.exportMerged.empty())
    throw UsageError{"--shard-size needs --export-merged"};
  if (o.baseModel && o.exportAdapter.empty())
    throw UsageError{"--base-model needs --export-adapter"};
  if (o.maxNewBytes && !o.generate)
    throw UsageError{"--max-new-bytes needs --generate"};
  if (o.maxNewTokens && o.tokenizer.empty())
    throw UsageError{"--max-new-tokens needs --tokenizer (byte-level generation counts "
                     "--max-new-bytes)"};
  if (o.maxNewBytes && !o.tokenizer.empty())
    throw UsageError{"--max-new-bytes is for byte-level generation: with --tokenizer, give "
                     "--max-new-tokens"};
  if (!o.tokenizer.empty() && !o.generate)
    throw UsageError{"--tokenizer needs --generate"};
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

/// The SIGINT or SIGTERM received during the steps, 0 while none (docs/checkpoints.md,
/// "Interrupting a run"). The handler only records it: the step loop reads it between steps, so
/// the step in flight finishes and a checkpoint can be saved before the run exits 0.
volatile std::sig_atomic_t gStopSignal = 0;

/// Async-signal-safe: sets the flag, or, at a second signal (the first is still being honoured:
/// a long step or save), restores the default action and raises the signal again, so the
/// process ends at once as the signal ends it by default (signal() and raise() are both on
/// POSIX's list of async-signal-safe functions).
extern "C" void onStopSignal(int number) {
  if (gStopSignal != 0) {
    std::signal(number, SIG_DFL);
    std::raise(number);
    return;
  }
  gStopSignal = number;
}

/// Installs onStopSignal for SIGINT and SIGTERM while it lives, and puts the previous actions
/// back when it goes: only the training steps stop gracefully; loading, exports and generation
/// keep the default (immediate) action. SA_RESTART: no read, write or fsync of a step or a save
/// fails with EINTR. A signal that was ignored when the run started (nohup) stays ignored.
class StopSignals {
public:
  StopSignals() {
    for (int i = 0; i < 2; ++i) {
      struct sigaction action = {};
      action.sa_handler = onStopSignal;
      sigemptyset(&action.sa_mask);
      action.sa_flags = SA_RESTART;
      ::sigaction(kSignals[i], nullptr, &previous_[i]);
      if (previous_[i].sa_handler != SIG_IGN)
        ::sigaction(kSignals[i], &action, nullptr);
    }
  }
  ~StopSignals() {
    for (int i = 0; i < 2; ++i)
      ::sigaction(kSignals[i], &previous_[i], nullptr);
  }
  StopSignals(const StopSignals &) = delete;
  StopSignals &operator=(const StopSignals &) = delete;

private:
  static constexpr int kSignals[2] = {SIGINT, SIGTERM};
  struct sigaction previous_[2];
};

/// Binds --weights (a safetensors file, a sharded index, or a Hugging Face model directory
/// holding either) and says, in one note line on stderr, which Hugging Face tensors it skipped
/// (rt::ignoredHfTensorReason: tensors no computation reads).
void bindWeightsNoting(rt::Executor &executor, const std::string &weights, uint64_t seed) {
  std::vector<std::string> ignored =
      executor.bindWeights(rt::Checkpoint::open(rt::resolveWeightsPath(weights)), seed);
  if (ignored.empty())
    return;
  std::string names;
  for (size_t i = 0; i < ignored.size() && i < 4; ++i)
    names += (i ? ", " : "") + ignored[i];
  if (ignored.size() > 4)
    names += " and " + std::to_string(ignored.size() - 4) + " more";
  std::fprintf(stderr,
               "bonsai-run: note: --weights: ignoring %zu tensor%s that Hugging Face keeps but "
               "no computation reads (rotary inv_freq, attention-mask buffers, a tied "
               "lm_head): %s\n",
               ignored.size(), ignored.size() == 1 ? "" : "s", names.c_str());
}

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

/// Greedy generation: the context (the last T ids of prompt and output) goes into row 0 of the
/// ids, the Forward phase runs, and the argmax of the logits at the context's last position,
/// over ids below `idLimit` (and the logits' vocabulary), is the next id; it stops after `count`
/// ids or after `stop`. With a fused LM head the Forward kernels before it run and the logits of
/// those ids are x's last row times W's rows, summed in f32 here.
std::vector<int64_t> generateIds(rt::Executor &executor, std::vector<int64_t> context,
                                 int64_t idLimit, uint64_t count, std::optional<int64_t> stop) {
  const rt::LoadedPlan &plan = executor.plan();
  std::vector<int64_t> shape = executor.inputShape();
  int64_t B = shape[0], T = shape[1];
  LogitsSource source = findLogits(plan, B, T);
  int64_t V = source.vocab;
  int64_t limit = std::min<int64_t>({V, plan.vocabularySize(), idLimit});
  if (context.empty())
    throw rt::Error("--generate: the prompt encodes to no token");
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
  std::vector<int64_t> out;
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
    out.push_back(best);
    if (stop && best == *stop)
      break;
  }
  return out;
}

/// Byte-level generation (no tokenizer): token id = byte value, ids below 256.
std::string generate(rt::Executor &executor, const std::string &prompt, uint64_t count) {
  const rt::LoadedPlan &plan = executor.plan();
  // A plan without logits is the first thing to say, before the prompt's bytes.
  std::vector<int64_t> shape = executor.inputShape();
  findLogits(plan, shape[0], shape[1]);
  std::vector<int64_t> context;
  for (size_t i = 0; i < prompt.size(); ++i) {
    int64_t id = static_cast<unsigned char>(prompt[i]);
    if (id >= plan.vocabularySize())
      throw rt::Error("--generate: prompt byte " + std::to_string(i) + " is " + std::to_string(id) +
                      ", not below the plan's vocabulary size " +
                      std::to_string(plan.vocabularySize()));
    context.push_back(id);
  }
  std::string out;
  for (int64_t id : generateIds(executor, context, 256, count, std::nullopt))
    out += char(id);
  return out;
}

/// Throws unless `tokenizer`'s ids fit the plan's vocabulary and the two are the same but for
/// the padding some models give their embedding (rounded up to a multiple of 64 or 128: fewer
/// than 1024 rows).
void checkTokenizerVocabulary(const bonsai::tok::Tokenizer &tokenizer, const rt::LoadedPlan &plan) {
  int64_t ids = tokenizer.vocabSize(), rows = plan.vocabularySize();
  if (ids > rows || rows - ids >= 1024)
    throw rt::Error("--tokenizer '" + tokenizer.path() + "' has a vocabulary of " +
                    std::to_string(ids) + " ids, but plan '" + plan.path + "' has " +
                    std::to_string(rows) +
                    (ids > rows ? " (its ids would not fit)"
                                : " (more than a padded embedding: another model's tokenizer)"));
}

/// Generation with the model's tokenizer: the prompt is encoded (nothing added before it),
/// `count` tokens are generated greedily, stopping after the tokenizer's EOS, and decoded.
std::string generateText(rt::Executor &executor, const bonsai::tok::Tokenizer &tokenizer,
                         const std::string &prompt, uint64_t count) {
  std::vector<int64_t> context;
  for (uint32_t id : tokenizer.encode(prompt))
    context.push_back(id);
  std::optional<int64_t> stop;
  if (tokenizer.eos())
    stop = tokenizer.eos()->id;
  std::vector<uint32_t> ids;
  for (int64_t id : generateIds(executor, context, tokenizer.vocabSize(), count, stop))
    ids.push_back(uint32_t(id));
  return tokenizer.decode(ids);
}

/// Where the profiled step's time went (`ms`, per plan kernel): by kernel kind and phase, then
/// the slowest kernels. `onGpu`: timed between CUDA events, without the phases' graphs.
void printProfile(const rt::LoadedPlan &plan, const std::vector<double> &ms, bool onGpu) {
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
    std::snprintf(line, sizeof line, "profile: %-26s %-8s %6d kernels %9.3f ms %5.1f%%",
                  key.first.c_str(), phases[key.second], value.second, value.first,
                  100.0 * value.first / total);
    rows.push_back({value.first, line});
  }
  std::sort(rows.rbegin(), rows.rend());
  std::printf("profile: one step, %.3f ms in kernels (timed one by one%s)\n", total,
              onGpu ? ", without CUDA Graphs" : "");
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

/// This process's rank and the number of ranks, once the communicator exists: errors of a run
/// of several ranks say which rank they come from.
int gRank = 0, gRanks = 1;

/// A metric for a message: %.9g, or "nan" / "inf" / "-inf".
std::string formatValue(float value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", double(value));
  return buf;
}

int run(const Options &o) {
  // Where the launcher put this process (docs/sharding.md, "bonsai-run"); read before anything
  // else, so that malformed launcher variables are the first error.
  rt::LaunchInfo launch = rt::detectLaunch();
  rt::ExecutorOptions executorOptions;
  executorOptions.device = o.device;
  executorOptions.cudaGraphs = !o.noCudaGraphs;
  executorOptions.deterministic = !o.nondeterministic;
  executorOptions.offloadTiming = o.offloadTiming;
  executorOptions.guardNonFinite = o.maxNonFinite > 0;
  std::string backend = o.backend.empty() ? (rt::cudaDeviceAvailable() ? "cuda" : "cpu")
                                          : o.backend;
  executorOptions.backend = backend == "cuda" ? rt::Backend::Cuda : rt::Backend::Cpu;

  rt::LoadedPlan plan = rt::loadPlanFile(o.plan);
  if (o.printPlan) {
    std::fputs(rt::printPlan(plan).c_str(), stdout);
    return 0;
  }
  // The plan's ranks against the launch, before any rank starts MPI: N processes of a plan of
  // one rank would each train the whole model on the same data and write the same
  // checkpoints; a sharded plan needs exactly its ranks.
  const std::string planRanks = std::to_string(plan.ranks);
  if (plan.ranks <= 1 && launch.size > 1)
    throw rt::Error("started as rank " + std::to_string(launch.rank) + " of " +
                    std::to_string(launch.size) + " by " + launch.launcher + ": plan '" + o.plan +
                    "' runs on one rank (it was not compiled with bonsai.shard; "
                    "docs/sharding.md); run bonsai-run as one process, or compile the plan for " +
                    std::to_string(launch.size) + " ranks");
  if (plan.ranks > 1 && uint32_t(launch.size) != plan.ranks)
    throw rt::Error("plan '" + o.plan + "' was compiled for " + planRanks + " ranks (" +
                    plan.rankDirectives() + ")" +
                    (launch.size > 1 ? ", but it was started as " + std::to_string(launch.size) +
                                           " ranks by " + launch.launcher
                                     : std::string()) +
                    ": start it as " + planRanks + " processes, mpirun -np " + planRanks +
                    " bonsai-run ...");
  // What a run of several ranks cannot do yet (docs/sharding.md, "Not yet").
  if (plan.ranks > 1) {
    const char *flag = !o.dumpGradients.empty() ? "--dump-gradients"
                       : o.generate             ? "--generate"
                       : o.findNonFinite        ? "--find-nonfinite"
                                                : nullptr;
    if (flag)
      throw rt::Error(std::string(flag) + ": plan '" + o.plan + "' runs on " + planRanks +
                      " ranks, and generation, gradient dumps and the non-finite search of "
                      "several ranks are not built yet (docs/sharding.md)");
  }
  // The communicator: one rank, or MPI ranks (every rank starts it here, at once).
  std::unique_ptr<rt::Communicator> communicator = rt::makeCommunicator();
  gRank = communicator->rank();
  gRanks = communicator->size();
  if (gRanks > 1) {
    // Every rank runs the same plan: every rank's hash against rank 0's, on every rank, so
    // that a mismatch stops them all and each names both hashes.
    std::string mine = rt::sha256File(o.plan);
    std::vector<char> hashes(mine.size() * size_t(gRanks));
    // 64 hex digits, moved as 16 i32 (a gather copies bytes whatever the dtype).
    communicator->allGather(mine.data(), hashes.data(), mine.size() / 4, rt::DType::I32,
                            "the plans' SHA-256");
    auto hashOf = [&](int r) { return std::string(&hashes[size_t(r) * mine.size()], mine.size()); };
    for (int r = 1; r < gRanks; ++r)
      if (hashOf(r) != hashOf(0))
        throw rt::Error("plan '" + o.plan + "' differs between the ranks: SHA-256 " + hashOf(0) +
                        " on rank 0, " + hashOf(r) + " on rank " + std::to_string(r) +
                        "; every rank must run the same plan file");
    // Only rank 0 reports progress and metrics; the others print errors only.
    if (gRank != 0 && !std::freopen("/dev/null", "w", stdout))
      throw rt::Error("cannot silence stdout on rank " + std::to_string(gRank));
    // One GPU per rank: the rank's place on its host, unless --device says otherwise.
    if (!o.deviceGiven)
      executorOptions.device = communicator->localRank();
    // The ranks on one host share its cores (HostThreads.h): each takes its part for the CPU
    // kernels, OpenBLAS, the host optimizer and checkpoint hashing.
    int local = communicator->localSize();
    if (local > 1) {
      unsigned cores = rt::hostThreads();
      rt::setHostThreads(rt::hostThreadsPerRank(cores, unsigned(local)));
      std::printf("host: %d ranks share this host's %u cores: %u thread%s each\n", local, cores,
                  rt::hostThreads(), rt::hostThreads() == 1 ? "" : "s");
    }
  }
  executorOptions.communicator = communicator.get();
  // An export that cannot happen is reported before the steps, not after them.
  if (!o.exportAdapter.empty()) {
    rt::checkPeftExportable(plan);
    rt::checkExportDestination(o.exportAdapter, "--export-adapter", /*directory=*/true);
  }
  // --export-merged FILE.safetensors writes one file; anything else is a model directory.
  bool mergedFile = endsWith(o.exportMerged, ".safetensors");
  if (!o.exportMerged.empty())
    rt::checkExportDestination(o.exportMerged, "--export-merged", /*directory=*/!mergedFile);
  if (!o.exportMerged.empty() && mergedFile && (!o.hfDir.empty() || o.shardSize))
    throw rt::Error(std::string(o.hfDir.empty() ? "--shard-size" : "--hf-dir") +
                    " is for a model directory, and --export-merged '" + o.exportMerged +
                    "' names a .safetensors file");
  // The model directory a merged export takes its config and tokenizer from.
  std::string sourceDir = !o.hfDir.empty() ? o.hfDir
                          : isDirectory(o.weights) ? o.weights : std::string();
  if (!o.hfDir.empty() && !isDirectory(o.hfDir))
    throw rt::Error("--hf-dir '" + o.hfDir + "' is not a directory");
  // The tokenizer is loaded and checked against the plan before any step runs.
  std::unique_ptr<bonsai::tok::Tokenizer> tokenizer;
  if (!o.tokenizer.empty()) {
    tokenizer = bonsai::tok::loadTokenizer(o.tokenizer);
    checkTokenizerVocabulary(*tokenizer, plan);
  }
  uint32_t microBatches = uint32_t(o.microBatches.value_or(plan.microBatches));
  const std::vector<int64_t> &inputShape = plan.tensors[plan.inputs[0]].shape;
  // A ring's ranks hold a share of each row (docs/ring-attention.md): a micro-batch is the
  // whole rows.
  uint64_t tokensPerMicroBatch = uint64_t(inputShape[0] * inputShape[1]) * plan.ringRanks;
  // A step of N data ranks takes N blocks of micro-batches (docs/sharding.md); the ranks of a
  // ring share theirs.
  const int dataRanks = gRanks / int(plan.ringRanks);
  const uint64_t stepMicroBatches = uint64_t(microBatches) * uint64_t(dataRanks);
  std::string perStep = std::to_string(tokensPerMicroBatch * stepMicroBatches) + " tokens/step";
  if (plan.ringRanks > 1)
    perStep += " (" + (dataRanks > 1 ? std::to_string(dataRanks) + " data ranks x " : "") +
               std::to_string(microBatches) + " micro-batch" + (microBatches == 1 ? "" : "es") +
               " of " + std::to_string(tokensPerMicroBatch) +
               ", each row's sequence split over a ring of " + std::to_string(plan.ringRanks) +
               " ranks" + (plan.shardStrategy.empty() ? "" : ", " + plan.shardStrategy) + ")";
  else if (gRanks > 1)
    perStep += " (" + std::to_string(gRanks) + " ranks x " + std::to_string(microBatches) +
               " micro-batch" + (microBatches == 1 ? "" : "es") + " of " +
               std::to_string(tokensPerMicroBatch) + ", " + plan.shardStrategy + ")";
  else if (microBatches > 1)
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
  // The frozen base's identity, computed once (it is a hash of the whole base) and recorded in
  // every adapter checkpoint of the run.
  std::optional<rt::BaseIdentity> base;
  if (o.resume) {
    std::string dir = rt::resolveCheckpoint(o.resumePath.empty() ? o.ckptDir : o.resumePath);
    // The manifest alone: loadCheckpoint verifies the files this rank reads.
    rt::CheckpointManifest verified = rt::readCheckpointManifest(dir);
    if (o.seed && *o.seed != verified.position.seed)
      throw rt::Error("--seed " + std::to_string(*o.seed) + " differs from the seed " +
                      std::to_string(verified.position.seed) + " of checkpoint '" + dir +
                      "' (a resumed run continues the checkpoint's streams)");
    if (verified.baseSha256.empty()) {
      if (!o.weights.empty())
        throw rt::Error("checkpoint '" + dir + "' holds the whole model: --weights is not used "
                        "with it (give one of --resume and --weights)");
    } else {
      // An adapter checkpoint: the base comes from where the run's came from, then the
      // checkpoint's trainable tensors and optimizer state go over it.
      if (!o.weights.empty())
        bindWeightsNoting(executor, o.weights, verified.position.seed);
      else
        executor.initWeights(verified.position.seed);
      base = rt::baseIdentity(executor);
    }
    rt::CheckpointManifest manifest = rt::loadCheckpoint(dir, executor, base ? &*base : nullptr);
    position = manifest.position;
    std::printf("resume: %s (step %" PRIu64 ", micro-batch %" PRIu64 ")\n", dir.c_str(),
                position.step, position.dataPosition);
    std::fflush(stdout);
  } else if (!o.weights.empty()) {
    bindWeightsNoting(executor, o.weights, position.seed);
  } else {
    executor.initWeights(position.seed);
  }

  std::vector<int64_t> shape = executor.inputShape();
  rt::TokenLoader loader(o.data, shape[0], shape[1], plan.vocabularySize(), position.seed,
                         !o.noShuffle);
  // Documents packed into rows need the plan's positions and segment ids; a plan without them
  // attends across the documents of a row and runs RoPE on through them. That still trains
  // (the labels are masked), but it is rarely what was meant: say so once, with the fix.
  if (loader.file() && loader.file()->version() == 2 &&
      loader.file()->documentEnds().size() > 1 &&
      !(executor.plan().positionsInput && executor.plan().segmentIdsInput))
    std::fprintf(stderr,
                 "bonsai-run: warning: '%s' holds %zu documents, packed several to a row, but "
                 "the plan has no positions / segment_ids inputs: attention crosses documents "
                 "and RoPE positions do not restart; import the model with --packed "
                 "(docs/training.md, \"Packed sequences\")\n",
                 o.data.c_str(), loader.file()->documentEnds().size());
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
  uint64_t tokensPerStep = stepMicroBatches * uint64_t(shape[0] * shape[1]);
  std::unique_ptr<rt::MetricsFile> metrics;
  // Rank 0 writes the metrics, as it prints the progress: the ranks' steps are one step.
  if (!o.metrics.empty() && gRank == 0)
    metrics = std::make_unique<rt::MetricsFile>(o.metrics, o.resume);
  rt::Progress progress(stdout, ::isatty(::fileno(stdout)) == 1);

  uint64_t firstStep = position.step + 1;
  // A cosine schedule ends at its total_steps; a run that goes past it trains on at min_lr,
  // which is rarely what was meant: say so before the first step.
  if (steps > 0)
    for (const rt::KernelInfo &k : plan.kernels) {
      if (k.kind != rt::KernelKind::LearningRate)
        continue;
      const rt::LearningRateAttrs &schedule = k.attrsAs<rt::LearningRateAttrs>();
      uint64_t last = position.step + steps;
      if (schedule.cosine && schedule.totalSteps > 0 && last > uint64_t(schedule.totalSteps))
        std::fprintf(stderr,
                     "bonsai-run: warning: this run ends at step %" PRIu64
                     ", past the schedule's total_steps %" PRId64
                     ": the learning rate is min_lr (%g) from step %" PRId64 "\n",
                     last, schedule.totalSteps, schedule.lr * schedule.minLrRatio,
                     schedule.totalSteps);
      break;
    }
  // The spike rule (docs/training.md, "Loss and gradient spikes"), its windows continued from
  // the checkpoint a run resumes; a run without the rule saves none.
  std::optional<rt::SpikeRule> spikes;
  if (o.spikeZscore) {
    spikes.emplace(*o.spikeZscore, o.spikeWindow.value_or(100));
    spikes->restore(position.spikeLosses, position.spikeGradNorms);
    if (plan.updateInBackward())
      std::fprintf(stderr,
                   "bonsai-run: warning: --spike-zscore watches the loss only: the plan "
                   "applies its updates in the backward pass, before a gradient norm exists\n");
    else if (!plan.metric("grad_norm"))
      std::fprintf(stderr, "bonsai-run: warning: --spike-zscore watches the loss only: the plan "
                           "has no grad_norm metric\n");
  }
  position.spikeLosses.clear();
  position.spikeGradNorms.clear();
  uint64_t skippedSteps = 0;
  using Cause = rt::StepResult::Cause;
  // The current run of skipped steps: their numbers and why each was skipped.
  std::vector<std::pair<uint64_t, Cause>> skippedRun;
  uint64_t plannedBytes = 0;
  bool offloaded = false; // pinned host arenas: the metrics' "offload" object
  for (const rt::ArenaInfo &a : plan.arenas) {
    plannedBytes += a.size;
    offloaded |= a.space == rt::MemorySpace::PinnedHost;
  }
  const rt::LoadedPlan::PcieBytes pcie = executor.plan().pcieBytesPerStep(microBatches);
  // The offload telemetry of this run's steps after its first (which captures the graphs),
  // summed for the closing line; a link running slow is said once.
  rt::OffloadTimes offloadTotals;
  uint64_t offloadSteps = 0;
  // The steps after the first, timed against the compiler's prediction.
  double laterStepSeconds = 0;
  uint64_t laterSteps = 0;
  bool linkWarned = false;
  std::vector<double> profiled;
  double evalSeconds = 0; // not training: left out of the time line's throughput
  // Saves the state after the step just done to --ckpt-dir (--save-every, and after SIGINT or
  // SIGTERM), then prunes with --keep-last.
  uint64_t savedStep = 0;
  std::string savedDir;
  auto save = [&]() {
    if (!base && rt::writesAdapterCheckpoints(executor))
      base = rt::baseIdentity(executor);
    if (spikes) {
      position.spikeLosses = spikes->losses();
      position.spikeGradNorms = spikes->gradNorms();
    }
    savedDir = rt::saveCheckpoint(o.ckptDir, executor, position, base ? &*base : nullptr);
    savedStep = position.step;
    progress.note("checkpoint: step " + std::to_string(position.step) + " saved to " + savedDir);
    // Only now, with the new checkpoint durable and named by `latest`, may older ones go
    // (the one this run resumed from among them).
    if (o.keepLast && gRank == 0)
      for (const std::string &old : rt::pruneCheckpoints(o.ckptDir, *o.keepLast))
        progress.note("checkpoint: removed " + old + " (--keep-last " +
                      std::to_string(*o.keepLast) + ")");
  };
  // SIGINT / SIGTERM end the loop after the step in flight (and its save, if it has one);
  // with several ranks, after the step after which the ranks agreed on it.
  std::optional<StopSignals> stopSignals(std::in_place);
  int agreedSignal = 0;
  auto stopRequested = [&] { return gRanks > 1 ? agreedSignal != 0 : gStopSignal != 0; };
  auto start = std::chrono::steady_clock::now();
  try {
    for (uint64_t s = 0; s < steps && !stopRequested(); ++s) {
      // The last step is the profiled one: earlier steps warm caches, graphs and plans up.
      if (o.profile && s + 1 == steps)
        executor.setProfiling(true);
      auto stepStart = std::chrono::steady_clock::now();
      rt::SpikeLimits limits = spikes ? spikes->limits() : rt::SpikeLimits{};
      executor.setWhere("step " + std::to_string(position.step + 1));
      rt::StepResult result =
          executor.trainStep(loader, position.dataPosition, microBatches, limits);
      if (spikes)
        spikes->record(result.loss, result.gradNorm);
      auto now = std::chrono::steady_clock::now();
      position.step += 1;
      position.dataPosition += stepMicroBatches;
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
      if (result.skipped) {
        ++skippedSteps;
        skippedRun.emplace_back(position.step, result.cause);
        std::string why = "not finite";
        if (result.cause != Cause::NonFinite) {
          bool loss = result.cause == Cause::LossSpike;
          why = std::string(loss ? "loss" : "grad_norm") + " above the spike limit " +
                formatValue(loss ? limits.loss : limits.gradNorm) + " (mean + " +
                formatValue(float(spikes->zscore())) + " sd of the last " +
                std::to_string(spikes->window()) + " steps)";
        }
        progress.note("warning: step " + std::to_string(position.step) + ": loss " +
                          formatValue(result.loss) + ", grad_norm " +
                          (result.gradNorm ? formatValue(*result.gradNorm) : "-") + ": " + why +
                          ", update skipped (" + std::to_string(skippedRun.size()) +
                          " in a row, --max-nonfinite " + std::to_string(o.maxNonFinite) + ")",
                      stderr);
        if (o.findNonFinite && result.cause == Cause::NonFinite) {
          std::string found = executor.findNonFinite(loader, position.dataPosition - microBatches,
                                                     microBatches);
          progress.note("nonfinite: step " + std::to_string(position.step) + ": " +
                            (found.empty() ? "no kernel of the re-run wrote a non-finite value"
                                           : found),
                        stderr);
        }
      } else {
        skippedRun.clear();
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
      report.skippedSteps = skippedSteps;
      report.microBatches = microBatches;
      report.tokens = tokensPerStep;
      report.stepSeconds = std::chrono::duration<double>(now - stepStart).count();
      report.elapsedSeconds = std::chrono::duration<double>(now - start).count();
      report.plannedBytes = plannedBytes;
      for (const rt::ArenaUsage &u : executor.memoryUsage())
        report.measuredBytes += u.measured;
      if (position.step != firstStep) {
        laterStepSeconds += report.stepSeconds;
        ++laterSteps;
      }
      std::string linkWarning;
      if (offloaded) {
        rt::OffloadTimes times = result.offload.value_or(rt::OffloadTimes{});
        report.offload = rt::OffloadStats{pcie.hostToDevice, pcie.deviceToHost, times};
        if (position.step != firstStep && times.timed) {
          offloadTotals += times;
          ++offloadSteps;
          // Only a real link has a rate to fall short of (the CPU backend's copies are
          // memcpy).
          if (!linkWarned && executor.hasDevice()) {
            linkWarning =
                rt::formatLinkWarning(times, plan.targetLinkBytesPerSecond, position.step);
            linkWarned = !linkWarning.empty();
          }
        }
      }
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
      if (!linkWarning.empty())
        progress.note(linkWarning, stderr);
      if (metrics)
        metrics->write(report);
      if (o.maxNonFinite > 0 && skippedRun.size() >= o.maxNonFinite) {
        bool allNonFinite = std::all_of(skippedRun.begin(), skippedRun.end(),
                                        [](const auto &s) { return s.second == Cause::NonFinite; });
        std::string list;
        for (const auto &[step, cause] : skippedRun)
          list += (list.empty() ? "" : ", ") + std::to_string(step) +
                  (allNonFinite                 ? ""
                   : cause == Cause::NonFinite ? " (non-finite)"
                   : cause == Cause::LossSpike ? " (loss spike)"
                                               : " (grad_norm spike)");
        throw rt::Error(std::to_string(skippedRun.size()) +
                        (allNonFinite ? " steps in a row had a non-finite loss or gradient norm"
                                      : " steps in a row were skipped") +
                        " (steps " + list + "; --max-nonfinite " +
                        std::to_string(o.maxNonFinite) +
                        "): stopping; their updates were skipped, so the weights are those "
                        "after step " + std::to_string(skippedRun.front().first - 1));
      }
      if (o.saveEvery > 0 && position.step % o.saveEvery == 0)
        save();
      if (gRanks > 1) {
        // A signal reaches the ranks at different moments (or only one of them): they agree
        // after each step, so that all stop after the same one and save it together. A signal
        // that comes after the last agreement is not acted on (the run ends anyway).
        std::vector<int32_t> signals(size_t(gRanks), 0);
        int32_t mine = int32_t(gStopSignal);
        communicator->allGather(&mine, signals.data(), 1, rt::DType::I32,
                                "step " + std::to_string(position.step) + ", stop signals");
        for (int32_t signal : signals)
          if (signal != 0 && agreedSignal == 0)
            agreedSignal = signal;
      }
    }
  } catch (...) {
    progress.finish(); // an error line starts on a line of its own
    throw;
  }
  progress.finish();
  // Interrupted: save the last step unless --save-every just did, say where, and stop (no
  // exports or generation from a run cut short). From here a signal acts at once again.
  int stopSignal = gRanks > 1 ? agreedSignal : int(gStopSignal);
  stopSignals.reset();
  if (stopSignal != 0) {
    const char *name = stopSignal == SIGINT ? "SIGINT" : "SIGTERM";
    std::string outcome;
    if (position.step + 1 == firstStep)
      outcome = "no step ran in this run, nothing saved";
    else if (o.ckptDir.empty())
      outcome = "nothing saved (no --ckpt-dir)";
    else {
      if (savedStep != position.step)
        save();
      outcome = "checkpoint saved to " + savedDir;
    }
    std::printf("interrupted: %s, stopped after step %" PRIu64 ": %s\n", name, position.step,
                outcome.c_str());
    std::fflush(stdout);
    return 0;
  }
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() - evalSeconds;
  if (evalLoader && steps == 0) {
    // No step to attach it to: evaluate the weights as loaded (a checkpoint, --weights).
    float value = executor.evaluate(*evalLoader, evalBatches);
    std::printf("eval: step %" PRIu64 " val_loss %.9g (%" PRIu64 " batches)\n", position.step,
                double(value), evalBatches);
    std::fflush(stdout);
  }

  // Exports read the trained parameters; nothing after this point changes them. A sharded
  // plan's run gathers the sharded ones whole on rank 0 first (every rank sends its shares),
  // then rank 0 writes, and an error there stops every rank (docs/sharding.md, "Checkpoints
  // and exports").
  std::optional<rt::WholeParameters> whole;
  if (exports && std::any_of(plan.tensors.begin(), plan.tensors.end(),
                             [](const rt::TensorInfo &t) { return t.sharded(); }))
    whole.emplace(executor, /*adaptersOnly=*/o.exportMerged.empty());
  const rt::LoadedPlan &exportPlan = whole ? whole->plan : plan;
  auto views = [&]() -> const std::vector<rt::TensorView> & {
    return whole ? whole->views : executor.views();
  };
  rt::onAllRanks(*communicator, "exports", [&] {
    if (gRank != 0)
      return;
    if (!o.exportAdapter.empty()) {
      rt::ExportSummary written =
          rt::exportPeftAdapter(o.exportAdapter, exportPlan, views(), o.baseModel.value_or(""));
      const rt::AdapterInfo &a = plan.adapters.front();
      std::printf("adapter: %zu adapters (%zu tensors, %s r%u alpha %g) written to %s\n",
                  plan.adapters.size(), written.tensors, a.magnitude ? "DoRA" : "LoRA", a.rank,
                  a.alpha, o.exportAdapter.c_str());
      std::fflush(stdout);
    }
    if (!o.exportMerged.empty() && mergedFile) {
      rt::ExportSummary written = rt::exportMergedWeights(o.exportMerged, exportPlan, views());
      std::printf("merged: %zu tensors (%zu adapted weights merged) written to %s\n",
                  written.tensors, written.merged, o.exportMerged.c_str());
      std::fflush(stdout);
    } else if (!o.exportMerged.empty()) {
      rt::HfExportOptions options;
      options.sourceDir = sourceDir;
      std::optional<rt::Checkpoint> source;
      if (!o.weights.empty()) {
        source = rt::Checkpoint::open(rt::resolveWeightsPath(o.weights));
        options.source = &*source;
      }
      if (o.shardSize)
        options.maxShardBytes = *o.shardSize;
      rt::HfExportSummary written = rt::exportHfModel(o.exportMerged, exportPlan, views(), options);
      std::printf("merged: %zu tensors (%zu adapted weights merged) in %zu shard%s, config.json %s"
                  ", %zu tokenizer file%s, written to %s\n",
                  written.tensors, written.merged, written.shards, written.shards == 1 ? "" : "s",
                  written.configCopied ? ("from " + sourceDir).c_str() : "rebuilt from the plan",
                  written.tokenizerFiles, written.tokenizerFiles == 1 ? "" : "s",
                  o.exportMerged.c_str());
      std::fflush(stdout);
    }
  });
  whole.reset();
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
    printProfile(plan, profiled, executorOptions.backend == rt::Backend::Cuda);
  if (o.generate) {
    std::string text;
    if (tokenizer) {
      std::printf("tokenizer: %s\n", tokenizer->describe().c_str());
      text = generateText(executor, *tokenizer, *o.generate, o.maxNewTokens.value_or(64));
    } else {
      text = generate(executor, *o.generate, o.maxNewBytes.value_or(64));
    }
    std::printf("prompt: %s\ngenerated: %s\n", escapeBytes(*o.generate).c_str(),
                escapeBytes(text).c_str());
    std::fflush(stdout);
  }

  uint64_t planned = 0, measured = 0, plannedHost = 0, measuredHost = 0;
  size_t index = 0;
  for (const rt::ArenaUsage &u : executor.memoryUsage()) {
    if (u.arena->space == rt::MemorySpace::PinnedHost) {
      plannedHost += u.planned;
      measuredHost += u.measured;
    }
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
  // Offloaded state (docs/offload.md) is in the totals above but not in device memory.
  if (plannedHost)
    std::printf("memory: pinned host arenas planned %.2f MiB, measured %.2f MiB; device arenas "
                "planned %.2f MiB, measured %.2f MiB\n",
                mib(plannedHost), mib(measuredHost), mib(planned - plannedHost),
                mib(measured - measuredHost));
  const uint64_t plannedDevice = planned - plannedHost;
  if (uint64_t device = executor.measuredDeviceBytes())
    // The driver's count (cudaMemGetInfo at start and at every synchronisation): the arenas
    // plus what the CUDA runtime holds for the kernels (cuBLASLt workspace, scratch pools).
    std::printf("device memory: measured peak %" PRIu64 " bytes (%.2f MiB, driver), planned %.2f MiB, "
                "%+.2f%%\n",
                device, mib(device), mib(plannedDevice),
                plannedDevice ? 100.0 * (double(device) - double(plannedDevice)) /
                                    double(plannedDevice)
                              : 0.0);
  if (offloadSteps) {
    // Per step, over the steps after the first: what the link moved and how fast, and how
    // much of the copies' and host steps' time the compute did not hide.
    const double n = double(offloadSteps);
    const rt::OffloadTimes &t = offloadTotals;
    auto rate = [](uint64_t bytes, double seconds) {
      std::optional<double> r = rt::achievedBytesPerSecond(bytes, seconds);
      return r ? *r / 1e9 : 0.0;
    };
    std::printf("offload: per step (mean of %" PRIu64 " after the first): to the device %.2f GiB "
                "in %.1f ms (%.1f GB/s), to the host %.2f GiB in %.1f ms (%.1f GB/s); the compute "
                "waited %.1f ms for copies and host steps; host steps %.1f ms\n",
                offloadSteps, double(t.toDeviceBytes) / n / double(1 << 30),
                t.toDeviceSeconds / n * 1e3, rate(t.toDeviceBytes, t.toDeviceSeconds),
                double(t.toHostBytes) / n / double(1 << 30), t.toHostSeconds / n * 1e3,
                rate(t.toHostBytes, t.toHostSeconds), t.exposedSeconds / n * 1e3,
                t.hostStepSeconds / n * 1e3);
  }
  double tokens = double(steps) * double(tokensPerStep);
  std::printf("time: %" PRIu64 " steps in %.3f s, %.0f tokens/s", steps, seconds,
              seconds > 0 ? tokens / seconds : 0.0);
  if (evalSeconds > 0)
    std::printf(" (evaluation: %.3f s more)", evalSeconds);
  std::printf("\n");
  // The compiler's prediction (docs/offload.md, "Predicted step time") against the steps
  // after the first, which captures the CUDA Graphs. It is the target's, not this machine's.
  if (plan.predictedStepSeconds > 0 && laterSteps) {
    double measured = laterStepSeconds / double(laterSteps);
    std::printf("time: the compiler predicted %.4g ms a step on its target (%.4g ms of it the "
                "offload's), measured %.4g ms (mean of %" PRIu64 " after the first), %+.1f%%\n",
                plan.predictedStepSeconds * 1e3, plan.predictedExposedSeconds * 1e3, measured * 1e3,
                laterSteps, 100.0 * (plan.predictedStepSeconds - measured) / measured);
  }
  return 0;
}

} // namespace

/// --nproc N: replaces this process with `mpirun -np N` running this program with the same
/// arguments but --nproc, so that one command starts every rank of a sharded plan on one
/// machine (docs/sharding.md). Returns only by throwing.
[[noreturn]] void startRanks(int argc, char **argv, uint64_t nproc) {
  if (nproc < 1 || nproc > 4096)
    throw UsageError{"--nproc must be between 1 and 4096"};
  rt::LaunchInfo launch = rt::detectLaunch();
  if (launch.size > 1)
    throw rt::Error("--nproc starts the ranks itself, but this process is already rank " +
                    std::to_string(launch.rank) + " of " + std::to_string(launch.size) +
                    " started by " + launch.launcher + ": leave out --nproc");
  std::vector<std::string> args = {"mpirun"};
  // Open MPI refuses to run as root unless told; a container's user often is root.
  if (::geteuid() == 0)
    args.push_back("--allow-run-as-root");
  // More ranks than cores are allowed (CPU ranks on a small machine), and no rank is bound to
  // one core: each rank runs threads of its own (the CPU kernels, the host optimizer step).
  for (const char *flag : {"--oversubscribe", "--bind-to", "none", "-np"})
    args.push_back(flag);
  args.push_back(std::to_string(nproc));
  // This program's own path: /proc/self/exe would name mpirun once it runs.
  char self[4096];
  ssize_t length = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (length <= 0)
    throw rt::Error(std::string("--nproc: cannot find this program's path (") +
                    std::strerror(errno) + "); start the ranks with mpirun -np " +
                    std::to_string(nproc) + " bonsai-run ...");
  args.push_back(std::string(self, size_t(length)));
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--nproc") {
      ++i; // its value
      continue;
    }
    if (arg.rfind("--nproc=", 0) == 0)
      continue;
    args.push_back(arg);
  }
  std::vector<char *> pointers;
  for (std::string &arg : args)
    pointers.push_back(arg.data());
  pointers.push_back(nullptr);
  std::fflush(stdout);
  ::execvp("mpirun", pointers.data());
  throw rt::Error("--nproc " + std::to_string(nproc) + ": cannot start mpirun (" +
                  std::strerror(errno) +
                  "): it is Open MPI's launcher (scripts/install-deps.sh installs it); or start "
                  "the ranks with your own launcher, mpirun -np " +
                  std::to_string(nproc) + " bonsai-run ... or srun bonsai-run ...");
}

int main(int argc, char **argv) {
  rt::installCrashReport("bonsai-run");
  try {
    Options options = parseOptions(argc, argv);
    if (options.help) {
      std::fputs(kSynopsis, stdout);
      std::fputs(kHelp, stdout);
      return 0;
    }
    if (options.nproc > 0)
      startRanks(argc, argv, options.nproc);
    return run(options);
  } catch (const UsageError &e) {
    std::fflush(stdout);
    std::fprintf(stderr, "bonsai-run: error: %s\n%s", e.message.c_str(), kSynopsis);
  } catch (const rt::Error &e) {
    std::fflush(stdout);
    // One of several ranks says which, unless the message does (the communicator's errors).
    std::string message = e.what();
    if (gRanks > 1 && message.rfind("rank ", 0) != 0)
      message = "rank " + std::to_string(gRank) + " of " + std::to_string(gRanks) + ": " + message;
    std::fprintf(stderr, "bonsai-run: error: %s\n", message.c_str());
  } catch (const std::bad_alloc &) {
    std::fflush(stdout);
    std::fprintf(stderr, "bonsai-run: error: out of memory\n");
  } catch (const std::exception &e) {
    std::fflush(stdout);
    std::fprintf(stderr, "bonsai-run: error: %s\n", e.what());
  }
  return 1;
}
