//===- CommMpiTest.cpp - The MPI communicator under mpirun ----------------===//
//
// bonsai-comm-tests, run by run-mpi-test.sh under `mpirun -np 2` and `-np 4` (one process per
// rank, so not a gtest binary: every rank must call the same collectives in the same order, and
// the fault modes end ranks on purpose). Modes:
//
//   collectives  every collective against references computed here, bit for bit: the inputs of
//                all ranks are generated on every rank from (seed, rank, index), with exponents
//                spread over 2^-20..2^20 so that the order of a sum changes its bits; odd
//                counts, counts below the number of ranks, empty ones, in place and not; the
//                results' hashes compared across ranks; repeated all-reduces compared with the
//                first; ring shifts (each rank gets the previous rank's buffer); bad
//                arguments an error on every rank that leaves the communicator usable. Prints
//                "DIGEST <hex>" (rank 0), which two runs must agree on.
//   skip         the last rank skips an all-reduce; every other rank must get, within the
//                deadline (BONSAI_COLLECTIVE_TIMEOUT, 2 s in the script) and not much later, an
//                error naming that rank, the step, the byte count; then every call fails at
//                once. Prints "SKIP-DETECTED" per such rank and exits 1.
//   kill         the last rank kills itself (SIGKILL) in the middle of a stream of all-reduces;
//                the job must end, non-zero, within the deadline (5 s in the script). Prints
//                "KILL-DETECTED" on ranks whose collective timed out naming the dead rank
//                (plain mpirun usually ends them first; under `mpirun --enable-recovery` it does
//                not, and every survivor must report).
//   late         the last rank sleeps 20 s before starting: the others' start-up must end at
//                the deadline (2 s in the script) with an error ("LATE-DETECTED"), or with
//                the MPI_Init watchdog's message when MPI_Init itself waits for every rank.
//
// Exit status: 0 all checks passed (collectives); 1 the expected error (fault modes) or a failed
// check (collectives, where every rank learns the failure count); 2 bad use; 3 a fault that went
// unnoticed.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Communicator.h"

#include <chrono>
#include <cinttypes>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

using namespace bonsai::rt;

