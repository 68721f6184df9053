//===- Checkpoint.cpp - Crash-safe training checkpoints and resume --------===//
//
// The write order is what makes a crash harmless: everything goes into DIR/.tmp-<step>-<pid>,
// each file is fsynced as it is closed and the directory after it, and the one rename that
// publishes it happens only when it is complete; `latest` is replaced the same way (write
// latest.tmp, fsync, rename), after the parent directory has been fsynced so the new step
// directory is durable before anything names it. A reader therefore sees either the old
// checkpoint or the new one, never a mixture. The manifest carries the SHA-256 of every file
// and of its own canonical text, so a flipped bit anywhere is reported with the file's name.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Checkpoint.h"

#include "bonsai/runtime/Communicator.h"
#include "bonsai/runtime/Executor.h"
#include "bonsai/runtime/HostThreads.h"
#include "bonsai/runtime/Json.h"
#include "bonsai/runtime/Safetensors.h"
#include "bonsai/runtime/Sha256.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <thread>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace bonsai::rt {

namespace {

constexpr const char kManifestFormat[] = "bonsai-checkpoint";
constexpr uint64_t kMaxManifestBytes = 1 << 20;

std::string errnoText() { return std::strerror(errno); }

std::string join(const std::string &dir, const std::string &name) {
  if (dir.empty())
    return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool exists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool isDirectory(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

/// Calls _exit(99) when the crash-test variable names `point`: the process dies as if killed
/// there, with no destructor, flush or cleanup running.
void crashPoint(const char *point) {
  const char *value = std::getenv(kCheckpointCrashVariable);
  if (value && std::strcmp(value, point) == 0)
    ::_exit(99);
}

void syncDirectory(const std::string &dir);

/// Makes `path` and its missing parents, each made durable in its parent (fsync of the parent
/// directory): without it, a power loss after the first save could lose the checkpoint
/// directory itself, with everything the save had synced inside it.
void makeDirectories(const std::string &path) {
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty() || isDirectory(partial))
      continue;
    if (::mkdir(partial.c_str(), 0755) != 0) {
      if (errno != EEXIST)
        throw Error("cannot create checkpoint directory '" + partial + "': " + errnoText());
      continue;
    }
    size_t slash = partial.find_last_of('/');
    syncDirectory(slash == std::string::npos ? "." : slash == 0 ? "/" : partial.substr(0, slash));
  }
  if (!isDirectory(path))
    throw Error("checkpoint directory '" + path + "' is not a directory");
}

/// fsync of a directory: makes the entries created or renamed in it durable.
void syncDirectory(const std::string &dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    throw Error("cannot open directory '" + dir + "' to sync it: " + errnoText());
  if (::fsync(fd) != 0) {
    std::string reason = errnoText();
    ::close(fd);
    throw Error("cannot sync directory '" + dir + "': " + reason);
  }
  ::close(fd);
}

/// Writes `text` to `path` (created or truncated) and fsyncs it.
void writeDurable(const std::string &path, const std::string &text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error("cannot create '" + path + "': " + errnoText());
  const char *p = text.data();
  size_t left = text.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      std::string reason = errnoText();
      ::close(fd);
      throw Error("cannot write '" + path + "': " + reason);
    }
    p += n;
    left -= size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0)
    throw Error("cannot flush '" + path + "': " + errnoText());
}

