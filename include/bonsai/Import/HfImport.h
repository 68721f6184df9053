//===- HfImport.h - Hugging Face config.json and checkpoint -> bonsai IR --===//
//
// The library behind bonsai-import-hf, kept apart from the tool's command line so that the HF
// config fuzzer (test/fuzz/HfConfigFuzzer.cpp) runs the same code: config.json is parsed and
// checked into a ModelConfig, the forward graph is built from it with the dialect's builders,
// and the checkpoint's tensors are checked against the parameters the graph declares.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_IMPORT_HFIMPORT_H
#define BONSAI_IMPORT_HFIMPORT_H

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace bonsai::rt {
class Checkpoint;
} // namespace bonsai::rt

namespace mlir::bonsai::hf {

/// A reason the checkpoint cannot be imported; main prints it as one error line.
struct ImportError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The model families the importer builds.
enum class Family { Llama, GPT2 };

/// What the graph depends on, read from config.json and checked.
struct ModelConfig {
  std::string architecture;
  Family family = Family::Llama;
  int64_t vocab = 0, hidden = 0, layers = 0, heads = 0, kvHeads = 0, intermediate = 0;
  int64_t headDim = 0;   ///< head_dim, or hidden / heads where the config does not give it
  int64_t positions = 0; ///< max_position_embeddings / n_positions
  double eps = 0, ropeTheta = 0;
  /// rope_scaling of type "llama3" (Llama 3.1): factor, low_freq_factor, high_freq_factor,
  /// original_max_position_embeddings, as bonsai.rope's scaling attributes.
  struct Llama3Scaling {
    double factor, lowFreqFactor, highFreqFactor;
    int64_t originalMaxPositions;
  };
  std::optional<Llama3Scaling> ropeScaling;
  bool tied = false;
  bool qkvBias = false;                             ///< Qwen2; Qwen3's attention_bias
  bool qkNorm = false;                              ///< Qwen3: q_norm / k_norm per head
  GeluApproximation gelu = GeluApproximation::Tanh; ///< GPT-2
  std::optional<std::string> torchDType;            ///< "bfloat16", ... if given
  std::optional<int64_t> slidingWindow;             ///< the active window, if any
};

/// Parses config.json's text and checks everything the graph depends on; `path` names the file
/// in errors. Throws ImportError (or rt::Error for malformed JSON).
ModelConfig parseModelConfig(std::string_view text, const std::string &path);

/// Refuses a config with more layers than `checkpointTensors`, the number of tensors of the
/// checkpoint it is imported with: every layer has weights of its own, so such a config cannot
/// match, and building its graph first could take unbounded time and memory.
void checkLayerCount(const ModelConfig &config, uint64_t checkpointTensors);

/// A parameter the graph declares: the checkpoint must hold it with this shape.
struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
};

/// Appends `func.func @forward(%ids, %labels[, %positions, %segment_ids]) -> tensor<f32>` of
/// [batch, seq] int32 inputs to `module`, with element type `dtype`; `gpt2Prefix` is GPT-2's
/// tensor-name prefix ("transformer." or ""). Returns the parameters it declares. Throws
/// ImportError for --packed on GPT-2.
std::vector<ExpectedTensor> buildForward(ModuleOp module, Type dtype, const ModelConfig &config,
                                         int64_t batch, int64_t seq, bool packed,
                                         const std::string &gpt2Prefix);

/// Every expected tensor must be in the checkpoint with the expected shape and a float dtype;
/// all problems are reported in one error. Tensors the model does not use get a note.
void checkCheckpoint(const ::bonsai::rt::Checkpoint &checkpoint,
                     const std::vector<ExpectedTensor> &expected);

/// The element type ("bf16", "f32", "f16") a --dtype value, a config torch_dtype or a
/// safetensors dtype names; `spelling` 0, 1 or 2 picks which of the three `name` is.
std::optional<std::string> elementType(llvm::StringRef name, int spelling);

/// Prints "bonsai-import-hf: note: <message>" to stderr.
void printNote(const std::string &message);

} // namespace mlir::bonsai::hf

#endif // BONSAI_IMPORT_HFIMPORT_H
