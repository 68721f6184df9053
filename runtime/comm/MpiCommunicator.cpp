//===- MpiCommunicator.cpp - Collectives over MPI ranks, with deadlines -----===//
//
// The MPI communicator of Communicator.h, for CPU ranks started by `mpirun` or `srun`. It does
// not use MPI's collectives: their reduction order is the library's choice (and may depend on
// message sizes and timing), and a blocking call cannot be given a deadline. Every collective is
// instead point-to-point messages between every pair of ranks, posted non-blocking
// (MPI_Isend/MPI_Irecv) and polled with MPI_Testsome until they complete or the deadline passes:
//
// - reduceScatterSum: rank p sends shard q of its input to rank q; each rank sums the shards it
//   received in rank order. allReduceSum is that over the element range cut into size() nearly
//   equal chunks, then an all-gather of the summed chunks: each element is summed once, by the
//   chunk's owner, in rank order, so every rank gets the same bits (the traffic is a ring's,
//   2 (N-1)/N of the buffer per rank, in N-1 messages each way instead of N-1 steps).
// - allGather: rank p sends its shard to every rank.
// - broadcast: the root sends to every rank; every other rank tells the root it arrived.
// - barrier: every rank sends an empty message to every rank.
//
// That is N (N-1) messages per collective, fine for CPU ranks (tests run 2 and 4); a ring or a
// tree for many ranks would keep the rank-order sum but name late ranks less directly. Staging
// costs about twice the buffer.
//
// Since every rank receives directly from every rank it waits for, the receives still pending
// at the deadline name the ranks that did not arrive. The message tag holds the collective's
// sequence number and kind, so a rank that skipped a collective or called another one does not
// match the others' messages: they time out naming it. Data moves through staging buffers the
// communicator owns, never the caller's: after a failure MPI may still write into the pending
// receives (a late rank, single-copy transports), so the staging of a failed communicator is
// kept until the process ends, and MPI is not finalized (MPI_Finalize waits for every rank).
//
//===----------------------------------------------------------------------===//

#include "CommInternal.h"

// MPI's C API only: Open MPI's and MPICH's mpi.h otherwise pull in the deprecated C++ bindings,
// which need a library of their own (MPI::MPI_CXX).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

namespace bonsai::rt::comm {

namespace {

using Clock = std::chrono::steady_clock;

/// The largest message: MPI counts are int, and 1 GiB keeps every transport far from it.
constexpr size_t kMaxMessageBytes = size_t(1) << 30;

/// The kinds of message, the low bits of a tag (with the sequence number above them).
enum class Kind : int {
  Barrier = 0,
  BroadcastArrival = 1,
  BroadcastData = 2,
  AllReduceScatter = 3,
  AllReduceGather = 4,
  ReduceScatter = 5,
  AllGather = 6,
  RingShift = 7,
  Count = 8
};

std::string mpiErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, size_t(len));
}

std::string rankList(const std::vector<int> &ranks) {
  std::ostringstream os;
  os << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i)
    os << (i ? ", " : "") << ranks[i];
  return os.str();
}

std::string secondsText(double s) {
  std::ostringstream os;
  os << s << " s";
  return os.str();
}

/// The chunk of `count` elements that rank p owns among `size`: first elements and count.
std::pair<size_t, size_t> chunkOf(size_t count, int size, int p) {
  size_t base = count / size_t(size), extra = count % size_t(size);
  size_t begin = size_t(p) * base + std::min(size_t(p), extra);
  return {begin, base + (size_t(p) < extra ? 1 : 0)};
}

/// One rank's view of the job at start-up, exchanged so that every rank checks every other.
struct Hello {
  int32_t mpiRank;
  int32_t launchRank;
  int32_t launchSize;
  char host[128];
};

// One communicator per process: MPI is initialised once and cannot be again after finalizing.
std::atomic<bool> gAlive{false};

