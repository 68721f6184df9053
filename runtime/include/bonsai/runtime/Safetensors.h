//===- Safetensors.h - Reading, writing and binding safetensors weights ---===//
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of JSON describing each
// tensor (dtype, shape, byte range of the data section), then the data section. A sharded
// checkpoint is a `*.safetensors.index.json` whose "weight_map" names the shard (relative to the
// index's directory) that holds each tensor. Everything in a header is validated before any data
// is read: lengths against the file size, byte ranges against the data section and against each
// other, sizes against shape and dtype. Binding then matches the plan's parameters by name and
// reports every missing, extra and mis-shaped tensor in one message.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_SAFETENSORS_H
#define BONSAI_RUNTIME_SAFETENSORS_H

#include "bonsai/runtime/Plan.h"
#include "bonsai/runtime/Tensor.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace bonsai::rt {

/// The safetensors spelling of a runtime dtype ("F32", "BF16", "F8_E4M3", "I64", ...); "U8"
/// for NF4, whose tensors are written as their storage bytes.
const char *safetensorsDTypeName(DType dtype);

/// One tensor of a checkpoint, as its header describes it.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;                 ///< As written in the header ("F32", "BF16", "U8", ...).
  size_t elementSize = 0;            ///< Bytes per element of `dtype`.
  std::optional<DType> runtimeDType; ///< The runtime's type for `dtype`, when it has one.
  std::vector<int64_t> shape;
  uint64_t numel = 0;
  std::string file;     ///< The file that holds the data.
  uint64_t offset = 0;  ///< Absolute byte offset of the data in `file`.
  uint64_t bytes = 0;   ///< numel * elementSize.
};

/// The tensors of one safetensors file or of a sharded checkpoint, validated.
class Checkpoint {
public:
  /// Opens `path`: a `.safetensors` file, or a sharded checkpoint's `.index.json` (any path
  /// ending in ".json"). Throws rt::Error naming the file and the problem.
  static Checkpoint open(const std::string &path);

  /// The path it was opened from.
  const std::string &path() const { return path_; }
  /// Every tensor, sorted by name.
  const std::vector<SafetensorsEntry> &tensors() const { return tensors_; }
  /// The tensor named `name`, or nullptr.
  const SafetensorsEntry *find(std::string_view name) const;
  /// The "__metadata__" of the file (of the index for a sharded checkpoint: its "metadata"
  /// members whose values are strings).
  const std::map<std::string, std::string> &metadata() const { return metadata_; }

  /// Reads `entry`'s data into `dst`, whose shape must equal the entry's. Same dtypes copy the
  /// bytes; F32, F16 and BF16 convert into one another (exact widening, round-to-nearest-even
  /// narrowing). An NF4 `dst` takes either its storage bytes (isNf4Storage) or F32, F16 or
  /// BF16 values of its shape, which are quantized (Nf4.h). Throws rt::Error on any other
  /// dtype pair or a read failure.
  void read(const SafetensorsEntry &entry, const TensorView &dst) const;
  /// Reads elements [first, first + dst.numel()) of `entry`'s row-major data into `dst`, a
  /// shard of it (docs/sharding.md): only those bytes are read. The dtypes convert as for
  /// read(); `dst` is not NF4. Throws rt::Error when the range is outside the entry.
  void readSlice(const SafetensorsEntry &entry, int64_t first, const TensorView &dst) const;

private:
  std::string path_;
  std::vector<SafetensorsEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// Whether `entry` is the storage of an NF4 tensor of `bytes` bytes as checkpoints write it:
/// U8 of shape [bytes].
bool isNf4Storage(const SafetensorsEntry &entry, uint64_t bytes);

/// Parses and validates the header of one safetensors file; entries in file order.
std::vector<SafetensorsEntry> readSafetensorsHeader(const std::string &path,
                                                    std::map<std::string, std::string> *metadata);

/// One tensor to write: `data` holds numel * dtypeSize(dtype) bytes.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void *data = nullptr;
};

/// Writes a safetensors file (header padded to 8 bytes; data in the given order). Written to a
/// temporary name beside `path`, flushed to disk, then renamed: a crash never leaves a partial
/// file under `path`. Throws rt::Error on duplicate names or an I/O failure.
void writeSafetensors(const std::string &path, const std::vector<SafetensorsTensor> &tensors,
                      const std::map<std::string, std::string> &metadata = {});

/// Binds every Parameter tensor of `plan` from `checkpoint`, writing through `views` (one per
/// plan tensor). Checks everything first and throws one rt::Error that lists all missing
/// (in the plan, not the checkpoint), extra (in the checkpoint, not the plan) and mis-shaped
/// (shape differs, or a dtype that does not convert) names; only then reads any data. A
/// parameter with an initializer (an adapter, docs/lora.md) may be absent: it is left unbound.
/// Returns, per plan tensor, whether it was bound. A sharded parameter (TensorInfo::shardRanks)
/// binds the tensor of its full shape, of which it reads rank `rank`'s slice only.
/// Tensors of the checkpoint that the plan lacks and ignoredHfTensorReason names are not
/// extra: they are skipped and their names appended to `ignored` when it is non-null.
std::vector<bool> bindCheckpoint(const LoadedPlan &plan, const Checkpoint &checkpoint,
                                 const std::vector<TensorView> &views,
                                 std::vector<std::string> *ignored = nullptr, int rank = 0);

/// "; 2 missing: a, b" for the tensor names a binding found at fault under `label`, or "" when
/// there are none: the clauses of bindCheckpoint's and loadCheckpoint's mismatch errors.
std::string formatNameList(const char *label, const std::vector<std::string> &names);

/// Why `name`, a tensor of a Hugging Face checkpoint, is one no computation reads and may be
/// skipped (rotary_emb.inv_freq, GPT-2's attn.bias and attn.masked_bias buffers, a tied
/// lm_head.weight; the caller asks only about tensors its model does not have), or nullptr.
/// The one list that bonsai-import-hf and bonsai-run --weights both use.
const char *ignoredHfTensorReason(std::string_view name);

/// The weights file `path` stands for: itself, or in a directory (a Hugging Face model
/// directory) its model.safetensors.index.json, else its model.safetensors. Throws rt::Error
/// for a directory with neither.
std::string resolveWeightsPath(const std::string &path);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_SAFETENSORS_H
