//===- UpdatePlacementTest.cpp - Unit tests of the host/streamed split ----===//
//
// One update worked out by hand under each policy, an update without a host implementation,
// and a Llama-2-7B-shaped backward pass where the split beats both single placements.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/UpdatePlacement.h"

#include <gtest/gtest.h>

#include <algorithm>

using namespace mlir::bonsai;

namespace {

/// 10 parameters, 30 bytes of state, 20 bytes each way when on the host, ready at 5 s; a link
/// of 10 bytes/s and a host of 10 parameters/s.
UpdateWork smallUpdate() {
  UpdateWork w;
  w.readySeconds = 5;
  w.params = 10;
  w.streamedBytes = 30;
  w.toHostBytes = 20;
  w.toDeviceBytes = 20;
  return w;
}
const OffloadRates kSlow{10, 10};

TEST(UpdatePlacement, OneUpdateOnTheHost) {
  // Gradient out 5..7, update 7..8, parameter back 8..10.
  UpdatePlacement p = placeUpdates({smallUpdate()}, 5, kSlow, UpdatePolicy::Host);
  EXPECT_EQ(p.onHost, std::vector<bool>{true});
  EXPECT_DOUBLE_EQ(p.toHostSeconds, 7);
  EXPECT_DOUBLE_EQ(p.hostSeconds, 8);
  EXPECT_DOUBLE_EQ(p.toDeviceSeconds, 10);
  EXPECT_DOUBLE_EQ(p.computeSeconds, 5);
  EXPECT_DOUBLE_EQ(p.stepSeconds(), 10);
  EXPECT_EQ(p.toHostBytes, 20);
  EXPECT_EQ(p.toDeviceBytes, 20);
}

TEST(UpdatePlacement, OneUpdateStreamed) {
  // State in 0..3 (ahead of the gradient), update at 5, state out 5..8: no wait.
  UpdatePlacement p = placeUpdates({smallUpdate()}, 5, kSlow, UpdatePolicy::Streamed);
  EXPECT_EQ(p.onHost, std::vector<bool>{false});
  EXPECT_DOUBLE_EQ(p.toDeviceSeconds, 3);
  EXPECT_DOUBLE_EQ(p.toHostSeconds, 8);
  EXPECT_DOUBLE_EQ(p.stallSeconds, 0);
  EXPECT_DOUBLE_EQ(p.stepSeconds(), 8);
  EXPECT_EQ(p.toHostBytes, 30);
  EXPECT_EQ(p.toDeviceBytes, 30);
  // The split takes the sooner of the two.
  EXPECT_EQ(placeUpdates({smallUpdate()}, 5, kSlow, UpdatePolicy::Split).onHost,
            std::vector<bool>{false});
}

TEST(UpdatePlacement, StreamedStateComesInFromItsPhaseStart) {
  // The same update whose phase starts at 4 s: its state comes in 4..7, the compute stream
  // waits from 5 to 7, and the state goes out 7..10.
  UpdateWork w = smallUpdate();
  w.earliestCopySeconds = 4;
  UpdatePlacement p = placeUpdates({w}, 5, kSlow, UpdatePolicy::Streamed);
  EXPECT_DOUBLE_EQ(p.toDeviceSeconds, 7);
  EXPECT_DOUBLE_EQ(p.stallSeconds, 2);
  EXPECT_DOUBLE_EQ(p.toHostSeconds, 10);
  EXPECT_DOUBLE_EQ(p.stepSeconds(), 10);
}

TEST(UpdatePlacement, AGivenPlacementSimulatesAsChosen) {
  // simulateUpdates, given what placeUpdates chose, predicts what placeUpdates did.
  std::vector<UpdateWork> updates(4, smallUpdate());
  for (size_t i = 0; i < updates.size(); ++i)
    updates[i].readySeconds = 5 + 2.0 * double(i);
  for (UpdatePolicy policy : {UpdatePolicy::Streamed, UpdatePolicy::Host, UpdatePolicy::Split}) {
    UpdatePlacement chosen = placeUpdates(updates, 12, kSlow, policy);
    UpdatePlacement given = simulateUpdates(updates, 12, kSlow, chosen.onHost);
    EXPECT_EQ(given.onHost, chosen.onHost);
    EXPECT_DOUBLE_EQ(given.stepSeconds(), chosen.stepSeconds());
    EXPECT_DOUBLE_EQ(given.stallSeconds, chosen.stallSeconds);
    EXPECT_EQ(given.toHostBytes, chosen.toHostBytes);
  }
  // An update the placement does not name is streamed.
  EXPECT_EQ(simulateUpdates(updates, 12, kSlow, {true}).onHost,
            (std::vector<bool>{true, false, false, false}));
}

TEST(UpdatePlacement, StreamedStateLateMakesTheComputeWait) {
  // Ready at 1 s, its state arrives at 3 s: the compute stream waits 2 s, and its 1 s of
  // device work moves everything after it.
  UpdateWork w = smallUpdate();
  w.readySeconds = 1;
  w.deviceSeconds = 1;
  UpdatePlacement p = placeUpdates({w}, 5, kSlow, UpdatePolicy::Streamed);
  EXPECT_DOUBLE_EQ(p.stallSeconds, 2);
  EXPECT_DOUBLE_EQ(p.computeSeconds, 8);
  EXPECT_DOUBLE_EQ(p.toHostSeconds, 7);
}

TEST(UpdatePlacement, TheHostDoesNotWaitForItsCopiesBack) {
  // Two updates ready at 5: gradients out 5..7 and 7..9, steps 7..8 and 9..10, copies back
  // 8..10 and 10..12. The second step starts when its gradient is in, not after the first
  // copy back.
  UpdatePlacement p = placeUpdates({smallUpdate(), smallUpdate()}, 5, kSlow, UpdatePolicy::Host);
  EXPECT_DOUBLE_EQ(p.hostSeconds, 10);
  EXPECT_DOUBLE_EQ(p.toDeviceSeconds, 12);
  EXPECT_DOUBLE_EQ(p.stepSeconds(), 12);
}

TEST(UpdatePlacement, AnUpdateWithoutAHostImplementationIsStreamed) {
  UpdateWork w = smallUpdate();
  w.canRunOnHost = false;
  w.params = 1000; // would be far sooner on the host if it could run there
  for (UpdatePolicy policy : {UpdatePolicy::Host, UpdatePolicy::Split})
    EXPECT_EQ(placeUpdates({w}, 5, kSlow, policy).onHost, std::vector<bool>{false});
}

/// Llama-2-7B's updates in the backward pass (update_in_backward): the LM head, 32 layers of
/// four 4096x4096 and three 4096x11008 matrices at even intervals over 1 s after a 0.5 s
/// forward, the embedding last; fp32 moments and masters streamed (12 bytes a parameter each
/// way) or bf16 gradient and parameter over the link (2 bytes each way); H200-like rates.
std::vector<UpdateWork> llama7bBackward() {
  std::vector<UpdateWork> updates;
  double clock = 0.5;
  auto add = [&](int64_t params) {
    UpdateWork w;
    w.readySeconds = clock;
    w.params = params;
    w.streamedBytes = 12 * params;
    w.toHostBytes = 2 * params;
    w.toDeviceBytes = 2 * params;
    w.deviceSeconds = 28.0 * params / 3.2e12;
    updates.push_back(w);
  };
  const int64_t vocab = 32000 * 4096, attention = 4096 * 4096, mlp = 4096 * 11008;
  add(vocab);
  for (int layer = 0; layer < 32; ++layer)
    for (int64_t params : {attention, attention, attention, attention, mlp, mlp, mlp}) {
      clock += 1.0 / 32 / 7;
      add(params);
    }
  add(vocab);
  return updates;
}

TEST(UpdatePlacement, TheSplitBeatsBothPlacementsOfA7bStep) {
  std::vector<UpdateWork> updates = llama7bBackward();
  OffloadRates rates{55.7e9, 4.5e9};
  UpdatePlacement host = placeUpdates(updates, 1.5, rates, UpdatePolicy::Host);
  UpdatePlacement streamed = placeUpdates(updates, 1.5, rates, UpdatePolicy::Streamed);
  UpdatePlacement split = placeUpdates(updates, 1.5, rates, UpdatePolicy::Split);
  // Alone, the host needs 6.7 G parameters / 4.5 G/s = 1.5 s after the first gradient, the
  // link 81 GB / 55.7 GB/s = 1.45 s with the compute waiting for it.
  EXPECT_GT(host.stepSeconds(), 2.0);
  EXPECT_GT(streamed.stepSeconds(), 2.0);
  EXPECT_GT(streamed.stallSeconds, 0.4);
  EXPECT_EQ(host.stallSeconds, 0);
  // Together they finish within 10% of the compute.
  EXPECT_LT(split.stepSeconds(), 1.65);
  EXPECT_LT(split.stepSeconds(), 0.85 * std::min(host.stepSeconds(), streamed.stepSeconds()));
  size_t onHost = std::count(split.onHost.begin(), split.onHost.end(), true);
  EXPECT_GT(onHost, 0u);
  EXPECT_LT(onHost, updates.size());
}

} // namespace
