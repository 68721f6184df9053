//===- NcclCommunicatorTest.cpp - NCCL collectives on one rank, deadlines --===//
//
// What NcclCommunicator.h promises on one GPU, started through the single-rank host
// communicator (the NCCL code path end to end: unique id, broadcast, non-blocking start-up,
// collectives, synchronize, finalize): every collective on device buffers equals its input bit
// for bit (one rank: the sum is the input, the gather and the broadcast copy it) for f32, bf16
// and f16, odd sizes and 0 elements, in place and out of place, on a non-blocking stream, with
// nothing written past the output; a synchronize on a stream held by a host function past a 1 s
// deadline throws naming the rank, the context, the last collective and the seconds, after
// which the communicator refuses every call; bad arguments (null buffers, pageable host memory,
// partial overlaps, an integer sum, an unknown dtype, a byte count that overflows, a root that is
// not a rank) are errors before anything is enqueued and leave the communicator usable; a bad
// deadline setting or device ordinal is refused before NCCL is touched. Built only with the
// CUDA backend and NCCL; tests that need a GPU skip without one. Several ranks need several
// processes (mpirun) and are not tested here.
//
//===----------------------------------------------------------------------===//

#if defined(BONSAI_HAVE_CUDA) && defined(BONSAI_HAVE_NCCL)

#include "bonsai/runtime/NcclCommunicator.h"

#include "bonsai/runtime/Communicator.h"
#include "bonsai/runtime/KernelBackend.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace bonsai::rt;

namespace {

using Clock = std::chrono::steady_clock;

void cudaOk(cudaError_t status, const char *call) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorString(status));
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

/// An environment of exactly these variables.
EnvLookup envOf(std::map<std::string, std::string> vars) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [shared](const char *name) -> const char * {
    auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// `count` elements of `dtype` as random bit patterns (infinities, subnormals and signed zeros
/// included), NaNs redrawn: one rank must return every other pattern as it was.
std::vector<uint8_t> randomElements(DType dtype, size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(count * dtypeSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    if (dtype == DType::F32) {
      uint32_t u;
      do
        u = uint32_t(rng());
      while ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0);
      std::memcpy(bytes.data() + 4 * i, &u, 4);
    } else {
      // bf16: 8 exponent bits; f16: 5.
      uint16_t expMask = dtype == DType::BF16 ? 0x7F80 : 0x7C00;
      uint16_t u;
      do
        u = uint16_t(rng());
      while ((u & expMask) == expMask && (u & uint16_t(~expMask & 0x7FFF)) != 0);
      std::memcpy(bytes.data() + 2 * i, &u, 2);
    }
  }
  return bytes;
}

/// The byte every output is poisoned with before a collective.
constexpr uint8_t kPoison = 0xA5;
/// Elements after each output that must keep the poison.
constexpr size_t kGuard = 64;

