//===- NcclCommunicator.h - Collectives on device buffers through NCCL -----===//
//
// The CUDA backend's collectives (issue #25, point 2; docs/sharding.md, "NCCL"): all-reduce,
// reduce-scatter, all-gather and broadcast of device buffers between the ranks of a job, one
// GPU per rank, through NCCL. rt::Communicator (Communicator.h) moves host buffers and is what
// the ranks first agree through; this class is built on top of one: rank 0 makes NCCL's unique
// id and the host communicator broadcasts it, so NCCL starts wherever the host communicator
// does (the single-rank one, or MPI ranks under `mpirun` / `srun`). Each rank uses the GPU of
// its local rank.
//
// Collectives are enqueued on a CUDA stream given by the caller and return without waiting for
// the device. The CUDA backend is to give them a stream of their own, ordered against compute
// with events (no executor uses this class yet):
//
//   compute:     ... backward of layer 3 ...; cudaEventRecord(gradsReady, compute)
//   collectives: cudaStreamWaitEvent(collectives, gradsReady)
//                nccl.reduceScatterSum(grads, shard, n, DType::BF16, collectives, "step 12 ...")
//                cudaEventRecord(shardReady, collectives)
//   compute:     ... backward of layer 2 (overlaps the reduce-scatter) ...
//                cudaStreamWaitEvent(compute, shardReady); optimizer step on the shard
//   end of step: nccl.synchronize(collectives, "step 12")
//
// When a collective call returns its work is on the stream (NCCL's non-blocking mode is waited
// out inside the call), so an event recorded after it covers it. One communicator's
// collectives go on one stream: NCCL runs a communicator's operations in the order they are
// issued, and every rank must issue the same ones in the same order.
//
// The host communicator's promises, as far as NCCL allows them:
//
// - Deadlines. Start-up and synchronize() end within a deadline (600 s unless the options or
//   BONSAI_COLLECTIVE_TIMEOUT say otherwise, as for the host communicator). NCCL runs in
//   non-blocking mode and is polled (ncclCommGetAsyncError, cudaStreamQuery); at the deadline
//   the NCCL communicator is aborted (ncclCommAbort, which also ends NCCL kernels waiting for a
//   peer) and the call throws rt::Error naming the rank, the collective or context and the
//   seconds. A rank that never arrives is thus an error on the others, never a hang. A failed
//   communicator refuses every later call with its first error.
// - Determinism, weaker than the host communicator's. NCCL sums in its own order (ring, tree or
//   in-switch, chosen per message size and topology), not in rank order, and rounds bf16 and
//   f16 partial sums to the 16-bit type at each step. One rank: every collective is a copy, bit
//   for bit. Several ranks: the sums are not the host communicator's bits in general; with the
//   same NCCL version, ranks, GPUs and NCCL_ALGO / NCCL_PROTO / channel counts pinned, runs
//   repeat their bits (docs/sharding.md says which settings and why).
//
// This header has no CUDA or NCCL include: the stream is forward-declared, as in CudaKernels.h.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_NCCLCOMMUNICATOR_H
#define BONSAI_RUNTIME_NCCLCOMMUNICATOR_H

#include "bonsai/runtime/Communicator.h"
#include "bonsai/runtime/Tensor.h"

#include <cstddef>
#include <memory>
#include <string>

struct CUstream_st;
struct ncclComm;

namespace bonsai::rt {

/// How NcclCommunicator::create builds a communicator.
struct NcclCommunicatorOptions {
  /// The deadline of start-up and of each synchronize() in seconds; 0 takes
  /// BONSAI_COLLECTIVE_TIMEOUT, else 600 (collectiveTimeoutSeconds).
  double timeoutSeconds = 0;
  /// The CUDA device ordinal of this rank; -1 takes the host communicator's localRank().
  int device = -1;
  /// Where BONSAI_COLLECTIVE_TIMEOUT is read; empty: getenv. (NCCL reads its own variables,
  /// NCCL_COMM_ID among them, from the process environment.)
  EnvLookup env;
};

/// One rank's NCCL communicator: collectives on device buffers, enqueued on a caller's stream.
/// Every rank calls the same collectives in the same order with the same counts, dtypes and
/// roots. Counts are elements of `dtype`. Buffers are memory the communicator's device can
/// access (its device memory, managed memory, or pinned / registered host memory), checked with
/// cudaPointerGetAttributes; their extent is not checked. A count of 0 enqueues nothing (every
/// rank has the same count, so every rank skips). `context` says what the caller was doing
/// ("step 12, reduce-scatter of layers.3") and is part of every error. Bad arguments are an
/// rt::Error before anything is enqueued and leave the communicator usable; an NCCL or CUDA
/// failure or a missed deadline aborts the NCCL communicator, and every later call throws at
/// once with the first error. Not to be called from several threads at the same time.
class NcclCommunicator {
public:
  /// Starts NCCL on the ranks of `host`: checks the deadline's setting and the device (before
  /// any NCCL call), makes the unique id on rank 0 (ncclGetUniqueId) and broadcasts it over
  /// `host` (so every rank uses rank 0's id, also when NCCL_COMM_ID is set: NCCL's bootstrap
  /// then listens on that address from rank 0's start-up instead of an address of its own
  /// choosing), sets this thread's device to options.device (else host.localRank()) and
  /// creates the NCCL communicator of host.size() ranks in non-blocking mode, polled until it
  /// is ready or the deadline. Throws rt::Error naming the rank, the device and the failing
  /// call (with NCCL's or CUDA's message), or the deadline that passed. Every rank of `host`
  /// must call create at the same time; `host` is not used afterwards.
  static std::unique_ptr<NcclCommunicator> create(Communicator &host,
                                                  const NcclCommunicatorOptions &options = {});