class MpiCommunicator final : public Communicator {
public:
  MpiCommunicator(const LaunchInfo &launch, double timeoutSeconds);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int localRank() const override { return localRank_; }
  int localSize() const override { return localSize_; }
  double timeoutSeconds() const override { return timeout_; }
  const char *backendName() const override { return "mpi"; }

protected:
  void doAllReduceSum(const void *send, void *recv, size_t count, DType dtype,
                      const std::string &context) override;
  void doReduceScatterSum(const void *send, void *recv, size_t recvCount, DType dtype,
                          const std::string &context) override;
  void doAllGather(const void *send, void *recv, size_t sendCount, DType dtype,
                   const std::string &context) override;
  void doBroadcast(void *buffer, size_t count, DType dtype, int root,
                   const std::string &context) override;
  void doRingShift(const void *send, void *recv, size_t count, DType dtype, int ringSize,
                   const std::string &context) override;
  void doBarrier(const std::string &context) override;

private:
  /// The messages of one phase of a collective, each request with its peer.
  struct Pending {
    std::vector<MPI_Request> requests;
    std::vector<int> peers;
    std::vector<bool> receives;
    std::vector<int> expectedBytes; // receives: the size of the piece
  };

  /// A collective in progress: what errors say and when it must end.
  struct Op {
    std::string what; // describeCollective
    int tag;
    Clock::time_point deadline;
  };

  Op begin(const char *name, Kind kind, size_t count, DType dtype, const std::string &context);
  void initExchange(const LaunchInfo &launch);
  void postSend(Pending &pending, const char *data, size_t bytes, int peer, int tag);
  void postRecv(Pending &pending, char *data, size_t bytes, int peer, int tag);
  /// Polls until every request of `pending` completes; at the deadline, or on an MPI error,
  /// marks the communicator failed and throws. `phase` says what a late receive means.
  void wait(Pending &pending, const Op &op, const char *phase);
  [[noreturn]] void fail(const std::string &message);
  void checkUsable(const std::string &what) const;
  char *staging(size_t bytes);

  int rank_ = 0, size_ = 1, localRank_ = 0, localSize_ = 1;
  double timeout_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool ownsMpi_ = false;
  int tagSequences_ = 1; // sequence numbers that fit a tag
  uint64_t sequence_ = 0;
  std::string failure_;
  std::vector<char> staging_;
};

//===----------------------------------------------------------------------===//
// Start-up
//===----------------------------------------------------------------------===//

/// Runs MPI_Init_thread with a watchdog: a blocked MPI_Init cannot be interrupted or turned
/// into an exception, so past the deadline the watchdog reports and ends the process.
void initMpiWithin(double timeoutSeconds, const LaunchInfo &launch) {
  std::mutex mutex;
  std::condition_variable done;
  bool finished = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mutex);
    auto limit = std::chrono::duration<double>(timeoutSeconds);
    if (!done.wait_for(lock, limit, [&] { return finished; })) {
      std::fprintf(stderr,
                   "bonsai: error: rank %d of %d (%s launch): MPI_Init did not return within "
                   "%g s (a rank that never started, or a launcher that cannot reach it); "
                   "exiting\n",
                   launch.rank, launch.size, launch.launcher.c_str(), timeoutSeconds);
      std::fflush(stderr);
      std::_Exit(1);
    }
  });
  int provided = 0;
  int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  {
    std::lock_guard<std::mutex> lock(mutex);
    finished = true;
  }
  done.notify_all();
  watchdog.join();
  if (rc != MPI_SUCCESS)
    throw Error("rank " + std::to_string(launch.rank) + " of " + std::to_string(launch.size) +
                ": MPI_Init failed: " + mpiErrorString(rc));
}

MpiCommunicator::MpiCommunicator(const LaunchInfo &launch, double timeoutSeconds)
    : timeout_(timeoutSeconds) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized)
    throw Error("MPI communicator: MPI was finalized already (one MPI communicator per process)");
  if (!initialized) {
    initMpiWithin(timeoutSeconds, launch);
    ownsMpi_ = true;
  }
  // Errors are returned, so that they become rt::Error naming the collective instead of an
  // abort of the job with MPI's message only (on MPI_COMM_WORLD only when MPI is ours: a
  // caller that initialised MPI chose its own handler).
  if (ownsMpi_)
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  int *tagUb = nullptr, flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tagUb, &flag);
  // MPI guarantees tags up to 32767 at least.
  int maxTag = flag && tagUb ? *tagUb : 32767;
  tagSequences_ = std::max(1, maxTag / int(Kind::Count) - 1);
  // When the exchange fails the constructor throws and MPI stays as it is, not finalized: it
  // may still be busy with the exchange, and the process is expected to end.
  initExchange(launch);
}

