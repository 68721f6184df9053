//===- RingMpiTest.cpp - Ring attention across MPI ranks ------------------===//
//
// Run under `mpirun -np N` (N = 2, 4) by ctest: every rank builds the same whole q, k, v (and
// dO, and segment ids for packed rows) from a fixed seed, takes its zigzag share of the
// sequence, and runs the CPU backend's ring attention (runtime/src/RingAttention.cpp) forward
// and backward, with the log-sum-exp (flash_attention) and without it (attention and
// attention_grad, which recompute it around the ring). Its rows of o, lse, dq, dk and dv must
// equal those of cpu::flashAttention and cpu::flashAttentionGrad on the whole sequence within
// 1e-5 relative: causal and full masks, MHA and GQA, one segment and packed rows. With 4
// ranks each case also runs on two rings of 2 (a data x ring grid), each on its own data.
// Exits 0 when every case matched on every rank.
//
//===----------------------------------------------------------------------===//

#include "RingAttention.h"

#include "bonsai/runtime/Communicator.h"
#include "bonsai/runtime/CpuKernels.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

using namespace bonsai::rt;

namespace {

int failures = 0;

struct Case {
  const char *name;
  int64_t batch, seq, heads, kvHeads, headDim;
  bool causal, packed;
};

TensorView view(std::vector<float> &data, std::vector<int64_t> shape) {
  return TensorView{data.data(), DType::F32, std::move(shape)};
}

/// Rows `index` of the [batch, seq, ...] `whole`, each row `width` floats wide.
std::vector<float> rowsOf(const std::vector<float> &whole, int64_t batch, int64_t seq,
                          int64_t width, const std::vector<int64_t> &index) {
  std::vector<float> out;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i : index)
      out.insert(out.end(), whole.begin() + (b * seq + i) * width,
                 whole.begin() + (b * seq + i + 1) * width);
  return out;
}

/// max |got - want| <= 1e-5 max |want| (and an absolute 1e-6 for all-zero references).
void compare(int rank, const Case &c, const char *what, const std::vector<float> &got,
             const std::vector<float> &want) {
  double maxWant = 0, maxDiff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i]) && got[i] == want[i])
      continue;
    maxWant = std::max(maxWant, std::fabs(double(want[i])));
    maxDiff = std::max(maxDiff, std::fabs(double(got[i]) - double(want[i])));
  }
  if (got.size() != want.size() || !(maxDiff <= std::max(1e-5 * maxWant, 1e-6))) {
    std::printf("FAIL rank %d: %s %s: max difference %g, max reference %g\n", rank, c.name, what,
                maxDiff, maxWant);
    ++failures;
  }
}

