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
#include <limits>
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
  EXPECT_EQ(v.find("offload"), nullptr); // a plan without pinned host memory
  r.loss = std::nanf("");
  r.gradNorm.reset();
  v = parseJson(formatMetricsJson(r), "metrics");
  EXPECT_TRUE(v.find("loss")->isNull());
  EXPECT_TRUE(v.find("grad_norm")->isNull());
  // Offloaded plans (docs/offload.md, "Telemetry"): the bytes each way, the copies' time and
  // rate each way, the exposed time and the host steps' time.
  OffloadTimes times;
  times.toDeviceBytes = 500992;
  times.toDeviceSeconds = 0.5;
  times.exposedSeconds = 0.125;
  times.hostStepSeconds = 0.25;
  r.offload = OffloadStats{500992, 501328, times};
  v = parseJson(formatMetricsJson(r), "metrics");
  const JsonValue *offload = v.find("offload");
  ASSERT_NE(offload, nullptr);
  EXPECT_EQ(offload->find("pcie_h2d_bytes")->unsignedValue(), 500992u);
  EXPECT_EQ(offload->find("pcie_d2h_bytes")->unsignedValue(), 501328u);
  EXPECT_DOUBLE_EQ(offload->find("h2d_s")->numberValue(), 0.5);
  EXPECT_DOUBLE_EQ(offload->find("d2h_s")->numberValue(), 0.0);
  EXPECT_DOUBLE_EQ(offload->find("h2d_gb_per_s")->numberValue(), 0.0); // 1 MB/s, to 2 digits
  EXPECT_TRUE(offload->find("d2h_gb_per_s")->isNull()) << "nothing timed that way";
  EXPECT_DOUBLE_EQ(offload->find("exposed_s")->numberValue(), 0.125);
  EXPECT_DOUBLE_EQ(offload->find("host_step_s")->numberValue(), 0.25);
  r.offload->times.toDeviceBytes = uint64_t(25) << 30;
  v = parseJson(formatMetricsJson(r), "metrics");
  EXPECT_DOUBLE_EQ(v.find("offload")->find("h2d_gb_per_s")->numberValue(), 53.69);
  // Not timed (bonsai-run without --offload-timing): the bytes and host steps, no times or rates.
  r.offload->times.timed = false;
  v = parseJson(formatMetricsJson(r), "metrics");
  offload = v.find("offload");
  EXPECT_EQ(offload->find("pcie_h2d_bytes")->unsignedValue(), 500992u);
  for (const char *key : {"h2d_s", "d2h_s", "h2d_gb_per_s", "d2h_gb_per_s", "exposed_s"})
    EXPECT_TRUE(offload->find(key)->isNull()) << key;
  EXPECT_DOUBLE_EQ(offload->find("host_step_s")->numberValue(), 0.25);
}

