//===- Communicator.h - Collectives over ranks, launch detection, deadlines -===//
//
// The runtime's collectives (issue #25, docs/sharding.md "Collectives and launch"): one
// interface, Communicator, behind which a sharded plan will all-gather its parameters and
// reduce-scatter its gradients, whatever carries the bytes. Two implementations exist:
// SingleRankCommunicator (one rank: every collective is a copy) and, in a build that found
// MPI (Open MPI from Debian here and in CI), an MPI one for CPU ranks started by `mpirun` or
// `srun`, which is how sharded plans are to be tested in CI without a GPU. Device buffers go
// through NCCL (NcclCommunicator.h), whose ranks agree through one of these. A program has the
// MPI one when it links the library bonsai_comm_mpi (built when CMake finds MPI) rather than
// bonsai_comm (one rank only, no libmpi: what binaries carried to GPU machines without Open MPI
// link).
//
// Two promises make ranks safe to debug:
//
// - Determinism. A sum is the fp32 sum of the ranks' contributions in rank order,
//   ((x_0 + x_1) + x_2) + ... + x_{N-1}, each element computed once by one rank and copied to the
//   others. The result therefore depends neither on MPI's algorithms nor on timing: it is the
//   same on every rank, bit for bit, and the same from run to run. bf16 and f16 are summed in
//   fp32 and rounded once (to nearest even) at the end.
// - Deadlines. The start-up exchange and every collective end within a deadline (600 s unless
//   the factory or BONSAI_COLLECTIVE_TIMEOUT says otherwise). A rank that does not arrive, or
//   dies, is an rt::Error on the others naming this rank, the collective, its byte count, the
//   caller's context ("step 12") and the ranks that did not arrive, never a hang.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_COMMUNICATOR_H
#define BONSAI_RUNTIME_COMMUNICATOR_H

