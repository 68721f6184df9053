//===- CommunicatorTest.cpp - One rank, the launcher's environment, deadlines ===//
//
// What Communicator.h promises without a second process: the single-rank communicator's
// collectives are copies (every bit kept, NaN payloads and signed zeros included, in place or
// not) and it checks its arguments like any communicator; detectLaunch reads Open MPI, PMI and
// Slurm variables in that precedence and rejects malformed or inconsistent values naming the
// variable; the deadline comes from the caller, else BONSAI_COLLECTIVE_TIMEOUT, else 600 s;
// makeCommunicator picks the single-rank communicator for one rank and, in this program (which
// links bonsai_comm, without MPI), refuses several ranks saying why. The MPI communicator is
// tested under mpirun by test/runtime/mpi (bonsai-comm-tests). The host thread budget
// (HostThreads.h): a rank's share of its host's cores, set and restored.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Communicator.h"
#include "bonsai/runtime/HostThreads.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

using namespace bonsai::rt;

namespace {

/// An environment of exactly these variables.
EnvLookup envOf(std::map<std::string, std::string> vars) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [shared](const char *name) -> const char * {
    auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

/// The message of the rt::Error that `fn` throws, or "" (and a test failure) when none.
template <typename Fn> std::string errorOf(Fn &&fn) {
  try {
    fn();
  } catch (const Error &e) {
    return e.what();
  }
  ADD_FAILURE() << "no rt::Error";
  return "";
}

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float fromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<float> awkwardFloats() {
  // A NaN with a payload, both zeros, infinities, a subnormal, odd count.
  return {1.5f,   -0.0f,    0.0f, fromBits(0x7fc12345u), INFINITY, -INFINITY,
          1e-40f, -3.25e7f, 0.1f, fromBits(0xffa00001u), 42.0f};
}

TEST(SingleRankCommunicator, IdentityAndDeadline) {
  SingleRankCommunicator comm(12.5);
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.localRank(), 0);
  EXPECT_EQ(comm.timeoutSeconds(), 12.5);
  EXPECT_STREQ(comm.backendName(), "single-rank");
}

TEST(SingleRankCommunicator, AllReduceAndReduceScatterCopyEveryBit) {
  SingleRankCommunicator comm;
  std::vector<float> in = awkwardFloats();
  std::vector<float> out(in.size(), 7.0f);
  comm.allReduceSum(in.data(), out.data(), in.size(), DType::F32, "step 1");
  for (size_t i = 0; i < in.size(); ++i)
    EXPECT_EQ(bitsOf(out[i]), bitsOf(in[i])) << "element " << i;

  std::vector<float> scattered(in.size(), 7.0f);
  comm.reduceScatterSum(in.data(), scattered.data(), in.size(), DType::F32, "step 1");
  for (size_t i = 0; i < in.size(); ++i)
    EXPECT_EQ(bitsOf(scattered[i]), bitsOf(in[i])) << "element " << i;

  // In place.
  std::vector<float> inPlace = in;
  comm.allReduceSum(inPlace.data(), inPlace.data(), inPlace.size(), DType::F32);
  for (size_t i = 0; i < in.size(); ++i)
    EXPECT_EQ(bitsOf(inPlace[i]), bitsOf(in[i])) << "element " << i;

  // bf16 and f16 (stored as uint16): the copy keeps signalling NaNs that a round trip through
  // fp32 would quieten.
  for (DType dtype : {DType::BF16, DType::F16}) {
    std::vector<uint16_t> half = {0x3f80, 0x8000, 0x7f81, 0x0001, 0xfc00, 0x1234, 0x7bff};
    std::vector<uint16_t> halfOut(half.size(), 0);
    comm.allReduceSum(half.data(), halfOut.data(), half.size(), dtype);
    EXPECT_EQ(halfOut, half) << dtypeName(dtype);
  }
}

// allReduceMax (FP8's amax statistics) gathers and keeps the largest: on one rank every bit of
// the input, in place or not, NaNs included; it takes f32 only.
TEST(SingleRankCommunicator, AllReduceMaxCopiesEveryBitOfF32) {
  SingleRankCommunicator comm;
  std::vector<float> in = awkwardFloats();
  std::vector<float> out(in.size(), 7.0f);
  comm.allReduceMax(in.data(), out.data(), in.size(), DType::F32, "step 1");
  for (size_t i = 0; i < in.size(); ++i)
    EXPECT_EQ(bitsOf(out[i]), bitsOf(in[i])) << "element " << i;
  std::vector<float> inPlace = in;
  comm.allReduceMax(inPlace.data(), inPlace.data(), inPlace.size(), DType::F32);
  for (size_t i = 0; i < in.size(); ++i)
    EXPECT_EQ(bitsOf(inPlace[i]), bitsOf(in[i])) << "element " << i;
  std::vector<uint16_t> half(4, 0);
  try {
    comm.allReduceMax(half.data(), half.data(), half.size(), DType::BF16);
    ADD_FAILURE() << "allReduceMax of bf16 was accepted";
  } catch (const Error &e) {
    EXPECT_STREQ(e.what(), "allReduceMax: the maximum is of f32 values, not bf16");
  }
}

TEST(SingleRankCommunicator, AllGatherBroadcastAndRingShift) {
  SingleRankCommunicator comm;
  std::vector<int64_t> in = {1, -2, 3, INT64_MAX, INT64_MIN};
  std::vector<int64_t> out(in.size(), 0);
  comm.allGather(in.data(), out.data(), in.size(), DType::I64, "gather");
  EXPECT_EQ(out, in);
  std::vector<int64_t> buf = in;
  comm.broadcast(buf.data(), buf.size(), DType::I64, 0, "broadcast");
  EXPECT_EQ(buf, in);
  // One rank is its own neighbour around the ring: the shift is a copy, in place or not.
  std::vector<int64_t> shifted(in.size(), 0);
  comm.ringShift(in.data(), shifted.data(), in.size(), DType::I64, "ring");
  EXPECT_EQ(shifted, in);
  comm.ringShift(shifted.data(), shifted.data(), in.size(), DType::I64, "ring in place");
  EXPECT_EQ(shifted, in);
  EXPECT_NE(errorOf([&] { comm.ringShift(nullptr, shifted.data(), 1, DType::I64); })
                .find("ringShift: `send` is null"),
            std::string::npos);
  comm.barrier("barrier");
  // Empty collectives with null buffers are fine.
  comm.allReduceSum(nullptr, nullptr, 0, DType::F32);
  comm.allGather(nullptr, nullptr, 0, DType::I32);
  comm.broadcast(nullptr, 0, DType::F32, 0);
}

TEST(SingleRankCommunicator, BadArgumentsAreErrorsBeforeAnythingMoves) {
  SingleRankCommunicator comm;
  std::vector<int32_t> ints = {1, 2, 3};
  std::vector<int32_t> untouched = ints;
  EXPECT_NE(errorOf([&] {
              comm.allReduceSum(ints.data(), ints.data(), 3, DType::I32);
            }).find("allReduceSum: sums are f32, bf16 or f16, not i32"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              comm.reduceScatterSum(ints.data(), ints.data(), 3, DType::NF4);
            }).find("reduceScatterSum: sums are f32, bf16 or f16, not nf4"),
            std::string::npos);
  EXPECT_EQ(ints, untouched);
  float x = 1;
  EXPECT_NE(errorOf([&] { comm.allReduceSum(nullptr, &x, 1, DType::F32); }).find("`send` is null"),
            std::string::npos);
  EXPECT_NE(errorOf([&] { comm.allGather(&x, nullptr, 1, DType::F32); }).find("`recv` is null"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              comm.broadcast(&x, 1, DType::F32, 1, "step 3");
            }).find("broadcast: root 1 is not a rank of 1 [step 3]"),
            std::string::npos);
  EXPECT_NE(errorOf([&] { comm.broadcast(&x, 1, DType::F32, -1); }).find("root -1"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              comm.allReduceSum(&x, &x, std::numeric_limits<size_t>::max() / 2, DType::F32);
            }).find("overflow the byte count"),
            std::string::npos);
  EXPECT_NE(errorOf([&] { comm.allGather(&x, &x, 1, DType(200)); }).find("unknown dtype 200"),
            std::string::npos);
}

