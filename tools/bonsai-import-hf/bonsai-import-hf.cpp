//===- bonsai-import-hf.cpp - Import a Hugging Face checkpoint as bonsai IR ===//
//
// bonsai-import-hf DIR [-o model.mlir] [--batch B] [--seq S] [--dtype bf16|f32|f16] [--packed]
//
// Reads DIR/config.json and DIR's safetensors (model.safetensors, or a sharded checkpoint's
// model.safetensors.index.json) and writes the model as bonsai IR: `func.func @forward(%ids,
// %labels) -> tensor<f32>` with one `bonsai.param` per checkpoint tensor the model uses, under
// the checkpoint's own name, so that `bonsai-run --weights DIR/model.safetensors` binds the
// checkpoint as it is. The graph is the one scripts/gen_models.py writes for the same
// configuration (op for op, value names included), built with the dialect's builders and
// verified before anything is written. --packed writes the four-argument function of packed
// rows, `@forward(%ids, %labels, %positions, %segment_ids)` (docs/training.md).
//
// Supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (q/k/v biases),
// Qwen3ForCausalLM (RMSNorm on every query and key head) and GPT2LMHeadModel. Everything the graph
// would get wrong is refused with an error that names it: another architecture, a rope_scaling
// other than Llama 3.1's "llama3", a hidden_act other than silu, attention or MLP biases on Llama,
// a sliding window shorter than the sequence, a missing config key, a missing tensor or one whose
// shape differs from the config's. Checkpoint tensors no computation reads (rotary_emb.inv_freq,
// GPT-2's attention-mask buffers, a tied lm_head.weight: the runtime's list,
// rt::ignoredHfTensorReason, which bonsai-run --weights uses too) are ignored with a note; any
// other tensor the model has no parameter for is an error. Only headers are read: the tool never
// loads tensor data.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Import/HfImport.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiDialect.h"
#include "bonsai/runtime/Plan.h"
#include "bonsai/runtime/Safetensors.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

#include <optional>
#include <string>
#include <vector>

using namespace mlir;
using namespace mlir::bonsai;
using namespace mlir::bonsai::hf;
namespace rt = ::bonsai::rt;

static llvm::cl::opt<std::string> hfDir(llvm::cl::Positional, llvm::cl::Required,
                                        llvm::cl::desc("<hf-dir>"));
static llvm::cl::opt<std::string> outputFile("o", llvm::cl::desc("Output file (default: stdout)"),
                                             llvm::cl::value_desc("model.mlir"),
                                             llvm::cl::init("-"));
static llvm::cl::opt<unsigned> batchOption("batch", llvm::cl::desc("Batch size (default 1)"),
                                           llvm::cl::init(1));
static llvm::cl::opt<unsigned>
    seqOption("seq", llvm::cl::desc("Sequence length (default: min(2048, the config's "
                                    "max_position_embeddings or n_positions))"));
static llvm::cl::opt<bool>
    packedOption("packed", llvm::cl::desc("Packed training rows (docs/training.md): @forward takes "
                                          "%positions and %segment_ids after %ids and %labels; "
                                          "rope reads the positions, attention the segment ids "
                                          "(Llama family)"));
static llvm::cl::opt<std::string>
    dtypeOption("dtype", llvm::cl::desc("Element type of the model: bf16, f32 or f16 (default: "
                                        "the config's torch_dtype, else the checkpoint's)"));

