//===- Export.h - PEFT adapters and merged weights from a trained plan ----===//
//
// Two ways out of Bonsai for a LoRA/DoRA fine-tune (docs/import-export.md):
//
//  * a PEFT adapter directory (adapter_config.json + adapter_model.safetensors) that
//    `PeftModel.from_pretrained(base, dir)` loads onto the Hugging Face base model: keys
//    `base_model.model.<module>.lora_A.weight`, `.lora_B.weight` and, for DoRA,
//    `.lora_magnitude_vector`, in the dtype the adapters were trained in;
//  * one safetensors file with every model weight under its Hugging Face name and each adapted
//    weight merged: W' = W + s·B·A (LoRA) or W' = m / ||W + s·B·A||_row ⊙ (W + s·B·A) (DoRA),
//    s = alpha / rank, W dequantized first when the base is NF4;
//  * a Hugging Face model directory that `AutoModelForCausalLM.from_pretrained(dir)` loads: the
//    same merged weights in sharded safetensors (model-0000k-of-0000N.safetensors and
//    model.safetensors.index.json), each tensor in the dtype the source checkpoint had it in,
//    config.json (the source model directory's, or rebuilt from the plan for Llama and GPT-2
//    shapes) and the source directory's tokenizer files.
//
// Both read the plan's adapter metadata (Plan.adapters, Plan.adapter_targets) and the
// executor's current parameters; neither runs a kernel. Files are written under temporary
// names and renamed into place. No MLIR.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_EXPORT_H
#define BONSAI_RUNTIME_EXPORT_H

