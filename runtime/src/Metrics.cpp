//===- Metrics.cpp - Per-step metrics: JSON lines and terminal progress ---===//
//
// Plain lines print the loss with %.9g, enough digits to round-trip an f32, so scripts can
// compare runs bit for bit; the terminal line favours legibility. JSON has no NaN or infinity,
// so a non-finite value is written as null.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Metrics.h"

#include "bonsai/runtime/Json.h"
#include "bonsai/runtime/Tensor.h"

#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstring>

namespace bonsai::rt {

namespace {

std::string format(const char *fmt, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, value);
  return buf;
}

std::string jsonNumber(std::optional<float> value, const char *fmt) {
  if (!value || !std::isfinite(*value))
    return "null";
  return format(fmt, double(*value));
}

/// The operand with the largest value of `field` (the first of equals), or null.
const Fp8OperandStats *largest(const Fp8Summary &s, float Fp8OperandStats::*field) {
  const Fp8OperandStats *best = nullptr;
  for (const Fp8OperandStats &o : s.operands)
    if (!best || o.*field > best->*field)
      best = &o;
  return best;
}

std::string fp8Maximum(const Fp8Summary &s, float Fp8OperandStats::*field) {
  const Fp8OperandStats *o = largest(s, field);
  if (!o)
    return "null";
  return "{\"tensor\": " + jsonQuote(o->tensor) + ", \"operand\": " + jsonQuote(o->operand) +
         ", \"fraction\": " + jsonNumber(o->*field, "%.9g") + "}";
}

double tokensPerSecond(const StepReport &r) {
  return r.stepSeconds > 0 ? double(r.tokens) / r.stepSeconds : 0.0;
}

} // namespace

std::string formatStepLine(const StepReport &r) {
  std::string line = "step " + std::to_string(r.step) + " loss " + format("%.9g", double(r.loss));
  if (r.gradNorm)
    line += " grad_norm " + format("%.6g", double(*r.gradNorm));
  if (r.lr)
    line += " lr " + format("%.6g", double(*r.lr));
  // %.9g as the loss, so that an evaluation can be compared bit for bit with a forward run.
  if (r.valLoss)
    line += " val_loss " + format("%.9g", double(*r.valLoss));
  if (r.skippedSteps > 0)
    line += " skipped " + std::to_string(r.skippedSteps);
  return line;
}

std::string formatMetricsJson(const StepReport &r) {
  std::string s = "{\"step\": " + std::to_string(r.step);
  s += ", \"loss\": " + jsonNumber(r.loss, "%.9g");
  s += ", \"grad_norm\": " + jsonNumber(r.gradNorm, "%.9g");
  s += ", \"lr\": " + jsonNumber(r.lr, "%.9g");
  // Only on the steps that evaluate: a plot draws the validation curve through them.
  if (r.valLoss)
    s += ", \"val_loss\": " + jsonNumber(r.valLoss, "%.9g");
  s += ", \"tokens_per_s\": " + format("%.1f", tokensPerSecond(r));
  s += ", \"memory_planned_bytes\": " + std::to_string(r.plannedBytes);
  s += ", \"memory_measured_bytes\": " + std::to_string(r.measuredBytes);
  s += ", \"micro_batches\": " + std::to_string(r.microBatches);
  s += ", \"tokens\": " + std::to_string(r.tokens);
  s += ", \"elapsed_s\": " + format("%.3f", r.elapsedSeconds);
  s += ", \"skipped_steps\": " + std::to_string(r.skippedSteps);
  if (r.offload) {
    const OffloadTimes &t = r.offload->times;
    // Without timing (bonsai-run without --offload-timing) the times and rates are unknown.
    auto rate = [&](uint64_t bytes, double seconds) {
      std::optional<double> perSecond = achievedBytesPerSecond(bytes, seconds);
      return perSecond && t.timed ? format("%.2f", *perSecond / 1e9) : std::string("null");
    };
    auto time = [&](double seconds) {
      return t.timed ? format("%.6f", seconds) : std::string("null");
    };
    s += ", \"offload\": {\"pcie_h2d_bytes\": " + std::to_string(r.offload->hostToDeviceBytes) +
         ", \"pcie_d2h_bytes\": " + std::to_string(r.offload->deviceToHostBytes) +
         ", \"h2d_s\": " + time(t.toDeviceSeconds) + ", \"d2h_s\": " + time(t.toHostSeconds) +
         ", \"h2d_gb_per_s\": " + rate(t.toDeviceBytes, t.toDeviceSeconds) +
         ", \"d2h_gb_per_s\": " + rate(t.toHostBytes, t.toHostSeconds) +
         ", \"exposed_s\": " + time(t.exposedSeconds) +
         ", \"host_step_s\": " + format("%.6f", t.hostStepSeconds) + "}";
  }
  if (r.fp8)
    s += ", \"fp8\": " + formatFp8Json(*r.fp8);
  return s + "}";
}

std::optional<double> achievedBytesPerSecond(uint64_t bytes, double seconds) {
  if (bytes == 0 || !(seconds > 0))
    return std::nullopt;
  return double(bytes) / seconds;
}

