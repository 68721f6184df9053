//===- Checkpoint.h - Crash-safe training checkpoints and resume ----------===//
//
// A training checkpoint is a directory DIR/step-00000020/ holding model.safetensors (every
// Parameter tensor), optimizer.safetensors (every OptimizerState tensor, the i64 step counter
// "optimizer.step" among them) and manifest.json (format version, model, step, data position,
// seed, and each file's size and SHA-256, itself checksummed). It is written under a temporary
// name, every file and directory fsynced, renamed into place, and only then named by DIR/latest
// (replaced atomically): a crash at any point leaves the previous checkpoint, and `latest`
// naming it, untouched. Resuming verifies everything before binding anything, and binds only
// tensors whose names, shapes and dtypes equal the plan's, so the continuation is bit for bit
// the run that was interrupted.
//
// A plan with LoRA/DoRA adapters (frozen base parameters) writes an adapter checkpoint (format
// version 2): model.safetensors holds the trainable parameters only, and the manifest records
// the identity of the frozen base (baseIdentity: a SHA-256 over the frozen tensors' names,
// shapes, dtypes and bytes). Resuming one binds the base first (the same --weights, or the
// plan's random init from the checkpoint's seed) and refuses it when its identity differs.
// A plan of several ranks (bonsai.shard, docs/sharding.md) writes a sharded checkpoint (format
// version 3): every rank writes its own model and optimizer files at once, holding its shards
// of the sharded tensors (rank 0's also the tensors every rank holds whole), into the one
// temporary directory, and rank 0 publishes it with a manifest of every rank's files and of
// the sharded tensors' whole shapes. A checkpoint of N ranks resumes on M ranks (or one): each
// rank reads the elements of its own shards from the files that hold them, and verifies those
// files only. See docs/checkpoints.md.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_CHECKPOINT_H
#define BONSAI_RUNTIME_CHECKPOINT_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bonsai::rt {

class Executor;
struct LoadedPlan;

/// The manifest format of a full checkpoint (manifest.json "format_version").
inline constexpr uint32_t kCheckpointFormatVersion = 1;
/// The manifest format of an adapter checkpoint: version 1 plus the frozen base's identity
/// ("base_sha256", "base_tensors", "base_bytes"); model.safetensors holds the trainable
/// parameters only.
inline constexpr uint32_t kAdapterCheckpointFormatVersion = 2;
/// The manifest format of a checkpoint written by several ranks (a sharded plan): versions 1 or
/// 2 plus "ranks" and "sharded_tensors", and one model and one optimizer file per rank
/// (checkpointRankFile); an adapter checkpoint has version 2's base identity.
inline constexpr uint32_t kShardedCheckpointFormatVersion = 3;
/// The files of a checkpoint directory.
inline constexpr const char kCheckpointModelFile[] = "model.safetensors";
inline constexpr const char kCheckpointOptimizerFile[] = "optimizer.safetensors";
inline constexpr const char kCheckpointManifestFile[] = "manifest.json";
/// The file in a checkpoint root that names the newest complete checkpoint.
inline constexpr const char kCheckpointLatestFile[] = "latest";
/// The environment variable that makes saveCheckpoint call _exit(99) at a named point
/// (after-model, after-optimizer, before-rename, before-latest), for crash tests.
inline constexpr const char kCheckpointCrashVariable[] = "BONSAI_TEST_CRASH_IN_SAVE";

/// The most values a checkpoint's spike window holds per series (bonsai-run --spike-window's
/// upper limit).
inline constexpr size_t kMaxSpikeWindow = 10000;

/// Where a training run stands: what a checkpoint records beside the tensors.
struct TrainingPosition {
  uint64_t step = 0;         ///< Steps completed (optimizer updates, for a training plan).
  uint64_t dataPosition = 0; ///< Micro-batches consumed: the index of the next one to read.
  uint64_t seed = 0;         ///< The seed of the run (random init and random tokens).
  /// The spike rule's windows (SpikeRule, bonsai-run --spike-zscore), oldest first: empty
  /// when the rule is off. Finite values, written so that they read back bit for bit.
  std::vector<float> spikeLosses, spikeGradNorms;
};

/// One file a manifest lists.
struct CheckpointFile {
  std::string name; ///< Relative to the checkpoint directory.
  uint64_t size = 0;
  std::string sha256; ///< 64 lowercase hex digits.
};

/// The contents of a verified manifest.json.
struct CheckpointManifest {
  uint32_t formatVersion = kCheckpointFormatVersion;
  std::string model; ///< The plan's model name when it was written.
  TrainingPosition position;
  std::vector<CheckpointFile> files;
  /// Adapter checkpoints (version 2) only: the frozen base's identity (baseIdentity), the
  /// number of its tensors and their bytes. Empty for a full checkpoint.
  std::string baseSha256;
  uint64_t baseTensors = 0;
  uint64_t baseBytes = 0;
  /// The ranks that wrote it: 1 for versions 1 and 2, at least 2 for version 3.
  uint32_t ranks = 1;
  /// Version 3 only: each tensor saved in rank pieces, by name (sorted), with its whole shape.
  /// Rank r's file holds elements [r * n / ranks, (r + 1) * n / ranks) of the row-major whole
  /// tensor of n elements, as a 1-D tensor; the other tensors are whole in rank 0's file.
  std::vector<std::pair<std::string, std::vector<int64_t>>> shardedTensors;
};

/// The identity of a plan's frozen base as the executor holds it.
struct BaseIdentity {
  std::string sha256; ///< Over every frozen parameter, sorted by name; see baseIdentity.
  uint64_t tensors = 0;
  uint64_t bytes = 0;
};

