//===- CommInternal.h - What the communicators share, not part of the API ---===//
//
// The rank-order sum every communicator reduces with (so that the single-rank and MPI ones,
// and NCCL's host fallback later, give the same bits), the description of a collective that
// errors start with, and the MPI communicator's constructor for makeCommunicator.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_COMM_COMMINTERNAL_H
#define BONSAI_RUNTIME_COMM_COMMINTERNAL_H

#include "bonsai/runtime/Communicator.h"

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace bonsai::rt::comm {

/// out[i] = ((parts[0][i] + parts[1][i]) + parts[2][i]) + ..., in fp32, for i in [0, count);
/// bf16 and f16 are widened to fp32 and the sum is rounded once to nearest even. `out` may
/// alias none of `parts` unless parts.size() == 1. `dtype` F32, BF16 or F16 (checked before).
void sumInRankOrder(const std::vector<const void *> &parts, void *out, size_t count, DType dtype);

/// "rank 1 of 4: allReduceSum of 4096 bytes (1024 x f32) [step 12]": how every error of a
/// collective starts.
std::string describeCollective(int rank, int size, const char *name, size_t count, DType dtype,
                               const std::string &context);

#ifdef BONSAI_HAVE_MPI
/// The MPI communicator of this process for the launch `launch` (size > 1), with deadline
/// `timeoutSeconds`: initialises MPI (once per process) and runs the start-up exchange.
std::unique_ptr<Communicator> makeMpiCommunicator(const LaunchInfo &launch, double timeoutSeconds);
#endif

} // namespace bonsai::rt::comm

#endif // BONSAI_RUNTIME_COMM_COMMINTERNAL_H