  /// Finalizes and destroys the NCCL communicator, waiting for its enqueued work at most the
  /// deadline (then aborting it); a failed communicator was aborted already.
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator &) = delete;
  NcclCommunicator &operator=(const NcclCommunicator &) = delete;

  /// This process's rank in [0, size()).
  int rank() const { return rank_; }
  /// The number of ranks.
  int size() const { return size_; }
  /// The CUDA device ordinal this rank's collectives run on.
  int device() const { return device_; }
  /// The deadline of start-up and of each synchronize(), in seconds.
  double timeoutSeconds() const { return timeout_; }
  /// True once an error or a missed deadline has aborted the NCCL communicator.
  bool failed() const { return !failure_.empty(); }

  /// recv[i] = the sum over ranks of send[i], for i in [0, count), on every rank, in NCCL's
  /// order (ncclAllReduce, ncclSum). `dtype` F32, BF16 or F16. In place when send == recv;
  /// other overlaps are refused.
  void allReduceSum(const void *send, void *recv, size_t count, DType dtype, CUstream_st *stream,
                    const std::string &context = "");
  /// recv[i] = the largest of the ranks' send[i], for i in [0, count), on every rank
  /// (ncclAllReduce, ncclMax). `dtype` F32 (FP8's amax statistics). In place when send ==
  /// recv; other overlaps are refused.
  void allReduceMax(const void *send, void *recv, size_t count, DType dtype, CUstream_st *stream,
                    const std::string &context = "");
  /// recv[i] = the sum over ranks r of rank r's send[rank() * recvCount + i], for i in
  /// [0, recvCount): `send` holds size() equal shards (ncclReduceScatter). `dtype` F32, BF16 or
  /// F16. In place when recv == send + rank() * recvCount elements; other overlaps are refused.
  void reduceScatterSum(const void *send, void *recv, size_t recvCount, DType dtype,
                        CUstream_st *stream, const std::string &context = "");
  /// recv[r * sendCount + i] = rank r's send[i]: every rank gets all ranks' shards in rank
  /// order (ncclAllGather). Any dtype (moved as bytes). In place when send == recv + rank() *
  /// sendCount elements; other overlaps are refused.
  void allGather(const void *send, void *recv, size_t sendCount, DType dtype, CUstream_st *stream,
                 const std::string &context = "");
  /// Every rank's recv[0, count) becomes rank `root`'s send[0, count) (ncclBroadcast; `send`
  /// is read on the root only and may be null elsewhere). Any dtype (moved as bytes). In place
  /// when send == recv; other overlaps are refused. `root` in [0, size()).
  void broadcast(const void *send, void *recv, size_t count, DType dtype, int root,
                 CUstream_st *stream, const std::string &context = "");
  /// recv[0, count) = the send[0, count) of the previous rank of this rank's ring: every rank
  /// passes its buffer to the next around the ring (ncclSend to the next rank and ncclRecv
  /// from the previous one, in one group; RingAttention's K/V blocks,
  /// docs/ring-attention.md). The rings are the consecutive groups of `ringSize` ranks (0:
  /// one ring of every rank), as Communicator::ringShift. Any dtype (moved as bytes). `send`
  /// and `recv` must not overlap: a ring step double-buffers its block.
  void ringShift(const void *send, void *recv, size_t count, DType dtype, CUstream_st *stream,
                 const std::string &context = "", int ringSize = 0);

  /// Returns when everything enqueued on `stream` so far has completed, polling the stream
  /// (cudaStreamQuery) and NCCL's asynchronous error. An NCCL error, a CUDA error of the
  /// stream, or the deadline (timeoutSeconds() from this call) aborts the NCCL communicator and
  /// throws rt::Error naming the rank, `context`, the last collective enqueued and the seconds.
  void synchronize(CUstream_st *stream, const std::string &context = "");

private:
  NcclCommunicator(int rank, int size, int device, double timeoutSeconds);

  /// Enqueues one collective (arguments checked): waits out NCCL's non-blocking issue within
  /// the deadline. `issue` makes the NCCL call and returns its ncclResult_t as an int.
  template <typename Issue>
  void enqueue(const char *ncclCall, const std::string &what, Issue &&issue);
  /// allReduceSum (`max` false) and allReduceMax: the same checks, then ncclAllReduce with
  /// ncclSum or ncclMax.
  void allReduce(bool max, const void *send, void *recv, size_t count, DType dtype,
                 CUstream_st *stream, const std::string &context);
  /// Checks that `p` (when non-null) is memory this communicator's device can access.
  void checkDevicePointer(const void *p, const char *name, const char *which,
                          const std::string &context) const;
  /// Throws the first error of a failed communicator.
  void checkUsable(const std::string &what) const;
  /// Aborts the NCCL communicator (once), records `message` as the first error and throws it.
  [[noreturn]] void fail(const std::string &message);
  /// "rank 0 of 1 (device 0)": how this rank's errors start.
  std::string who() const;

  int rank_ = 0, size_ = 1, device_ = 0;
  double timeout_ = 600;
  ncclComm *comm_ = nullptr;
  std::string failure_;
  std::string lastIssued_; // describes the last collective enqueued, for synchronize's errors
};

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_NCCLCOMMUNICATOR_H