#include "bonsai/runtime/Plan.h"
#include "bonsai/runtime/Tensor.h"

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace bonsai::rt {

class Checkpoint;
class Executor;

/// The adapter file names of a PEFT adapter directory.
inline constexpr const char kPeftConfigFile[] = "adapter_config.json";
inline constexpr const char kPeftWeightsFile[] = "adapter_model.safetensors";

/// What an export wrote.
struct ExportSummary {
  size_t tensors = 0; ///< Tensors in the safetensors file.
  size_t merged = 0;  ///< Adapted weights merged (merged export only).
};

/// Throws rt::Error unless `plan` can be exported as one PEFT adapter: it has adapters, all
/// of one rank, alpha and kind (LoRA or DoRA). Checked before training so that a run does not
/// end in an export that cannot happen.
void checkPeftExportable(const LoadedPlan &plan);

/// Throws rt::Error when `path` cannot be an export's destination: its directory does not
/// exist, or (for a file) it is a directory. `what` names the option in the message.
void checkExportDestination(const std::string &path, const std::string &what, bool directory);

/// The adapter_config.json of `plan`'s adapters: peft_type LORA, task_type CAUSAL_LM, r,
/// lora_alpha, use_dora, target_modules (the plan's adapter_targets when PEFT's matching rule
/// over the plan's weights selects exactly the adapted modules, otherwise the module paths),
/// bias "none", lora_dropout 0 and the rest of LoraConfig's keys at their defaults.
std::string peftAdapterConfig(const LoadedPlan &plan, const std::string &baseModel);

/// Writes the PEFT adapter directory `dir` from the executor's current parameters. A new
/// directory is written under a temporary name and renamed into place; into an existing one,
/// each file is written under a temporary name and renamed (other files are left alone).
/// Throws rt::Error naming the path on any failure.
ExportSummary exportPeftAdapter(const std::string &dir, const Executor &executor,
                                const std::string &baseModel);
/// exportPeftAdapter of `plan`'s parameters as `views` (one host view per plan tensor) hold
/// them: what an export from a sharded run writes from WholeParameters.
ExportSummary exportPeftAdapter(const std::string &dir, const LoadedPlan &plan,
                                const std::vector<TensorView> &views, const std::string &baseModel);

/// Writes every model weight (every named Parameter that is not an adapter tensor) to the
/// safetensors file `path` under its name, each adapted weight merged with its adapter in fp32
/// and stored in the base's dtype (the adapter's dtype when the base is NF4). NF4 weights
/// without an adapter are dequantized into the dtype their Dequantize kernel produces.
/// Throws rt::Error when the plan has no parameter or a write fails.
ExportSummary exportMergedWeights(const std::string &path, const Executor &executor);
/// exportMergedWeights of `plan`'s parameters as `views` hold them.
ExportSummary exportMergedWeights(const std::string &path, const LoadedPlan &plan,
                                  const std::vector<TensorView> &views);

/// How exportHfModel writes a model directory.
struct HfExportOptions {
  /// A Hugging Face model directory whose config.json and tokenizer files are copied; empty:
  /// config.json is rebuilt from the plan (hfConfigFromPlan) and no tokenizer is written.
  std::string sourceDir;
  /// The checkpoint the run's weights came from (--weights), or null: each tensor is written in
  /// the float dtype it has there (the source dtype), else in the plan's.
  const Checkpoint *source = nullptr;
  /// The largest shard, in bytes (a tensor larger than it gets a shard of its own). Hugging
  /// Face's save_pretrained default, "5GB".
  uint64_t maxShardBytes = 5000000000ull;
};

/// The tokenizer files copied from a source model directory when present.
inline constexpr const char *kHfTokenizerFiles[] = {"tokenizer.json", "tokenizer.model",
                                                    "tokenizer_config.json",
                                                    "special_tokens_map.json"};

/// What exportHfModel wrote, beyond ExportSummary.
struct HfExportSummary : ExportSummary {
  size_t shards = 0;
  uint64_t totalBytes = 0;     ///< The index's metadata.total_size.
  bool configCopied = false;   ///< config.json came from the source directory.
  size_t tokenizerFiles = 0;   ///< Tokenizer files copied.
};

/// A transformers config.json for `plan`'s model, rebuilt from its parameter names and shapes
/// and its kernels' attributes: LlamaForCausalLM (Qwen2ForCausalLM with q/k/v biases) from
/// "model.layers.N..." names, GPT2LMHeadModel from "h.N..." names. max_position_embeddings is
/// the plan's sequence length for Llama (the plan does not know the model's). Throws rt::Error
/// for any other layout. `dtype` is the torch_dtype written.
std::string hfConfigFromPlan(const LoadedPlan &plan, DType dtype);

/// Writes the Hugging Face model directory `dir` (created, or its files replaced) from the
/// executor's current parameters: the merged weights of exportMergedWeights, sharded, the
/// index, config.json and the tokenizer files. A new directory is written under a temporary
/// name and renamed into place. Throws rt::Error naming the path on any failure.
HfExportSummary exportHfModel(const std::string &dir, const Executor &executor,
                              const HfExportOptions &options);
/// exportHfModel of `plan`'s parameters as `views` hold them.
HfExportSummary exportHfModel(const std::string &dir, const LoadedPlan &plan,
                              const std::vector<TensorView> &views, const HfExportOptions &options);

/// The parameters of a run of several ranks gathered whole on rank `root` (docs/sharding.md,
/// "Exports"): there, a copy of the plan whose sharded parameters have their whole shapes and
/// are no longer sharded, and one host view per plan tensor, the gathered ones into buffers it
/// owns; the adapters alone for a PEFT export (`adaptersOnly`), every parameter for a merged
/// one. Every rank builds it (each rank's share of each sharded parameter is broadcast in rank
/// order, in plan order: collectives), but only `root` keeps what it gathers: the others hold
/// one share at a time, and their `plan` and `views` are the executor's own.
struct WholeParameters {
  WholeParameters(const Executor &executor, bool adaptersOnly, int root = 0);
  LoadedPlan plan;
  std::vector<TensorView> views;

private:
  std::deque<std::vector<unsigned char>> storage_;
};

/// "model-00002-of-00005.safetensors".
std::string hfShardName(size_t index, size_t count);

/// The merge itself, on host views: `out` (f32, [out, in]) = W + s·B·A, then, with a
/// magnitude, each row r scaled by m[r] / ||row r||_2. `base` may be NF4, F32, F16 or BF16.
void mergeAdapter(const TensorView &base, const TensorView &loraA, const TensorView &loraB,
                  const TensorView *magnitude, double scale, std::vector<float> &out);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_EXPORT_H