void MpiCommunicator::initExchange(const LaunchInfo &launch) {
  std::string who = "rank " + std::to_string(rank_) + " of " + std::to_string(size_);
  // A communicator of our own, so that the caller's MPI traffic on MPI_COMM_WORLD never
  // matches ours. MPI_Comm_idup, not MPI_Comm_dup: the blocking one would wait forever for a
  // rank that never comes.
  MPI_Request request;
  int rc = MPI_Comm_idup(MPI_COMM_WORLD, &comm_, &request);
  if (rc != MPI_SUCCESS)
    fail(who + ": start-up: MPI_Comm_idup failed: " + mpiErrorString(rc));
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(timeout_));
  for (int idle = 0;; ++idle) {
    int flag = 0;
    rc = MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
      fail(who + ": start-up: MPI_Comm_idup failed: " + mpiErrorString(rc));
    if (flag)
      break;
    if (Clock::now() >= deadline)
      fail(who + ": start-up (duplicating MPI_COMM_WORLD) did not complete within " +
           secondsText(timeout_) + ": some rank did not start or is stuck before its start-up");
    if (idle > 1000)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    else if (idle > 100)
      std::this_thread::yield();
  }
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);

  Hello mine{};
  mine.mpiRank = rank_;
  mine.launchRank = launch.rank;
  mine.launchSize = launch.size;
  if (gethostname(mine.host, sizeof(mine.host) - 1) != 0)
    std::snprintf(mine.host, sizeof(mine.host), "unknown-host");
  mine.host[sizeof(mine.host) - 1] = '\0';
  std::vector<Hello> all(static_cast<size_t>(size_));
  static_assert(sizeof(Hello) % 4 == 0, "Hello is exchanged as i32 words");
  allGather(&mine, all.data(), sizeof(Hello) / 4, DType::I32, "start-up");

  // Every rank checks every rank, so that all report the same inconsistency.
  for (const Hello &h : all) {
    if (h.launchSize != size_)
      fail(who + ": start-up: MPI started " + std::to_string(size_) + " ranks but rank " +
           std::to_string(h.mpiRank) + "'s launcher environment (" + launch.launcher + ") says " +
           std::to_string(h.launchSize) + ": run every rank under one mpirun or srun");
    if (h.launchRank != h.mpiRank)
      fail(who + ": start-up: MPI rank " + std::to_string(h.mpiRank) + " has launcher rank " +
           std::to_string(h.launchRank) + " (" + launch.launcher +
           " environment): the launcher's and MPI's ranks must agree");
  }
  // The ranks on this host, counted by host name whatever the launcher says.
  localSize_ = 0;
  for (const Hello &h : all)
    if (std::strcmp(h.host, mine.host) == 0)
      ++localSize_;
  if (launch.localRank >= 0) {
    localRank_ = launch.localRank;
  } else {
    localRank_ = 0;
    for (int p = 0; p < rank_; ++p)
      if (std::strcmp(all[size_t(p)].host, mine.host) == 0)
        ++localRank_;
  }
  gAlive = true;
}

MpiCommunicator::~MpiCommunicator() {
  // A failed communicator keeps MPI as it is: MPI_Finalize would wait for every rank.
  if (!failure_.empty())
    return;
  if (comm_ != MPI_COMM_NULL)
    MPI_Comm_free(&comm_);
  if (ownsMpi_)
    MPI_Finalize();
  gAlive = false;
}

//===----------------------------------------------------------------------===//
// Messages and deadlines
//===----------------------------------------------------------------------===//

void MpiCommunicator::fail(const std::string &message) {
  if (failure_.empty())
    failure_ = message;
  // MPI may still write into the pending receives of the failed collective (a late rank, a
  // single-copy transport reading or writing this process's memory), so their staging is
  // handed to no one again: kept until the process ends, which it is expected to.
  static auto *abandoned = new std::vector<std::vector<char>>();
  abandoned->push_back(std::move(staging_));
  staging_ = {};
  throw Error(message);
}

void MpiCommunicator::checkUsable(const std::string &what) const {
  if (!failure_.empty())
    throw Error(what + ": this communicator failed earlier and cannot be used: " + failure_);
}