// The link warning (docs/offload.md, "Telemetry"): below half the target's rate, either way,
// once enough bytes moved for the rate to mean something; never without a target rate.
TEST(MetricsTest, LinkWarning) {
  OffloadTimes t;
  t.toDeviceBytes = uint64_t(1) << 30;
  t.toDeviceSeconds = double(uint64_t(1) << 30) / 40e9; // 40 GB/s
  t.toHostBytes = uint64_t(1) << 30;
  t.toHostSeconds = double(uint64_t(1) << 30) / 33e9;
  EXPECT_EQ(formatLinkWarning(t, 64e9, 3), "");
  EXPECT_EQ(formatLinkWarning(t, 0, 3), "") << "no target rate, no warning";
  OffloadTimes untimed = t;
  untimed.timed = false;
  untimed.toHostSeconds = 10;
  EXPECT_EQ(formatLinkWarning(untimed, 64e9, 3), "") << "no timing, no warning";
  t.toHostSeconds = double(uint64_t(1) << 30) / 6.7e9; // pageable memory's rate
  EXPECT_EQ(formatLinkWarning(t, 64e9, 3),
            "warning: step 3: copies to the host ran at 6.7 GB/s, below half of the target's "
            "64.0 GB/s each way (pageable memory, or another process on the bus?)");
  t.toHostBytes = uint64_t(32) << 20; // too few bytes to judge the link by
  EXPECT_EQ(formatLinkWarning(t, 64e9, 3), "");
  t.toDeviceSeconds = double(uint64_t(1) << 30) / 20e9;
  EXPECT_NE(formatLinkWarning(t, 64e9, 7).find("step 7: copies to the device ran at 20.0 GB/s"),
            std::string::npos);
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

// Skipped non-finite steps (docs/training.md, "Non-finite steps"): counted on the step and
// progress lines once there is one, and on every metrics line.
TEST(MetricsTest, SkippedSteps) {
  StepReport r = sample();
  EXPECT_EQ(parseJson(formatMetricsJson(r), "metrics").find("skipped_steps")->unsignedValue(),
            0u);
  r.skippedSteps = 2;
  EXPECT_EQ(formatStepLine(r), "step 12 loss 2.77967405 grad_norm 0.53125 lr 0.001 skipped 2");
  EXPECT_EQ(formatProgress(r, 1), "step 12/100 | loss 2.7797 | grad_norm 0.531 | lr 0.001 | "
                                  "skipped 2 | 32 tok/s | ETA 0:44");
  EXPECT_EQ(parseJson(formatMetricsJson(r), "metrics").find("skipped_steps")->unsignedValue(),
            2u);
}

TEST(MetricsTest, ValLossOnEvaluationSteps) {
  StepReport r = sample();
  r.valLoss = 2.9012345790863037f;
  EXPECT_EQ(formatStepLine(r),
            "step 12 loss 2.77967405 grad_norm 0.53125 lr 0.001 val_loss 2.90123463");
  EXPECT_EQ(formatProgress(r, 1), "step 12/100 | loss 2.7797 | grad_norm 0.531 | lr 0.001 | "
                                  "val_loss 2.9012 | 32 tok/s | ETA 0:44");
  JsonValue v = parseJson(formatMetricsJson(r), "metrics");
  EXPECT_EQ(float(v.find("val_loss")->numberValue()), *r.valLoss);
  r.valLoss = std::nanf("");
  EXPECT_TRUE(parseJson(formatMetricsJson(r), "metrics").find("val_loss")->isNull());
  // A step without an evaluation has no val_loss at all.
  r.valLoss.reset();
  EXPECT_EQ(parseJson(formatMetricsJson(r), "metrics").find("val_loss"), nullptr);

  // On a terminal, the last val_loss stays on the line until the next evaluation.
  std::string path = test::tempPath("progress.txt");
  std::FILE *out = std::fopen(path.c_str(), "w");
  ASSERT_NE(out, nullptr);
  {
    Progress progress(out, /*terminal=*/true);
    StepReport first = sample();
    first.valLoss = 3.5f;
    progress.step(first, 1);
    StepReport next = sample();
    next.step = 13;
    progress.step(next, 1);
    progress.finish();
  }
  std::fclose(out);
  std::string text = test::readText(path);
  std::remove(path.c_str());
  size_t last = text.rfind('\r');
  ASSERT_NE(last, std::string::npos) << text;
  EXPECT_NE(text.find("step 13/100", last), std::string::npos) << text;
  EXPECT_NE(text.find("val_loss 3.5000", last), std::string::npos) << text;
}

Fp8Summary fp8Sample() {
  Fp8Summary s;
  s.tensors = 2;
  s.operands = {{"a.weight", "input", 32.0f, 14.0f, 0.0f, 0.0f},
                {"a.weight", "weight", 1120.0f, 0.4f, 0.002f, 0.0f},
                {"a.weight", "grad_output", 2.5e6f, 0.0229f, 0.25f, 0.0f},
                {"b\"q.weight", "input", 16.0f, std::numeric_limits<float>::infinity(), 0.0f,
                 0.125f},
                {"b\"q.weight", "weight", 896.0f, 0.5f, 0.25f, 0.0f},
                {"b\"q.weight", "grad_output", 0.0f, 0.0f, 0.0f, 0.0f}};
  return s;
}

TEST(MetricsTest, Fp8Json) {
  Fp8Summary s = fp8Sample();
  EXPECT_EQ(formatFp8Json(Fp8Summary{}),
            "{\"tensors\": 0, \"max_underflow\": null, \"max_saturation\": null, "
            "\"per_tensor\": []}");
  JsonValue v = parseJson(formatFp8Json(s), "fp8");
  EXPECT_EQ(v.find("tensors")->unsignedValue(), 2u);
  // The largest fraction, the first of equals.
  const JsonValue *under = v.find("max_underflow");
  EXPECT_EQ(under->find("tensor")->stringValue(), "a.weight");
  EXPECT_EQ(under->find("operand")->stringValue(), "grad_output");
  EXPECT_EQ(under->find("fraction")->numberValue(), 0.25);
  const JsonValue *saturation = v.find("max_saturation");
  EXPECT_EQ(saturation->find("tensor")->stringValue(), "b\"q.weight");
  EXPECT_EQ(saturation->find("operand")->stringValue(), "input");
  EXPECT_EQ(saturation->find("fraction")->numberValue(), 0.125);
  const std::vector<JsonValue> &rows = v.find("per_tensor")->elements();
  ASSERT_EQ(rows.size(), 6u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const Fp8OperandStats &o = s.operands[i];
    EXPECT_EQ(rows[i].find("tensor")->stringValue(), o.tensor);
    EXPECT_EQ(rows[i].find("operand")->stringValue(), o.operand);
    EXPECT_EQ(float(rows[i].find("scale")->numberValue()), o.scale);
    EXPECT_EQ(float(rows[i].find("underflow")->numberValue()), o.underflow);
    EXPECT_EQ(float(rows[i].find("saturation")->numberValue()), o.saturation);
  }
  EXPECT_EQ(float(rows[2].find("amax")->numberValue()), 0.0229f);
  EXPECT_TRUE(rows[3].find("amax")->isNull()) << "an overflowed amax is not finite";
  // The exact text of one row: stable for scripts.
  EXPECT_NE(formatFp8Json(s).find("{\"tensor\": \"a.weight\", \"operand\": \"weight\", "
                                  "\"scale\": 1120, \"amax\": 0.400000006, \"underflow\": "
                                  "0.00200000009, \"saturation\": 0}"),
            std::string::npos)
      << formatFp8Json(s);

  // In the metrics line only on the steps that read it.
  StepReport r = sample();
  EXPECT_EQ(parseJson(formatMetricsJson(r), "metrics").find("fp8"), nullptr);
  r.fp8 = s;
  v = parseJson(formatMetricsJson(r), "metrics");
  ASSERT_NE(v.find("fp8"), nullptr);
  EXPECT_EQ(v.find("fp8")->find("per_tensor")->elements().size(), 6u);
  EXPECT_EQ(v.find("step")->unsignedValue(), 12u);
}

TEST(MetricsTest, Fp8UnderflowWarning) {
  Fp8Summary s = fp8Sample();
  // At or below the threshold: nothing.
  EXPECT_EQ(formatFp8UnderflowWarning(s, 20, 0.25), "");
  EXPECT_EQ(formatFp8UnderflowWarning(s, 20, 0.5), "");
  EXPECT_EQ(formatFp8UnderflowWarning(Fp8Summary{}, 20, 0.0), "");
  // One above: named, with the step and the fraction.
  EXPECT_EQ(formatFp8UnderflowWarning(s, 20, 0.1),
            "warning: step 20: FP8 underflow: 25% of grad_output of 'a.weight' became zero "
            "(--fp8-underflow-warn 10%; 1 more FP8 operand above it)");
  s.operands[4].underflow = 0.2f;
  EXPECT_EQ(formatFp8UnderflowWarning(s, 7, 0.21),
            "warning: step 7: FP8 underflow: 25% of grad_output of 'a.weight' became zero "
            "(--fp8-underflow-warn 21%)");
  EXPECT_EQ(formatFp8UnderflowWarning(s, 30, 0.001),
            "warning: step 30: FP8 underflow: 25% of grad_output of 'a.weight' became zero "
            "(--fp8-underflow-warn 0.1%; 2 more FP8 operands above it)");
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
