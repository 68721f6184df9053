//===- NcclCommunicator.cpp - NCCL start-up, collectives, deadlines --------===//
//
// Implements NcclCommunicator.h. NCCL runs in non-blocking mode (ncclConfig_t::blocking = 0) so
// that nothing waits without a deadline: ncclCommInitRankConfig and the collectives may return
// ncclInProgress, and this file polls ncclCommGetAsyncError (and, in synchronize, cudaStreamQuery)
// until the work is done, NCCL reports an error, or the deadline passes; the last two abort the
// NCCL communicator (ncclCommAbort, which also releases NCCL kernels blocked on a peer) and throw.
// The checks every collective makes before anything is enqueued are here too: they mirror the
// host communicator's (Communicator.cpp) and add what device buffers need (memory the device
// can access, no partial overlap that NCCL would silently mis-handle).
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/NcclCommunicator.h"

#include "CommInternal.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <thread>

namespace bonsai::rt {

namespace {

using Clock = std::chrono::steady_clock;

static_assert(NCCL_UNIQUE_ID_BYTES % 4 == 0, "the unique id is broadcast as 32-bit words");

std::string secondsText(double s) {
  std::ostringstream os;
  os << s << " s";
  return os.str();
}

Clock::time_point deadlineAfter(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

/// Sleeps between polls: 50 us at first, doubling to 1 ms, so that short waits stay short and
/// long ones do not spin a core.
class Backoff {
public:
  void pause() {
    std::this_thread::sleep_for(std::chrono::microseconds(micros_));
    micros_ = micros_ >= 1000 ? 1000 : micros_ * 2;
  }

private:
  int micros_ = 50;
};

/// NCCL's words for `rc`, with the communicator's last error message when NCCL has one.
std::string ncclText(ncclResult_t rc, ncclComm_t comm) {
  std::string text = ncclGetErrorString(rc);
  const char *last = ncclGetLastError(comm);
  if (last && *last)
    text += " (" + std::string(last) + ")";
  return text;
}

std::string contextText(const std::string &context) {
  return context.empty() ? "" : " [" + context + "]";
}

/// Makes `device` this thread's current device for the guard's lifetime (no change when it
/// already is); `status` says whether that worked.
class DeviceGuard {
public:
  explicit DeviceGuard(int device) {
    int current = -1;
    status = cudaGetDevice(&current);
    if (status == cudaSuccess && current != device) {
      status = cudaSetDevice(device);
      if (status == cudaSuccess)
        previous_ = current;
    }
  }
  ~DeviceGuard() {
    if (previous_ >= 0)
      cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard &) = delete;
  DeviceGuard &operator=(const DeviceGuard &) = delete;

  cudaError_t status = cudaSuccess;

private:
  int previous_ = -1;
};

/// NCCL's type for a sum of `dtype` (F32, BF16, F16, checked before).
ncclDataType_t sumType(DType dtype) {
  switch (dtype) {
  case DType::BF16:
    return ncclBfloat16;
  case DType::F16:
    return ncclFloat16;
  default:
    return ncclFloat32;
  }
}

bool overlaps(const void *a, size_t aBytes, const void *b, size_t bBytes) {
  if (aBytes == 0 || bBytes == 0)
    return false;
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bBytes && y < x + aBytes;
}

std::string pointerText(const void *p) {
  std::ostringstream os;
  os << p;
  return os.str();
}

} // namespace

//===----------------------------------------------------------------------===//
// Start-up and tear-down
//===----------------------------------------------------------------------===//

NcclCommunicator::NcclCommunicator(int rank, int size, int device, double timeoutSeconds)
    : rank_(rank), size_(size), device_(device), timeout_(timeoutSeconds) {}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(Communicator &host,
                                                           const NcclCommunicatorOptions &options) {
  int rank = host.rank(), size = host.size();
  std::string who = "rank " + std::to_string(rank) + " of " + std::to_string(size);
  int device = options.device >= 0 ? options.device : host.localRank();
  std::string prefix = who + " (device " + std::to_string(device) + "): NCCL start-up: ";

  // What this rank can get wrong alone is checked before any rank waits for another: a rank
  // other than 0 throws at once (rank 0's broadcast below then names it as one that did not
  // arrive); rank 0 first tells the others that it failed, so that they do not wait for it.
  std::string localError;
  double timeout = 0;
  try {
    EnvLookup env = options.env;
    if (!env)
      env = [](const char *name) -> const char * { return std::getenv(name); };
    timeout = collectiveTimeoutSeconds(options.timeoutSeconds, env);
  } catch (const Error &e) {
    localError = prefix + e.what();
  }
  if (localError.empty() && options.device < -1)
    localError = prefix + "device " + std::to_string(options.device) +
                 " is not a CUDA device ordinal (-1 takes the local rank)";
  if (localError.empty() && device < 0)
    localError = prefix + "the host communicator does not know this rank's local rank (" +
                 std::to_string(device) + "): give the device in the options";
  if (localError.empty()) {
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      cudaGetLastError();
      localError = prefix + "cudaGetDeviceCount failed: " + cudaGetErrorString(status);
    } else if (device >= count) {
      localError = prefix + "device " + std::to_string(device) + " is not below the " +
                   std::to_string(count) +
                   " CUDA devices this process sees (more ranks on this host than GPUs, or "
                   "CUDA_VISIBLE_DEVICES hides them)";
    }
  }
  if (localError.empty()) {
    // Left set after start-up: this rank's later allocations belong on the same device.
    cudaError_t status = cudaSetDevice(device);
    if (status != cudaSuccess) {
      cudaGetLastError();
      localError = prefix + "cudaSetDevice(" + std::to_string(device) +
                   ") failed: " + cudaGetErrorString(status);
    }
  }

