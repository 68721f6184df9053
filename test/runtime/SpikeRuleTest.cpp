//===- SpikeRuleTest.cpp - The spike rule's windows and bounds ------------===//
//
// SpikeRule (bonsai-run --spike-zscore): no bound until a window is full, then mean + Z·sd of
// the newest N values, non-finite values left out, windows restored from a checkpoint as they
// were. The training tests (TrainingTest.cpp) check that the executor skips on the bounds.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/SpikeRule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

using namespace bonsai::rt;

namespace {

const float kInf = std::numeric_limits<float>::infinity();

TEST(SpikeRuleTest, NoBoundUntilTheWindowIsFull) {
  SpikeRule rule(3.0, 4);
  for (float loss : {2.0f, 3.0f, 4.0f}) {
    EXPECT_EQ(rule.limits().loss, kInf);
    rule.record(loss, 1.0f);
  }
  EXPECT_EQ(rule.limits().loss, kInf);
  rule.record(5.0f, 1.0f);
  // 2, 3, 4, 5: mean 3.5, population sd sqrt(1.25).
  EXPECT_FLOAT_EQ(rule.limits().loss, float(3.5 + 3.0 * std::sqrt(1.25)));
  // Four equal norms: the bound is the value itself (a larger one is a spike).
  EXPECT_FLOAT_EQ(rule.limits().gradNorm, 1.0f);
}

TEST(SpikeRuleTest, TheWindowSlidesAndLeavesNonFiniteValuesOut) {
  SpikeRule rule(2.0, 3);
  for (float v : {100.0f, 1.0f, 2.0f, 3.0f})
    rule.record(v, v);
  // The oldest value (100) is gone: 1, 2, 3.
  EXPECT_EQ(rule.losses(), (std::vector<float>{1.0f, 2.0f, 3.0f}));
  EXPECT_FLOAT_EQ(rule.limits().loss, float(2.0 + 2.0 * std::sqrt(2.0 / 3.0)));
  rule.record(std::numeric_limits<float>::quiet_NaN(), std::nullopt);
  rule.record(kInf, kInf);
  EXPECT_EQ(rule.losses(), (std::vector<float>{1.0f, 2.0f, 3.0f}));
  EXPECT_EQ(rule.gradNorms(), (std::vector<float>{1.0f, 2.0f, 3.0f}));
  // A plan without a gradient norm: the loss window alone fills.
  SpikeRule lossOnly(2.0, 2);
  lossOnly.record(1.0f, std::nullopt);
  lossOnly.record(2.0f, std::nullopt);
  EXPECT_FLOAT_EQ(lossOnly.limits().loss, 2.5f);
  EXPECT_EQ(lossOnly.limits().gradNorm, kInf);
}

TEST(SpikeRuleTest, RestoreKeepsTheNewestValues) {
  SpikeRule rule(3.0, 3);
  rule.restore({9.0f, 1.0f, 2.0f, 3.0f}, {4.0f});
  EXPECT_EQ(rule.losses(), (std::vector<float>{1.0f, 2.0f, 3.0f}));
  EXPECT_EQ(rule.gradNorms(), (std::vector<float>{4.0f}));
  EXPECT_EQ(rule.limits().gradNorm, kInf);
  SpikeRule same(3.0, 3);
  for (float v : {1.0f, 2.0f, 3.0f})
    same.record(v, std::nullopt);
  EXPECT_EQ(rule.limits().loss, same.limits().loss);
}

TEST(SpikeRuleTest, BadSettingsAreErrors) {
  EXPECT_THROW(SpikeRule(0.0, 10), Error);
  EXPECT_THROW(SpikeRule(-1.0, 10), Error);
  EXPECT_THROW(SpikeRule(std::numeric_limits<double>::infinity(), 10), Error);
  EXPECT_THROW(SpikeRule(3.0, 1), Error);
}

} // namespace
