//===- MetricsTest.cpp - Step lines, JSON metrics and terminal progress ---===//
//
// The plain step line scripts parse, the JSON object each metrics line holds (null for what a
// plan does not report or what is not finite), durations and the terminal progress line, and
// the metrics file truncated for a new run and appended to for a resumed one.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Metrics.h"

#include "TestPlans.h"
#include "bonsai/runtime/Json.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

namespace bonsai::rt {
namespace {

StepReport sample() {
  StepReport r;
  r.step = 12;
  r.lastStep = 100;
  r.loss = 2.7796740531921387f;
  r.gradNorm = 0.53125f;
  r.lr = 1e-3f;
  r.microBatches = 2;
  r.tokens = 16;
  r.stepSeconds = 0.5;
  r.elapsedSeconds = 6.0;
  r.plannedBytes = 4096;
  r.measuredBytes = 4000;
  return r;
}

TEST(MetricsTest, StepLine) {
  StepReport r = sample();
  EXPECT_EQ(formatStepLine(r), "step 12 loss 2.77967405 grad_norm 0.53125 lr 0.001");
  r.gradNorm.reset();
  r.lr.reset();
  EXPECT_EQ(formatStepLine(r), "step 12 loss 2.77967405");
}

TEST(MetricsTest, JsonLine) {
  StepReport r = sample();
  JsonValue v = parseJson(formatMetricsJson(r), "metrics");
  EXPECT_EQ(v.find("step")->unsignedValue(), 12u);
  EXPECT_EQ(float(v.find("loss")->numberValue()), r.loss);
  EXPECT_EQ(float(v.find("grad_norm")->numberValue()), 0.53125f);
  EXPECT_EQ(float(v.find("lr")->numberValue()), 1e-3f);
  EXPECT_DOUBLE_EQ(v.find("tokens_per_s")->numberValue(), 32.0);
  EXPECT_EQ(v.find("memory_planned_bytes")->unsignedValue(), 4096u);
  EXPECT_EQ(v.find("memory_measured_bytes")->unsignedValue(), 4000u);
  EXPECT_EQ(v.find("micro_batches")->unsignedValue(), 2u);
  EXPECT_EQ(v.find("tokens")->unsignedValue(), 16u);
  EXPECT_DOUBLE_EQ(v.find("elapsed_s")->numberValue(), 6.0);
  r.loss = std::nanf("");
  r.gradNorm.reset();
  v = parseJson(formatMetricsJson(r), "metrics");
  EXPECT_TRUE(v.find("loss")->isNull());
  EXPECT_TRUE(v.find("grad_norm")->isNull());
}

TEST(MetricsTest, ProgressAndDuration) {
  EXPECT_EQ(formatDuration(0), "0:00");
  EXPECT_EQ(formatDuration(65.4), "1:05");
  EXPECT_EQ(formatDuration(3725), "1:02:05");
  EXPECT_EQ(formatDuration(std::nan("")), "?");
  // 6 s for steps 1..12 of 100: 0.5 s a step, 88 left.
  EXPECT_EQ(formatProgress(sample(), 1),
            "step 12/100 | loss 2.7797 | grad_norm 0.531 | lr 0.001 | 32 tok/s | ETA 0:44");
}

TEST(MetricsTest, FileTruncatesOrAppends) {
  std::string path = test::tempPath("metrics.jsonl");
  {
    MetricsFile f(path, false);
    f.write(sample());
    f.write(sample());
  }
  {
    MetricsFile f(path, false);
    f.write(sample());
  }
  {
    MetricsFile f(path, true);
    f.write(sample());
  }
  std::ifstream in(path);
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines)
    EXPECT_NO_THROW(parseJson(line, "metrics"));
  EXPECT_EQ(lines, 2);
  std::remove(path.c_str());
  EXPECT_THROW(MetricsFile(test::tempPath("no/such/dir/m.jsonl"), false), Error);
}

} // namespace
} // namespace bonsai::rt