/// Removes a directory the writer made (files only, one level); best effort.
void removeTree(const std::string &dir) {
  if (DIR *d = ::opendir(dir.c_str())) {
    while (struct dirent *e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..")
        ::unlink(join(dir, name).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(dir.c_str());
}

std::string readSmallFile(const std::string &path, uint64_t limit, const std::string &what) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in)
    throw Error(what + ": cannot open '" + path + "'" + (exists(path) ? "" : " (it is missing)"));
  std::streamoff size = in.tellg();
  if (size < 0 || uint64_t(size) > limit)
    throw Error(what + ": '" + path + "' is not a regular file or is larger than " +
                std::to_string(limit) + " bytes");
  std::string text(size_t(size), '\0');
  in.seekg(0);
  if (size > 0 && !in.read(text.data(), size))
    throw Error(what + ": cannot read '" + path + "'");
  return text;
}

/// The manifest's members other than its own checksum, as written: the checksum covers this
/// exact text, so verification re-renders it from the parsed values and compares.
std::string manifestBody(const CheckpointManifest &m) {
  std::string s;
  s += "  \"format\": " + jsonQuote(kManifestFormat) + ",\n";
  s += "  \"format_version\": " + std::to_string(m.formatVersion) + ",\n";
  s += "  \"model\": " + jsonQuote(m.model) + ",\n";
  s += "  \"step\": " + std::to_string(m.position.step) + ",\n";
  s += "  \"data_position\": " + std::to_string(m.position.dataPosition) + ",\n";
  s += "  \"seed\": " + std::to_string(m.position.seed) + ",\n";
  if (!m.position.spikeLosses.empty() || !m.position.spikeGradNorms.empty()) {
    // %.9g: every f32 reads back as itself (9 significant digits suffice for binary32).
    auto list = [](const std::vector<float> &values) {
      std::string out = "[";
      char buffer[32];
      for (size_t i = 0; i < values.size(); ++i) {
        std::snprintf(buffer, sizeof buffer, "%.9g", double(values[i]));
        out += (i ? ", " : "") + std::string(buffer);
      }
      return out + "]";
    };
    s += "  \"spike_window\": {\"loss\": " + list(m.position.spikeLosses) +
         ", \"grad_norm\": " + list(m.position.spikeGradNorms) + "},\n";
  }
  if (m.formatVersion == kShardedCheckpointFormatVersion) {
    s += "  \"ranks\": " + std::to_string(m.ranks) + ",\n";
    s += "  \"sharded_tensors\": {";
    for (size_t i = 0; i < m.shardedTensors.size(); ++i) {
      std::string dims;
      for (int64_t d : m.shardedTensors[i].second)
        dims += (dims.empty() ? "" : ", ") + std::to_string(d);
      s += std::string(i ? "," : "") + "\n    " + jsonQuote(m.shardedTensors[i].first) + ": [" +
           dims + "]";
    }
    s += std::string(m.shardedTensors.empty() ? "" : "\n  ") + "},\n";
  }
  if (!m.baseSha256.empty()) {
    s += "  \"base_sha256\": " + jsonQuote(m.baseSha256) + ",\n";
    s += "  \"base_tensors\": " + std::to_string(m.baseTensors) + ",\n";
    s += "  \"base_bytes\": " + std::to_string(m.baseBytes) + ",\n";
  }
  s += "  \"files\": {";
  for (size_t i = 0; i < m.files.size(); ++i) {
    const CheckpointFile &f = m.files[i];
    s += std::string(i ? "," : "") + "\n    " + jsonQuote(f.name) +
         ": {\"size\": " + std::to_string(f.size) + ", \"sha256\": " + jsonQuote(f.sha256) + "}";
  }
  s += "\n  }";
  return s;
}

std::string renderManifest(const CheckpointManifest &m) {
  std::string body = manifestBody(m);
  return "{\n" + body + ",\n  \"manifest_sha256\": " + jsonQuote(sha256Hex(body)) + "\n}\n";
}

/// Whether `t` is a parameter's exact copy: optimizer state that starts as a copy of a
/// parameter in the parameter's own dtype (not a master, which is wider). The host copy of a
/// parameter an update on the host works on (docs/offload.md, "The host step") is one, copied
/// into the parameter after every update: it holds nothing the parameter does not.
bool isParameterMirror(const LoadedPlan &plan, const TensorInfo &t) {
  if (t.role != TensorRole::OptimizerState || t.init != TensorInit::CopyOf)
    return false;
  const TensorInfo &source = plan.tensors[t.initSource];
  return source.role == TensorRole::Parameter && source.dtype == t.dtype;
}

/// Whether a checkpoint of `plan` holds tensor `t` in the file of `role`: every tensor of the
/// role, but the frozen parameters when the plan has adapters (an adapter checkpoint), and
/// the parameters' exact copies, which resuming makes again from the parameters (applyInits),
/// so that a plan with updates on the host saves what the same recipe on the device saves.
bool savedInRole(const LoadedPlan &plan, const TensorInfo &t, TensorRole role) {
  if (t.role != role || isParameterMirror(plan, t))
    return false;
  return !(role == TensorRole::Parameter && !plan.adapters.empty() && !t.trainable);
}

bool isFrozenBase(const LoadedPlan &plan, const TensorInfo &t) {
  return !plan.adapters.empty() && t.role == TensorRole::Parameter && !t.trainable;
}

/// The tensors of `role` as safetensors entries, sorted by name: a sharded tensor as this
/// rank's shard (1-D), the others only when `whole` (rank 0's file holds them).
std::vector<SafetensorsTensor> tensorsOfRole(const Executor &executor, TensorRole role,
                                             bool whole = true) {
  const LoadedPlan &plan = executor.plan();
  std::vector<SafetensorsTensor> out;
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorInfo &t = plan.tensors[i];
    if (!savedInRole(plan, t, role) || (!whole && !t.sharded()))
      continue;
    // A frozen NF4 weight is saved as its storage bytes (U8 [bytes]): resuming binds exactly
    // the quantized values the run used, without the full-precision weights; a share of one
    // is its piece of those bytes.
    // A "shard" of one rank (bonsai.shard ... ranks 1) is the whole tensor, saved as such.
    if (t.dtype == DType::NF4 || t.nf4Share())
      out.push_back({t.name, t.dtype, {int64_t(t.bytes)}, executor.view(i).data});
    else
      out.push_back({t.name, t.dtype, t.sharded() && t.shardRanks == 1 ? t.fullShape : t.shape,
                     executor.view(i).data});
  }
  std::sort(out.begin(), out.end(),
            [](const SafetensorsTensor &a, const SafetensorsTensor &b) { return a.name < b.name; });
  return out;
}

/// Throws unless every persistent zero-initialized gradient (an accumulator) is zero: the
/// update phase must have cleared it, or the checkpoint would miss state.
void checkAccumulatorsClear(const Executor &executor, uint64_t step) {
  const LoadedPlan &plan = executor.plan();
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorInfo &t = plan.tensors[i];
    if (t.role != TensorRole::Gradient || t.init != TensorInit::Zeros)
      continue;
    const auto *bytes = static_cast<const unsigned char *>(executor.view(i).data);
    if (std::any_of(bytes, bytes + t.bytes, [](unsigned char b) { return b != 0; }))
      throw Error("cannot checkpoint step " + std::to_string(step) + ": gradient accumulator " +
                  plan.describeTensor(i) +
                  " is not zero between steps (the plan's update phase must zero it), so a "
                  "checkpoint would not capture the run's state");
  }
}

/// Throws unless every value a checkpoint would hold (the parameters and the optimizer state
/// it saves, of float dtypes) is finite: a checkpoint of a diverged run would poison every run
/// resumed from it (docs/training.md, "Non-finite steps").
void checkFinite(const Executor &executor, uint64_t step) {
  const LoadedPlan &plan = executor.plan();
  for (TensorRole role : {TensorRole::Parameter, TensorRole::OptimizerState})
    for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
      const TensorInfo &t = plan.tensors[i];
      if (!savedInRole(plan, t, role) || !isComputeFloat(t.dtype))
        continue;
      std::vector<float> values(size_t(t.numel));
      loadF32(executor.view(i), values.data());
      for (size_t e = 0; e < values.size(); ++e)
        if (!std::isfinite(values[e]))
          throw Error("cannot checkpoint step " + std::to_string(step) + ": " +
                      plan.describeTensor(i) + " holds a non-finite value (element " +
                      std::to_string(e) + " is " + std::to_string(values[e]) +
                      "); a checkpoint is never written from non-finite weights");
    }
}

bool isPlainName(const std::string &name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

/// The step directory `root/latest` names ("" when there is no latest file).
std::string readLatest(const std::string &root) {
  std::string path = join(root, kCheckpointLatestFile);
  if (!exists(path))
    return "";
  std::string text = readSmallFile(path, 4096, "checkpoint directory '" + root + "'");
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.pop_back();
  if (!isPlainName(text))
    throw Error("checkpoint directory '" + root + "': '" + path +
                "' does not name a checkpoint directory inside it (got '" + text + "')");
  return text;
}

} // namespace

bool writesAdapterCheckpoints(const Executor &executor) {
  return !executor.plan().adapters.empty();
}