/// A device allocation of `bytes` bytes plus a guard tail, freed on scope exit.
struct DeviceBuffer {
  void *data = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t bytes) : bytes(bytes) {
    cudaOk(cudaMalloc(&data, bytes + kGuard * 4), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(data); }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  char *bytePtr() const { return static_cast<char *>(data); }
  /// Poisons the buffer and its guard, then copies `content` to the start, in `stream`'s order.
  void fill(const std::vector<uint8_t> &content, cudaStream_t stream) {
    cudaOk(cudaMemsetAsync(data, kPoison, bytes + kGuard * 4, stream), "cudaMemsetAsync");
    if (!content.empty())
      cudaOk(cudaMemcpyAsync(data, content.data(), content.size(), cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync");
  }
  /// The buffer and its guard (the stream must be idle).
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> out(bytes + kGuard * 4);
    cudaOk(cudaMemcpy(out.data(), data, out.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return out;
  }
};

/// Checks that `got` starts with `expected` (bit for bit) and that the poison follows it up to
/// `got`'s end; says where it does not.
void expectBytes(const std::vector<uint8_t> &got, const std::vector<uint8_t> &expected,
                 const std::string &what) {
  ASSERT_GE(got.size(), expected.size()) << what;
  for (size_t i = 0; i < expected.size(); ++i)
    if (got[i] != expected[i]) {
      ADD_FAILURE() << what << ": byte " << i << " of " << expected.size() << " is " << int(got[i])
                    << ", expected " << int(expected[i]);
      return;
    }
  for (size_t i = expected.size(); i < got.size(); ++i)
    if (got[i] != kPoison) {
      ADD_FAILURE() << what << ": byte " << i << " past the output (" << expected.size()
                    << " bytes) was written";
      return;
    }
}

const DType kFloatTypes[] = {DType::F32, DType::BF16, DType::F16};
const size_t kCounts[] = {0, 1, 7, 4097, 1000003};

/// Runs a host function on `stream` that sleeps `seconds` (CUDA must not be called in it).
void holdStream(cudaStream_t stream, double *seconds) {
  cudaOk(cudaLaunchHostFunc(
             stream,
             [](void *arg) {
               std::this_thread::sleep_for(
                   std::chrono::duration<double>(*static_cast<double *>(arg)));
             },
             seconds),
         "cudaLaunchHostFunc");
}

//===----------------------------------------------------------------------===//
// The collectives on one rank, through one communicator for the whole suite
//===----------------------------------------------------------------------===//

class NcclCollectivesTest : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    if (!cudaDeviceAvailable())
      return;
    try {
      host_ = std::make_unique<SingleRankCommunicator>();
      nccl_ = NcclCommunicator::create(*host_);
    } catch (const std::exception &e) {
      startError_ = e.what();
    }
  }
  static void TearDownTestSuite() {
    nccl_.reset();
    host_.reset();
  }
  void SetUp() override {
    if (!cudaDeviceAvailable())
      GTEST_SKIP() << "no GPU here";
    ASSERT_TRUE(nccl_) << "NCCL start-up failed: " << startError_;
    cudaOk(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  void TearDown() override {
    if (stream_) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }

  /// Runs `collective(send, recv, count, dtype)` out of place and in place (`inPlaceRecv`
  /// gives recv's start for a send buffer, `inPlaceSend` send's start in a recv buffer) for
  /// every float dtype and count, and checks that the output is the input.
  template <typename Collective> void checkCopies(const char *name, Collective &&collective) {
    for (DType dtype : kFloatTypes)
      for (size_t count : kCounts) {
        std::string what =
            std::string(name) + " " + dtypeName(dtype) + " x " + std::to_string(count);
        size_t bytes = count * dtypeSize(dtype);
        std::vector<uint8_t> input = randomElements(dtype, count, uint32_t(count * 3 + 1));
        // Out of place.
        {
          DeviceBuffer send(bytes), recv(bytes);
          send.fill(input, stream_);
          recv.fill({}, stream_);
          collective(send.data, recv.data, count, dtype, what + " out of place");
          nccl_->synchronize(stream_, what);
          expectBytes(recv.download(), input, what + " out of place: recv");
          expectBytes(send.download(), input, what + " out of place: send kept");
        }
        // In place (one rank: the in-place layouts are send == recv).
        {
          DeviceBuffer buffer(bytes);
          buffer.fill(input, stream_);
          collective(buffer.data, buffer.data, count, dtype, what + " in place");
          nccl_->synchronize(stream_, what);
          expectBytes(buffer.download(), input, what + " in place");
        }
        // Null buffers are fine for 0 elements.
        if (count == 0) {
          collective(nullptr, nullptr, 0, dtype, what + " null");
          nccl_->synchronize(stream_, what);
        }
      }
    EXPECT_FALSE(nccl_->failed());
  }

  static std::unique_ptr<SingleRankCommunicator> host_;
  static std::unique_ptr<NcclCommunicator> nccl_;
  static std::string startError_;
  cudaStream_t stream_ = nullptr;
};

std::unique_ptr<SingleRankCommunicator> NcclCollectivesTest::host_;
std::unique_ptr<NcclCommunicator> NcclCollectivesTest::nccl_;
std::string NcclCollectivesTest::startError_;

TEST_F(NcclCollectivesTest, OneRankFromTheSingleRankCommunicator) {
  EXPECT_EQ(nccl_->rank(), 0);
  EXPECT_EQ(nccl_->size(), 1);
  EXPECT_EQ(nccl_->device(), 0); // the single-rank communicator's local rank
  int current = -1;
  cudaOk(cudaGetDevice(&current), "cudaGetDevice");
  EXPECT_EQ(current, 0);
  EXPECT_FALSE(nccl_->failed());
}

TEST_F(NcclCollectivesTest, AllReduceSumIsTheInput) {
  checkCopies("allReduceSum",
              [&](void *send, void *recv, size_t count, DType dtype, const std::string &context) {
                nccl_->allReduceSum(send, recv, count, dtype, stream_, context);
              });
}

// allReduceMax (FP8's amax statistics) takes f32 only: on one rank a copy, in place or not.
TEST_F(NcclCollectivesTest, AllReduceMaxIsTheInput) {
  for (size_t count : kCounts) {
    std::string what = "allReduceMax f32 x " + std::to_string(count);
    size_t bytes = count * sizeof(float);
    std::vector<uint8_t> input = randomElements(DType::F32, count, uint32_t(count * 5 + 2));
    DeviceBuffer send(bytes), recv(bytes);
    send.fill(input, stream_);
    recv.fill({}, stream_);
    nccl_->allReduceMax(send.data, recv.data, count, DType::F32, stream_, what);
    nccl_->allReduceMax(send.data, send.data, count, DType::F32, stream_, what + " in place");
    nccl_->synchronize(stream_, what);
    expectBytes(recv.download(), input, what + " out of place");
    expectBytes(send.download(), input, what + " in place");
  }
  DeviceBuffer buffer(64);
  try {
    nccl_->allReduceMax(buffer.data, buffer.data, 32, DType::BF16, stream_, "bf16");
    ADD_FAILURE() << "allReduceMax of bf16 was accepted";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("the maximum is of f32 values, not bf16"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(nccl_->failed());
}

TEST_F(NcclCollectivesTest, ReduceScatterSumIsTheInput) {
  checkCopies("reduceScatterSum",
              [&](void *send, void *recv, size_t count, DType dtype, const std::string &context) {
                nccl_->reduceScatterSum(send, recv, count, dtype, stream_, context);
              });
}

TEST_F(NcclCollectivesTest, AllGatherIsTheInput) {
  checkCopies("allGather",
              [&](void *send, void *recv, size_t count, DType dtype, const std::string &context) {
                nccl_->allGather(send, recv, count, dtype, stream_, context);
              });
}

TEST_F(NcclCollectivesTest, BroadcastIsTheRootsInput) {
  checkCopies("broadcast",
              [&](void *send, void *recv, size_t count, DType dtype, const std::string &context) {
                nccl_->broadcast(send, recv, count, dtype, 0, stream_, context);
              });
}

TEST_F(NcclCollectivesTest, GathersMoveAnyDtypeAsBytes) {
  // Not summable, but copied: i32, i64, fp8 and NF4 bytes.
  for (DType dtype : {DType::I32, DType::I64, DType::F8E4M3FN, DType::NF4}) {
    size_t count = 1001;
    size_t bytes = count * dtypeSize(dtype);
    std::mt19937 rng(uint32_t(dtype) + 17);
    std::vector<uint8_t> input(bytes);
    for (uint8_t &b : input)
      b = uint8_t(rng());
    DeviceBuffer send(bytes), gathered(bytes), broadcast(bytes);
    send.fill(input, stream_);
    gathered.fill({}, stream_);
    broadcast.fill({}, stream_);
    nccl_->allGather(send.data, gathered.data, count, dtype, stream_, "gather");
    nccl_->broadcast(send.data, broadcast.data, count, dtype, 0, stream_, "broadcast");
    nccl_->synchronize(stream_, "gathers");
    expectBytes(gathered.download(), input, std::string("allGather ") + dtypeName(dtype));
    expectBytes(broadcast.download(), input, std::string("broadcast ") + dtypeName(dtype));
  }
}

// One rank is its own neighbour: the shift is a copy, bit for bit, for any dtype; overlapping
// buffers are refused (a ring step double-buffers its block), leaving the communicator usable.
TEST_F(NcclCollectivesTest, RingShiftOfOneRankIsACopy) {
  for (DType dtype : {DType::BF16, DType::F32, DType::I64, DType::U8})
    for (size_t count : {size_t(1), size_t(7), size_t(4097), size_t(1000003)}) {
      std::string what =
          std::string("ringShift ") + dtypeName(dtype) + " x " + std::to_string(count);
      size_t bytes = count * dtypeSize(dtype);
      // Moved as bytes: any bits will do.
      std::mt19937 rng(uint32_t(count) + uint32_t(dtype));
      std::vector<uint8_t> input(bytes);
      for (uint8_t &b : input)
        b = uint8_t(rng());
      DeviceBuffer send(bytes), recv(bytes);
      send.fill(input, stream_);
      recv.fill({}, stream_);
      nccl_->ringShift(send.data, recv.data, count, dtype, stream_, what);
      nccl_->synchronize(stream_, what);
      expectBytes(recv.download(), input, what + ": recv");
      expectBytes(send.download(), input, what + ": send kept");
    }
  DeviceBuffer buffer(64);
  try {
    nccl_->ringShift(buffer.data, static_cast<char *>(buffer.data) + 4, 8, DType::F32, stream_,
                     "overlap");
    FAIL() << "overlapping ring buffers were accepted";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("overlap but are not the in-place layout"),
              std::string::npos)
        << e.what();
  }
  nccl_->ringShift(nullptr, nullptr, 0, DType::F32, stream_, "empty");
  nccl_->synchronize(stream_, "after the refusal");
  EXPECT_FALSE(nccl_->failed());
}

TEST_F(NcclCollectivesTest, PinnedHostBuffersAreAccepted) {
  size_t count = 513;
  std::vector<uint8_t> input = randomElements(DType::F32, count, 99);
  void *pinned = nullptr;
  cudaOk(cudaMallocHost(&pinned, input.size()), "cudaMallocHost");
  std::memcpy(pinned, input.data(), input.size());
  DeviceBuffer recv(input.size());
  recv.fill({}, stream_);
  nccl_->allReduceSum(pinned, recv.data, count, DType::F32, stream_, "from pinned memory");
  nccl_->synchronize(stream_, "from pinned memory");
  expectBytes(recv.download(), input, "allReduceSum from pinned host memory");
  cudaFreeHost(pinned);
}

TEST_F(NcclCollectivesTest, SynchronizeWaitsForWorkWithinTheDeadline) {
  // The stream is held 0.3 s by a host function, then the collective runs: synchronize must
  // return after both, with the result in place (the deadline is 600 s).
  size_t count = 4097;
  std::vector<uint8_t> input = randomElements(DType::BF16, count, 7);
  DeviceBuffer send(input.size()), recv(input.size());
  send.fill(input, stream_);
  recv.fill({}, stream_);
  static double hold = 0.3; // read by the host function, which may outlive a failed check
  holdStream(stream_, &hold);
  auto start = Clock::now();
  nccl_->allReduceSum(send.data, recv.data, count, DType::BF16, stream_, "held");
  nccl_->synchronize(stream_, "held");
  EXPECT_GE(secondsSince(start), 0.25);
  EXPECT_EQ(cudaStreamQuery(stream_), cudaSuccess);
  expectBytes(recv.download(), input, "allReduceSum behind a held stream");
}

TEST_F(NcclCollectivesTest, BadArgumentsAreErrorsThatLeaveItUsable) {
  size_t count = 100;
  DeviceBuffer a(count * 4), b(count * 4);
  std::vector<float> pageable(count, 1.0f);
  char *p = a.bytePtr();
  auto expectError = [&](const std::string &message, const char *expected) {
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    EXPECT_NE(message.find("[bad args]"), std::string::npos) << message;
    EXPECT_NE(message.find("rank 0 of 1"), std::string::npos) << message;
  };
  const std::string ctx = "bad args";
  expectError(
      errorOf([&] { nccl_->allReduceSum(nullptr, b.data, count, DType::F32, stream_, ctx); }),
      "`send` is null but 400 bytes");
  expectError(
      errorOf([&] { nccl_->reduceScatterSum(a.data, nullptr, count, DType::F16, stream_, ctx); }),
      "`recv` is null but 200 bytes");
  expectError(errorOf([&] { nccl_->allGather(nullptr, b.data, 3, DType::I64, stream_, ctx); }),
              "`send` is null");
  expectError(
      errorOf([&] { nccl_->broadcast(nullptr, b.data, count, DType::F32, 0, stream_, ctx); }),
      "`send` is null");
  expectError(
      errorOf([&] { nccl_->allReduceSum(a.data, b.data, count, DType::I32, stream_, ctx); }),
      "sums are f32, bf16 or f16, not i32");
  expectError(
      errorOf([&] { nccl_->reduceScatterSum(a.data, b.data, count, DType::NF4, stream_, ctx); }),
      "sums are f32, bf16 or f16");
  expectError(errorOf([&] { nccl_->allGather(a.data, b.data, count, DType(42), stream_, ctx); }),
              "unknown dtype 42");
  size_t huge = std::numeric_limits<size_t>::max() / 2 + 1; // 2 or 4 bytes each: too many
  expectError(errorOf([&] { nccl_->allReduceSum(a.data, b.data, huge, DType::F32, stream_, ctx); }),
              "overflow the byte count");
  expectError(errorOf([&] { nccl_->allGather(a.data, b.data, huge, DType::BF16, stream_, ctx); }),
              "overflow the byte count");
  expectError(
      errorOf([&] { nccl_->broadcast(a.data, b.data, count, DType::F32, 1, stream_, ctx); }),
      "root 1 is not a rank of 1");
  expectError(
      errorOf([&] { nccl_->broadcast(a.data, b.data, count, DType::F32, -1, stream_, ctx); }),
      "root -1 is not a rank of 1");
  // Pageable host memory: NCCL's kernels cannot read it.
  expectError(errorOf([&] {
                nccl_->allReduceSum(pageable.data(), b.data, count, DType::F32, stream_, ctx);
              }),
              "host memory the device cannot access");
  expectError(
      errorOf([&] { nccl_->allGather(a.data, pageable.data(), count, DType::F32, stream_, ctx); }),
      "host memory the device cannot access");
  // Overlaps that are not the in-place layout.
  expectError(errorOf([&] { nccl_->allReduceSum(p, p + 4, count - 1, DType::F32, stream_, ctx); }),
              "overlap but are not the in-place layout");
  expectError(
      errorOf([&] { nccl_->reduceScatterSum(p + 2, p, count - 1, DType::BF16, stream_, ctx); }),
      "overlap but are not the in-place layout");
  expectError(errorOf([&] { nccl_->allGather(p, p + 8, 10, DType::F32, stream_, ctx); }),
              "overlap but are not the in-place layout");
  expectError(errorOf([&] { nccl_->broadcast(p + 4, p, 10, DType::F32, 0, stream_, ctx); }),
              "overlap but are not the in-place layout");
  // None of that failed the communicator.
  EXPECT_FALSE(nccl_->failed());
  std::vector<uint8_t> input = randomElements(DType::F32, count, 5);
  a.fill(input, stream_);
  b.fill({}, stream_);
  nccl_->allReduceSum(a.data, b.data, count, DType::F32, stream_, "after bad args");
  nccl_->synchronize(stream_, "after bad args");
  expectBytes(b.download(), input, "allReduceSum after the bad arguments");
}

//===----------------------------------------------------------------------===//
// Start-up settings
//===----------------------------------------------------------------------===//

TEST(NcclCommunicatorStartTest, BadDeadlineSettingIsRefusedBeforeNccl) {
  // No GPU needed: the setting is read before the device is touched.
  SingleRankCommunicator host;
  NcclCommunicatorOptions options;
  options.env = envOf({{"BONSAI_COLLECTIVE_TIMEOUT", "soon"}});
  std::string message = errorOf([&] { NcclCommunicator::create(host, options); });
  EXPECT_NE(message.find("rank 0 of 1"), std::string::npos) << message;
  EXPECT_NE(message.find("NCCL start-up"), std::string::npos) << message;
  EXPECT_NE(message.find("BONSAI_COLLECTIVE_TIMEOUT='soon'"), std::string::npos) << message;
}

TEST(NcclCommunicatorStartTest, BadDeviceOrdinalsAreRefused) {
  // No GPU needed: without one the error is cudaGetDeviceCount's, still naming the device.
  SingleRankCommunicator host;
  NcclCommunicatorOptions options;
  options.device = 4096;
  std::string message = errorOf([&] { NcclCommunicator::create(host, options); });
  EXPECT_NE(message.find("(device 4096): NCCL start-up"), std::string::npos) << message;
  if (cudaDeviceAvailable()) {
    EXPECT_NE(message.find("is not below the"), std::string::npos) << message;
  }
  options.device = -2;
  message = errorOf([&] { NcclCommunicator::create(host, options); });
  EXPECT_NE(message.find("device -2 is not a CUDA device ordinal"), std::string::npos) << message;
}

TEST(NcclCommunicatorStartTest, DeadlineFromTheEnvironment) {
  if (!cudaDeviceAvailable())
    GTEST_SKIP() << "no GPU here";
  SingleRankCommunicator host;
  NcclCommunicatorOptions options;
  options.env = envOf({{"BONSAI_COLLECTIVE_TIMEOUT", "2.5"}});
  options.device = 0;
  auto nccl = NcclCommunicator::create(host, options);
  EXPECT_EQ(nccl->timeoutSeconds(), 2.5);
  EXPECT_EQ(nccl->device(), 0);
  EXPECT_EQ(nccl->rank(), 0);
  EXPECT_EQ(nccl->size(), 1);
}

//===----------------------------------------------------------------------===//
// The deadline of synchronize
//===----------------------------------------------------------------------===//

TEST(NcclCommunicatorDeadlineTest, HeldStreamEndsInAnErrorAndAFailedCommunicator) {
  if (!cudaDeviceAvailable())
    GTEST_SKIP() << "no GPU here";
  SingleRankCommunicator host;
  NcclCommunicatorOptions options;
  options.timeoutSeconds = 1;
  auto nccl = NcclCommunicator::create(host, options);
  ASSERT_EQ(nccl->timeoutSeconds(), 1.0);
  cudaStream_t stream = nullptr;
  cudaOk(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  size_t count = 1000;
  std::vector<uint8_t> input = randomElements(DType::F32, count, 11);
  {
    DeviceBuffer send(input.size()), recv(input.size());
    send.fill(input, stream);
    recv.fill({}, stream);
    cudaOk(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    // The all-reduce, then a host function that holds the stream 4 s, past the 1 s deadline
    // (what a peer that never arrives looks like from this rank). The collective goes first so
    // that no NCCL work is left behind the hold when the abort comes.
    nccl->allReduceSum(send.data, recv.data, count, DType::F32, stream, "step 7, gradients");
    static double hold = 4.0;
    holdStream(stream, &hold);
    auto start = Clock::now();
    std::string message = errorOf([&] { nccl->synchronize(stream, "step 7"); });
    double elapsed = secondsSince(start);
    EXPECT_NE(message.find("rank 0 of 1 (device 0): NCCL synchronize [step 7]"), std::string::npos)
        << message;
    EXPECT_NE(message.find("did not complete within 1 s"), std::string::npos) << message;
    EXPECT_NE(message.find("NCCL allReduceSum of 4000 bytes (1000 x f32) [step 7, gradients]"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("aborted"), std::string::npos) << message;
    EXPECT_GE(elapsed, 0.9);
    EXPECT_LT(elapsed, 30.0);
    EXPECT_TRUE(nccl->failed());

    // Every later call throws at once with the first error.
    std::string again = errorOf(
        [&] { nccl->allReduceSum(send.data, recv.data, count, DType::F32, stream, "step 8"); });
    EXPECT_NE(again.find("[step 8]: this NCCL communicator failed earlier and cannot be used"),
              std::string::npos)
        << again;
    EXPECT_NE(again.find("did not complete within 1 s"), std::string::npos) << again;
    again = errorOf([&] { nccl->synchronize(stream, "step 8"); });
    EXPECT_NE(again.find("cannot be used"), std::string::npos) << again;
    again = errorOf([&] { nccl->broadcast(send.data, recv.data, 0, DType::F32, 0, stream); });
    EXPECT_NE(again.find("cannot be used"), std::string::npos) << again;

    // The buffers stay alive until the held stream has drained; the all-reduce, enqueued
    // before the hold, completed.
    cudaOk(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    expectBytes(recv.download(), input, "allReduceSum ahead of the hold");
  }
  cudaOk(cudaStreamDestroy(stream), "cudaStreamDestroy");
  nccl.reset(); // an aborted communicator has nothing left to destroy
}

} // namespace

#endif // BONSAI_HAVE_CUDA && BONSAI_HAVE_NCCL