namespace {

/// Whether `n` bytes at `a` and `b` are equal; true for none (where the buffers of an empty
/// collective are null, which memcmp may not be given).
bool sameBytes(const uint8_t *a, const uint8_t *b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// FNV-1a over bytes, chained.
uint64_t hashBytes(const void *data, size_t bytes, uint64_t h = 1469598103934665603ull) {
  const auto *p = static_cast<const unsigned char *>(data);
  for (size_t i = 0; i < bytes; ++i)
    h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

float toF32(DType dtype, const std::vector<uint8_t> &buf, size_t i) {
  if (dtype == DType::F32) {
    float f;
    std::memcpy(&f, buf.data() + 4 * i, 4);
    return f;
  }
  uint16_t bits;
  std::memcpy(&bits, buf.data() + 2 * i, 2);
  return dtype == DType::BF16 ? bf16ToF32(bits) : f16ToF32(bits);
}

void storeF32(DType dtype, std::vector<uint8_t> &buf, size_t i, float f) {
  if (dtype == DType::F32) {
    std::memcpy(buf.data() + 4 * i, &f, 4);
    return;
  }
  uint16_t bits = dtype == DType::BF16 ? f32ToBf16(f) : f32ToF16(f);
  std::memcpy(buf.data() + 2 * i, &bits, 2);
}

/// Rank `rank`'s input of test `seed`: `count` elements of `dtype`. Floats have random signs,
/// mantissas and exponents (f16 within its range), integers are random bits.
std::vector<uint8_t> input(uint64_t seed, int rank, size_t count, DType dtype) {
  std::vector<uint8_t> buf(count * dtypeSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    uint64_t h = splitmix(splitmix(seed * 1000003ull + uint64_t(rank)) ^ uint64_t(i));
    if (!isComputeFloat(dtype)) {
      std::memcpy(buf.data() + i * dtypeSize(dtype), &h, dtypeSize(dtype));
      continue;
    }
    float mantissa = float(h & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
    int span = dtype == DType::F16 ? 8 : 20;
    int exponent = int((h >> 24) % uint64_t(2 * span + 1)) - span;
    storeF32(dtype, buf, i, std::ldexp(mantissa, exponent));
  }
  return buf;
}

/// The rank-order sum of every rank's input: ((x_0 + x_1) + x_2) + ... in fp32, rounded once;
/// `reverse` sums in the other order (to show that the data tells the orders apart).
std::vector<uint8_t> reference(uint64_t seed, int ranks, size_t count, DType dtype,
                               bool reverse = false) {
  std::vector<std::vector<uint8_t>> inputs;
  for (int r = 0; r < ranks; ++r)
    inputs.push_back(input(seed, r, count, dtype));
  std::vector<uint8_t> out(count * dtypeSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    float acc = toF32(dtype, inputs[reverse ? ranks - 1 : 0], i);
    for (int k = 1; k < ranks; ++k)
      acc += toF32(dtype, inputs[reverse ? ranks - 1 - k : k], i);
    storeF32(dtype, out, i, acc);
  }
  return out;
}

class Checker {
public:
  explicit Checker(Communicator &comm) : comm_(comm) {}

  void check(bool ok, const std::string &what) {
    ++checks_;
    if (ok)
      return;
    ++failures_;
    if (failures_ <= 20)
      std::fprintf(stderr, "rank %d: FAIL: %s\n", comm_.rank(), what.c_str());
  }
  /// Checks that every rank holds the same bytes (by hash).
  void sameOnEveryRank(const std::vector<uint8_t> &bytes, const std::string &what) {
    uint64_t mine = hashBytes(bytes.data(), bytes.size());
    std::vector<uint64_t> all(size_t(comm_.size()));
    comm_.allGather(&mine, all.data(), 1, DType::I64, "hash of " + what);
    bool same = true;
    for (uint64_t h : all)
      same = same && h == mine;
    check(same, what + ": results differ between ranks");
    digest_ = hashBytes(&mine, sizeof(mine), digest_);
  }
  int failures() const { return failures_; }
  int checks() const { return checks_; }
  uint64_t digest() const { return digest_; }

private:
  Communicator &comm_;
  int failures_ = 0, checks_ = 0;
  uint64_t digest_ = 1469598103934665603ull;
};

std::string label(const char *name, DType dtype, size_t count, const char *variant = "") {
  return std::string(name) + " " + dtypeName(dtype) + " x" + std::to_string(count) + variant;
}

int runCollectives(Communicator &comm) {
  Checker c(comm);
  const int n = comm.size(), me = comm.rank();
  uint64_t seed = 1;
  auto t0 = Clock::now();

  // All-reduce: every dtype, odd and tiny counts, out of place and in place.
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    size_t big = dtype == DType::F32 ? 1000003 : 100003;
    // Tiny, odd, below and around the number of ranks (chunks of zero elements), large.
    std::vector<size_t> counts = {0, 1, 2, 3, 7, 1000, big};
    counts.insert(counts.end(), {size_t(n - 1), size_t(n), size_t(n + 1)});
    for (size_t count : counts) {
      for (bool inPlace : {false, true}) {
        ++seed;
        std::vector<uint8_t> in = input(seed, me, count, dtype);
        std::vector<uint8_t> out(in.size(), 0xAB);
        std::string what = label("allReduceSum", dtype, count, inPlace ? " in place" : "");
        if (inPlace) {
          out = in;
          comm.allReduceSum(out.data(), out.data(), count, dtype, what);
        } else {
          comm.allReduceSum(in.data(), out.data(), count, dtype, what);
        }
        c.check(out == reference(seed, n, count, dtype), what + ": not the rank-order sum");
        if (!inPlace)
          c.check(in == input(seed, me, count, dtype), what + ": the input was changed");
        c.sameOnEveryRank(out, what);
      }
    }
  }

  // The data tells summation orders apart (with 3 ranks or more; two-term sums commute), so
  // the comparisons above would catch another order.
  if (n >= 3) {
    size_t count = 100003;
    std::vector<uint8_t> forward = reference(77, n, count, DType::F32);
    std::vector<uint8_t> backward = reference(77, n, count, DType::F32, true);
    size_t differ = 0;
    for (size_t i = 0; i < count; ++i)
      differ += std::memcmp(&forward[4 * i], &backward[4 * i], 4) != 0;
    c.check(differ > count / 100, "the test data does not tell summation orders apart");
    if (me == 0)
      std::printf("rank-order and reverse-order sums differ in %zu of %zu elements\n", differ,
                  count);
  }

  // Reduce-scatter: rank r keeps the rank-order sum of shard r.
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (size_t recvCount : {size_t(0), size_t(1), size_t(5), size_t(1001), size_t(250007)}) {
      ++seed;
      std::vector<uint8_t> in = input(seed, me, recvCount * size_t(n), dtype);
      std::vector<uint8_t> out(recvCount * dtypeSize(dtype), 0xCD);
      std::string what = label("reduceScatterSum", dtype, recvCount);
      comm.reduceScatterSum(in.data(), out.data(), recvCount, dtype, what);
      std::vector<uint8_t> full = reference(seed, n, recvCount * size_t(n), dtype);
      size_t shard = recvCount * dtypeSize(dtype);
      c.check(sameBytes(out.data(), full.data() + size_t(me) * shard, shard),
              what + ": not the rank-order sum of this rank's shard");
      // The same bits as an all-reduce of the whole buffer.
      std::vector<uint8_t> all(in.size());
      comm.allReduceSum(in.data(), all.data(), recvCount * size_t(n), dtype, what + " (all)");
      c.check(sameBytes(out.data(), all.data() + size_t(me) * shard, shard),
              what + ": differs from the all-reduce of the same data");
      std::vector<uint8_t> gathered(in.size());
      comm.allGather(out.data(), gathered.data(), recvCount, dtype, what + " (gather)");
      c.sameOnEveryRank(gathered, what);
    }
  }

  // All-gather: any dtype, the shards in rank order.
  for (DType dtype : {DType::F32, DType::BF16, DType::I32, DType::I64}) {
    for (size_t count : {size_t(0), size_t(1), size_t(13), size_t(100003)}) {
      ++seed;
      std::vector<uint8_t> in = input(seed, me, count, dtype);
      std::vector<uint8_t> out(in.size() * size_t(n), 0xEF);
      std::string what = label("allGather", dtype, count);
      comm.allGather(in.data(), out.data(), count, dtype, what);
      bool ok = true;
      for (int r = 0; r < n; ++r) {
        std::vector<uint8_t> expected = input(seed, r, count, dtype);
        ok = ok && sameBytes(out.data() + size_t(r) * in.size(), expected.data(), expected.size());
      }
      c.check(ok, what + ": a shard is not its rank's");
      c.sameOnEveryRank(out, what);
    }
  }

  // Broadcast from every root.
  for (int root = 0; root < n; ++root) {
    for (DType dtype : {DType::F32, DType::I64}) {
      for (size_t count : {size_t(0), size_t(1), size_t(17), size_t(300001)}) {
        ++seed;
        std::vector<uint8_t> buf = input(seed, me, count, dtype);
        std::string what = label("broadcast", dtype, count) + " root " + std::to_string(root);
        comm.broadcast(buf.data(), count, dtype, root, what);
        c.check(buf == input(seed, root, count, dtype), what + ": not the root's data");
      }
    }
  }

  // Ring shift: every rank gets the previous rank's buffer, any dtype, in place and not; N
  // shifts in a row bring every rank's buffer back (the passes of a ring attention).
  for (DType dtype : {DType::BF16, DType::F32, DType::I64, DType::U8}) {
    for (size_t count : {size_t(0), size_t(1), size_t(13), size_t(300007)}) {
      ++seed;
      std::vector<uint8_t> in = input(seed, me, count, dtype);
      std::vector<uint8_t> out(in.size(), 0xEF);
      std::string what = label("ringShift", dtype, count);
      comm.ringShift(in.data(), out.data(), count, dtype, what);
      c.check(out == input(seed, (me - 1 + n) % n, count, dtype),
              what + ": not the previous rank's buffer");
      std::vector<uint8_t> travelling = in;
      for (int k = 0; k < n; ++k)
        comm.ringShift(travelling.data(), travelling.data(), count, dtype,
                       what + " in place, pass " + std::to_string(k));
      c.check(travelling == in, what + ": " + std::to_string(n) +
                                    " shifts in place did not bring this rank's buffer back");
    }
  }

  // Rings of 2 consecutive ranks (a data x ring grid, docs/ring-attention.md): each rank
  // gets its ring partner's buffer, and the rings do not mix.
  if (n % 2 == 0) {
    ++seed;
    std::vector<uint8_t> in = input(seed, me, 1001, DType::F32);
    std::vector<uint8_t> out(in.size(), 0xEF);
    comm.ringShift(in.data(), out.data(), 1001, DType::F32, "rings of 2", 2);
    c.check(out == input(seed, me % 2 == 0 ? me + 1 : me - 1, 1001, DType::F32),
            "ringShift in rings of 2: not the ring partner's buffer");
  }
  // A ring size that does not divide the ranks is refused before anything is sent.
  {
    bool refused = false;
    try {
      uint8_t byte = 0;
      comm.ringShift(&byte, &byte, 1, DType::U8, "bad ring", n + 1);
    } catch (const Error &e) {
      refused = std::string(e.what()).find("does not divide") != std::string::npos;
    }
    c.check(refused, "ringShift with a ring of n + 1 ranks was not refused");
  }

  // Barriers, many in a row (sequence numbers advance; nothing crosses over).
  for (int i = 0; i < 50; ++i)
    comm.barrier("barrier " + std::to_string(i));

  // Determinism: the same all-reduce five times gives the same bits.
  {
    size_t count = 1000003;
    std::vector<uint8_t> in = input(999, me, count, DType::F32);
    std::vector<uint8_t> first(in.size()), again(in.size());
    auto t = Clock::now();
    comm.allReduceSum(in.data(), first.data(), count, DType::F32, "repeat 0");
    double once = secondsSince(t);
    for (int k = 1; k < 5; ++k) {
      comm.allReduceSum(in.data(), again.data(), count, DType::F32, "repeat " + std::to_string(k));
      c.check(again == first, "allReduceSum repeat " + std::to_string(k) + " differs");
    }
    c.sameOnEveryRank(first, "repeat");
    if (me == 0)
      std::printf("allReduceSum of %zu f32 (%.1f MB) on %d ranks: %.1f ms\n", count,
                  double(count) * 4e-6, n, once * 1e3);
  }

  // Bad arguments: an error on every rank before anything moves; the communicator stays usable.
  {
    float x[4] = {1, 2, 3, 4};
    auto expectError = [&](const std::function<void()> &call, const std::string &needle,
                           const std::string &what) {
      try {
        call();
        c.check(false, what + ": no error");
      } catch (const Error &e) {
        c.check(std::string(e.what()).find(needle) != std::string::npos,
                what + ": the error '" + e.what() + "' does not say '" + needle + "'");
      }
    };
    expectError([&] { comm.broadcast(x, 4, DType::F32, n, "bad root"); },
                "root " + std::to_string(n) + " is not a rank", "broadcast root n");
    expectError([&] { comm.broadcast(x, 4, DType::F32, -1, "bad root"); }, "root -1 is not a rank",
                "broadcast root -1");
    expectError([&] { comm.allReduceSum(x, x, 4, DType::I32, "int sum"); },
                "sums are f32, bf16 or f16", "allReduceSum of i32");
    expectError([&] { comm.allGather(nullptr, x, 1, DType::F32, "null"); }, "`send` is null",
                "allGather from null");
    expectError([&] { comm.reduceScatterSum(x, x, SIZE_MAX / 2, DType::F32, "huge"); }, "overflow",
                "reduceScatterSum count overflow");
    comm.barrier("after bad arguments");
    float one = 1.0f, total = 0;
    comm.allReduceSum(&one, &total, 1, DType::F32, "after bad arguments");
    c.check(total == float(n), "allReduceSum after bad arguments: " + std::to_string(total));
  }

  // The ranks on this host: mpirun here starts them all on one machine.
  c.check(comm.localSize() >= 1 && comm.localSize() <= n && comm.localRank() < comm.localSize(),
          "local rank " + std::to_string(comm.localRank()) + " of " +
              std::to_string(comm.localSize()) + " ranks on this host, of " + std::to_string(n));

  // Every rank learns how many checks failed anywhere, so that all exit alike.
  float failures = float(c.failures()), allFailures = 0;
  comm.allReduceSum(&failures, &allFailures, 1, DType::F32, "failure count");
  if (me == 0) {
    std::printf("DIGEST %016" PRIx64 "\n", c.digest());
    std::printf("%d ranks (%s, local rank %d of %d, deadline %g s): %d checks per rank, %d "
                "failed on all ranks, %.2f s\n",
                n, comm.backendName(), comm.localRank(), comm.localSize(), comm.timeoutSeconds(),
                c.checks(), int(allFailures), secondsSince(t0));
  }
  return allFailures == 0 ? 0 : 1;
}

int runSkip(Communicator &comm) {
  const int n = comm.size(), me = comm.rank(), victim = n - 1;
  std::vector<float> data(1000, 1.0f), out(1000);
  comm.allReduceSum(data.data(), out.data(), data.size(), DType::F32, "step 6");
  if (out[0] != float(n)) {
    std::fprintf(stderr, "rank %d: FAIL: warm-up all-reduce gave %g\n", me, out[0]);
    return 3;
  }
  auto t0 = Clock::now();
  if (me == victim) {
    // Skips step 7's all-reduce and goes on to the next collective, which the others never
    // reach: it times out too.
    try {
      comm.barrier("step 8 (rank " + std::to_string(me) + " skipped step 7)");
      std::fprintf(stderr, "rank %d: FAIL: the barrier after the skipped all-reduce returned\n",
                   me);
      return 3;
    } catch (const Error &e) {
      std::fprintf(stderr, "rank %d (the one that skipped) after %.2f s: %s\n", me,
                   secondsSince(t0), e.what());
      // mpirun ends the job at the first non-zero exit: the others report first.
      std::this_thread::sleep_for(std::chrono::seconds(2));
      return 1;
    }
  }
  try {
    comm.allReduceSum(data.data(), out.data(), data.size(), DType::F32, "step 7");
    std::fprintf(stderr, "rank %d: FAIL: the all-reduce returned without rank %d\n", me, victim);
    return 3;
  } catch (const Error &e) {
    double elapsed = secondsSince(t0);
    std::string msg = e.what();
    double deadline = comm.timeoutSeconds();
    std::vector<std::string> needles = {"rank " + std::to_string(me) + " of " + std::to_string(n),
                                        "allReduceSum of 4000 bytes", "[step 7]",
                                        "rank " + std::to_string(victim) + " did not arrive"};
    bool ok = elapsed >= deadline * 0.99 && elapsed <= deadline + 3.0;
    for (const std::string &needle : needles)
      if (msg.find(needle) == std::string::npos) {
        std::fprintf(stderr, "rank %d: FAIL: the error does not say '%s'\n", me, needle.c_str());
        ok = false;
      }
    // The communicator is failed now: every call throws at once.
    auto t1 = Clock::now();
    try {
      comm.barrier("after the failure");
      ok = false;
    } catch (const Error &later) {
      ok = ok && std::string(later.what()).find("failed earlier") != std::string::npos &&
           secondsSince(t1) < 0.5;
    }
    std::fprintf(stderr, "%s rank %d after %.2f s (deadline %g s): %s\n",
                 ok ? "SKIP-DETECTED" : "FAIL: SKIP-MISREPORTED", me, elapsed, deadline,
                 msg.c_str());
    // mpirun ends the job at the first non-zero exit: every detecting rank reports first.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    return ok ? 1 : 3;
  }
}

int runKill(Communicator &comm) {
  const int n = comm.size(), me = comm.rank(), victim = n - 1;
  size_t count = size_t(4) << 20; // 16 MB of f32 per all-reduce
  std::vector<float> data(count, 0.5f), out(count);
  std::unique_ptr<std::thread> killer;
  auto t0 = Clock::now();
  for (int step = 0;; ++step) {
    if (me == victim && step == 2) {
      // Dies while the all-reduce of this step is in flight.
      killer = std::make_unique<std::thread>([me, t0] {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        std::fprintf(stderr, "rank %d: raising SIGKILL at %.2f s\n", me, secondsSince(t0));
        std::fflush(stderr);
        std::raise(SIGKILL);
      });
    }
    auto t = Clock::now();
    try {
      comm.allReduceSum(data.data(), out.data(), count, DType::F32, "step " + std::to_string(step));
    } catch (const Error &e) {
      // The error came at the deadline and its list of ranks names the dead one. Live ranks may
      // be named too, truthfully: a rank that finished the step before the victim died waits
      // in the next one for those still in this one, and a rank whose send to the dead one
      // never completes does not reach the all-reduce's second phase.
      std::string msg = e.what();
      double elapsed = secondsSince(t);
      std::smatch list;
      bool named = false;
      if (std::regex_search(msg, list, std::regex("within [0-9.]+ s: ranks? ([0-9, ]+) "))) {
        std::string ranks = list[1].str();
        std::regex number("[0-9]+");
        for (std::sregex_iterator it(ranks.begin(), ranks.end(), number), end; it != end; ++it)
          named = named || std::stoi(it->str()) == victim;
      }
      bool ok = named && elapsed <= comm.timeoutSeconds() + 3.0;
      std::fprintf(stderr, "%s rank %d after %.2f s in the collective: %s\n",
                   ok ? "KILL-DETECTED" : "FAIL: KILL-MISREPORTED", me, elapsed, msg.c_str());
      return ok ? 1 : 3;
    }
    if (step > 100000) {
      std::fprintf(stderr, "rank %d: FAIL: %d steps without noticing the kill\n", me, step);
      return 3;
    }
  }
}

} // namespace

int main(int argc, char **argv) {
  std::string mode = argc == 2 ? argv[1] : "";
  if (mode != "collectives" && mode != "skip" && mode != "kill" && mode != "late") {
    std::fprintf(stderr, "usage: mpirun -np N bonsai-comm-tests collectives|skip|kill|late\n");
    return 2;
  }
  std::unique_ptr<Communicator> comm;
  auto t0 = Clock::now();
  try {
    if (mode == "late") {
      // The last rank starts 20 s late: the others' start-up must end at its deadline.
      LaunchInfo launch = detectLaunch();
      if (launch.size > 1 && launch.rank == launch.size - 1) {
        std::this_thread::sleep_for(std::chrono::seconds(20));
        std::fprintf(stderr, "rank %d: FAIL: woke up after 20 s, the job should have ended\n",
                     launch.rank);
        return 3;
      }
    }
    comm = makeCommunicator();
  } catch (const Error &e) {
    if (mode == "late") {
      std::fprintf(stderr, "LATE-DETECTED after %.2f s: %s\n", secondsSince(t0), e.what());
      std::this_thread::sleep_for(std::chrono::seconds(1));
      return 1;
    }
    std::fprintf(stderr, "bonsai-comm-tests: %s\n", e.what());
    return 2;
  }
  if (mode == "late") {
    std::fprintf(stderr, "rank %d: FAIL: the start-up completed without the last rank\n",
                 comm->rank());
    return 3;
  }
  if (!mpiAvailable()) {
    std::fprintf(stderr, "bonsai-comm-tests: FAIL: linked without the MPI communicator\n");
    return 2;
  }
  if (comm->size() < 2) {
    std::fprintf(stderr, "bonsai-comm-tests: run under mpirun with 2 ranks or more (got %d)\n",
                 comm->size());
    return 2;
  }
  try {
    if (mode == "collectives")
      return runCollectives(*comm);
    if (mode == "skip")
      return runSkip(*comm);
    return runKill(*comm);
  } catch (const Error &e) {
    std::fprintf(stderr, "rank %d: FAIL: unexpected error: %s\n", comm->rank(), e.what());
    return 3;
  }
}