BaseIdentity baseIdentity(const Executor &executor) {
  const LoadedPlan &plan = executor.plan();
  std::vector<uint32_t> frozen;
  for (uint32_t i = 0; i < plan.tensors.size(); ++i)
    if (isFrozenBase(plan, plan.tensors[i]))
      frozen.push_back(i);
  std::sort(frozen.begin(), frozen.end(), [&](uint32_t a, uint32_t b) {
    return plan.tensors[a].name < plan.tensors[b].name;
  });
  // Views first, on this thread: with a GPU, taking one copies its arena back.
  std::vector<const void *> data;
  for (uint32_t i : frozen)
    data.push_back(executor.view(i).data);
  std::vector<std::string> digests(frozen.size());
  // A sharded frozen tensor (ZeRO-3) is hashed whole, as one rank would: its shards are
  // broadcast in rank order and every rank hashes them all, so that the identity is the same
  // on every rank and for every number of ranks, and a checkpoint resumes on any.
  Communicator &comm = executor.communicator();
  for (size_t k = 0; k < frozen.size(); ++k) {
    const TensorInfo &t = plan.tensors[frozen[k]];
    if (!t.sharded())
      continue;
    Sha256 h;
    std::vector<unsigned char> shard(size_t(t.bytes));
    for (int r = 0; r < comm.size(); ++r) {
      if (r == comm.rank())
        std::memcpy(shard.data(), data[k], shard.size());
      comm.broadcast(shard.data(), size_t(t.numel), t.dtype, r,
                     "the frozen base's identity, shard " + std::to_string(r) + " of " + t.name);
      h.update(shard.data(), shard.size());
    }
    digests[k] = toHex(h.digest());
  }
  unsigned threads = std::min(8u, hostThreads());
  std::atomic<size_t> next{0};
  auto work = [&]() {
    for (size_t k = next++; k < frozen.size(); k = next++) {
      if (plan.tensors[frozen[k]].sharded())
        continue;
      Sha256 h;
      h.update(data[k], size_t(plan.tensors[frozen[k]].bytes));
      digests[k] = toHex(h.digest());
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t)
    pool.emplace_back(work);
  work();
  for (std::thread &t : pool)
    t.join();
  BaseIdentity id;
  Sha256 all;
  for (size_t k = 0; k < frozen.size(); ++k) {
    const TensorInfo &t = plan.tensors[frozen[k]];
    const std::vector<int64_t> &shape = t.sharded() ? t.fullShape : t.shape;
    all.update(t.name + " " + dtypeName(t.wholeDType()) + " " + formatShape(shape) + " " +
               digests[k] + "\n");
    id.bytes += t.wholeBytes();
  }
  id.tensors = frozen.size();
  id.sha256 = toHex(all.digest());
  return id;
}

CheckpointSize checkpointSize(const LoadedPlan &plan) {
  CheckpointSize size;
  for (const TensorInfo &t : plan.tensors) {
    if (savedInRole(plan, t, TensorRole::Parameter)) {
      size.modelBytes += t.bytes;
      ++size.modelTensors;
    } else if (savedInRole(plan, t, TensorRole::OptimizerState)) {
      size.optimizerBytes += t.bytes;
      ++size.optimizerTensors;
    } else if (isFrozenBase(plan, t)) {
      size.frozenBytes += t.bytes;
      ++size.frozenTensors;
    }
  }
  return size;
}

std::vector<std::string> pruneCheckpoints(const std::string &root, uint64_t keep) {
  std::string latest = readLatest(root);
  std::vector<std::pair<uint64_t, std::string>> steps;
  DIR *d = ::opendir(root.c_str());
  if (!d)
    throw Error("cannot list checkpoint directory '" + root + "': " + errnoText());
  while (struct dirent *e = ::readdir(d)) {
    std::string name = e->d_name;
    // Only names saveCheckpoint makes: "step-" and digits, nothing else is touched.
    if (name.size() <= 5 || name.compare(0, 5, "step-") != 0 ||
        name.find_first_not_of("0123456789", 5) != std::string::npos || name.size() > 25 ||
        !isDirectory(join(root, name)))
      continue;
    steps.push_back({std::strtoull(name.c_str() + 5, nullptr, 10), name});
  }
  ::closedir(d);
  std::sort(steps.rbegin(), steps.rend()); // newest first
  std::vector<std::string> removed;
  uint64_t kept = 0;
  for (const auto &[step, name] : steps) {
    if (name == latest || kept < keep) {
      ++kept;
      continue;
    }
    std::string dir = join(root, name);
    removeTree(dir);
    if (exists(dir))
      throw Error("--keep-last: cannot remove old checkpoint '" + dir + "'");
    removed.push_back(dir);
  }
  if (!removed.empty())
    syncDirectory(root);
  return removed;
}

std::string renderCheckpointManifest(const CheckpointManifest &manifest) {
  return renderManifest(manifest);
}

std::string checkpointDirName(uint64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step-%08llu", static_cast<unsigned long long>(step));
  return buf;
}

std::string checkpointRankFile(const std::string &file, uint32_t rank, uint32_t ranks) {
  constexpr std::string_view kSuffix = ".safetensors";
  std::string stem = file;
  if (stem.size() > kSuffix.size() &&
      stem.compare(stem.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0)
    stem.resize(stem.size() - kSuffix.size());
  char buf[64];
  std::snprintf(buf, sizeof buf, ".rank-%05u-of-%05u", rank, ranks);
  return stem + buf + std::string(kSuffix);
}

namespace {

/// The files of a checkpoint, each with the role of the tensors it holds.
constexpr std::pair<const char *, TensorRole> kCheckpointFiles[] = {
    {kCheckpointModelFile, TensorRole::Parameter},
    {kCheckpointOptimizerFile, TensorRole::OptimizerState}};

/// Makes the complete checkpoint in `tempDir` (manifest written) the checkpoint `name` of
/// `root` and then the latest. Throws rt::Error leaving the previous checkpoint and `latest`
/// as they were; `tempDir` is the caller's to remove then.
std::string publishCheckpoint(const std::string &root, const std::string &name,
                              const std::string &tempDir, const std::string &pid) {
  std::string finalDir = join(root, name);
  syncDirectory(tempDir);
  crashPoint("before-rename");
  std::string asideDir;
  if (exists(finalDir)) {
    // A directory of this step that `latest` does not name is an earlier save that crashed
    // after its rename: nothing refers to it, so it is replaced. The latest checkpoint is
    // never touched.
    if (readLatest(root) == name)
      throw Error("checkpoint '" + finalDir +
                  "' already exists and is the latest checkpoint: it is not overwritten");
    asideDir = join(root, ".old-" + name + "-" + pid);
    if (std::rename(finalDir.c_str(), asideDir.c_str()) != 0)
      throw Error("cannot move the stale checkpoint '" + finalDir + "' aside: " + errnoText());
  }
  if (std::rename(tempDir.c_str(), finalDir.c_str()) != 0) {
    std::string reason = errnoText();
    if (!asideDir.empty())
      std::rename(asideDir.c_str(), finalDir.c_str());
    throw Error("cannot rename '" + tempDir + "' to '" + finalDir + "': " + reason);
  }
  syncDirectory(root);
  crashPoint("before-latest");

  std::string latest = join(root, kCheckpointLatestFile);
  std::string latestTemp = latest + ".tmp";
  writeDurable(latestTemp, name + "\n");
  if (std::rename(latestTemp.c_str(), latest.c_str()) != 0)
    throw Error("cannot rename '" + latestTemp + "' to '" + latest + "': " + errnoText());
  syncDirectory(root);
  if (!asideDir.empty())
    removeTree(asideDir);
  return finalDir;
}

/// Creates `tempDir` in `root` (both made if missing), removing a leftover of the same name.
void makeTempDirectory(const std::string &root, const std::string &tempDir) {
  makeDirectories(root);
  if (exists(tempDir))
    removeTree(tempDir);
  if (::mkdir(tempDir.c_str(), 0755) != 0)
    throw Error("cannot create checkpoint directory '" + tempDir + "': " + errnoText());
}

/// The manifest of `executor`'s checkpoint at `position` without its files.
CheckpointManifest manifestOf(const Executor &executor, const TrainingPosition &position,
                              const BaseIdentity *base) {
  CheckpointManifest manifest;
  manifest.model = executor.plan().model;
  manifest.position = position;
  if (writesAdapterCheckpoints(executor)) {
    BaseIdentity computed = base ? *base : baseIdentity(executor);
    manifest.formatVersion = kAdapterCheckpointFormatVersion;
    manifest.baseSha256 = computed.sha256;
    manifest.baseTensors = computed.tensors;
    manifest.baseBytes = computed.bytes;
  }
  return manifest;
}

/// saveCheckpoint of a plan of several ranks. Each phase ends with every rank learning
/// whether any rank failed (onAllRanks), so that one rank's full disk or non-finite shard
/// stops them all with the cause: (1) checks, and rank 0 makes the temporary directory;
/// (2) every rank writes its two files into it at once; (3) the files' sizes and digests go
/// to rank 0, which writes the manifest and publishes the directory as the single-rank save
/// does. A rank killed on the way leaves the temporary directory, never a checkpoint.
std::string saveShardedCheckpoint(const std::string &root, const Executor &executor,
                                  const TrainingPosition &position, const BaseIdentity *base) {
  Communicator &comm = executor.communicator();
  const LoadedPlan &plan = executor.plan();
  const uint32_t rank = uint32_t(comm.rank()), ranks = uint32_t(comm.size());
  const std::string name = checkpointDirName(position.step);
  const std::string context = "checkpoint of step " + std::to_string(position.step);
  // One temporary directory for every rank, named by rank 0's process.
  int64_t pid = ::getpid();
  comm.broadcast(&pid, 1, DType::I64, 0, context);
  const std::string pidText = std::to_string(pid);
  const std::string tempDir = join(root, ".tmp-" + name + "-" + pidText);
  // The base's identity is itself a collective (a sharded base is hashed whole): before any
  // phase in which a rank may stop alone.
  CheckpointManifest manifest = manifestOf(executor, position, base);
  onAllRanks(comm, context, [&] {
    checkAccumulatorsClear(executor, position.step);
    checkFinite(executor, position.step);
    if (rank == 0)
      makeTempDirectory(root, tempDir);
  });
  // Each rank's two files: sizes and digests, in a fixed-size record gathered to every rank.
  struct FileRecord {
    uint64_t size[2];
    char sha256[2][64];
  };
  static_assert(sizeof(FileRecord) % 4 == 0);
  FileRecord mine{};
  std::vector<FileRecord> all(ranks);
  try {
    onAllRanks(comm, context, [&] {
      std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                     {"bonsai.step", std::to_string(position.step)},
                                                     {"bonsai.rank", std::to_string(rank)},
                                                     {"bonsai.ranks", std::to_string(ranks)}};
      for (size_t f = 0; f < 2; ++f) {
        const auto &[file, role] = kCheckpointFiles[f];
        std::string path = join(tempDir, checkpointRankFile(file, rank, ranks));
        writeSafetensors(path, tensorsOfRole(executor, role, /*whole=*/rank == 0), metadata);
        crashPoint(role == TensorRole::Parameter ? "after-model" : "after-optimizer");
        std::string sha = sha256File(path, &mine.size[f]);
        std::memcpy(mine.sha256[f], sha.data(), 64);
      }
    });
    comm.allGather(&mine, all.data(), sizeof(FileRecord) / 4, DType::I32, context);
    std::string finalDir = join(root, name);
    onAllRanks(comm, context, [&] {
      if (rank != 0)
        return;
      manifest.formatVersion = kShardedCheckpointFormatVersion;
      manifest.ranks = ranks;
      for (const TensorInfo &t : plan.tensors)
        if (t.sharded() && (savedInRole(plan, t, TensorRole::Parameter) ||
                            savedInRole(plan, t, TensorRole::OptimizerState)))
          manifest.shardedTensors.emplace_back(
              t.name, t.nf4Share() ? std::vector<int64_t>{int64_t(t.wholeBytes())} : t.fullShape);
      std::sort(manifest.shardedTensors.begin(), manifest.shardedTensors.end());
      for (uint32_t r = 0; r < ranks; ++r)
        for (size_t f = 0; f < 2; ++f)
          manifest.files.push_back({checkpointRankFile(kCheckpointFiles[f].first, r, ranks),
                                    all[r].size[f], std::string(all[r].sha256[f], 64)});
      writeDurable(join(tempDir, kCheckpointManifestFile), renderManifest(manifest));
      finalDir = publishCheckpoint(root, name, tempDir, pidText);
    });
    return finalDir;
  } catch (...) {
    if (rank == 0)
      removeTree(tempDir);
    throw;
  }
}

} // namespace

std::string saveCheckpoint(const std::string &root, const Executor &executor,
                           const TrainingPosition &position, const BaseIdentity *base) {
  if (executor.ranks() > 1)
    return saveShardedCheckpoint(root, executor, position, base);
  // With a GPU, each view below brings its tensor's arena back from the device: the
  // parameters, gradient accumulators and optimizer state, not the activations.
  checkAccumulatorsClear(executor, position.step);
  checkFinite(executor, position.step);
  std::string name = checkpointDirName(position.step);
  std::string pid = std::to_string(::getpid());
  std::string tempDir = join(root, ".tmp-" + name + "-" + pid);
  makeTempDirectory(root, tempDir);
  try {
    CheckpointManifest manifest = manifestOf(executor, position, base);
    std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                   {"bonsai.step", std::to_string(position.step)}};
    for (const auto &[file, role] : kCheckpointFiles) {
      std::string path = join(tempDir, file);
      // writeSafetensors fsyncs the file before renaming it into place.
      writeSafetensors(path, tensorsOfRole(executor, role), metadata);
      crashPoint(role == TensorRole::Parameter ? "after-model" : "after-optimizer");
      CheckpointFile entry;
      entry.name = file;
      entry.sha256 = sha256File(path, &entry.size);
      manifest.files.push_back(std::move(entry));
    }
    writeDurable(join(tempDir, kCheckpointManifestFile), renderManifest(manifest));
    return publishCheckpoint(root, name, tempDir, pid);
  } catch (...) {
    removeTree(tempDir);
    throw;
  }
}