  // Rank 0's unique id, behind a status word, as 32-bit words over the host communicator. With
  // NCCL_COMM_ID set, ncclGetUniqueId encodes that address (every rank would compute the same
  // id) and rank 0's ncclCommInitRankConfig starts the bootstrap there; otherwise it starts the
  // bootstrap on an address of NCCL's choosing. Either way every rank uses rank 0's id.
  int32_t message[1 + NCCL_UNIQUE_ID_BYTES / 4] = {};
  ncclUniqueId id;
  if (rank == 0 && localError.empty()) {
    ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess)
      localError = prefix + "ncclGetUniqueId failed: " + ncclText(rc, nullptr);
    else
      std::memcpy(message + 1, id.internal, NCCL_UNIQUE_ID_BYTES);
  }
  if (!localError.empty() && rank != 0)
    throw Error(localError);
  message[0] = localError.empty() ? 0 : 1;
  host.broadcast(message, sizeof(message) / sizeof(message[0]), DType::I32, 0,
                 "NCCL start-up: the unique id from rank 0");
  if (!localError.empty())
    throw Error(localError);
  if (message[0] != 0)
    throw Error(prefix + "rank 0 could not start NCCL (its own error says why)");
  std::memcpy(id.internal, message + 1, NCCL_UNIQUE_ID_BYTES);

  std::unique_ptr<NcclCommunicator> comm(new NcclCommunicator(rank, size, device, timeout));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t raw = nullptr;
  auto deadline = deadlineAfter(timeout);
  ncclResult_t rc = ncclCommInitRankConfig(&raw, size, id, rank, &config);
  comm->comm_ = raw;
  if (rc != ncclSuccess && rc != ncclInProgress)
    comm->fail(prefix + "ncclCommInitRankConfig failed: " + ncclText(rc, raw));
  if (!raw)
    comm->fail(prefix + "ncclCommInitRankConfig returned no communicator");
  Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    rc = ncclCommGetAsyncError(raw, &state);
    if (rc != ncclSuccess)
      comm->fail(prefix + "ncclCommGetAsyncError failed: " + ncclText(rc, raw));
    if (state == ncclSuccess)
      break;
    if (state != ncclInProgress)
      comm->fail(prefix + "ncclCommInitRankConfig failed: " + ncclText(state, raw));
    if (Clock::now() >= deadline)
      comm->fail(prefix + "did not complete within " + secondsText(timeout) +
                 ": a rank did not start NCCL, or cannot reach rank 0's bootstrap (NCCL_COMM_ID, "
                 "NCCL_SOCKET_IFNAME); the NCCL communicator was aborted");
    backoff.pause();
  }
  int ncclSize = 0, ncclRank = 0;
  if ((rc = ncclCommCount(raw, &ncclSize)) != ncclSuccess)
    comm->fail(prefix + "ncclCommCount failed: " + ncclText(rc, raw));
  if ((rc = ncclCommUserRank(raw, &ncclRank)) != ncclSuccess)
    comm->fail(prefix + "ncclCommUserRank failed: " + ncclText(rc, raw));
  if (ncclSize != size || ncclRank != rank)
    comm->fail(prefix + "NCCL made rank " + std::to_string(ncclRank) + " of " +
               std::to_string(ncclSize) + ", not the host communicator's");
  return comm;
}