std::string formatLinkWarning(const OffloadTimes &times, double linkBytesPerSecond, uint64_t step) {
  // Small copies are latency-bound: their rate says nothing about the link.
  constexpr uint64_t kMinBytes = uint64_t(64) << 20;
  if (!(linkBytesPerSecond > 0) || !times.timed)
    return "";
  struct Direction {
    const char *name;
    uint64_t bytes;
    double seconds;
  };
  for (Direction d : {Direction{"to the device", times.toDeviceBytes, times.toDeviceSeconds},
                      Direction{"to the host", times.toHostBytes, times.toHostSeconds}}) {
    std::optional<double> rate = achievedBytesPerSecond(d.bytes, d.seconds);
    if (d.bytes < kMinBytes || !rate || *rate >= 0.5 * linkBytesPerSecond)
      continue;
    return "warning: step " + std::to_string(step) + ": copies " + d.name + " ran at " +
           format("%.1f", *rate / 1e9) + " GB/s, below half of the target's " +
           format("%.1f", linkBytesPerSecond / 1e9) +
           " GB/s each way (pageable memory, or another process on the bus?)";
  }
  return "";
}

std::string formatFp8Json(const Fp8Summary &summary) {
  std::string s = "{\"tensors\": " + std::to_string(summary.tensors);
  s += ", \"max_underflow\": " + fp8Maximum(summary, &Fp8OperandStats::underflow);
  s += ", \"max_saturation\": " + fp8Maximum(summary, &Fp8OperandStats::saturation);
  s += ", \"per_tensor\": [";
  for (size_t i = 0; i < summary.operands.size(); ++i) {
    const Fp8OperandStats &o = summary.operands[i];
    s += std::string(i ? ", " : "") + "{\"tensor\": " + jsonQuote(o.tensor) +
         ", \"operand\": " + jsonQuote(o.operand) +
         ", \"scale\": " + jsonNumber(o.scale, "%.9g") +
         ", \"amax\": " + jsonNumber(o.amax, "%.9g") +
         ", \"underflow\": " + jsonNumber(o.underflow, "%.9g") +
         ", \"saturation\": " + jsonNumber(o.saturation, "%.9g") + "}";
  }
  return s + "]}";
}

std::string formatFp8UnderflowWarning(const Fp8Summary &summary, uint64_t step,
                                      double threshold) {
  const Fp8OperandStats *worst = nullptr;
  size_t above = 0;
  for (const Fp8OperandStats &o : summary.operands)
    if (double(o.underflow) > threshold) {
      ++above;
      if (!worst || o.underflow > worst->underflow)
        worst = &o;
    }
  if (!worst)
    return "";
  std::string line = "warning: step " + std::to_string(step) + ": FP8 underflow: " +
                     format("%.3g", 100.0 * double(worst->underflow)) + "% of " +
                     worst->operand + " of '" + worst->tensor + "' became zero " +
                     "(--fp8-underflow-warn " + format("%.3g", 100.0 * threshold) + "%";
  if (above > 1)
    line += "; " + std::to_string(above - 1) + " more FP8 operand" + (above > 2 ? "s" : "") +
            " above it";
  return line + ")";
}

std::string formatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0)
    return "?";
  uint64_t s = uint64_t(seconds + 0.5);
  char buf[48];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%" PRIu64 ":%02u:%02u", s / 3600, unsigned(s / 60 % 60),
                  unsigned(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%u:%02u", unsigned(s / 60), unsigned(s % 60));
  return buf;
}

std::string formatProgress(const StepReport &r, uint64_t firstStep) {
  std::string line = "step " + std::to_string(r.step) + "/" + std::to_string(r.lastStep) +
                     " | loss " + format("%.4f", double(r.loss));
  if (r.gradNorm)
    line += " | grad_norm " + format("%.3g", double(*r.gradNorm));
  if (r.lr)
    line += " | lr " + format("%.3g", double(*r.lr));
  if (r.valLoss)
    line += " | val_loss " + format("%.4f", double(*r.valLoss));
  if (r.skippedSteps > 0)
    line += " | skipped " + std::to_string(r.skippedSteps);
  line += " | " + format("%.0f", tokensPerSecond(r)) + " tok/s";
  uint64_t done = r.step >= firstStep ? r.step - firstStep + 1 : 1;
  uint64_t left = r.lastStep > r.step ? r.lastStep - r.step : 0;
  line += " | ETA " + formatDuration(r.elapsedSeconds / double(done) * double(left));
  return line;
}

MetricsFile::MetricsFile(const std::string &path, bool append) : path_(path) {
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!file_)
    throw Error("cannot open metrics file '" + path + "': " + std::strerror(errno));
}

MetricsFile::~MetricsFile() {
  if (file_)
    std::fclose(file_);
}

void MetricsFile::write(const StepReport &report) {
  std::string line = formatMetricsJson(report) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    throw Error("cannot write metrics file '" + path_ + "': " + std::strerror(errno));
}

void Progress::step(const StepReport &report, uint64_t firstStep) {
  if (!terminal_) {
    std::fprintf(out_, "%s\n", formatStepLine(report).c_str());
    std::fflush(out_);
    return;
  }
  if (report.valLoss)
    lastValLoss_ = report.valLoss;
  StepReport shown = report;
  shown.valLoss = lastValLoss_;
  std::string line = formatProgress(shown, firstStep);
  // Pad over the end of a longer previous line.
  size_t length = line.size();
  if (line.size() < shown_)
    line.append(shown_ - line.size(), ' ');
  std::fprintf(out_, "\r%s", line.c_str());
  std::fflush(out_);
  shown_ = length;
}

void Progress::note(const std::string &line, std::FILE *to) {
  if (terminal_ && shown_ > 0) {
    std::fprintf(out_, "\r%s\r", std::string(shown_, ' ').c_str());
    std::fflush(out_);
    shown_ = 0;
  }
  if (!to)
    to = out_;
  std::fprintf(to, "%s\n", line.c_str());
  std::fflush(to);
}

void Progress::finish() {
  if (terminal_ && shown_ > 0) {
    std::fprintf(out_, "\n");
    std::fflush(out_);
    shown_ = 0;
  }
}

} // namespace bonsai::rt