std::string resolveCheckpoint(const std::string &path) {
  if (!isDirectory(path))
    throw Error("checkpoint '" + path + "' is not a directory" +
                (exists(path) ? "" : " (it does not exist)"));
  std::string latest = readLatest(path);
  if (latest.empty())
    return path; // a step directory; verifyCheckpoint says what is wrong with it, if anything
  std::string dir = join(path, latest);
  if (!isDirectory(dir))
    throw Error("checkpoint directory '" + path + "': '" + join(path, kCheckpointLatestFile) +
                "' names '" + latest + "', which does not exist");
  return dir;
}

CheckpointManifest parseCheckpointManifest(std::string_view text, const std::string &what,
                                           const std::string &path) {
  JsonValue root = parseJson(text, "'" + path + "'");
  auto fail = [&](const std::string &message) -> Error {
    return Error(what + ": '" + path + "' " + message);
  };
  if (!root.isObject())
    throw fail("is a JSON " + std::string(root.kindName()) + ", expected an object");
  static const std::set<std::string> known = {
      "format", "format_version", "model",        "step",       "data_position",   "seed",
      "files",  "base_sha256",    "base_tensors", "base_bytes", "manifest_sha256", "spike_window",
      "ranks",  "sharded_tensors"};
  for (const std::string &key : root.keys())
    if (!known.count(key))
      throw fail("has an unknown member \"" + key + "\"");
  auto member = [&](const char *key) -> const JsonValue & {
    const JsonValue *v = root.find(key);
    if (!v)
      throw fail(std::string("has no \"") + key + "\"");
    return *v;
  };
  auto string = [&](const char *key) -> const std::string & {
    const JsonValue &v = member(key);
    if (!v.isString())
      throw fail(std::string("\"") + key + "\" is not a string");
    return v.stringValue();
  };
  auto unsignedValue = [&](const JsonValue &v, const std::string &key) {
    if (!v.isUnsigned())
      throw fail("\"" + key + "\" is not a non-negative integer");
    return v.unsignedValue();
  };
  if (string("format") != kManifestFormat)
    throw fail("has format \"" + string("format") + "\", expected \"" + kManifestFormat + "\"");
  uint64_t version = unsignedValue(member("format_version"), "format_version");
  if (version != kCheckpointFormatVersion && version != kAdapterCheckpointFormatVersion &&
      version != kShardedCheckpointFormatVersion)
    throw fail("has format version " + std::to_string(version) +
               ", but this runtime reads versions " + std::to_string(kCheckpointFormatVersion) +
               " to " + std::to_string(kShardedCheckpointFormatVersion));
  CheckpointManifest m;
  m.formatVersion = uint32_t(version);
  m.model = string("model");
  m.position.step = unsignedValue(member("step"), "step");
  m.position.dataPosition = unsignedValue(member("data_position"), "data_position");
  m.position.seed = unsignedValue(member("seed"), "seed");
  if (const JsonValue *window = root.find("spike_window")) {
    if (!window->isObject() || window->keys().size() != 2 || !window->find("loss") ||
        !window->find("grad_norm"))
      throw fail("\"spike_window\" is not an object of \"loss\" and \"grad_norm\"");
    auto values = [&](const char *key, std::vector<float> &out) {
      const JsonValue &list = *window->find(key);
      if (!list.isArray() || list.elements().size() > kMaxSpikeWindow)
        throw fail(std::string("\"spike_window\" \"") + key + "\" is not an array of at most " +
                   std::to_string(kMaxSpikeWindow) + " numbers");
      for (const JsonValue &v : list.elements()) {
        float f = v.isNumber() ? float(v.numberValue()) : 0.0f;
        if (!v.isNumber() || !std::isfinite(f))
          throw fail(std::string("\"spike_window\" \"") + key +
                     "\" holds something other than a finite f32 number");
        out.push_back(f);
      }
    };
    values("loss", m.position.spikeLosses);
    values("grad_norm", m.position.spikeGradNorms);
  }
  // A sharded checkpoint (version 3) is an adapter checkpoint when it has the base's identity.
  bool adapter = version == kAdapterCheckpointFormatVersion ||
                 (version == kShardedCheckpointFormatVersion && root.find("base_sha256"));
  if (version == kShardedCheckpointFormatVersion) {
    uint64_t ranks = unsignedValue(member("ranks"), "ranks");
    if (ranks < 2 || ranks > 99999)
      throw fail("\"ranks\" is " + std::to_string(ranks) + ", expected 2 to 99999");
    m.ranks = uint32_t(ranks);
    const JsonValue &sharded = member("sharded_tensors");
    if (!sharded.isObject())
      throw fail("\"sharded_tensors\" is not an object");
    for (size_t i = 0; i < sharded.keys().size(); ++i) {
      const std::string &tensor = sharded.keys()[i];
      const JsonValue &dims = sharded.values()[i];
      std::vector<int64_t> shape;
      uint64_t numel = 1;
      bool ok = dims.isArray() && !dims.elements().empty();
      for (size_t e = 0; ok && e < dims.elements().size(); ++e) {
        const JsonValue &d = dims.elements()[e];
        ok = d.isUnsigned() && d.unsignedValue() > 0 && d.unsignedValue() < (1ull << 40);
        if (!ok)
          break;
        shape.push_back(int64_t(d.unsignedValue()));
        numel *= d.unsignedValue();
        ok = numel < (1ull << 48);
      }
      if (!ok || numel % ranks != 0)
        throw fail("\"sharded_tensors\" \"" + tensor + "\" is not a shape of positive " +
                   "dimensions whose element count the " + std::to_string(ranks) + " ranks divide");
      m.shardedTensors.emplace_back(tensor, std::move(shape));
    }
    if (!std::is_sorted(m.shardedTensors.begin(), m.shardedTensors.end()))
      throw fail("\"sharded_tensors\" is not sorted by name");
  } else {
    for (const char *key : {"ranks", "sharded_tensors"})
      if (root.find(key))
        throw fail(std::string("has \"") + key + "\" but format version " +
                   std::to_string(version) + " (written by one rank)");
  }
  if (adapter) {
    m.baseSha256 = string("base_sha256");
    if (m.baseSha256.size() != 64 ||
        m.baseSha256.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw fail("\"base_sha256\" is not 64 lowercase hex digits");
    m.baseTensors = unsignedValue(member("base_tensors"), "base_tensors");
    m.baseBytes = unsignedValue(member("base_bytes"), "base_bytes");
  } else {
    for (const char *key : {"base_sha256", "base_tensors", "base_bytes"})
      if (root.find(key))
        throw fail(std::string("has \"") + key + "\" but format version " +
                   std::to_string(version) + " and no \"base_sha256\" (a full checkpoint)");
  }
  const JsonValue &files = member("files");
  if (!files.isObject())
    throw fail("\"files\" is not an object");
  for (size_t i = 0; i < files.keys().size(); ++i) {
    const std::string &name = files.keys()[i];
    const JsonValue &entry = files.values()[i];
    if (!isPlainName(name))
      throw fail("lists a file '" + name + "' outside the checkpoint directory");
    const JsonValue *size = entry.isObject() ? entry.find("size") : nullptr;
    const JsonValue *sha = entry.isObject() ? entry.find("sha256") : nullptr;
    if (!size || !sha || !sha->isString())
      throw fail("entry for '" + name + "' needs \"size\" and \"sha256\"");
    m.files.push_back({name, unsignedValue(*size, "files." + name + ".size"), sha->stringValue()});
  }
  if (sha256Hex(manifestBody(m)) != string("manifest_sha256"))
    throw fail("fails its own checksum (manifest_sha256): it was edited or corrupted");
  for (uint32_t r = 0; r < m.ranks; ++r)
    for (const auto &[file, role] : kCheckpointFiles) {
      std::string required = m.ranks == 1 ? file : checkpointRankFile(file, r, m.ranks);
      if (std::none_of(m.files.begin(), m.files.end(),
                       [&](const CheckpointFile &f) { return f.name == required; }))
        throw fail("does not list '" + required + "'");
    }
  return m;
}

CheckpointManifest readCheckpointManifest(const std::string &dir) {
  std::string what = "checkpoint '" + dir + "'";
  std::string path = join(dir, kCheckpointManifestFile);
  if (!exists(path))
    throw Error(what + ": '" + path + "' is missing (not a checkpoint, or an interrupted save)");
  return parseCheckpointManifest(readSmallFile(path, kMaxManifestBytes, what), what, path);
}

namespace {

/// Checks the size and SHA-256 of the files of `m` that `wanted` names (every file when null).
void verifyFiles(const std::string &dir, const CheckpointManifest &m,
                 const std::set<std::string> *wanted) {
  std::string what = "checkpoint '" + dir + "'";
  for (const CheckpointFile &f : m.files) {
    if (wanted && !wanted->count(f.name))
      continue;
    std::string filePath = join(dir, f.name);
    if (!exists(filePath))
      throw Error(what + ": '" + filePath + "' is missing");
    uint64_t size = 0;
    std::string sha = sha256File(filePath, &size);
    if (size != f.size)
      throw Error(what + ": '" + filePath + "' is " + std::to_string(size) +
                  " bytes, but the manifest says " + std::to_string(f.size) +
                  " (truncated or replaced)");
    if (sha != f.sha256)
      throw Error(what + ": '" + filePath + "' fails its SHA-256 check (manifest " + f.sha256 +
                  ", file " + sha + "): the file is corrupt");
  }
}

/// The tensors one file of a checkpoint holds (model or optimizer), whole or, in a sharded
/// checkpoint, in rank pieces: what a plan of any number of ranks binds from it.
class SavedTensors {
public:
  /// One tensor: its entry in the first file that holds it, and its whole shape.
  struct Tensor {
    const SafetensorsEntry *entry = nullptr; ///< rank 0's piece for a sharded tensor
    std::vector<int64_t> wholeShape;
    bool sharded = false;
  };

  SavedTensors(const std::string &dir, const CheckpointManifest &m, const std::string &file)
      : dir_(dir), file_(file), ranks_(m.ranks) {
    for (const auto &[name, shape] : m.shardedTensors)
      shardedShapes_.emplace(name, shape);
  }

  /// The file that holds rank `rank`'s pieces (the only file of a single-rank checkpoint).
  std::string fileOf(uint32_t rank) const {
    return ranks_ == 1 ? file_ : checkpointRankFile(file_, rank, ranks_);
  }

  /// The files elements [first, first + count) of `name` are read from: file 0 for a whole
  /// tensor, the ranks whose pieces overlap the range for a sharded one.
  void filesOf(const std::string &name, int64_t first, int64_t count,
               std::set<std::string> &files) const {
    auto it = shardedShapes_.find(name);
    if (it == shardedShapes_.end()) {
      files.insert(fileOf(0));
      return;
    }
    const int64_t piece = numelOf(it->second) / int64_t(ranks_);
    for (uint32_t r = 0; r < ranks_; ++r)
      if (int64_t(r) * piece < first + count && first < int64_t(r + 1) * piece)
        files.insert(fileOf(r));
  }

  /// Opens rank 0's file and every file of `files` of this kind, and checks that each piece
  /// of a sharded tensor is 1-D of its share of the whole and of the first piece's dtype, and
  /// that only rank 0's file holds whole tensors.
  void open(const std::set<std::string> &files) {
    for (uint32_t r = 0; r < ranks_; ++r)
      if (r == 0 || files.count(fileOf(r)))
        opened_.emplace(r, Checkpoint::open(join(dir_, fileOf(r))));
    const Checkpoint &first = opened_.at(0);
    std::string where = "checkpoint '" + dir_ + "'";
    for (const auto &[name, shape] : shardedShapes_) {
      const int64_t piece = numelOf(shape) / int64_t(ranks_);
      const SafetensorsEntry *head = first.find(name);
      for (const auto &[r, ckpt] : opened_) {
        const SafetensorsEntry *e = ckpt.find(name);
        if (!e && !head)
          continue; // a sharded tensor of the other file
        if (!e || !head || e->shape != std::vector<int64_t>{piece} || e->dtype != head->dtype)
          throw Error(where + ": '" + fileOf(r) + "' does not hold tensor " + name +
                      "'s piece (1-D of " + std::to_string(piece) + " " +
                      (head ? head->dtype : std::string("elements")) + "), which the manifest " +
                      "says is sharded over " + std::to_string(ranks_) + " ranks");
      }
    }
    for (const auto &[r, ckpt] : opened_)
      if (r != 0)
        for (const SafetensorsEntry &e : ckpt.tensors())
          if (!shardedShapes_.count(e.name))
            throw Error(where + ": '" + fileOf(r) + "' holds tensor " + e.name +
                        ", which the manifest does not list as sharded (only rank 0's file " +
                        "holds whole tensors)");
    for (const SafetensorsEntry &e : first.tensors()) {
      auto it = shardedShapes_.find(e.name);
      tensors_.emplace(e.name, Tensor{&e, it == shardedShapes_.end() ? e.shape : it->second,
                                      it != shardedShapes_.end()});
    }
  }

  /// Every tensor the file (rank 0's, for a sharded checkpoint) names.
  const std::map<std::string, Tensor> &tensors() const { return tensors_; }
  const Tensor *find(const std::string &name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }
  /// The path of the file it reads whole tensors from.
  std::string path() const { return join(dir_, fileOf(0)); }

  /// Reads the tensor `name` into `dst`: the whole of it when `whole` (dst has its shape,
  /// or is its NF4 storage), else elements [first, first + dst.numel()) of its row-major
  /// data. From the whole tensor, or from each rank piece that holds some of them.
  void read(const std::string &name, bool whole, int64_t first, const TensorView &dst) const {
    const Tensor &t = tensors_.at(name);
    if (!t.sharded) {
      const Checkpoint &file = opened_.at(0);
      if (whole)
        file.read(*t.entry, dst);
      else
        file.readSlice(*t.entry, first, dst);
      return;
    }
    const int64_t piece = numelOf(t.wholeShape) / int64_t(ranks_);
    const int64_t end = first + dst.numel();
    for (uint32_t r = 0; r < ranks_; ++r) {
      const int64_t lo = std::max(first, int64_t(r) * piece);
      const int64_t hi = std::min(end, int64_t(r + 1) * piece);
      if (lo >= hi)
        continue;
      const Checkpoint &file = opened_.at(r);
      TensorView part = dst;
      part.data = static_cast<char *>(dst.data) + (lo - first) * int64_t(dtypeSize(dst.dtype));
      part.shape = {hi - lo};
      file.readSlice(*file.find(name), lo - int64_t(r) * piece, part);
    }
  }

private:
  static int64_t numelOf(const std::vector<int64_t> &shape) {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }

  std::string dir_, file_;
  uint32_t ranks_;
  std::map<std::string, std::vector<int64_t>> shardedShapes_;
  std::map<uint32_t, Checkpoint> opened_;
  std::map<std::string, Tensor> tensors_;
};

} // namespace

CheckpointManifest verifyCheckpoint(const std::string &dir) {
  CheckpointManifest m = readCheckpointManifest(dir);
  verifyFiles(dir, m, nullptr);
  return m;
}

CheckpointManifest loadCheckpoint(const std::string &dir, Executor &executor,
                                  const BaseIdentity *base) {
  const LoadedPlan &plan = executor.plan();
  Communicator &comm = executor.communicator();
  const int rank = executor.rank();
  const std::string context = "loading checkpoint '" + dir + "'";
  CheckpointManifest manifest;
  // An adapter checkpoint leaves the frozen base out; a full one (version 1) holds it, also
  // for an adapter plan (checkpoints written before adapter checkpoints existed).
  bool adapterCheckpoint = false;
  // Bindings: a plan tensor, the saved tensor of the same name, the first element to read.
  struct Binding {
    uint32_t tensor;
    std::string name;
    int64_t first;
  };
  std::vector<SavedTensors> saved;
  saved.reserve(2); // each holds entries of the files it opened
  std::vector<std::vector<Binding>> bindings(2);
  // Everything this rank can find wrong before writing anything: the manifest, the files it
  // reads (sizes and digests), the tensors against the plan. Every rank learns of any
  // rank's error (onAllRanks).
  onAllRanks(comm, context, [&] {
    manifest = readCheckpointManifest(dir);
    adapterCheckpoint = !manifest.baseSha256.empty();
    if (adapterCheckpoint && plan.adapters.empty())
      throw Error("checkpoint '" + dir + "' is an adapter checkpoint (it leaves out a frozen " +
                  "base of " + std::to_string(manifest.baseTensors) + " tensors), but plan '" +
                  plan.path + "' has no adapters");
    // The plan tensors each file binds, and the files this rank reads them from.
    std::vector<std::vector<uint32_t>> wanted(2);
    std::set<std::string> files;
    for (size_t f = 0; f < 2; ++f) {
      const auto &[file, role] = kCheckpointFiles[f];
      saved.emplace_back(dir, manifest, file);
      files.insert(saved[f].fileOf(0));
      for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
        const TensorInfo &t = plan.tensors[i];
        // A parameter's exact copy is never saved: applyInits makes it from the parameter.
        if (t.role != role || isParameterMirror(plan, t) ||
            (adapterCheckpoint && !savedInRole(plan, t, role)))
          continue;
        wanted[f].push_back(i);
        saved[f].filesOf(t.name, t.sharded() ? t.shardOffset(rank) : 0, t.numel, files);
      }
    }
    verifyFiles(dir, manifest, &files);
    saved[0].open(files);
    // Another model's checkpoint: no name in common, and a list of every name would say less.
    if (!wanted[0].empty() && !saved[0].tensors().empty() &&
        std::none_of(wanted[0].begin(), wanted[0].end(),
                     [&](uint32_t i) { return saved[0].find(plan.tensors[i].name); }))
      throw Error("checkpoint '" + dir + "' is of another model than plan '" + plan.path +
                  "': none of the " + std::to_string(saved[0].tensors().size()) +
                  " tensors of its " + saved[0].fileOf(0) + " (the first is " +
                  saved[0].tensors().begin()->first + ") is a parameter of the plan (the first " +
                  "is " + plan.tensors[wanted[0].front()].name + ")");
    std::string problems;
    for (size_t f = 0; f < 2; ++f) {
      const char *file = kCheckpointFiles[f].first;
      if (f == 1)
        saved[f].open(files);
      std::vector<std::string> missing, extra, mismatched;
      std::set<std::string> planNames;
      for (uint32_t i : wanted[f]) {
        const TensorInfo &t = plan.tensors[i];
        planNames.insert(t.name);
        const SavedTensors::Tensor *e = saved[f].find(t.name);
        // NF4 storage, whole or shared out, is saved as U8 bytes of its layout.
        const bool nf4 = t.wholeDType() == DType::NF4;
        const std::vector<int64_t> whole = nf4 ? std::vector<int64_t>{int64_t(t.wholeBytes())}
                                           : t.sharded() ? t.fullShape
                                                         : t.shape;
        if (!e) {
          missing.push_back(t.name);
        } else if (e->wholeShape != whole ||
                   (nf4 ? e->entry->dtype != "U8" : e->entry->runtimeDType != t.dtype)) {
          // Exact dtypes only: a conversion would make the continuation differ from the run.
          mismatched.push_back(t.name + " (plan " + formatShape(whole) + " " +
                               (nf4 ? "nf4 storage U8" : dtypeName(t.dtype)) + ", checkpoint " +
                               formatShape(e->wholeShape) + " " + e->entry->dtype + ")");
        } else {
          bindings[f].push_back({i, t.name, t.sharded() ? t.shardOffset(rank) : 0});
        }
      }
      for (const auto &[name, tensor] : saved[f].tensors())
        if (!planNames.count(name))
          extra.push_back(name);
      std::string fileProblems = formatNameList("missing", missing) +
                                 formatNameList("extra", extra) +
                                 formatNameList("mismatched", mismatched);
      if (!fileProblems.empty())
        problems += std::string(problems.empty() ? "" : "; ") + file + ":" + fileProblems.substr(1);
    }
    if (!problems.empty())
      throw Error("checkpoint '" + dir + "' does not match plan '" + plan.path + "': " + problems);
  });
  if (adapterCheckpoint) {
    // A collective with several ranks (a sharded base is hashed whole), and the same
    // outcome on every rank.
    BaseIdentity bound = base ? *base : baseIdentity(executor);
    if (bound.sha256 != manifest.baseSha256)
      throw Error("checkpoint '" + dir + "' was trained on another base model: its frozen base (" +
                  std::to_string(manifest.baseTensors) + " tensors, " +
                  std::to_string(manifest.baseBytes) + " bytes) has SHA-256 " +
                  manifest.baseSha256 + ", the base bound now (" + std::to_string(bound.tensors) +
                  " tensors, " + std::to_string(bound.bytes) + " bytes) has " + bound.sha256 +
                  "; resume with the base the run started from (the same --weights, or none " +
                  "for the plan's random init)");
  }
  onAllRanks(comm, context, [&] {
    for (const Binding &b : bindings[0]) {
      const TensorInfo &t = plan.tensors[b.tensor];
      if (t.dtype == DType::NF4) {
        // Its storage bytes, from one file or from the pieces of a sharded checkpoint.
        TensorView bytes{executor.view(b.tensor).data, DType::U8, {int64_t(t.bytes)}};
        saved[0].read(b.name, /*whole=*/false, 0, bytes);
      } else {
        saved[0].read(b.name, !t.sharded(), b.first, executor.view(b.tensor));
      }
      executor.markWritten(b.tensor);
    }
    // Zeros and copies (master weights) as a fresh run has them, then the saved state over
    // them.
    executor.applyInits();
    for (const Binding &b : bindings[1]) {
      saved[1].read(b.name, !plan.tensors[b.tensor].sharded(), b.first, executor.view(b.tensor));
      executor.markWritten(b.tensor);
    }
  });
  return manifest;
}

size_t writeGradients(const std::string &path, const Executor &executor) {
  // With a GPU, each view below brings its gradient's arena back from the device.
  const LoadedPlan &plan = executor.plan();
  std::map<std::string, uint32_t> chosen;
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorInfo &t = plan.tensors[i];
    if (t.role != TensorRole::Gradient || t.name.empty())
      continue;
    auto [it, inserted] = chosen.emplace(t.name, i);
    bool persistent = plan.arenas[t.arena].lifetime == Lifetime::Persistent;
    bool chosenPersistent =
        plan.arenas[plan.tensors[it->second].arena].lifetime == Lifetime::Persistent;
    if (!inserted && persistent && !chosenPersistent)
      it->second = i;
  }
  if (chosen.empty())
    throw Error("plan '" + plan.path + "' has no named gradient tensor to write");
  std::vector<SafetensorsTensor> tensors;
  for (const auto &[name, index] : chosen)
    tensors.push_back(
        {name, plan.tensors[index].dtype, plan.tensors[index].shape, executor.view(index).data});
  writeSafetensors(path, tensors, {{"format", "pt"}});
  return tensors.size();
}

} // namespace bonsai::rt