char *MpiCommunicator::staging(size_t bytes) {
  if (staging_.size() < bytes)
    staging_.resize(bytes);
  return staging_.data();
}

MpiCommunicator::Op MpiCommunicator::begin(const char *name, Kind kind, size_t count, DType dtype,
                                           const std::string &context) {
  Op op;
  op.what = describeCollective(rank_, size_, name, count, dtype, context);
  checkUsable(op.what);
  op.tag = int(sequence_ % uint64_t(tagSequences_)) * int(Kind::Count) + int(kind);
  ++sequence_;
  op.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(timeout_));
  return op;
}

void MpiCommunicator::postSend(Pending &pending, const char *data, size_t bytes, int peer,
                               int tag) {
  // Pieces of at most kMaxMessageBytes, in order: MPI delivers messages of one sender and tag
  // in the order they were sent, and the receiver posts the same pieces in the same order.
  size_t offset = 0;
  do {
    size_t n = std::min(kMaxMessageBytes, bytes - offset);
    MPI_Request request;
    int rc = MPI_Isend(data + offset, int(n), MPI_BYTE, peer, tag, comm_, &request);
    if (rc != MPI_SUCCESS)
      fail("MPI_Isend to rank " + std::to_string(peer) + " failed: " + mpiErrorString(rc));
    pending.requests.push_back(request);
    pending.peers.push_back(peer);
    pending.receives.push_back(false);
    pending.expectedBytes.push_back(int(n));
    offset += n;
  } while (offset < bytes);
}

void MpiCommunicator::postRecv(Pending &pending, char *data, size_t bytes, int peer, int tag) {
  size_t offset = 0;
  do {
    size_t n = std::min(kMaxMessageBytes, bytes - offset);
    MPI_Request request;
    int rc = MPI_Irecv(data + offset, int(n), MPI_BYTE, peer, tag, comm_, &request);
    if (rc != MPI_SUCCESS)
      fail("MPI_Irecv from rank " + std::to_string(peer) + " failed: " + mpiErrorString(rc));
    pending.requests.push_back(request);
    pending.peers.push_back(peer);
    pending.receives.push_back(true);
    pending.expectedBytes.push_back(int(n));
    offset += n;
  } while (offset < bytes);
}

void MpiCommunicator::wait(Pending &pending, const Op &op, const char *phase) {
  int n = int(pending.requests.size());
  std::vector<int> indices(size_t(n) + 1);
  std::vector<MPI_Status> statuses(size_t(n) + 1);
  std::vector<bool> done(size_t(n), false);
  for (int idle = 0;;) {
    int completed = 0;
    int rc = MPI_Testsome(n, pending.requests.data(), &completed, indices.data(), statuses.data());
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS)
      fail(op.what + ": MPI_Testsome failed: " + mpiErrorString(rc));
    if (completed == MPI_UNDEFINED)
      return;
    for (int k = 0; k < completed; ++k) {
      int i = indices[size_t(k)];
      const MPI_Status &status = statuses[size_t(k)];
      done[size_t(i)] = true;
      if (rc == MPI_ERR_IN_STATUS && status.MPI_ERROR != MPI_SUCCESS)
        fail(op.what + ": the message " + (pending.receives[size_t(i)] ? "from" : "to") + " rank " +
             std::to_string(pending.peers[size_t(i)]) +
             " failed: " + mpiErrorString(status.MPI_ERROR) +
             (status.MPI_ERROR == MPI_ERR_TRUNCATE
                  ? " (that rank called this collective with another count)"
                  : ""));
      if (pending.receives[size_t(i)]) {
        int got = 0;
        MPI_Get_count(&status, MPI_BYTE, &got);
        if (got != pending.expectedBytes[size_t(i)])
          fail(op.what + ": rank " + std::to_string(pending.peers[size_t(i)]) + " sent " +
               std::to_string(got) + " bytes where " +
               std::to_string(pending.expectedBytes[size_t(i)]) +
               " were expected: the ranks called this collective with different counts, "
               "dtypes or roots");
      }
    }
    if (completed > 0)
      idle = 0;
    else
      ++idle;
    // The deadline is absolute: a collective still moving bytes at its deadline fails too.
    if (Clock::now() >= op.deadline) {
      std::vector<int> silent, unreceived;
      for (int i = 0; i < n; ++i) {
        if (done[size_t(i)])
          continue;
        std::vector<int> &list = pending.receives[size_t(i)] ? silent : unreceived;
        int peer = pending.peers[size_t(i)];
        if (std::find(list.begin(), list.end(), peer) == list.end())
          list.push_back(peer);
      }
      std::sort(silent.begin(), silent.end());
      std::sort(unreceived.begin(), unreceived.end());
      std::ostringstream os;
      os << op.what << ": did not complete within " << secondsText(timeout_) << ": ";
      if (!silent.empty())
        os << rankList(silent) << " " << phase;
      else
        os << rankList(unreceived)
           << " did not take their data (died or stalled inside this collective)";
      os << "; the job cannot continue";
      fail(os.str());
    }
    if (completed > 0)
      continue;
    // Poll hard for a while (a collective in progress), then yield and sleep so that ranks
    // waiting for a late one leave the cores to the others (oversubscribed CI machines).
    if (idle > 2000)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    else if (idle > 200)
      std::this_thread::yield();
  }
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