/// Runs `c` on rings of `ranks` consecutive ranks of `comm`; each ring has its own data.
void runCase(Communicator &comm, const Case &c, int ranks) {
  const int rank = comm.rank() % ranks, ring = comm.rank() / ranks;
  const int64_t B = c.batch, S = c.seq, H = c.heads, KV = c.kvHeads, D = c.headDim;
  const int64_t local = S / ranks;
  std::mt19937 gen(1234 + ring);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float &x : v)
      x = normal(gen);
    return v;
  };
  std::vector<float> q = fill(B * S * H * D), k = fill(B * S * KV * D), v = fill(B * S * KV * D),
                     dout = fill(B * S * H * D);
  // Packed rows: three documents per row, of uneven lengths.
  std::vector<int64_t> segments;
  if (c.packed)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < S; ++t)
        segments.push_back(t < S / 3 + b ? 0 : t < (2 * S) / 3 ? 1 : 2);
  TensorView segWhole{segments.data(), DType::I64, {B, S}};

  // The whole sequence, unpartitioned.
  std::vector<float> o(q.size()), lse(size_t(B * H * S)), dq(q.size()), dk(k.size()), dv(v.size());
  cpu::flashAttention(view(q, {B, S, H, D}), view(k, {B, S, KV, D}), view(v, {B, S, KV, D}),
                      c.causal, 0.25, view(o, {B, S, H, D}), view(lse, {B, H, S}),
                      c.packed ? &segWhole : nullptr);
  cpu::flashAttentionGrad(view(dout, {B, S, H, D}), view(q, {B, S, H, D}), view(k, {B, S, KV, D}),
                          view(v, {B, S, KV, D}), view(o, {B, S, H, D}), view(lse, {B, H, S}),
                          c.causal, 0.25, view(dq, {B, S, H, D}), view(dk, {B, S, KV, D}),
                          view(dv, {B, S, KV, D}), c.packed ? &segWhole : nullptr);

  // This rank's share.
  std::vector<int64_t> index = ringTokenIndices(local, ranks, rank);
  std::vector<float> qr = rowsOf(q, B, S, H * D, index), kr = rowsOf(k, B, S, KV * D, index),
                     vr = rowsOf(v, B, S, KV * D, index), dor = rowsOf(dout, B, S, H * D, index);
  std::vector<int64_t> segr;
  for (int64_t b = 0; b < B && c.packed; ++b)
    for (int64_t i : index)
      segr.push_back(segments[size_t(b * S + i)]);
  TensorView segShare{segr.data(), DType::I64, {B, local}};
  const TensorView *seg = c.packed ? &segShare : nullptr;
  AttentionAttrs a{c.causal, 0.25, uint32_t(ranks)};

  std::vector<float> or_(qr.size()), lser(size_t(B * H * local)), dqr(qr.size()), dkr(kr.size()),
      dvr(vr.size());
  TensorView lseView = view(lser, {B, H, local});
  cpuRingAttention(comm, a, view(qr, {B, local, H, D}), view(kr, {B, local, KV, D}),
                   view(vr, {B, local, KV, D}), seg, view(or_, {B, local, H, D}), &lseView, c.name);
  compare(rank, c, "o", or_, rowsOf(o, B, S, H * D, index));
  std::vector<float> lseWant;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i : index)
        lseWant.push_back(lse[size_t((b * H + h) * S + i)]);
  compare(rank, c, "lse", lser, lseWant);

  cpuRingAttentionGrad(comm, a, view(dor, {B, local, H, D}), view(qr, {B, local, H, D}),
                       view(kr, {B, local, KV, D}), view(vr, {B, local, KV, D}),
                       view(or_, {B, local, H, D}), &lseView, seg, view(dqr, {B, local, H, D}),
                       view(dkr, {B, local, KV, D}), view(dvr, {B, local, KV, D}), c.name);
  compare(rank, c, "dq", dqr, rowsOf(dq, B, S, H * D, index));
  compare(rank, c, "dk", dkr, rowsOf(dk, B, S, KV * D, index));
  compare(rank, c, "dv", dvr, rowsOf(dv, B, S, KV * D, index));

  // attention and attention_grad: no lse kept, the grad recomputes it around the ring.
  std::vector<float> o2(qr.size()), dq2(qr.size()), dk2(kr.size()), dv2(vr.size());
  cpuRingAttention(comm, a, view(qr, {B, local, H, D}), view(kr, {B, local, KV, D}),
                   view(vr, {B, local, KV, D}), seg, view(o2, {B, local, H, D}), nullptr, c.name);
  compare(rank, c, "o (attention)", o2, or_);
  cpuRingAttentionGrad(comm, a, view(dor, {B, local, H, D}), view(qr, {B, local, H, D}),
                       view(kr, {B, local, KV, D}), view(vr, {B, local, KV, D}),
                       view(o2, {B, local, H, D}), nullptr, seg, view(dq2, {B, local, H, D}),
                       view(dk2, {B, local, KV, D}), view(dv2, {B, local, KV, D}), c.name);
  compare(rank, c, "dq (attention_grad)", dq2, rowsOf(dq, B, S, H * D, index));
  compare(rank, c, "dk (attention_grad)", dk2, rowsOf(dk, B, S, KV * D, index));
  compare(rank, c, "dv (attention_grad)", dv2, rowsOf(dv, B, S, KV * D, index));
}

} // namespace

int main() {
  std::unique_ptr<Communicator> comm = makeCommunicator();
  const int ranks = comm->size();
  // Every sequence splits into 2N chunks for N = 2 and 4.
  const Case cases[] = {
      {"causal-gqa", 2, 48, 4, 2, 8, true, false},
      {"causal-mha", 1, 32, 2, 2, 16, true, false},
      {"full-gqa", 2, 16, 4, 1, 8, false, false},
      {"full-mha", 1, 24, 3, 3, 4, false, false},
      {"causal-gqa-packed", 2, 48, 4, 2, 8, true, true},
      {"full-mha-packed", 1, 40, 2, 2, 8, false, true},
  };
  for (const Case &c : cases) {
    if (c.seq % (2 * ranks) != 0) {
      std::printf("FAIL: case %s's sequence %lld does not split over %d ranks\n", c.name,
                  (long long)c.seq, ranks);
      ++failures;
      continue;
    }
    runCase(*comm, c, ranks);
    // A data x ring grid: rings of 2 consecutive ranks, each on data of its own, must not
    // see each other's blocks.
    if (ranks == 4)
      runCase(*comm, c, 2);
  }
  std::printf("rank %d of %d: %s\n", comm->rank(), ranks, failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
