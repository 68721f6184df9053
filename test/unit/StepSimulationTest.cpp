//===- StepSimulationTest.cpp - Unit tests of the scheduled-step simulation -===//
//
// Small schedules worked out by hand: the waits the bytes make (as the runtime's loader derives
// them), a wait that holds up an in-order copy stream, two streams sharing one direction of the
// link, the phases' joins and micro-batches, the update phase in order, and the host's memory
// shared between the host stream and the copies.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/StepSimulation.h"

#include <gtest/gtest.h>

using namespace mlir::bonsai;

namespace {

/// A launch on `stream` in `phase` taking `seconds`, reading and writing the given byte ranges
/// of arena 0.
SimLaunch launch(SimStream stream, double seconds, std::vector<std::pair<int64_t, int64_t>> reads,
                 std::vector<std::pair<int64_t, int64_t>> writes, unsigned phase = 1) {
  SimLaunch l;
  l.stream = stream;
  l.phase = phase;
  l.seconds = seconds;
  if (stream == SimStream::HostToDevice || stream == SimStream::HostResults)
    l.link = SimLink::ToDevice;
  if (stream == SimStream::DeviceToHost)
    l.link = SimLink::ToHost;
  for (auto [begin, end] : reads)
    l.accesses.push_back({0, begin, end, false});
  for (auto [begin, end] : writes)
    l.accesses.push_back({0, begin, end, true});
  return l;
}

TEST(StepSimulation, ComputeAloneIsTheSumOfItsKernels) {
  SimulatedStep step = simulateStep({launch(SimStream::Compute, 2, {}, {{0, 10}}, 0),
                                     launch(SimStream::Compute, 3, {{0, 10}}, {{10, 20}})},
                                    1);
  EXPECT_DOUBLE_EQ(step.stepSeconds, 5);
  EXPECT_DOUBLE_EQ(step.kernelSeconds, 5);
  EXPECT_DOUBLE_EQ(step.exposedSeconds, 0);
}

TEST(StepSimulation, ACopyOverlapsComputeItDoesNotShareBytesWith) {
  // The copy in (4 s) runs beside the first kernel (5 s); the kernel that reads it starts at 5.
  SimulatedStep step = simulateStep({launch(SimStream::HostToDevice, 4, {{100, 110}}, {{0, 10}}),
                                     launch(SimStream::Compute, 5, {{20, 30}}, {{30, 40}}),
                                     launch(SimStream::Compute, 1, {{0, 10}}, {{40, 50}})},
                                    1);
  EXPECT_DOUBLE_EQ(step.stepSeconds, 6);
  EXPECT_DOUBLE_EQ(step.kernelSeconds, 6);
  EXPECT_DOUBLE_EQ(step.toDeviceSeconds, 4);
}

TEST(StepSimulation, AKernelWaitsForTheCopyItReads) {
  SimulatedStep step = simulateStep({launch(SimStream::HostToDevice, 4, {{100, 110}}, {{0, 10}}),
                                     launch(SimStream::Compute, 1, {{20, 30}}, {{30, 40}}),
                                     launch(SimStream::Compute, 1, {{0, 10}}, {{40, 50}})},
                                    1);
  EXPECT_DOUBLE_EQ(step.stepSeconds, 5);
  EXPECT_DOUBLE_EQ(step.exposedSeconds, 3);
}

TEST(StepSimulation, AWriteAfterReadWaitHoldsUpTheCopyStreamBehindIt) {
  // The first copy lands where the 5 s kernel still reads (the memory plan reused the bytes):
  // it waits until 5, and the second copy, behind it on the in-order stream, until 7, though
  // its own bytes are free from the start.
  SimulatedStep step = simulateStep({launch(SimStream::Compute, 5, {{0, 10}}, {{30, 40}}),
                                     launch(SimStream::HostToDevice, 2, {{100, 110}}, {{0, 10}}),
                                     launch(SimStream::HostToDevice, 2, {{110, 120}}, {{50, 60}}),
                                     launch(SimStream::Compute, 1, {{50, 60}}, {{60, 70}})},
                                    1);
  EXPECT_DOUBLE_EQ(step.stepSeconds, 10);
  EXPECT_DOUBLE_EQ(step.exposedSeconds, 4);
}

TEST(StepSimulation, TwoStreamsShareOneDirectionOfTheLink) {
  // The copy stream's copy takes the direction 0..4; the host-results stream's copy, issued at
  // the same time, gets the direction once it is free: 4..7. A copy the other way runs beside.
  SimulatedStep step = simulateStep({launch(SimStream::HostToDevice, 4, {{100, 110}}, {{0, 10}}),
                                     launch(SimStream::HostResults, 3, {{110, 120}}, {{10, 20}}),
                                     launch(SimStream::DeviceToHost, 6, {{20, 30}}, {{120, 130}})},
                                    1);
  EXPECT_DOUBLE_EQ(step.stepSeconds, 7);
  EXPECT_DOUBLE_EQ(step.toDeviceSeconds, 7);
  EXPECT_DOUBLE_EQ(step.toHostSeconds, 6);
}

TEST(StepSimulation, ACopyFillsTheLinksIdleTimeBetweenEarlierCopies) {
  // Copy A waits for the 3 s kernel (it overwrites what the kernel reads): 3..5 on the link.
  // Copy B on the other stream the same way, ready at once: 0..3 in the gap, then 5..6.
  SimulatedStep step = simulateStep({launch(SimStream::Compute, 3, {{0, 10}}, {{30, 40}}),
                                     launch(SimStream::HostToDevice, 2, {{100, 110}}, {{0, 10}}),
                                     launch(SimStream::HostResults, 4, {{110, 120}}, {{50, 60}})},
                                    1);
  EXPECT_DOUBLE_EQ(step.stepSeconds, 6);
  EXPECT_DOUBLE_EQ(step.toDeviceSeconds, 6);
}

TEST(StepSimulation, PhasesJoinEveryStreamAndRunOncePerMicroBatch) {
  // The forward pass's copy out (3 s) outlasts its kernel (1 s): the backward pass starts at 3.
  std::vector<SimLaunch> launches = {
      launch(SimStream::Compute, 1, {}, {{0, 10}}, 0),
      launch(SimStream::DeviceToHost, 3, {{20, 30}}, {{100, 110}}, 0),
      launch(SimStream::Compute, 2, {{0, 10}}, {{30, 40}}, 1),
      launch(SimStream::Compute, 0.5, {{30, 40}}, {{40, 50}}, 2),
  };
  EXPECT_DOUBLE_EQ(simulateStep(launches, 1).stepSeconds, 5.5);
  // Two micro-batches: forward and backward twice, the update once.
  EXPECT_DOUBLE_EQ(simulateStep(launches, 2).stepSeconds, 10.5);
  EXPECT_DOUBLE_EQ(simulateStep(launches, 2).kernelSeconds, 6.5);
}

TEST(StepSimulation, TheUpdatePhaseInOrderOverlapsNothing) {
  std::vector<SimLaunch> launches = {
      launch(SimStream::HostToDevice, 2, {{100, 110}}, {{0, 10}}, 2),
      launch(SimStream::Compute, 3, {{20, 30}}, {{30, 40}}, 2),
  };
  EXPECT_DOUBLE_EQ(simulateStep(launches, 1).stepSeconds, 3);
  SimMachine inOrder;
  inOrder.updateInOrder = true;
  EXPECT_DOUBLE_EQ(simulateStep(launches, 1, inOrder).stepSeconds, 5);
}

TEST(StepSimulation, TheHostAndTheCopiesShareTheHostsMemory) {
  // A host update (4 s) beside a copy to the device (4 s): alone, both end at 4. Each at half
  // its rate while the other runs: the simulation settles where each is slowed for the part
  // it overlaps the other, which is longer than 4 and at most 8.
  std::vector<SimLaunch> launches = {
      launch(SimStream::Host, 4, {{100, 110}}, {{110, 120}}),
      launch(SimStream::HostToDevice, 4, {{200, 210}}, {{0, 10}}),
  };
  EXPECT_DOUBLE_EQ(simulateStep(launches, 1).stepSeconds, 4);
  SimMachine shared;
  shared.toDeviceUnderHost = 0.5;
  shared.hostUnderCopies = 0.5;
  SimulatedStep step = simulateStep(launches, 1, shared);
  EXPECT_GT(step.stepSeconds, 5);
  EXPECT_LE(step.stepSeconds, 8);
  EXPECT_GT(step.hostSeconds, 4);
  // A copy to the host is not slowed when its share is 1.
  shared.toHostUnderHost = 1;
  launches[1] = launch(SimStream::DeviceToHost, 4, {{20, 30}}, {{200, 210}});
  EXPECT_DOUBLE_EQ(simulateStep(launches, 1, shared).toHostSeconds, 4);
}

} // namespace