namespace {

std::string joinPath(const std::string &dir, const std::string &name) {
  llvm::SmallString<256> path(dir);
  llvm::sys::path::append(path, name);
  return std::string(path);
}

int importModel() {
  if (batchOption == 0)
    throw ImportError("--batch must be positive");
  std::string configPath = joinPath(hfDir, "config.json");
  if (!llvm::sys::fs::is_directory(hfDir))
    throw ImportError("'" + hfDir + "' is not a directory");
  std::vector<uint8_t> configBytes = rt::readFileBytes(configPath);
  ModelConfig c = parseModelConfig(
      std::string_view(reinterpret_cast<const char *>(configBytes.data()), configBytes.size()),
      configPath);

  int64_t B = batchOption;
  int64_t S =
      seqOption.getNumOccurrences() ? int64_t(seqOption) : std::min<int64_t>(2048, c.positions);
  if (S <= 0)
    throw ImportError("--seq must be positive");
  if (S > c.positions)
    throw ImportError("--seq " + std::to_string(S) + " is longer than the model's " +
                      std::to_string(c.positions) + " positions (" +
                      (c.family == Family::GPT2 ? "n_positions" : "max_position_embeddings") +
                      " in " + configPath + ")");
  if (c.slidingWindow && *c.slidingWindow < S)
    throw ImportError(configPath + ": 'sliding_window' " + std::to_string(*c.slidingWindow) +
                      " is shorter than --seq " + std::to_string(S) +
                      ": sliding-window attention is not supported (import with --seq " +
                      std::to_string(*c.slidingWindow) + " or less)");

  std::string single = joinPath(hfDir, "model.safetensors");
  std::string index = joinPath(hfDir, "model.safetensors.index.json");
  std::string weights;
  if (llvm::sys::fs::exists(index))
    weights = index;
  else if (llvm::sys::fs::exists(single))
    weights = single;
  else
    throw ImportError("'" + hfDir +
                      "' has neither model.safetensors nor model.safetensors.index.json");
  rt::Checkpoint checkpoint = rt::Checkpoint::open(weights);
  checkLayerCount(c, checkpoint.tensors().size());

  // GPT-2 checkpoints come with and without the "transformer." prefix; keep the checkpoint's.
  std::string prefix = "transformer.";
  if (c.family == Family::GPT2 && !checkpoint.find("transformer.wte.weight") &&
      checkpoint.find("wte.weight"))
    prefix = "";

  std::string dtypeName;
  if (dtypeOption.getNumOccurrences()) {
    std::optional<std::string> d = elementType(dtypeOption, 0);
    if (!d)
      throw ImportError("--dtype '" + dtypeOption + "' is not one of bf16, f32, f16");
    dtypeName = *d;
  } else if (c.torchDType) {
    std::optional<std::string> d = elementType(*c.torchDType, 1);
    if (!d)
      throw ImportError(configPath + ": torch_dtype '" + *c.torchDType +
                        "' is not supported (bfloat16, float32, float16); choose the element "
                        "type with --dtype");
    dtypeName = *d;
  } else {
    std::string embed =
        c.family == Family::GPT2 ? prefix + "wte.weight" : "model.embed_tokens.weight";
    const rt::SafetensorsEntry *entry = checkpoint.find(embed);
    std::optional<std::string> d = entry ? elementType(entry->dtype, 2) : std::nullopt;
    if (!d)
      throw ImportError(configPath + " has no torch_dtype and the checkpoint's '" + embed +
                        "' is " + (entry ? entry->dtype : std::string("missing")) +
                        ": choose the element type with --dtype");
    dtypeName = *d;
  }

  DialectRegistry registry;
  registry.insert<BonsaiDialect, func::FuncDialect>();
  MLIRContext context(registry);
  context.loadAllAvailableDialects();
  OpBuilder top(&context);
  Type dtype = dtypeName == "bf16"  ? Type(top.getBF16Type())
               : dtypeName == "f16" ? Type(top.getF16Type())
                                    : Type(top.getF32Type());
  OwningOpRef<ModuleOp> module = ModuleOp::create(top.getUnknownLoc());
  std::vector<ExpectedTensor> expected =
      buildForward(*module, dtype, c, B, S, packedOption, prefix);
  auto func = cast<func::FuncOp>(module->getBody()->front());

  checkCheckpoint(checkpoint, expected);
  // The builders cannot produce an op the verifier rejects unless the config is one the
  // checks above missed: say so rather than write an invalid model.
  if (failed(verify(*module)))
    throw ImportError("the imported model does not verify (the errors above); this "
                      "configuration is not supported");

  std::string error;
  std::unique_ptr<llvm::ToolOutputFile> file = openOutputFile(outputFile, &error);
  if (!file)
    throw ImportError(error);
  llvm::raw_ostream &os = file->os();
  std::string name =
      outputFile == "-" ? "model.mlir" : std::string(llvm::sys::path::filename(outputFile));
  os << "// " << name << " - " << c.architecture << " forward pass and loss, batch " << B
     << ", sequence " << S << ", " << dtypeName << ".\n//\n";
  os << "// Imported by bonsai-import-hf from " << hfDir << " (" << weights << ").\n";
  os << "// Config: vocab=" << c.vocab << ", hidden=" << c.hidden << ", layers=" << c.layers
     << ", heads=" << c.heads;
  if (c.family == Family::Llama)
    os << ", kv_heads=" << c.kvHeads << ", intermediate=" << c.intermediate
       << ", rope_theta=" << c.ropeTheta << ", eps=" << c.eps;
  if (c.family == Family::Llama && c.ropeScaling)
    os << ", rope_scaling=llama3(factor=" << c.ropeScaling->factor
       << ", low_freq_factor=" << c.ropeScaling->lowFreqFactor
       << ", high_freq_factor=" << c.ropeScaling->highFreqFactor
       << ", original_max_position_embeddings=" << c.ropeScaling->originalMaxPositions << ")";
  if (c.family == Family::Llama)
    os << ", qkv_bias=" << (c.qkvBias ? "True" : "False");
  if (c.family == Family::Llama && c.headDim * c.heads != c.hidden)
    os << ", head_dim=" << c.headDim;
  if (c.qkNorm)
    os << ", qk_norm=True";
  if (c.family == Family::GPT2)
    os << ", positions=" << c.positions << ", intermediate=" << c.intermediate << ", eps=" << c.eps
       << ", gelu=" << stringifyGeluApproximation(c.gelu);
  os << ", tied=" << (c.tied ? "True" : "False") << ", batch=" << B << ", seq=" << S
     << ", dtype=" << dtypeName << "\n\n";
  func->print(os, OpPrintingFlags().printNameLocAsPrefix());
  os << "\n";
  file->keep();
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  llvm::cl::ParseCommandLineOptions(
      argc, argv,
      "Bonsai importer: Hugging Face checkpoint directory (config.json + safetensors) -> "
      "bonsai IR\n");
  try {
    return importModel();
  } catch (const ImportError &e) {
    llvm::errs() << "bonsai-import-hf: error: " << e.what() << "\n";
  } catch (const rt::Error &e) {
    llvm::errs() << "bonsai-import-hf: error: " << e.what() << "\n";
  }
  return 1;
}