/// Whether `executor`'s plan writes adapter checkpoints: it has LoRA/DoRA adapters and so
/// frozen base parameters, which checkpoints leave out.
bool writesAdapterCheckpoints(const Executor &executor);

/// The identity of the frozen parameters (Parameter, not trainable) of `executor`'s plan: the
/// SHA-256 of one line per tensor, sorted by name, "<name> <dtype> <shape> <sha256 of its
/// bytes>\n" (NF4 tensors by their storage bytes). The per-tensor digests run on several
/// threads; a 7B bf16 base takes tens of seconds, so callers compute it once per run.
BaseIdentity baseIdentity(const Executor &executor);

/// What a checkpoint of `executor`'s plan holds: the bytes of model.safetensors' tensors and
/// of optimizer.safetensors' (tensor data, without headers), and the frozen bytes left out.
struct CheckpointSize {
  uint64_t modelBytes = 0, modelTensors = 0;
  uint64_t optimizerBytes = 0, optimizerTensors = 0;
  uint64_t frozenBytes = 0, frozenTensors = 0; ///< Left out (adapter checkpoints only).
};
CheckpointSize checkpointSize(const LoadedPlan &plan);

/// "step-00000020": the directory name of the checkpoint of `step`.
std::string checkpointDirName(uint64_t step);

/// The file of rank `rank` of `ranks` in a sharded checkpoint: for kCheckpointModelFile,
/// "model.rank-00001-of-00004.safetensors".
std::string checkpointRankFile(const std::string &file, uint32_t rank, uint32_t ranks);

/// Writes the checkpoint of `executor` at `position` into `root` (created if missing) and makes
/// it the latest; returns its directory. With several ranks every rank calls it, each writing
/// its own files (a sharded checkpoint), and a failure on any rank throws on all of them. Throws
/// rt::Error naming the file or directory that failed, leaving the previous checkpoint and `latest`
/// as they were. Also throws, writing nothing, when a persistent zero-initialized gradient tensor
/// is not zero (a plan whose update phase does not clear its accumulators has state no checkpoint
/// holds). An adapter plan's checkpoint records `base` (baseIdentity of the executor), computed
/// here when null.
std::string saveCheckpoint(const std::string &root, const Executor &executor,
                           const TrainingPosition &position, const BaseIdentity *base = nullptr);

/// Removes the oldest checkpoints (step-NNNNNNNN directories) of `root` so that at most `keep`
/// remain, never the one `latest` names: call it after saveCheckpoint has made the new one
/// durable and the latest, so that the one a run resumed from goes only once a newer one can
/// replace it. Returns the directories removed. Throws rt::Error when one cannot be removed.
std::vector<std::string> pruneCheckpoints(const std::string &root, uint64_t keep);

/// The checkpoint directory `path` stands for: the directory `path/latest` names when `path`
/// is a checkpoint root, otherwise `path` itself. Throws rt::Error when `latest` cannot be read
/// or does not name a directory inside the root.
std::string resolveCheckpoint(const std::string &path);

/// The text of manifest.json for `manifest`, its own checksum included: what saveCheckpoint
/// writes, and what parseCheckpointManifest reads back as `manifest`.
std::string renderCheckpointManifest(const CheckpointManifest &manifest);

/// Parses and checks the text of a manifest.json: well-formed, known members of the right
/// kinds, a supported format version, file names inside the checkpoint directory, model and
/// optimizer files listed, and its own checksum. Does not look at the files it lists. Throws
/// rt::Error starting with `what` and naming `path`.
CheckpointManifest parseCheckpointManifest(std::string_view text, const std::string &what,
                                           const std::string &path);

/// Reads and parses `dir`'s manifest (parseCheckpointManifest), without reading the files it
/// lists: what a caller needs to know before loading (the seed, whether it is an adapter
/// checkpoint). Throws rt::Error naming the manifest when it is missing or at fault.
CheckpointManifest readCheckpointManifest(const std::string &dir);

/// Reads and verifies `dir`'s manifest and files: manifest present and well-formed, its own
/// checksum, every listed file present with the recorded size and SHA-256. Throws rt::Error
/// naming the file at fault.
CheckpointManifest verifyCheckpoint(const std::string &dir);

/// Verifies `dir` (its manifest, and the size and SHA-256 of every file this rank reads),
/// checks that its tensors are exactly the plan's parameters and optimizer state (names,
/// whole shapes and dtypes; every mismatch listed in one error), then binds the parameters,
/// applies the plan's initializers, and binds the optimizer state over them. Returns the
/// manifest; nothing is written to `executor` unless every check passes.
///
/// Any checkpoint loads into a plan of any number of ranks: a sharded plan's rank reads the
/// elements of its shards, from a whole tensor or from the rank pieces of a sharded
/// checkpoint that hold them, whatever ranks wrote it. With several ranks every rank calls it,
/// and an error on one rank is thrown on every rank.
///
/// An adapter checkpoint holds the trainable parameters only: the frozen base must already be
/// bound (bindWeights or initWeights), and its baseIdentity (`base`, computed here when null)
/// must equal the manifest's, else rt::Error says that the base differs.
CheckpointManifest loadCheckpoint(const std::string &dir, Executor &executor,
                                  const BaseIdentity *base = nullptr);

/// Writes every Gradient tensor of `executor`'s plan to the safetensors file `path`, under its
/// tensor name (a parameter's gradient is named like the parameter). When several gradient
/// tensors share a name, the one in a persistent arena (the accumulator) is written. Throws
/// rt::Error when the plan has no named gradient tensor. Returns the number of tensors written.
size_t writeGradients(const std::string &path, const Executor &executor);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_CHECKPOINT_H