void MpiCommunicator::doReduceScatterSum(const void *send, void *recv, size_t recvCount,
                                         DType dtype, const std::string &context) {
  Op op = begin("reduceScatterSum", Kind::ReduceScatter, recvCount * size_t(size_), dtype, context);
  size_t shard = recvCount * dtypeSize(dtype);
  size_t total = shard * size_t(size_);
  // [0, total): a copy of the input, shard q sent to rank q; [total, 2 total): slot p holds
  // rank p's contribution to our shard; slot rank() takes the sum.
  char *base = staging(2 * total);
  char *input = base, *received = base + total;
  if (total)
    std::memcpy(input, send, total);
  Pending pending;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_)
      continue;
    postRecv(pending, received + size_t(p) * shard, shard, p, op.tag);
    postSend(pending, input + size_t(p) * shard, shard, p, op.tag);
  }
  wait(pending, op, "did not arrive (no message from them for this collective)");
  std::vector<const void *> parts(static_cast<size_t>(size_));
  for (int p = 0; p < size_; ++p)
    parts[size_t(p)] = p == rank_ ? input + size_t(p) * shard : received + size_t(p) * shard;
  char *sum = received + size_t(rank_) * shard;
  sumInRankOrder(parts, sum, recvCount, dtype);
  if (shard)
    std::memcpy(recv, sum, shard);
}

void MpiCommunicator::doAllReduceSum(const void *send, void *recv, size_t count, DType dtype,
                                     const std::string &context) {
  Op op = begin("allReduceSum", Kind::AllReduceScatter, count, dtype, context);
  size_t elem = dtypeSize(dtype);
  size_t bytes = count * elem;
  size_t maxChunk = chunkOf(count, size_, 0).second * elem;
  // [0, bytes): the input, then the result; [bytes, bytes + size * maxChunk): slot p holds
  // rank p's part of our chunk; slot rank() takes the sum.
  char *base = staging(bytes + size_t(size_) * maxChunk);
  char *data = base, *received = base + bytes;
  if (bytes)
    std::memcpy(data, send, bytes);
  auto [myBegin, myCount] = chunkOf(count, size_, rank_);
  Pending scatter;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_)
      continue;
    auto [begin, n] = chunkOf(count, size_, p);
    postRecv(scatter, received + size_t(p) * maxChunk, myCount * elem, p, op.tag);
    postSend(scatter, data + begin * elem, n * elem, p, op.tag);
  }
  wait(scatter, op, "did not arrive (no message from them for this collective)");
  std::vector<const void *> parts(static_cast<size_t>(size_));
  for (int p = 0; p < size_; ++p)
    parts[size_t(p)] = p == rank_ ? data + myBegin * elem : received + size_t(p) * maxChunk;
  char *sum = received + size_t(rank_) * maxChunk;
  sumInRankOrder(parts, sum, myCount, dtype);
  if (myCount)
    std::memcpy(data + myBegin * elem, sum, myCount * elem);

  // Second phase: every owner sends its summed chunk to every rank.
  int gatherTag = op.tag - int(Kind::AllReduceScatter) + int(Kind::AllReduceGather);
  Pending gather;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_)
      continue;
    auto [begin, n] = chunkOf(count, size_, p);
    postRecv(gather, data + begin * elem, n * elem, p, gatherTag);
    postSend(gather, data + myBegin * elem, myCount * elem, p, gatherTag);
  }
  wait(gather, op,
       "arrived but did not send their summed chunk (died or stalled inside this collective)");
  if (bytes)
    std::memcpy(recv, data, bytes);
}

