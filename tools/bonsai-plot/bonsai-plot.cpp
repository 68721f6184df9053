//===- bonsai-plot.cpp - bonsai-run's metrics JSONL as an SVG chart -------===//
//
// bonsai-plot METRICS.jsonl -o RUN.svg [--title TEXT]
//
// Reads the file bonsai-run --metrics writes (docs/training.md, "Metrics file") and draws four
// panels over the step number: loss (and val_loss where the records have it), learning rate,
// tokens per second, and memory (measured, and planned as a dashed line). The SVG is
// self-contained (no scripts, fonts named generically, no external references), so any browser
// or SVG renderer shows it with nothing else installed.
//
// Every line is read: a blank line is skipped, anything else must be a JSON object with an
// unsigned integer "step", or the tool stops with one line naming the line number. A resumed
// run appends records for steps it redoes; the last record of a step wins. A null value (the
// plan has no such metric, or it was not finite) is left out of its curve, which joins the
// steps on either side. Every failure is one line, "bonsai-plot: error: <cause>", exit status 1.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CrashReport.h"
#include "bonsai/runtime/Json.h"
#include "bonsai/runtime/Tensor.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace rt = bonsai::rt;

namespace {

const char *const kUsage = "usage: bonsai-plot METRICS.jsonl -o RUN.svg [--title TEXT]\n";

const char *const kHelp =
    "\n"
    "Draws the metrics file of bonsai-run --metrics as an SVG: loss and validation loss,\n"
    "learning rate, tokens per second and memory (measured; planned dashed) over the steps.\n"
    "See docs/training.md, \"Seeing a run\".\n"
    "\n"
    "options:\n"
    "  -o, --output FILE   the SVG to write (required)\n"
    "  --title TEXT        the chart's title (default: the metrics file's name)\n"
    "  -h, --help          this help\n"
    "\n"
    "Flags take their value as --flag VALUE or --flag=VALUE.\n";

/// A command-line mistake: printed with the usage line.
struct UsageError {
  std::string message;
};

struct Options {
  std::string input, output, title;
  bool help = false;
};

Options parseOptions(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      o.help = true;
      continue;
    }
    if (arg.size() > 1 && arg[0] == '-') {
      std::string flag = arg, value;
      bool hasValue = false;
      if (size_t eq = arg.find('='); eq != std::string::npos && arg.rfind("--", 0) == 0) {
        flag = arg.substr(0, eq);
        value = arg.substr(eq + 1);
        hasValue = true;
      }
      auto takeValue = [&]() {
        if (hasValue)
          return value;
        if (i + 1 >= argc)
          throw UsageError{flag + " needs a value"};
        return std::string(argv[++i]);
      };
      if (flag == "-o" || flag == "--output")
        o.output = takeValue();
      else if (flag == "--title")
        o.title = takeValue();
      else
        throw UsageError{"unknown option '" + arg + "'"};
      continue;
    }
    if (!o.input.empty())
      throw UsageError{"more than one metrics file given ('" + o.input + "' and '" + arg + "')"};
    o.input = arg;
  }
  if (o.help)
    return o;
  if (o.input.empty())
    throw UsageError{"no metrics file given"};
  if (o.output.empty())
    throw UsageError{"no output given (-o RUN.svg)"};
  return o;
}

/// One plotted quantity: its values by step (the last record of a step wins).
struct Series {
  Series(const char *key, const char *label, const char *color, bool dashed = false,
         bool markers = false)
      : key(key), label(label), color(color), dashed(dashed), markers(markers) {}

  const char *key;   // the metrics field
  const char *label; // the legend's text
  const char *color;
  bool dashed;
  bool markers; // sparse series (val_loss) get a dot per point
  std::map<uint64_t, double> points;
};

/// The value of `key` in `record`: nullopt when absent or null. Throws rt::Error for a value
/// that is neither a number nor null.
std::optional<double> numberField(const rt::JsonValue &record, const char *key,
                                  const std::string &where) {
  const rt::JsonValue *v = record.find(key);
  if (!v || v->isNull())
    return std::nullopt;
  if (!v->isNumber())
    throw rt::Error(where + ": \"" + key + "\" is " + v->kindName() + ", not a number");
  return v->numberValue();
}