TEST(DetectLaunch, NoLauncherIsOneRank) {
  LaunchInfo info = detectLaunch(envOf({{"HOME", "/root"}}));
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.size, 1);
  EXPECT_EQ(info.localRank, 0);
  EXPECT_EQ(info.launcher, "none");
}

TEST(DetectLaunch, OpenMpiPmiAndSlurm) {
  LaunchInfo ompi = detectLaunch(envOf({{"OMPI_COMM_WORLD_RANK", "3"},
                                        {"OMPI_COMM_WORLD_SIZE", "4"},
                                        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  EXPECT_EQ(ompi.launcher, "openmpi");
  EXPECT_EQ(ompi.rank, 3);
  EXPECT_EQ(ompi.size, 4);
  EXPECT_EQ(ompi.localRank, 1);

  LaunchInfo pmi = detectLaunch(envOf({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}));
  EXPECT_EQ(pmi.launcher, "pmi");
  EXPECT_EQ(pmi.rank, 1);
  EXPECT_EQ(pmi.size, 2);
  EXPECT_EQ(pmi.localRank, -1) << "PMI alone does not say the local rank";
  EXPECT_EQ(detectLaunch(envOf({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "0"}}))
                .localRank,
            0);

  LaunchInfo slurm =
      detectLaunch(envOf({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}}));
  EXPECT_EQ(slurm.launcher, "slurm");
  EXPECT_EQ(slurm.rank, 5);
  EXPECT_EQ(slurm.size, 8);
  EXPECT_EQ(slurm.localRank, 1);
  // SLURM_NPROCS, the older name, when SLURM_NTASKS is absent.
  EXPECT_EQ(detectLaunch(envOf({{"SLURM_PROCID", "2"}, {"SLURM_NPROCS", "3"}})).size, 3);

  // One rank is its host's only one.
  EXPECT_EQ(detectLaunch(envOf({{"PMI_RANK", "0"}, {"PMI_SIZE", "1"}})).localRank, 0);
}

TEST(DetectLaunch, InnermostLauncherWins) {
  // mpirun inside a Slurm allocation: the allocation's SLURM_PROCID is stale in every rank.
  LaunchInfo info = detectLaunch(envOf({{"SLURM_PROCID", "0"},
                                        {"SLURM_NTASKS", "1"},
                                        {"OMPI_COMM_WORLD_RANK", "2"},
                                        {"OMPI_COMM_WORLD_SIZE", "4"}}));
  EXPECT_EQ(info.launcher, "openmpi");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.size, 4);
  EXPECT_EQ(info.localRank, -1);
  // PMI before Slurm (srun --mpi=pmi2 sets both, and they agree; PMI's is the MPI view).
  EXPECT_EQ(
      detectLaunch(
          envOf(
              {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}))
          .launcher,
      "pmi");
}