#include "bonsai/runtime/Tensor.h"

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace bonsai::rt {

/// Where this process is among the ranks of a job, as its launcher's environment says.
struct LaunchInfo {
  /// This process's rank in [0, size).
  int rank = 0;
  /// The number of ranks of the job (1 when no launcher started this process).
  int size = 1;
  /// This process's rank among the ranks on its host (what picks its GPU), or -1 when the
  /// launcher does not say (PMI without MPI_LOCALRANKID): the MPI communicator then counts the
  /// lower ranks on the same host.
  int localRank = 0;
  /// The launcher whose variables were read: "openmpi", "pmi", "slurm", or "none".
  std::string launcher = "none";
};

/// Looks up one environment variable: its value, or nullptr when it is not set.
using EnvLookup = std::function<const char *(const char *name)>;

/// Reads rank, size and local rank from the launcher's environment through `env`, the first
/// launcher found in this order: Open MPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
/// OMPI_COMM_WORLD_LOCAL_RANK), PMI (PMI_RANK, PMI_SIZE; MPI_LOCALRANKID for the local rank when
/// set), Slurm (SLURM_PROCID, SLURM_NTASKS or else SLURM_NPROCS, SLURM_LOCALID). The order is a
/// precedence, not a cross-check: `mpirun` inside a Slurm allocation leaves the allocation's
/// SLURM_PROCID in every rank's environment, and the innermost launcher is the one that started
/// this process. No launcher: rank 0 of 1. Throws rt::Error naming the variable for a value that
/// is not a decimal integer in range, a rank without a size (or the reverse), a size below 1, a
/// rank or local rank outside [0, size), or a local rank at or above OMPI_COMM_WORLD_LOCAL_SIZE.
LaunchInfo detectLaunch(const EnvLookup &env);
/// detectLaunch of this process's environment (getenv).
LaunchInfo detectLaunch();

/// The deadline of the start-up exchange and of every collective, in seconds: `requested` when
/// above 0, else BONSAI_COLLECTIVE_TIMEOUT (read through `env`) when set, else 600. Throws
/// rt::Error naming BONSAI_COLLECTIVE_TIMEOUT when it is not a number above 0, or for a
/// `requested` that is not finite.
double collectiveTimeoutSeconds(double requested, const EnvLookup &env);

/// A group of ranks and the collectives between them. Every rank calls the same collectives in
/// the same order with the same counts, dtypes and roots; a rank that calls a different one
/// (or skips one) makes the others' call end in an error at its deadline. Buffers are host
/// memory; `send` and `recv` may alias. Counts are elements of `dtype`. `context` says what the
/// caller was doing ("step 12, all-gather of layers.3") and is part of every error. Errors are
/// rt::Error: bad arguments are reported before anything moves, on the calling rank only; a
/// failure or a missed deadline leaves the communicator failed, and every later call throws
/// at once with the first error. Not to be called from several threads at the same time.
class Communicator {
public:
  virtual ~Communicator();

  /// This process's rank in [0, size()).
  virtual int rank() const = 0;
  /// The number of ranks.
  virtual int size() const = 0;
  /// This process's rank among the ranks on its host.
  virtual int localRank() const = 0;
  /// The number of ranks on this process's host, this one included (what shares its cores).
  virtual int localSize() const = 0;
  /// The deadline of each collective, in seconds.
  virtual double timeoutSeconds() const = 0;
  /// "single-rank" or "mpi".
  virtual const char *backendName() const = 0;

  /// recv[i] = the sum over ranks r = 0, 1, ..., size()-1, in that order, of rank r's send[i],
  /// for i in [0, count), on every rank. `dtype` F32, BF16 or F16 (summed in fp32, rounded once).
  void allReduceSum(const void *send, void *recv, size_t count, DType dtype,
                    const std::string &context = "");
  /// recv[i] = the largest of the ranks' send[i], for i in [0, count), on every rank (NaN
  /// when any rank's is NaN). `dtype` F32: FP8's amax statistics (docs/fp8.md), a few values
  /// a step, so it gathers every rank's values and takes their maximum; `send` and `recv` may
  /// alias.
  void allReduceMax(const void *send, void *recv, size_t count, DType dtype,
                    const std::string &context = "");
  /// recv[i] = the rank-order sum of rank r's send[rank() * recvCount + i], for i in
  /// [0, recvCount): `send` holds size() equal shards, rank r keeps the sum of shard r. `dtype`
  /// F32, BF16 or F16. The bits are allReduceSum's on the same shard.
  void reduceScatterSum(const void *send, void *recv, size_t recvCount, DType dtype,
                        const std::string &context = "");
  /// recv[r * sendCount + i] = rank r's send[i]: every rank gets the concatenation of all
  /// ranks' equal shards in rank order. Any dtype (the elements are copied, not read).
  void allGather(const void *send, void *recv, size_t sendCount, DType dtype,
                 const std::string &context = "");
  /// Every rank's buffer[0, count) becomes rank `root`'s. Any dtype.
  void broadcast(void *buffer, size_t count, DType dtype, int root,
                 const std::string &context = "");
  /// recv[0, count) = the send[0, count) of the previous rank of this rank's ring: every rank
  /// passes its buffer to the next one around the ring (RingAttention's K/V blocks,
  /// docs/ring-attention.md). The rings are the consecutive groups of `ringSize` ranks (0:
  /// every rank, one ring), so rank r's previous is r - 1 within its group, wrapping. Any
  /// dtype (the elements are copied, not read). `send` and `recv` may alias.
  void ringShift(const void *send, void *recv, size_t count, DType dtype,
                 const std::string &context = "", int ringSize = 0);
  /// Returns when every rank has called barrier (or throws at the deadline naming the ranks
  /// that did not).
  void barrier(const std::string &context = "");

protected:
  /// The collectives with arguments already checked: counts fit size_t bytes, pointers are
  /// non-null where count > 0, `root` in range, sums only on F32, BF16, F16.
  virtual void doAllReduceSum(const void *send, void *recv, size_t count, DType dtype,
                              const std::string &context) = 0;
  /// reduceScatterSum with checked arguments.
  virtual void doReduceScatterSum(const void *send, void *recv, size_t recvCount, DType dtype,
                                  const std::string &context) = 0;
  /// allGather with checked arguments.
  virtual void doAllGather(const void *send, void *recv, size_t sendCount, DType dtype,
                           const std::string &context) = 0;
  /// broadcast with checked arguments.
  virtual void doBroadcast(void *buffer, size_t count, DType dtype, int root,
                           const std::string &context) = 0;
  /// ringShift with checked arguments: `ringSize` divides size().
  virtual void doRingShift(const void *send, void *recv, size_t count, DType dtype, int ringSize,
                           const std::string &context) = 0;
  /// barrier.
  virtual void doBarrier(const std::string &context) = 0;
};

/// One rank (size 1, rank 0, local rank 0): every collective is a copy and never waits.
class SingleRankCommunicator final : public Communicator {
public:
  /// A single rank whose timeoutSeconds() reports `timeoutSeconds` (nothing waits on it).
  explicit SingleRankCommunicator(double timeoutSeconds = 600.0);

  int rank() const override { return 0; }
  int size() const override { return 1; }
  int localRank() const override { return 0; }
  int localSize() const override { return 1; }
  double timeoutSeconds() const override { return timeoutSeconds_; }
  const char *backendName() const override { return "single-rank"; }

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
  double timeoutSeconds_;
};

/// Runs `work` on every rank of `comm`, then makes its outcome the same on all of them: when
/// `work` threw rt::Error on any rank, every rank throws. A rank whose own `work` failed throws
/// its own error; the others throw "stopped because rank R failed: <its error>" for the lowest
/// failing rank R.
/// What one rank alone can find wrong (a file it reads, a disk it writes) thus stops every rank
/// at once, instead of leaving the others at their next collective until its deadline. `work`
/// must not call collectives of `comm` (a rank that failed before them would not arrive).
/// Messages longer than 4000 bytes are cut. `context` names the exchange in a missed deadline.
void onAllRanks(Communicator &comm, const std::string &context, const std::function<void()> &work);

/// True when this program has the MPI communicator (it links bonsai_comm_mpi, not bonsai_comm).
bool mpiAvailable();

/// How makeCommunicator builds a communicator.
struct CommunicatorOptions {
  /// The deadline of start-up and of each collective in seconds; 0 takes
  /// BONSAI_COLLECTIVE_TIMEOUT, else 600 (collectiveTimeoutSeconds).
  double timeoutSeconds = 0;
  /// Where the environment is read (launcher variables, BONSAI_COLLECTIVE_TIMEOUT); empty:
  /// getenv.
  EnvLookup env;
};

/// The communicator of this process: a SingleRankCommunicator when the launcher's environment
/// says one rank (or there is no launcher), else the MPI one, which initialises MPI (once per
/// process), checks MPI's rank and size against the launcher's, learns every rank's host and
/// local rank, all within the deadline. Throws rt::Error when more than one rank is launched
/// and the program has no MPI communicator (saying why), or when the start-up fails or
/// misses its deadline, naming the ranks that did not arrive. If MPI_Init itself does not
/// return within the deadline (a launcher that never started a peer), the process writes that
/// error to stderr and exits with status 1: a blocked MPI_Init cannot be interrupted.
std::unique_ptr<Communicator> makeCommunicator(const CommunicatorOptions &options = {});

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_COMMUNICATOR_H