/// Reads every record of `path` into `series`; returns the number of step records.
size_t readMetrics(const std::string &path, std::vector<Series *> series) {
  std::ifstream in(path);
  if (!in)
    throw rt::Error("cannot open '" + path + "': " + std::strerror(errno));
  std::string line;
  size_t lineNumber = 0, records = 0;
  while (std::getline(in, line)) {
    ++lineNumber;
    if (line.find_first_not_of(" \t\r") == std::string::npos)
      continue;
    std::string where = path + ":" + std::to_string(lineNumber);
    rt::JsonValue record = rt::parseJson(line, where);
    if (!record.isObject())
      throw rt::Error(where + ": a metrics record is a JSON object, this is " +
                      std::string(record.kindName()));
    const rt::JsonValue *step = record.find("step");
    if (!step || !step->isUnsigned())
      throw rt::Error(where + ": the record has no \"step\" (an unsigned integer)");
    for (Series *s : series)
      if (std::optional<double> v = numberField(record, s->key, where); v && std::isfinite(*v))
        s->points[step->unsignedValue()] = *v;
    ++records;
  }
  if (in.bad())
    throw rt::Error("reading '" + path + "': " + std::strerror(errno));
  if (records == 0)
    throw rt::Error("'" + path + "' has no step records (is it bonsai-run --metrics output?)");
  return records;
}

/// `text` with the five XML special characters escaped.
std::string xmlEscape(const std::string &text) {
  std::string out;
  for (char c : text) {
    switch (c) {
    case '&':
      out += "&amp;";
      break;
    case '<':
      out += "&lt;";
      break;
    case '>':
      out += "&gt;";
      break;
    case '"':
      out += "&quot;";
      break;
    case '\'':
      out += "&apos;";
      break;
    default:
      out += c;
    }
  }
  return out;
}