TEST(DetectLaunch, MalformedValuesNameTheVariable) {
  for (const char *bad :
       {"", "abc", "-1", "+1", " 3", "3 ", "1.5", "0x2", "99999999999", "2147483648"}) {
    std::string msg = errorOf([&] {
      detectLaunch(envOf({{"OMPI_COMM_WORLD_RANK", bad}, {"OMPI_COMM_WORLD_SIZE", "4"}}));
    });
    EXPECT_NE(msg.find(std::string("OMPI_COMM_WORLD_RANK='") + bad +
                       "' is not a non-negative decimal integer"),
              std::string::npos)
        << "value '" << bad << "': " << msg;
  }
  EXPECT_NE(errorOf([] {
              detectLaunch(envOf({{"PMI_RANK", "0"}, {"PMI_SIZE", "two"}}));
            }).find("PMI_SIZE='two'"),
            std::string::npos);
  EXPECT_NE(
      errorOf([] {
        detectLaunch(envOf({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "x"}}));
      }).find("SLURM_LOCALID='x'"),
      std::string::npos);
}

TEST(DetectLaunch, InconsistentValuesNameTheVariables) {
  EXPECT_NE(errorOf([] {
              detectLaunch(envOf({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}}));
            }).find("OMPI_COMM_WORLD_RANK=4 is not below OMPI_COMM_WORLD_SIZE=4"),
            std::string::npos);
  EXPECT_NE(errorOf([] {
              detectLaunch(envOf({{"PMI_RANK", "0"}, {"PMI_SIZE", "0"}}));
            }).find("PMI_SIZE=0: a job has at least one rank"),
            std::string::npos);
  EXPECT_NE(errorOf([] {
              detectLaunch(envOf({{"SLURM_PROCID", "1"}}));
            }).find("SLURM_NTASKS is not set but SLURM_PROCID is"),
            std::string::npos);
  EXPECT_NE(errorOf([] {
              detectLaunch(envOf({{"OMPI_COMM_WORLD_SIZE", "2"}}));
            }).find("OMPI_COMM_WORLD_RANK is not set but OMPI_COMM_WORLD_SIZE is"),
            std::string::npos);
  EXPECT_NE(
      errorOf([] {
        detectLaunch(envOf({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "2"}}));
      }).find("SLURM_LOCALID=2 is not below SLURM_NTASKS=2"),
      std::string::npos);
  EXPECT_NE(errorOf([] {
              detectLaunch(envOf({{"OMPI_COMM_WORLD_RANK", "1"},
                                  {"OMPI_COMM_WORLD_SIZE", "4"},
                                  {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
            }).find("OMPI_COMM_WORLD_LOCAL_RANK=2 is not below OMPI_COMM_WORLD_LOCAL_SIZE=2"),
            std::string::npos);
}

TEST(CollectiveTimeout, CallerThenEnvironmentThenDefault) {
  EXPECT_EQ(collectiveTimeoutSeconds(0, envOf({})), 600.0);
  EXPECT_EQ(collectiveTimeoutSeconds(0, envOf({{"BONSAI_COLLECTIVE_TIMEOUT", "2.5"}})), 2.5);
  EXPECT_EQ(collectiveTimeoutSeconds(7, envOf({{"BONSAI_COLLECTIVE_TIMEOUT", "2.5"}})), 7.0);
  for (const char *bad : {"", "0", "-1", "abc", "5s", "inf", "nan", "1e999"}) {
    std::string msg = errorOf([&] {
      collectiveTimeoutSeconds(0, envOf({{"BONSAI_COLLECTIVE_TIMEOUT", bad}}));
    });
    EXPECT_NE(msg.find(std::string("BONSAI_COLLECTIVE_TIMEOUT='") + bad + "'"), std::string::npos)
        << "value '" << bad << "': " << msg;
  }
  EXPECT_NE(errorOf([] { collectiveTimeoutSeconds(std::nan(""), envOf({})); }).find("not finite"),
            std::string::npos);
}

TEST(MakeCommunicator, OneRankIsTheSingleRankCommunicator) {
  CommunicatorOptions options;
  options.env = envOf({{"BONSAI_COLLECTIVE_TIMEOUT", "3"}});
  auto comm = makeCommunicator(options);
  EXPECT_STREQ(comm->backendName(), "single-rank");
  EXPECT_EQ(comm->timeoutSeconds(), 3.0);

  options.env = envOf({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  options.timeoutSeconds = 9;
  comm = makeCommunicator(options);
  EXPECT_STREQ(comm->backendName(), "single-rank");
  EXPECT_EQ(comm->timeoutSeconds(), 9.0);
}

TEST(MakeCommunicator, BadEnvironmentIsAnErrorBeforeMpiStarts) {
  CommunicatorOptions options;
  options.env = envOf({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "1"}});
  EXPECT_NE(errorOf([&] {
              makeCommunicator(options);
            }).find("OMPI_COMM_WORLD_RANK=1 is not below OMPI_COMM_WORLD_SIZE=1"),
            std::string::npos);
  options.env = envOf({{"BONSAI_COLLECTIVE_TIMEOUT", "soon"}});
  EXPECT_NE(errorOf([&] { makeCommunicator(options); }).find("BONSAI_COLLECTIVE_TIMEOUT='soon'"),
            std::string::npos);
}

TEST(MakeCommunicator, SeveralRanksWithoutMpiSayWhy) {
  // bonsai-runtime-tests links bonsai_comm, the library without MPI (test/runtime/mpi runs the
  // MPI communicator).
  ASSERT_FALSE(mpiAvailable());
  CommunicatorOptions options;
  options.env = envOf({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}});
  std::string msg = errorOf([&] { makeCommunicator(options); });
  EXPECT_NE(msg.find("launched as rank 1 of 2 (pmi environment) but this program has no MPI "
                     "communicator: "),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find(", or run one rank"), std::string::npos) << msg;
}

// A single rank is alone on its host.
TEST(HostThreadsTest, SingleRankIsAloneOnItsHost) {
  SingleRankCommunicator comm;
  EXPECT_EQ(comm.localSize(), 1);
}

// Ranks on one host divide its cores evenly, each keeping at least one thread.
TEST(HostThreadsTest, RanksShareTheHostsCores) {
  EXPECT_EQ(hostThreadsPerRank(16, 1), 16u);
  EXPECT_EQ(hostThreadsPerRank(16, 4), 4u);
  EXPECT_EQ(hostThreadsPerRank(16, 3), 5u);
  EXPECT_EQ(hostThreadsPerRank(2, 4), 1u) << "more ranks than cores";
  EXPECT_EQ(hostThreadsPerRank(8, 0), 8u) << "no count is one rank";
}

// The budget is the machine's cores until set, what was set after, and the default again
// after setHostThreads(0).
TEST(HostThreadsTest, SetAndRestored) {
  unsigned cores = hostThreads();
  EXPECT_GE(cores, 1u);
  setHostThreads(3);
  EXPECT_EQ(hostThreads(), 3u);
  setHostThreads(0);
  EXPECT_EQ(hostThreads(), cores);
}

} // namespace
