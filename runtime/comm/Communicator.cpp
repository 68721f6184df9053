//===- Communicator.cpp - Argument checks, one rank, launch detection -------===//
//
// Implements Communicator.h except the MPI communicator (MpiCommunicator.cpp): the checks every
// collective makes before anything moves, the single-rank communicator, the rank-order sum,
// the launcher's environment, the deadline's setting and the factory. Compiled twice: into
// bonsai_comm (one rank only) and, with BONSAI_HAVE_MPI, into bonsai_comm_mpi, whose factory
// also builds the MPI communicator; a program links one of the two.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Communicator.h"

#include "CommInternal.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <sstream>
#include <vector>

namespace bonsai::rt {

namespace {

/// Bytes of `count` elements of `dtype`, or an error naming the collective when that does not
/// fit size_t.
size_t checkedBytes(size_t count, size_t multiplier, DType dtype, const char *name) {
  size_t elem = dtypeSize(dtype);
  if (multiplier != 0 && count > std::numeric_limits<size_t>::max() / multiplier / elem)
    throw Error(std::string(name) + ": " + std::to_string(count) + " x " +
                std::to_string(multiplier) + " elements of " + dtypeName(dtype) +
                " overflow the byte count");
  return count * multiplier * elem;
}

void checkSummable(DType dtype, const char *name) {
  if (!isComputeFloat(dtype))
    throw Error(std::string(name) + ": sums are f32, bf16 or f16, not " + dtypeName(dtype));
}

void checkPointer(const void *p, size_t bytes, const char *name, const char *which) {
  if (bytes > 0 && p == nullptr)
    throw Error(std::string(name) + ": `" + which + "` is null but " + std::to_string(bytes) +
                " bytes were asked for");
}

// A known dtype, so that dtypeSize and dtypeName do not meet a value outside the enum.
void checkDType(DType dtype, const char *name) {
  if (uint8_t(dtype) > uint8_t(DType::U8))
    throw Error(std::string(name) + ": unknown dtype " + std::to_string(int(dtype)));
}

} // namespace

Communicator::~Communicator() = default;

void Communicator::allReduceSum(const void *send, void *recv, size_t count, DType dtype,
                                const std::string &context) {
  const char *name = "allReduceSum";
  checkDType(dtype, name);
  checkSummable(dtype, name);
  size_t bytes = checkedBytes(count, 1, dtype, name);
  checkPointer(send, bytes, name, "send");
  checkPointer(recv, bytes, name, "recv");
  doAllReduceSum(send, recv, count, dtype, context);
}

void Communicator::allReduceMax(const void *send, void *recv, size_t count, DType dtype,
                                const std::string &context) {
  const char *name = "allReduceMax";
  checkDType(dtype, name);
  if (dtype != DType::F32)
    throw Error(std::string(name) + ": the maximum is of f32 values, not " + dtypeName(dtype));
  size_t bytes = checkedBytes(count, size_t(size()), dtype, name) / size_t(size());
  checkPointer(send, bytes, name, "send");
  checkPointer(recv, bytes, name, "recv");
  if (count == 0)
    return;
  std::vector<float> all(count * size_t(size()));
  doAllGather(send, all.data(), count, dtype, context);
  auto *out = static_cast<float *>(recv);
  for (size_t i = 0; i < count; ++i) {
    float m = all[i];
    for (size_t r = 1; r < size_t(size()) && !std::isnan(m); ++r) {
      float v = all[r * count + i];
      m = std::isnan(v) || v > m ? v : m;
    }
    out[i] = m;
  }
}

void Communicator::reduceScatterSum(const void *send, void *recv, size_t recvCount, DType dtype,
                                    const std::string &context) {
  const char *name = "reduceScatterSum";
  checkDType(dtype, name);
  checkSummable(dtype, name);
  size_t sendBytes = checkedBytes(recvCount, size_t(size()), dtype, name);
  checkPointer(send, sendBytes, name, "send");
  checkPointer(recv, recvCount * dtypeSize(dtype), name, "recv");
  doReduceScatterSum(send, recv, recvCount, dtype, context);
}

void Communicator::allGather(const void *send, void *recv, size_t sendCount, DType dtype,
                             const std::string &context) {
  const char *name = "allGather";
  checkDType(dtype, name);
  size_t recvBytes = checkedBytes(sendCount, size_t(size()), dtype, name);
  checkPointer(send, sendCount * dtypeSize(dtype), name, "send");
  checkPointer(recv, recvBytes, name, "recv");
  doAllGather(send, recv, sendCount, dtype, context);
}

void Communicator::ringShift(const void *send, void *recv, size_t count, DType dtype,
                             const std::string &context, int ringSize) {
  const char *name = "ringShift";
  if (ringSize == 0)
    ringSize = size();
  if (ringSize < 1 || size() % ringSize != 0)
    throw Error(std::string("communicator ") + name + ": a ring of " + std::to_string(ringSize) +
                " ranks does not divide the " + std::to_string(size()) + " ranks");
  checkDType(dtype, name);
  size_t bytes = checkedBytes(count, 1, dtype, name);
  checkPointer(send, bytes, name, "send");
  checkPointer(recv, bytes, name, "recv");
  doRingShift(send, recv, count, dtype, ringSize, context);
}

void Communicator::broadcast(void *buffer, size_t count, DType dtype, int root,
                             const std::string &context) {
  const char *name = "broadcast";
  checkDType(dtype, name);
  size_t bytes = checkedBytes(count, 1, dtype, name);
  checkPointer(buffer, bytes, name, "buffer");
  if (root < 0 || root >= size())
    throw Error(std::string(name) + ": root " + std::to_string(root) + " is not a rank of " +
                std::to_string(size()) + (context.empty() ? "" : " [" + context + "]"));
  doBroadcast(buffer, count, dtype, root, context);
}

void Communicator::barrier(const std::string &context) { doBarrier(context); }

void onAllRanks(Communicator &comm, const std::string &context, const std::function<void()> &work) {
  if (comm.size() == 1) {
    work();
    return;
  }
  std::exception_ptr failure;
  std::string message;
  try {
    work();
  } catch (const std::exception &e) {
    failure = std::current_exception();
    message = e.what();
  }
  // One fixed-size record per rank: a failed flag, then the message (cut, NUL-terminated).
  constexpr size_t kRecord = 4096;
  std::vector<char> mine(kRecord, '\0'), all(kRecord * size_t(comm.size()));
  mine[0] = failure ? 1 : 0;
  std::memcpy(&mine[1], message.data(), std::min(message.size(), kRecord - 2));
  comm.allGather(mine.data(), all.data(), kRecord / 4, DType::I32, context);
  if (failure)
    std::rethrow_exception(failure);
  for (int r = 0; r < comm.size(); ++r) {
    const char *record = &all[size_t(r) * kRecord];
    if (record[0])
      throw Error("stopped because rank " + std::to_string(r) +
                  " failed: " + std::string(record + 1));
  }
}

//===----------------------------------------------------------------------===//
// One rank
//===----------------------------------------------------------------------===//

SingleRankCommunicator::SingleRankCommunicator(double timeoutSeconds)
    : timeoutSeconds_(timeoutSeconds) {}

void SingleRankCommunicator::doAllReduceSum(const void *send, void *recv, size_t count, DType dtype,
                                            const std::string &) {
  comm::sumInRankOrder({send}, recv, count, dtype);
}

void SingleRankCommunicator::doReduceScatterSum(const void *send, void *recv, size_t recvCount,
                                                DType dtype, const std::string &) {
  comm::sumInRankOrder({send}, recv, recvCount, dtype);
}

void SingleRankCommunicator::doAllGather(const void *send, void *recv, size_t sendCount,
                                         DType dtype, const std::string &) {
  if (sendCount > 0)
    std::memmove(recv, send, sendCount * dtypeSize(dtype));
}

void SingleRankCommunicator::doBroadcast(void *, size_t, DType, int, const std::string &) {}

// One rank is its own neighbour: the shift is a copy.
void SingleRankCommunicator::doRingShift(const void *send, void *recv, size_t count, DType dtype,
                                         int, const std::string &) {
  if (count > 0)
    std::memmove(recv, send, count * dtypeSize(dtype));
}

void SingleRankCommunicator::doBarrier(const std::string &) {}

//===----------------------------------------------------------------------===//
// The rank-order sum
//===----------------------------------------------------------------------===//

namespace comm {

namespace {

template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void sumHalf(const std::vector<const void *> &parts, void *out, size_t count) {
  // Blocks of fp32 accumulators: the ranks are summed in order for each element, and an
  // element's sum never leaves fp32 until it is rounded once.
  constexpr size_t kBlock = 2048;
  float acc[kBlock];
  for (size_t begin = 0; begin < count; begin += kBlock) {
    size_t n = std::min(kBlock, count - begin);
    uint16_t v[kBlock];
    std::memcpy(v, static_cast<const char *>(parts[0]) + begin * 2, n * 2);
    for (size_t i = 0; i < n; ++i)
      acc[i] = Load(v[i]);
    for (size_t p = 1; p < parts.size(); ++p) {
      std::memcpy(v, static_cast<const char *>(parts[p]) + begin * 2, n * 2);
      for (size_t i = 0; i < n; ++i)
        acc[i] += Load(v[i]);
    }
    for (size_t i = 0; i < n; ++i)
      v[i] = Store(acc[i]);
    std::memcpy(static_cast<char *>(out) + begin * 2, v, n * 2);
  }
}

} // namespace

void sumInRankOrder(const std::vector<const void *> &parts, void *out, size_t count, DType dtype) {
  if (count == 0 || parts.empty())
    return;
  if (parts.size() == 1) {
    // One rank: the sum is its contribution; a copy keeps every bit (NaN payloads included).
    std::memmove(out, parts[0], count * dtypeSize(dtype));
    return;
  }
  switch (dtype) {
  case DType::F32: {
    constexpr size_t kBlock = 2048;
    float acc[kBlock], v[kBlock];
    for (size_t begin = 0; begin < count; begin += kBlock) {
      size_t n = std::min(kBlock, count - begin);
      std::memcpy(acc, static_cast<const char *>(parts[0]) + begin * 4, n * 4);
      for (size_t p = 1; p < parts.size(); ++p) {
        std::memcpy(v, static_cast<const char *>(parts[p]) + begin * 4, n * 4);
        for (size_t i = 0; i < n; ++i)
          acc[i] += v[i];
      }
      std::memcpy(static_cast<char *>(out) + begin * 4, acc, n * 4);
    }
    return;
  }
  case DType::BF16:
    sumHalf<bf16ToF32, f32ToBf16>(parts, out, count);
    return;
  case DType::F16:
    sumHalf<f16ToF32, f32ToF16>(parts, out, count);
    return;
  default:
    throw Error(std::string("sum of ") + dtypeName(dtype) + ": sums are f32, bf16 or f16");
  }
}

std::string describeCollective(int rank, int size, const char *name, size_t count, DType dtype,
                               const std::string &context) {
  std::ostringstream os;
  os << "rank " << rank << " of " << size << ": " << name << " of " << count * dtypeSize(dtype)
     << " bytes (" << count << " x " << dtypeName(dtype) << ")";
  if (!context.empty())
    os << " [" << context << "]";
  return os.str();
}

} // namespace comm

//===----------------------------------------------------------------------===//
// The launcher's environment
//===----------------------------------------------------------------------===//

namespace {

/// The value of `name` as a non-negative int, or nullopt-like -1 when unset; an error naming
/// the variable when it is set but not a decimal integer in [0, INT_MAX].
int readCount(const EnvLookup &env, const char *name) {
  const char *value = env(name);
  if (!value)
    return -1;
  std::string s(value);
  bool digits = !s.empty() && s.size() <= 10;
  for (char c : s)
    digits = digits && c >= '0' && c <= '9';
  long long v = digits ? std::strtoll(s.c_str(), nullptr, 10) : -1;
  if (!digits || v > INT_MAX)
    throw Error(std::string("launcher environment: ") + name + "='" + s +
                "' is not a non-negative decimal integer");
  return int(v);
}

/// Rank, size and local rank read from one launcher's variables; nullopt-like (size -1) when
/// none of them is set.
LaunchInfo readLauncher(const EnvLookup &env, const char *launcher, const char *rankVar,
                        const std::vector<const char *> &sizeVars, const char *localVar,
                        const char *localSizeVar) {
  LaunchInfo info;
  info.launcher = launcher;
  int rank = readCount(env, rankVar);
  int size = -1;
  const char *sizeVar = sizeVars.front();
  for (const char *var : sizeVars) {
    size = readCount(env, var);
    if (size >= 0) {
      sizeVar = var;
      break;
    }
  }
  int local = localVar ? readCount(env, localVar) : -1;
  if (rank < 0 && size < 0 && local < 0) {
    info.size = -1;
    return info;
  }
  std::string prefix = std::string("launcher environment (") + launcher + "): ";
  if (rank < 0)
    throw Error(prefix + rankVar + " is not set but " +
                (size >= 0 ? std::string(sizeVar) : std::string(localVar)) + " is");
  if (size < 0)
    throw Error(prefix + sizeVar + " is not set but " + rankVar + " is");
  if (size < 1)
    throw Error(prefix + sizeVar + "=0: a job has at least one rank");
  if (rank >= size)
    throw Error(prefix + rankVar + "=" + std::to_string(rank) + " is not below " + sizeVar + "=" +
                std::to_string(size));
  if (local >= size)
    throw Error(prefix + localVar + "=" + std::to_string(local) + " is not below " + sizeVar + "=" +
                std::to_string(size));
  if (localSizeVar && local >= 0) {
    int localSize = readCount(env, localSizeVar);
    if (localSize >= 0 && local >= localSize)
      throw Error(prefix + localVar + "=" + std::to_string(local) + " is not below " +
                  localSizeVar + "=" + std::to_string(localSize));
  }
  info.rank = rank;
  info.size = size;
  info.localRank = local;
  return info;
}

EnvLookup processEnv() {
  return [](const char *name) -> const char * { return std::getenv(name); };
}

} // namespace

LaunchInfo detectLaunch(const EnvLookup &env) {
  LaunchInfo info = readLauncher(env, "openmpi", "OMPI_COMM_WORLD_RANK", {"OMPI_COMM_WORLD_SIZE"},
                                 "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE");
  if (info.size < 0)
    info = readLauncher(env, "pmi", "PMI_RANK", {"PMI_SIZE"}, "MPI_LOCALRANKID", nullptr);
  if (info.size < 0)
    info = readLauncher(env, "slurm", "SLURM_PROCID", {"SLURM_NTASKS", "SLURM_NPROCS"},
                        "SLURM_LOCALID", nullptr);
  if (info.size < 0)
    return LaunchInfo{};
  // A single rank is its host's only rank whatever the launcher left unsaid.
  if (info.size == 1)
    info.localRank = 0;
  return info;
}

LaunchInfo detectLaunch() { return detectLaunch(processEnv()); }

double collectiveTimeoutSeconds(double requested, const EnvLookup &env) {
  if (!std::isfinite(requested))
    throw Error("collective timeout: " + std::to_string(requested) + " s is not finite");
  if (requested > 0)
    return requested;
  const char *value = env("BONSAI_COLLECTIVE_TIMEOUT");
  if (!value)
    return 600.0;
  std::string s(value);
  errno = 0;
  char *end = nullptr;
  double seconds = s.empty() ? 0 : std::strtod(s.c_str(), &end);
  if (s.empty() || errno != 0 || *end != '\0' || !std::isfinite(seconds) || seconds <= 0)
    throw Error("BONSAI_COLLECTIVE_TIMEOUT='" + s + "' is not a number of seconds above 0");
  return seconds;
}

bool mpiAvailable() {
#ifdef BONSAI_HAVE_MPI
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Communicator> makeCommunicator(const CommunicatorOptions &options) {
  EnvLookup env = options.env ? options.env : processEnv();
  double timeout = collectiveTimeoutSeconds(options.timeoutSeconds, env);
  LaunchInfo launch = detectLaunch(env);
  if (launch.size == 1)
    return std::make_unique<SingleRankCommunicator>(timeout);
#ifdef BONSAI_HAVE_MPI
  return comm::makeMpiCommunicator(launch, timeout);
#else
  throw Error("launched as rank " + std::to_string(launch.rank) + " of " +
              std::to_string(launch.size) + " (" + launch.launcher +
              " environment) but this program has no MPI communicator: " +
#ifdef BONSAI_BUILD_HAS_MPI
              "it links bonsai_comm, not bonsai_comm_mpi" +
#else
              "the build found no MPI (install libopenmpi-dev with scripts/install-deps.sh and "
              "reconfigure)" +
#endif
              std::string(", or run one rank"));
#endif
}

} // namespace bonsai::rt
