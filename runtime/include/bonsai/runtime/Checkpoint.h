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
// the run that was interrupted. See docs/checkpoints.md.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_CHECKPOINT_H
#define BONSAI_RUNTIME_CHECKPOINT_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace bonsai::rt {

class Executor;

/// The manifest format this runtime writes and reads (manifest.json "format_version").
inline constexpr uint32_t kCheckpointFormatVersion = 1;
/// The files of a checkpoint directory.
inline constexpr const char kCheckpointModelFile[] = "model.safetensors";
inline constexpr const char kCheckpointOptimizerFile[] = "optimizer.safetensors";
inline constexpr const char kCheckpointManifestFile[] = "manifest.json";
/// The file in a checkpoint root that names the newest complete checkpoint.
inline constexpr const char kCheckpointLatestFile[] = "latest";
/// The environment variable that makes saveCheckpoint call _exit(99) at a named point
/// (after-model, after-optimizer, before-rename, before-latest), for crash tests.
inline constexpr const char kCheckpointCrashVariable[] = "BONSAI_TEST_CRASH_IN_SAVE";

/// Where a training run stands: what a checkpoint records beside the tensors.
struct TrainingPosition {
  uint64_t step = 0;         ///< Steps completed (optimizer updates, for a training plan).
  uint64_t dataPosition = 0; ///< Micro-batches consumed: the index of the next one to read.
  uint64_t seed = 0;         ///< The seed of the run (random init and random tokens).
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
};

/// "step-00000020": the directory name of the checkpoint of `step`.
std::string checkpointDirName(uint64_t step);

/// Writes the checkpoint of `executor` at `position` into `root` (created if missing) and makes
/// it the latest; returns its directory. Throws rt::Error naming the file or directory that
/// failed, leaving the previous checkpoint and `latest` as they were. Also throws, writing
/// nothing, when a persistent zero-initialized gradient tensor is not zero (a plan whose
/// update phase does not clear its accumulators has state no checkpoint holds).
std::string saveCheckpoint(const std::string &root, const Executor &executor,
                           const TrainingPosition &position);

/// The checkpoint directory `path` stands for: the directory `path/latest` names when `path`
/// is a checkpoint root, otherwise `path` itself. Throws rt::Error when `latest` cannot be read
/// or does not name a directory inside the root.
std::string resolveCheckpoint(const std::string &path);

/// Reads and verifies `dir`'s manifest and files: manifest present and well-formed, its own
/// checksum, every listed file present with the recorded size and SHA-256. Throws rt::Error
/// naming the file at fault.
CheckpointManifest verifyCheckpoint(const std::string &dir);

/// Verifies `dir` (verifyCheckpoint), checks that its tensors are exactly the plan's
/// parameters and optimizer state (names, shapes and dtypes; every mismatch listed in one
/// error), then binds the parameters, applies the plan's initializers, and binds the optimizer
/// state over them. Returns the manifest; nothing is written to `executor` unless every check
/// passes.
CheckpointManifest loadCheckpoint(const std::string &dir, Executor &executor);

/// Writes every Gradient tensor of `executor`'s plan to the safetensors file `path`, under its
/// tensor name (a parameter's gradient is named like the parameter). When several gradient
/// tensors share a name, the one in a persistent arena (the accumulator) is written. Throws
/// rt::Error when the plan has no named gradient tensor. Returns the number of tensors written.
size_t writeGradients(const std::string &path, const Executor &executor);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_CHECKPOINT_H