NcclCommunicator::~NcclCommunicator() {
  if (!comm_)
    return;
  DeviceGuard guard(device_);
  // Finalize flushes what NCCL still has in flight (non-blocking here: polled, with the
  // deadline); a communicator that does not finish is aborted rather than waited for.
  ncclResult_t rc = ncclCommFinalize(comm_);
  bool finished = rc == ncclSuccess || rc == ncclInProgress;
  auto deadline = deadlineAfter(timeout_);
  Backoff backoff;
  while (finished) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess ||
        (state != ncclSuccess && state != ncclInProgress)) {
      finished = false;
      break;
    }
    if (state == ncclSuccess)
      break;
    if (Clock::now() >= deadline) {
      finished = false;
      break;
    }
    backoff.pause();
  }
  if (finished) {
    ncclCommDestroy(comm_);
  } else {
    std::fprintf(stderr,
                 "bonsai: warning: %s: NCCL communicator did not finalize within %g s; "
                 "aborting it\n",
                 who().c_str(), timeout_);
    ncclCommAbort(comm_);
  }
  comm_ = nullptr;
}

//===----------------------------------------------------------------------===//
// Failure
//===----------------------------------------------------------------------===//

std::string NcclCommunicator::who() const {
  return "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " (device " +
         std::to_string(device_) + ")";
}

void NcclCommunicator::fail(const std::string &message) {
  if (failure_.empty())
    failure_ = message;
  if (comm_) {
    DeviceGuard guard(device_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  throw Error(message);
}

void NcclCommunicator::checkUsable(const std::string &what) const {
  if (!failure_.empty())
    throw Error(what + ": this NCCL communicator failed earlier and cannot be used: " + failure_);
}

//===----------------------------------------------------------------------===//
// Argument checks
//===----------------------------------------------------------------------===//

namespace {

/// The checks every collective shares, before anything is enqueued; errors start with `prefix`
/// ("rank 0 of 1 (device 0): NCCL allReduceSum [step 3]").
struct Checker {
  std::string prefix;

  void dtype(DType dtype) const {
    if (uint8_t(dtype) > uint8_t(DType::U8))
      throw Error(prefix + ": unknown dtype " + std::to_string(int(dtype)));
  }
  void summable(DType dtype) const {
    if (!isComputeFloat(dtype))
      throw Error(prefix + ": sums are f32, bf16 or f16, not " + dtypeName(dtype));
  }
  /// count * multiplier elements of `dtype` in bytes, or an error when that overflows size_t.
  size_t bytes(size_t count, size_t multiplier, DType dtype) const {
    size_t elem = dtypeSize(dtype);
    if (multiplier != 0 && count > std::numeric_limits<size_t>::max() / multiplier / elem)
      throw Error(prefix + ": " + std::to_string(count) + " x " + std::to_string(multiplier) +
                  " elements of " + dtypeName(dtype) + " overflow the byte count");
    return count * multiplier * elem;
  }
  void pointer(const void *p, size_t bytes, const char *which) const {
    if (bytes > 0 && p == nullptr)
      throw Error(prefix + ": `" + which + "` is null but " + std::to_string(bytes) +
                  " bytes were asked for");
  }
  /// Out of place: the two ranges must not overlap; `inPlace` says whether send and recv are
  /// the collective's in-place layout.
  void aliasing(const void *send, size_t sendBytes, const void *recv, size_t recvBytes,
                bool inPlace, const char *layout) const {
    if (!inPlace && overlaps(send, sendBytes, recv, recvBytes))
      throw Error(prefix + ": `send` (" + pointerText(send) + ", " + std::to_string(sendBytes) +
                  " bytes) and `recv` (" + pointerText(recv) + ", " + std::to_string(recvBytes) +
                  " bytes) overlap but are not the in-place layout (" + layout + ")");
  }
};

} // namespace

void NcclCommunicator::checkDevicePointer(const void *p, const char *name, const char *which,
                                          const std::string &context) const {
  if (!p)
    return;
  std::string prefix = who() + ": NCCL " + name + contextText(context) + ": `" + which + "` (" +
                       pointerText(p) + ")";
  cudaPointerAttributes attributes{};
  cudaError_t status = cudaPointerGetAttributes(&attributes, p);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw Error(prefix + ": cudaPointerGetAttributes failed: " + cudaGetErrorString(status));
  }
  switch (attributes.type) {
  case cudaMemoryTypeDevice:
    if (attributes.device != device_)
      throw Error(prefix + " is memory of device " + std::to_string(attributes.device) +
                  ", not of this rank's device " + std::to_string(device_));
    return;
  case cudaMemoryTypeManaged:
  case cudaMemoryTypeHost:
    return;
  default:
    throw Error(prefix + " is host memory the device cannot access (allocate it with "
                         "cudaMalloc, or pin it with cudaHostRegister)");
  }
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

template <typename Issue>
void NcclCommunicator::enqueue(const char *ncclCall, const std::string &what, Issue &&issue) {
  DeviceGuard guard(device_);
  if (guard.status != cudaSuccess) {
    cudaGetLastError();
    fail(what + ": cudaSetDevice(" + std::to_string(device_) +
         ") failed: " + cudaGetErrorString(guard.status));
  }
  // An error of earlier work (a peer that failed, a transport error) ends the communicator
  // here rather than after one more collective that could never complete.
  ncclResult_t state = ncclSuccess;
  ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
  if (rc != ncclSuccess)
    fail(what + ": ncclCommGetAsyncError failed: " + ncclText(rc, comm_));
  if (state != ncclSuccess && state != ncclInProgress)
    fail(what + ": NCCL reported an error of earlier work: " + ncclText(state, comm_));
  rc = ncclResult_t(issue());
  if (rc != ncclSuccess && rc != ncclInProgress)
    fail(what + ": " + ncclCall + " failed: " + ncclText(rc, comm_));
  // Non-blocking mode: ncclInProgress means NCCL is still putting the work on the stream. Wait
  // until it is there, so that an event recorded after this call covers the collective.
  auto deadline = deadlineAfter(timeout_);
  Backoff backoff;
  while (rc == ncclInProgress || state == ncclInProgress) {
    rc = ncclCommGetAsyncError(comm_, &state);
    if (rc != ncclSuccess)
      fail(what + ": ncclCommGetAsyncError failed: " + ncclText(rc, comm_));
    if (state == ncclSuccess)
      break;
    if (state != ncclInProgress)
      fail(what + ": " + ncclCall + " failed: " + ncclText(state, comm_));
    if (Clock::now() >= deadline)
      fail(what + ": " + ncclCall + " was not enqueued within " + secondsText(timeout_) +
           "; the NCCL communicator was aborted");
    backoff.pause();
  }
  lastIssued_ = what;
}

void NcclCommunicator::allReduce(bool max, const void *send, void *recv, size_t count, DType dtype,
                                 CUstream_st *stream, const std::string &context) {
  const char *name = max ? "allReduceMax" : "allReduceSum";
  Checker check{who() + ": NCCL " + name + contextText(context)};
  checkUsable(check.prefix);
  check.dtype(dtype);
  if (!max)
    check.summable(dtype);
  else if (dtype != DType::F32)
    throw Error(check.prefix + ": the maximum is of f32 values, not " + dtypeName(dtype));
  size_t bytes = check.bytes(count, 1, dtype);
  check.pointer(send, bytes, "send");
  check.pointer(recv, bytes, "recv");
  if (count == 0)
    return;
  checkDevicePointer(send, name, "send", context);
  checkDevicePointer(recv, name, "recv", context);
  check.aliasing(send, bytes, recv, bytes, send == recv, "send == recv");
  std::string what = comm::describeCollective(
      rank_, size_, max ? "NCCL allReduceMax" : "NCCL allReduceSum", count, dtype, context);
  enqueue("ncclAllReduce", what, [&] {
    return int(
        ncclAllReduce(send, recv, count, sumType(dtype), max ? ncclMax : ncclSum, comm_, stream));
  });
}

void NcclCommunicator::allReduceSum(const void *send, void *recv, size_t count, DType dtype,
                                    CUstream_st *stream, const std::string &context) {
  allReduce(/*max=*/false, send, recv, count, dtype, stream, context);
}

void NcclCommunicator::allReduceMax(const void *send, void *recv, size_t count, DType dtype,
                                    CUstream_st *stream, const std::string &context) {
  allReduce(/*max=*/true, send, recv, count, dtype, stream, context);
}

void NcclCommunicator::reduceScatterSum(const void *send, void *recv, size_t recvCount, DType dtype,
                                        CUstream_st *stream, const std::string &context) {
  const char *name = "reduceScatterSum";
  Checker check{who() + ": NCCL " + name + contextText(context)};
  checkUsable(check.prefix);
  check.dtype(dtype);
  check.summable(dtype);
  size_t sendBytes = check.bytes(recvCount, size_t(size_), dtype);
  size_t recvBytes = recvCount * dtypeSize(dtype);
  check.pointer(send, sendBytes, "send");
  check.pointer(recv, recvBytes, "recv");
  if (recvCount == 0)
    return;
  checkDevicePointer(send, name, "send", context);
  checkDevicePointer(recv, name, "recv", context);
  bool inPlace = recv == static_cast<const char *>(send) + size_t(rank_) * recvBytes;
  check.aliasing(send, sendBytes, recv, recvBytes, inPlace, "recv == send + rank * recvCount");
  std::string what =
      comm::describeCollective(rank_, size_, "NCCL reduceScatterSum", recvCount, dtype, context);
  enqueue("ncclReduceScatter", what, [&] {
    return int(ncclReduceScatter(send, recv, recvCount, sumType(dtype), ncclSum, comm_, stream));
  });
}

void NcclCommunicator::allGather(const void *send, void *recv, size_t sendCount, DType dtype,
                                 CUstream_st *stream, const std::string &context) {
  const char *name = "allGather";
  Checker check{who() + ": NCCL " + name + contextText(context)};
  checkUsable(check.prefix);
  check.dtype(dtype);
  size_t recvBytes = check.bytes(sendCount, size_t(size_), dtype);
  size_t sendBytes = sendCount * dtypeSize(dtype);
  check.pointer(send, sendBytes, "send");
  check.pointer(recv, recvBytes, "recv");
  if (sendCount == 0)
    return;
  checkDevicePointer(send, name, "send", context);
  checkDevicePointer(recv, name, "recv", context);
  bool inPlace = send == static_cast<const char *>(recv) + size_t(rank_) * sendBytes;
  check.aliasing(send, sendBytes, recv, recvBytes, inPlace, "send == recv + rank * sendCount");
  std::string what =
      comm::describeCollective(rank_, size_, "NCCL allGather", sendCount, dtype, context);
  // Gathers copy: the elements go as bytes, whatever their type.
  enqueue("ncclAllGather", what,
          [&] { return int(ncclAllGather(send, recv, sendBytes, ncclUint8, comm_, stream)); });
}

void NcclCommunicator::broadcast(const void *send, void *recv, size_t count, DType dtype, int root,
                                 CUstream_st *stream, const std::string &context) {
  const char *name = "broadcast";
  Checker check{who() + ": NCCL " + name + contextText(context)};
  checkUsable(check.prefix);
  check.dtype(dtype);
  size_t bytes = check.bytes(count, 1, dtype);
  if (root < 0 || root >= size_)
    throw Error(check.prefix + ": root " + std::to_string(root) + " is not a rank of " +
                std::to_string(size_));
  bool isRoot = root == rank_;
  // Only the root reads `send`.
  if (isRoot)
    check.pointer(send, bytes, "send");
  check.pointer(recv, bytes, "recv");
  if (count == 0)
    return;
  if (isRoot) {
    checkDevicePointer(send, name, "send", context);
    check.aliasing(send, bytes, recv, bytes, send == recv, "send == recv");
  }
  checkDevicePointer(recv, name, "recv", context);
  std::string what = comm::describeCollective(rank_, size_, "NCCL broadcast", count, dtype,
                                              context + (context.empty() ? "" : ", ") + "root " +
                                                  std::to_string(root));
  enqueue("ncclBroadcast", what, [&] {
    return int(ncclBroadcast(isRoot ? send : recv, recv, bytes, ncclUint8, root, comm_, stream));
  });
}

void NcclCommunicator::ringShift(const void *send, void *recv, size_t count, DType dtype,
                                 CUstream_st *stream, const std::string &context, int ringSize) {
  const char *name = "ringShift";
  Checker check{who() + ": NCCL " + name + contextText(context)};
  checkUsable(check.prefix);
  if (ringSize == 0)
    ringSize = size_;
  if (ringSize < 1 || size_ % ringSize != 0)
    throw Error(check.prefix + ": a ring of " + std::to_string(ringSize) +
                " ranks does not divide the " + std::to_string(size_) + " ranks");
  check.dtype(dtype);
  size_t bytes = check.bytes(count, 1, dtype);
  check.pointer(send, bytes, "send");
  check.pointer(recv, bytes, "recv");
  if (count == 0)
    return;
  checkDevicePointer(send, name, "send", context);
  checkDevicePointer(recv, name, "recv", context);
  check.aliasing(send, bytes, recv, bytes, false, "none: send and recv are separate buffers");
  std::string what =
      comm::describeCollective(rank_, size_, "NCCL ringShift", count, dtype, context);
  // This rank's ring: the consecutive group of ringSize ranks that holds it.
  const int first = rank_ - rank_ % ringSize, at = rank_ % ringSize;
  int next = first + (at + 1) % ringSize, previous = first + (at - 1 + ringSize) % ringSize;
  // One group, so that every rank's send and receive progress together (a ring of blocking
  // sends would wait on itself).
  enqueue("ncclSend/ncclRecv", what, [&] {
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess)
      return int(rc);
    ncclResult_t sent = ncclSend(send, bytes, ncclUint8, next, comm_, stream);
    ncclResult_t received =
        sent == ncclSuccess ? ncclRecv(recv, bytes, ncclUint8, previous, comm_, stream) : sent;
    rc = ncclGroupEnd();
    return int(received != ncclSuccess ? received : rc);
  });
}

void NcclCommunicator::synchronize(CUstream_st *stream, const std::string &context) {
  std::string what = who() + ": NCCL synchronize" + contextText(context);
  checkUsable(what);
  std::string last =
      lastIssued_.empty() ? "no collective enqueued yet" : "last collective: " + lastIssued_;
  auto deadline = deadlineAfter(timeout_);
  Backoff backoff;
  for (;;) {
    cudaError_t status = cudaStreamQuery(stream);
    if (status != cudaSuccess && status != cudaErrorNotReady) {
      cudaGetLastError();
      fail(what + ": cudaStreamQuery failed: " + cudaGetErrorString(status) + " (" + last + ")");
    }
    ncclResult_t state = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
    if (rc != ncclSuccess)
      fail(what + ": ncclCommGetAsyncError failed: " + ncclText(rc, comm_) + " (" + last + ")");
    if (state != ncclSuccess && state != ncclInProgress)
      fail(what + ": NCCL reported an error: " + ncclText(state, comm_) + " (" + last + ")");
    if (status == cudaSuccess && state == ncclSuccess)
      return;
    if (Clock::now() >= deadline)
      fail(what + ": the stream's work did not complete within " + secondsText(timeout_) + " (" +
           last +
           "): a rank did not arrive, or the stream waits for something that does not happen; "
           "the NCCL communicator was aborted");
    backoff.pause();
  }
}

} // namespace bonsai::rt