void MpiCommunicator::doAllGather(const void *send, void *recv, size_t sendCount, DType dtype,
                                  const std::string &context) {
  Op op = begin("allGather", Kind::AllGather, sendCount * size_t(size_), dtype, context);
  size_t shard = sendCount * dtypeSize(dtype);
  char *data = staging(shard * size_t(size_));
  if (shard)
    std::memcpy(data + size_t(rank_) * shard, send, shard);
  Pending pending;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_)
      continue;
    postRecv(pending, data + size_t(p) * shard, shard, p, op.tag);
    postSend(pending, data + size_t(rank_) * shard, shard, p, op.tag);
  }
  wait(pending, op, "did not arrive (no message from them for this collective)");
  if (shard)
    std::memcpy(recv, data, shard * size_t(size_));
}

void MpiCommunicator::doBroadcast(void *buffer, size_t count, DType dtype, int root,
                                  const std::string &context) {
  std::string name = "broadcast from rank " + std::to_string(root);
  Op op = begin(name.c_str(), Kind::BroadcastData, count, dtype, context);
  int arrivalTag = op.tag - int(Kind::BroadcastData) + int(Kind::BroadcastArrival);
  size_t bytes = count * dtypeSize(dtype);
  char *data = staging(bytes + 1);
  Pending pending;
  if (rank_ == root) {
    if (bytes)
      std::memcpy(data, buffer, bytes);
    for (int p = 0; p < size_; ++p) {
      if (p == root)
        continue;
      postRecv(pending, data + bytes, 0, p, arrivalTag);
      postSend(pending, data, bytes, p, op.tag);
    }
    wait(pending, op, "did not arrive (no message from them for this collective)");
    return;
  }
  postSend(pending, data + bytes, 0, root, arrivalTag);
  postRecv(pending, data, bytes, root, op.tag);
  wait(pending, op, "(the root) did not arrive or did not send (no data from it)");
  if (bytes)
    std::memcpy(buffer, data, bytes);
}

void MpiCommunicator::doRingShift(const void *send, void *recv, size_t count, DType dtype,
                                  int ringSize, const std::string &context) {
  Op op = begin("ringShift", Kind::RingShift, count, dtype, context);
  size_t bytes = count * dtypeSize(dtype);
  // This rank's ring: the consecutive group of ringSize ranks that holds it.
  const int first = rank_ - rank_ % ringSize, at = rank_ % ringSize;
  int next = first + (at + 1) % ringSize, previous = first + (at - 1 + ringSize) % ringSize;
  // [0, bytes): the outgoing copy (send and recv may alias); [bytes, 2 bytes): the incoming.
  char *data = staging(2 * bytes);
  if (bytes)
    std::memcpy(data, send, bytes);
  Pending pending;
  postRecv(pending, data + bytes, bytes, previous, op.tag);
  postSend(pending, data, bytes, next, op.tag);
  wait(pending, op, "did not arrive (no message from the previous rank of the ring)");
  if (bytes)
    std::memcpy(recv, data + bytes, bytes);
}

void MpiCommunicator::doBarrier(const std::string &context) {
  Op op = begin("barrier", Kind::Barrier, 0, DType::F32, context);
  op.what = "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": barrier" +
            (context.empty() ? "" : " [" + context + "]");
  char *token = staging(1);
  Pending pending;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_)
      continue;
    postRecv(pending, token, 0, p, op.tag);
    postSend(pending, token, 0, p, op.tag);
  }
  wait(pending, op, "did not arrive (no message from them for this barrier)");
}

} // namespace

std::unique_ptr<Communicator> makeMpiCommunicator(const LaunchInfo &launch, double timeoutSeconds) {
  if (gAlive)
    throw Error("MPI communicator: this process has one already (one per process)");
  return std::make_unique<MpiCommunicator>(launch, timeoutSeconds);
}

} // namespace bonsai::rt::comm