std::string fmt(const char *format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

/// A 1, 2 or 5 times a power of ten, near `range / 5`: about five ticks on an axis.
double tickStep(double range) {
  double raw = range / 5;
  double power = std::pow(10.0, std::floor(std::log10(raw)));
  double m = raw / power;
  return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * power;
}

/// A tick label: `value` rounded to the tick step, with k/M/G for large numbers.
std::string tickLabel(double value, double step) {
  if (std::fabs(value) < step * 1e-6)
    return "0";
  double magnitude = std::max(std::fabs(value), step);
  const char *suffix = "";
  double scale = 1;
  if (magnitude >= 1e9)
    suffix = "G", scale = 1e9;
  else if (magnitude >= 1e6)
    suffix = "M", scale = 1e6;
  else if (magnitude >= 1e4)
    suffix = "k", scale = 1e3;
  double s = step / scale, v = value / scale;
  if (s < 1e-3) { // learning rates: 2.5e-04, with the digits the step needs
    int decimals = std::max(0, int(std::floor(std::log10(std::fabs(value)))) -
                                   int(std::floor(std::log10(step) + 1e-9)));
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*e", decimals, value);
    return buf;
  }
  int decimals = s >= 1 ? 0 : int(std::ceil(-std::log10(s) - 1e-9));
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f%s", decimals, v, suffix);
  return buf;
}

/// An axis: its data range, widened to whole tick steps.
struct Axis {
  double lo = 0, hi = 1, step = 0.2;

  static Axis fit(double lo, double hi) {
    if (!(hi > lo)) { // one value (or all equal): a range around it
      double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
      lo -= pad, hi += pad;
    }
    Axis a;
    a.step = tickStep(hi - lo);
    a.lo = std::floor(lo / a.step + 1e-9) * a.step;
    a.hi = std::ceil(hi / a.step - 1e-9) * a.step;
    return a;
  }
};

// The layout: a 2 x 2 grid of panels. The plot area of each panel has its ticks and labels to the
// left and below, the panel title and legend above.
constexpr int kWidth = 960, kHeight = 660;
constexpr int kPanelWidth = 480, kPanelHeight = 300, kTop = 50;
constexpr int kPlotLeft = 80, kPlotRight = 20, kPlotTop = 40, kPlotBottom = 45;

/// Byte counts shown in a unit that suits the largest of them.
struct ByteUnit {
  const char *name;
  double bytes;
};

ByteUnit byteUnit(double largest) {
  if (largest >= 1024.0 * 1024 * 1024)
    return {"GiB", 1024.0 * 1024 * 1024};
  if (largest >= 1024.0 * 1024)
    return {"MiB", 1024.0 * 1024};
  if (largest >= 1024.0)
    return {"KiB", 1024.0};
  return {"bytes", 1};
}

/// Draws one panel at (x0, y0) with the series that have points; `scale` divides the values
/// (byte units). Throughput and memory read best from zero (`fromZero`); loss and learning rate
/// use the range of their values.
void drawPanel(std::string &svg, int x0, int y0, const std::string &title,
               const std::string &yLabel, const std::vector<const Series *> &all, double scale,
               bool fromZero, uint64_t firstStep, uint64_t lastStep) {
  std::vector<const Series *> series;
  for (const Series *s : all)
    if (!s->points.empty())
      series.push_back(s);
  int left = x0 + kPlotLeft, top = y0 + kPlotTop;
  int width = kPanelWidth - kPlotLeft - kPlotRight, height = kPanelHeight - kPlotTop - kPlotBottom;

  svg += "<g class=\"panel\">\n";
  svg += "<text x=\"" + std::to_string(left) + "\" y=\"" + std::to_string(y0 + 18) +
         "\" font-size=\"15\" font-weight=\"bold\">" + xmlEscape(title) + "</text>\n";
  if (series.empty()) {
    svg += "<rect x=\"" + std::to_string(left) + "\" y=\"" + std::to_string(top) + "\" width=\"" +
           std::to_string(width) + "\" height=\"" + std::to_string(height) +
           "\" fill=\"#f4f4f4\" stroke=\"#bbbbbb\"/>\n";
    svg += "<text x=\"" + std::to_string(left + width / 2) + "\" y=\"" +
           std::to_string(top + height / 2) +
           "\" text-anchor=\"middle\" fill=\"#666666\">no values in the metrics file</text>\n";
    svg += "</g>\n";
    return;
  }

  double lo = INFINITY, hi = -INFINITY;
  for (const Series *s : series)
    for (auto [step, value] : s->points)
      lo = std::min(lo, value / scale), hi = std::max(hi, value / scale);
  if (fromZero)
    lo = std::min(lo, 0.0);
  Axis y = Axis::fit(lo, hi);
  Axis x = Axis::fit(double(firstStep), double(lastStep));
  if (x.step < 1) // steps are integers: so are the ticks
    x = Axis{std::floor(x.lo), std::ceil(x.hi), 1};
  auto px = [&](double v) { return left + (v - x.lo) / (x.hi - x.lo) * width; };
  auto py = [&](double v) { return top + (y.hi - v) / (y.hi - y.lo) * height; };

  // The plot area carries its data range, so a test (or a script) can find where a value is.
  svg += "<rect class=\"plot-area\" x=\"" + std::to_string(left) + "\" y=\"" + std::to_string(top) +
         "\" width=\"" + std::to_string(width) + "\" height=\"" + std::to_string(height) +
         "\" fill=\"#ffffff\" stroke=\"#333333\" data-x0=\"" + fmt("%.17g", x.lo) +
         "\" data-x1=\"" + fmt("%.17g", x.hi) + "\" data-y0=\"" + fmt("%.17g", y.lo * scale) +
         "\" data-y1=\"" + fmt("%.17g", y.hi * scale) + "\"/>\n";
  for (double t = y.lo; t <= y.hi + y.step * 1e-6; t += y.step) {
    std::string ty = fmt("%.1f", py(t));
    svg += "<line x1=\"" + std::to_string(left) + "\" x2=\"" + std::to_string(left + width) +
           "\" y1=\"" + ty + "\" y2=\"" + ty + "\" stroke=\"#e6e6e6\"/>\n";
    svg += "<line x1=\"" + std::to_string(left - 5) + "\" x2=\"" + std::to_string(left) +
           "\" y1=\"" + ty + "\" y2=\"" + ty + "\" stroke=\"#333333\"/>\n";
    svg += "<text x=\"" + std::to_string(left - 8) + "\" y=\"" + fmt("%.1f", py(t) + 4) +
           "\" text-anchor=\"end\" font-size=\"11\">" + tickLabel(t, y.step) + "</text>\n";
  }
  for (double t = x.lo; t <= x.hi + x.step * 1e-6; t += x.step) {
    std::string tx = fmt("%.1f", px(t));
    svg += "<line x1=\"" + tx + "\" x2=\"" + tx + "\" y1=\"" + std::to_string(top + height) +
           "\" y2=\"" + std::to_string(top + height + 5) + "\" stroke=\"#333333\"/>\n";
    svg += "<text x=\"" + tx + "\" y=\"" + std::to_string(top + height + 18) +
           "\" text-anchor=\"middle\" font-size=\"11\">" + tickLabel(t, x.step) + "</text>\n";
  }
  svg += "<text x=\"" + std::to_string(left + width / 2) + "\" y=\"" +
         std::to_string(top + height + 36) +
         "\" text-anchor=\"middle\" font-size=\"12\">step</text>\n";
  svg += "<text transform=\"translate(" + std::to_string(x0 + 14) + " " +
         std::to_string(top + height / 2) +
         ") rotate(-90)\" text-anchor=\"middle\" font-size=\"12\">" + xmlEscape(yLabel) +
         "</text>\n";

  // The curves are clipped to the plot area; a series is drawn after its grid lines.
  std::string clip = "clip" + std::to_string(x0) + "_" + std::to_string(y0);
  svg += "<clipPath id=\"" + clip + "\"><rect x=\"" + std::to_string(left) + "\" y=\"" +
         std::to_string(top) + "\" width=\"" + std::to_string(width) + "\" height=\"" +
         std::to_string(height) + "\"/></clipPath>\n";
  int legendX = left + width;
  for (auto it = series.rbegin(); it != series.rend(); ++it) {
    const Series *s = *it;
    std::string points;
    for (auto [step, value] : s->points)
      points += fmt("%.2f", px(double(step))) + "," + fmt("%.2f", py(value / scale)) + " ";
    svg += "<polyline data-series=\"" + std::string(s->key) + "\" clip-path=\"url(#" + clip +
           ")\" fill=\"none\" stroke=\"" + s->color +
           "\" stroke-width=\"2\" stroke-linejoin=\"round\"" +
           (s->dashed ? " stroke-dasharray=\"6 4\"" : "") + " points=\"" + points + "\"/>\n";
    if (s->markers || s->points.size() == 1)
      for (auto [step, value] : s->points)
        svg += "<circle cx=\"" + fmt("%.2f", px(double(step))) + "\" cy=\"" +
               fmt("%.2f", py(value / scale)) + "\" r=\"3.5\" fill=\"" + s->color + "\"/>\n";
    // The legend, right-aligned above the plot area.
    std::string label = xmlEscape(s->label);
    legendX -= int(label.size()) * 8 + 40;
    svg += "<line x1=\"" + std::to_string(legendX) + "\" x2=\"" + std::to_string(legendX + 20) +
           "\" y1=\"" + std::to_string(top - 10) + "\" y2=\"" + std::to_string(top - 10) +
           "\" stroke=\"" + s->color + "\" stroke-width=\"2\"" +
           (s->dashed ? " stroke-dasharray=\"6 4\"" : "") + "/>\n";
    svg += "<text x=\"" + std::to_string(legendX + 24) + "\" y=\"" + std::to_string(top - 6) +
           "\" font-size=\"12\">" + label + "</text>\n";
  }
  svg += "</g>\n";
}

int run(const Options &o) {
  Series loss{"loss", "loss", "#1f77b4"};
  Series valLoss{"val_loss", "val_loss", "#ff7f0e", /*dashed=*/false, /*markers=*/true};
  Series lr{"lr", "lr", "#2ca02c"};
  Series tokens{"tokens_per_s", "tokens/s", "#9467bd"};
  Series measured{"memory_measured_bytes", "measured", "#d62728"};
  Series planned{"memory_planned_bytes", "planned", "#7f7f7f", /*dashed=*/true};
  std::vector<Series *> all = {&loss, &valLoss, &lr, &tokens, &measured, &planned};
  size_t records = readMetrics(o.input, all);

  uint64_t firstStep = UINT64_MAX, lastStep = 0;
  double largestBytes = 0;
  for (Series *s : all)
    for (auto [step, value] : s->points) {
      firstStep = std::min(firstStep, step), lastStep = std::max(lastStep, step);
      if (s == &measured || s == &planned)
        largestBytes = std::max(largestBytes, value);
    }
  if (firstStep == UINT64_MAX) // step records whose every value is null
    firstStep = lastStep = 0;
  ByteUnit unit = byteUnit(largestBytes);

  std::string title = o.title.empty() ? o.input : o.title;
  std::string svg = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(kWidth) +
         "\" height=\"" + std::to_string(kHeight) + "\" viewBox=\"0 0 " + std::to_string(kWidth) +
         " " + std::to_string(kHeight) +
         "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n";
  svg += "<title>" + xmlEscape(title) + "</title>\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  svg += "<text x=\"20\" y=\"30\" font-size=\"18\">" + xmlEscape(title) + "</text>\n";
  svg += "<text x=\"" + std::to_string(kWidth - 20) +
         "\" y=\"30\" font-size=\"12\" text-anchor=\"end\" fill=\"#555555\">" +
         std::to_string(records) + (records == 1 ? " record, " : " records, ") +
         (firstStep == lastStep
              ? "step " + std::to_string(firstStep)
              : "steps " + std::to_string(firstStep) + "-" + std::to_string(lastStep)) +
         "</text>\n";
  drawPanel(svg, 0, kTop, "Loss", "loss", {&loss, &valLoss}, 1, false, firstStep, lastStep);
  drawPanel(svg, kPanelWidth, kTop, "Learning rate", "lr", {&lr}, 1, false, firstStep, lastStep);
  drawPanel(svg, 0, kTop + kPanelHeight, "Throughput", "tokens/s", {&tokens}, 1, true, firstStep,
            lastStep);
  drawPanel(svg, kPanelWidth, kTop + kPanelHeight, "Memory",
            std::string("memory (") + unit.name + ")", {&measured, &planned}, unit.bytes, true,
            firstStep, lastStep);
  svg += "</svg>\n";

  // Written under a temporary name and renamed, so a failure leaves no partial file.
  std::string temporary = o.output + ".tmp";
  std::FILE *f = std::fopen(temporary.c_str(), "wb");
  if (!f)
    throw rt::Error("cannot write '" + o.output + "': " + std::strerror(errno));
  bool ok = std::fwrite(svg.data(), 1, svg.size(), f) == svg.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(temporary.c_str(), o.output.c_str()) != 0) {
    int error = errno;
    std::remove(temporary.c_str());
    throw rt::Error("cannot write '" + o.output + "': " + std::strerror(error));
  }
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  rt::installCrashReport("bonsai-plot");
  try {
    Options options = parseOptions(argc, argv);
    if (options.help) {
      std::fputs(kUsage, stdout);
      std::fputs(kHelp, stdout);
      return 0;
    }
    return run(options);
  } catch (const UsageError &e) {
    std::fprintf(stderr, "bonsai-plot: error: %s\n%s", e.message.c_str(), kUsage);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "bonsai-plot: error: %s\n", e.what());
  }
  return 1;
}
