// Inline SVG charts of metric series and of sweep results, for the HTML reports and the dashboard.
#include "runtime/report/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <iterator>
#include <limits>
#include <stdexcept>

namespace runner::report {

std::string escape_html(std::string_view text) {
  std::string escaped;
  escaped.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        escaped += "&amp;";
        break;
      case '<':
        escaped += "&lt;";
        break;
      case '>':
        escaped += "&gt;";
        break;
      case '"':
        escaped += "&quot;";
        break;
      case '\'':
        escaped += "&#39;";
        break;
      default:
        escaped += c;
    }
  }
  return escaped;
}

AxisTicks nice_ticks(double low, double high, int target_intervals) {
  if (!(high > low) || !std::isfinite(high - low) || target_intervals < 1) {
    throw std::invalid_argument(
        fmt::format("nice_ticks: bad range [{}, {}] or interval count {}", low, high, target_intervals));
  }
  const double raw_step = (high - low) / target_intervals;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw_step)));
  const double fraction = raw_step / magnitude;
  constexpr double slack = 1e-9;
  const double multiplier = fraction <= 1 + slack ? 1 : fraction <= 2 + slack ? 2 : fraction <= 5 + slack ? 5 : 10;
  AxisTicks ticks;
  // For steps below 1, dividing by the exact power of ten gives the correctly rounded decimal (0.6, not
  // 3 * 0.2 = 0.6000000000000001).
  const double inverse_magnitude = magnitude < 1 ? std::round(1 / magnitude) : 0;
  ticks.step = inverse_magnitude > 0 ? multiplier / inverse_magnitude : multiplier * magnitude;
  const auto first = static_cast<int64_t>(std::floor(low / ticks.step + slack));
  const auto last = static_cast<int64_t>(std::ceil(high / ticks.step - slack));
  for (int64_t i = first; i <= last; ++i) {
    const double value = inverse_magnitude > 0 ? static_cast<double>(i) * multiplier / inverse_magnitude
                                               : static_cast<double>(i) * ticks.step;
    ticks.values.push_back(value);
  }
  return ticks;
}

bool wants_log_scale(const std::vector<ChartSeries>& series) {
  double smallest = std::numeric_limits<double>::infinity();
  double largest = 0;
  for (const auto& one : series) {
    for (const auto& [step, value] : one.points) {
      if (!std::isfinite(value)) continue;
      if (value <= 0) return false;
      smallest = std::min(smallest, value);
      largest = std::max(largest, value);
    }
  }
  return std::isfinite(smallest) && largest / smallest > 100;
}

SeriesPoints downsample_min_max(const SeriesPoints& points, std::size_t max_points) {
  max_points = std::max<std::size_t>(max_points, 8);
  if (points.size() <= max_points) return points;
  // Each bucket contributes at most three points (min, max, first gap); the first and last point are kept.
  const std::size_t bucket_count = (max_points - 2) / 3;
  const std::size_t interior = points.size() - 2;
  SeriesPoints kept;
  kept.reserve(max_points);
  kept.push_back(points.front());
  std::vector<std::size_t> chosen;
  for (std::size_t bucket = 0; bucket < bucket_count; ++bucket) {
    const std::size_t begin = 1 + interior * bucket / bucket_count;
    const std::size_t end = 1 + interior * (bucket + 1) / bucket_count;
    std::size_t lowest = end, highest = end, first_gap = end;
    for (std::size_t i = begin; i < end; ++i) {
      const double value = points[i].second;
      if (!std::isfinite(value)) {
        if (first_gap == end) first_gap = i;
        continue;
      }
      if (lowest == end || value < points[lowest].second) lowest = i;
      if (highest == end || value > points[highest].second) highest = i;
    }
    chosen.clear();
    for (std::size_t i : {lowest, highest, first_gap}) {
      if (i != end) chosen.push_back(i);
    }
    std::sort(chosen.begin(), chosen.end());
    chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
    for (std::size_t i : chosen) kept.push_back(points[i]);
  }
  kept.push_back(points.back());
  return kept;
}

SeriesPoints smoothed(const SeriesPoints& points, double smoothing) {
  if (!(smoothing > 0 && smoothing < 1)) return points;
  SeriesPoints out;
  out.reserve(points.size());
  double average = 0, weight = 0;
  for (const auto& [step, value] : points) {
    if (!std::isfinite(value)) {
      out.emplace_back(step, value);
      continue;
    }
    average = average * smoothing + (1 - smoothing) * value;
    weight = weight * smoothing + (1 - smoothing);
    out.emplace_back(step, average / weight);
  }
  return out;
}

std::optional<XAxis> x_axis_named(std::string_view name) {
  if (name == "step") return XAxis::step;
  if (name == "time") return XAxis::wall_time;
  if (name == "relative") return XAxis::relative_time;
  return std::nullopt;
}

namespace {

constexpr double kMarginLeft = 64;
constexpr double kMarginRight = 20;
constexpr double kMarginTop = 32;
constexpr double kXAxisBand = 40;  // tick labels and the "step" label below the plot
constexpr double kLegendItemWidth = 180;
constexpr double kLegendRowHeight = 18;
constexpr std::size_t kLegendLabelChars = 24;
constexpr double kValueMargin = 0.04;  // of the value range, above and below
// A series of fewer values is drawn as it is, with a marker at each value, whatever the smoothing: a moving average
// of a few points hides them.
constexpr std::size_t kSparsePoints = 30;

std::size_t finite_count(const SeriesPoints& points) {
  return static_cast<std::size_t>(
      std::count_if(points.begin(), points.end(), [](const auto& point) { return std::isfinite(point.second); }));
}

// The ticks within [low, high]; nice ticks computed over that range leave at least two.
AxisTicks ticks_within(const AxisTicks& ticks, double low, double high) {
  const double slack = ticks.step * 1e-9;
  AxisTicks inside{ticks.step, {}};
  for (double v : ticks.values) {
    if (v >= low - slack && v <= high + slack) inside.values.push_back(v);
  }
  return inside;
}

// Maps data to pixels; y may be logarithmic.
struct Frame {
  double left, right, top, bottom;
  double x_low, x_high, y_low, y_high;  // y bounds in log10 units when log_y
  bool log_y = false;

  double x(double step) const { return left + (step - x_low) / (x_high - x_low) * (right - left); }
  double axis_y(double axis_value) const { return bottom - (axis_value - y_low) / (y_high - y_low) * (bottom - top); }
  double y(double value) const { return axis_y(log_y ? std::log10(value) : value); }
};

std::string format_linear_tick(double value, double step, double largest_magnitude) {
  if (value == 0) return "0";  // also -0
  if (step >= 1e-3 && largest_magnitude < 1e6) {
    const int decimals = std::max(0, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
    return fmt::format("{:.{}f}", value, decimals);
  }
  // Enough significant digits that neighbouring ticks differ.
  const int digits =
      std::max(1, static_cast<int>(std::floor(std::log10(largest_magnitude)) - std::floor(std::log10(step))) + 1);
  return fmt::format("{:.{}g}", value, digits);
}

std::string format_decade(int exponent) {
  if (exponent >= -3 && exponent <= 5) return fmt::format("{:g}", std::pow(10.0, exponent));
  return fmt::format("1e{}", exponent);
}

// Shortens to at most `limit` code points, ending in an ellipsis when cut.
std::string shorten(const std::string& text, std::size_t limit) {
  std::size_t code_points = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) continue;
    if (code_points++ == limit - 1) {
      std::size_t rest = 0;
      for (std::size_t j = i; j < text.size(); ++j) rest += (static_cast<unsigned char>(text[j]) & 0xC0) != 0x80;
      if (rest > 1) return text.substr(0, i) + "\u2026";
      return text;
    }
  }
  return text;
}

struct Extent {
  double low = std::numeric_limits<double>::infinity();
  double high = -std::numeric_limits<double>::infinity();
  bool empty() const { return low > high; }
  void add(double v) {
    low = std::min(low, v);
    high = std::max(high, v);
  }
};

// faded: the raw values under a smoothed line.
void append_polyline(std::string& svg, const ChartSeries& series, const std::vector<std::pair<double, double>>& run,
                     bool faded) {
  const std::string colour = escape_html(series.colour);
  const std::string label = escape_html(series.label);
  const char* opacity = faded ? " opacity=\"0.25\"" : "";
  if (run.size() == 1) {
    fmt::format_to(std::back_inserter(svg),
                   "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"{}><title>{}</title></circle>\n",
                   run[0].first, run[0].second, colour, opacity, label);
    return;
  }
  fmt::format_to(std::back_inserter(svg),
                 "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" stroke-linejoin=\"round\" "
                 "stroke-linecap=\"round\"{}",
                 colour, opacity);
  if (!series.dash_pattern.empty()) {
    fmt::format_to(std::back_inserter(svg), " stroke-dasharray=\"{}\"", escape_html(series.dash_pattern));
  }
  svg += " points=\"";
  for (std::size_t i = 0; i < run.size(); ++i) {
    fmt::format_to(std::back_inserter(svg), "{}{:.1f},{:.1f}", i ? " " : "", run[i].first, run[i].second);
  }
  fmt::format_to(std::back_inserter(svg), "\"><title>{}</title></polyline>\n", label);
}

// `points` already downsampled.
void append_series(std::string& svg, const ChartSeries& series, const SeriesPoints& points, const Frame& frame,
                   bool faded) {
  std::vector<std::pair<double, double>> run;
  for (const auto& [step, value] : points) {
    const double px = frame.x(static_cast<double>(step));
    const double py = std::isfinite(value) ? frame.y(value) : std::numeric_limits<double>::quiet_NaN();
    if (std::isfinite(px) && std::isfinite(py)) {
      run.emplace_back(px, py);
    } else if (!run.empty()) {
      append_polyline(svg, series, run, faded);
      run.clear();
    }
  }
  if (!run.empty()) append_polyline(svg, series, run, faded);
  // A sparse series (an evaluation every few thousand steps) gets a marker at each value.
  if (faded || finite_count(points) >= kSparsePoints) return;
  auto out = std::back_inserter(svg);
  for (const auto& [step, value] : points) {
    const double px = frame.x(static_cast<double>(step));
    const double py = std::isfinite(value) ? frame.y(value) : std::numeric_limits<double>::quiet_NaN();
    if (std::isfinite(px) && std::isfinite(py))
      fmt::format_to(out, "<circle class=\"marker\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"/>\n", px, py,
                     escape_html(series.colour));
  }
}

using Ticks = std::vector<std::pair<double, std::string>>;  // (axis value, label)

const char* x_axis_title(XAxis axis) {
  switch (axis) {
    case XAxis::wall_time:
      return "time";
    case XAxis::relative_time:
      return "time since the start";
    case XAxis::step:
      break;
  }
  return "step";
}

// A time axis counts in the largest of seconds, minutes, hours and days that its range holds twice.
double time_unit(double range) {
  for (const double unit : {86400.0, 3600.0, 60.0})
    if (range >= 2 * unit) return unit;
  return 1;
}

// The x ticks and their labels: steps as numbers; relative time as durations ("30s", "1.5h"); wall time as local
// clock times at round multiples of its unit ("14:05", "11-27 14:00" for days).
Ticks x_tick_labels(XAxis axis, double low, double high) {
  Ticks labels;
  if (axis == XAxis::step) {
    const AxisTicks ticks = ticks_within(nice_ticks(low, high, 6), low, high);
    for (double v : ticks.values)
      labels.emplace_back(v, format_linear_tick(v, ticks.step, std::abs(ticks.values.back())));
    return labels;
  }
  const double unit = time_unit(high - low);
  const AxisTicks ticks = ticks_within(nice_ticks(low / unit, high / unit, 6), low / unit, high / unit);
  const double largest = std::max(std::abs(ticks.values.front()), std::abs(ticks.values.back()));
  for (double v : ticks.values) {
    if (axis == XAxis::relative_time) {
      const char* suffix = unit == 86400 ? "d" : unit == 3600 ? "h" : unit == 60 ? "m" : "s";
      labels.emplace_back(v * unit, format_linear_tick(v, ticks.step, largest) + suffix);
      continue;
    }
    const double seconds = v * unit;
    const auto whole = static_cast<std::time_t>(std::floor(seconds));
    std::tm local{};
    localtime_r(&whole, &local);
    char text[32];
    std::strftime(text, sizeof text, unit >= 86400 ? "%m-%d %H:%M" : unit == 1 ? "%H:%M:%S" : "%H:%M", &local);
    std::string label = text;
    if (unit == 1 && ticks.step < 1) label += fmt::format("{:.1f}", seconds - std::floor(seconds)).substr(1);
    labels.emplace_back(seconds, label);
  }
  return labels;
}

// The points within the zoomed step range (all without one).
SeriesPoints points_in_range(const SeriesPoints& points, const std::optional<StepRange>& range) {
  if (!range) return points;
  SeriesPoints inside;
  for (const auto& point : points)
    if (point.first >= range->first && point.first <= range->last) inside.push_back(point);
  return inside;
}

// "1 2 5" / "0.5 nan 0.25": a data-* attribute's list, six significant digits.
std::string steps_attribute(const SeriesPoints& points) {
  std::string text;
  for (const auto& [step, value] : points)
    fmt::format_to(std::back_inserter(text), "{}{}", text.empty() ? "" : " ", step);
  return text;
}
std::string values_attribute(const SeriesPoints& points) {
  std::string text;
  for (const auto& [step, value] : points) {
    if (!text.empty()) text += ' ';
    text += std::isfinite(value) ? fmt::format("{:.6g}", value) : "nan";
  }
  return text;
}

// A series as drawn: the values to plot (smoothed or raw) and, when smoothed, the raw values under them; both
// cut to the zoomed range and downsampled.
struct DrawnSeries {
  SeriesPoints shown;
  SeriesPoints raw;                  // empty unless smoothed
  SeriesPoints band_low, band_high;  // the spread of a group, as given
};
DrawnSeries drawn_series(const ChartSeries& series, const ChartOptions& options) {
  DrawnSeries drawn;
  drawn.band_low =
      downsample_min_max(points_in_range(series.band_low, options.step_range), options.max_points_per_series);
  drawn.band_high =
      downsample_min_max(points_in_range(series.band_high, options.step_range), options.max_points_per_series);
  if (options.smoothing > 0 && finite_count(series.points) >= kSparsePoints) {
    drawn.shown = downsample_min_max(points_in_range(smoothed(series.points, options.smoothing), options.step_range),
                                     options.max_points_per_series);
    drawn.raw = downsample_min_max(points_in_range(series.points, options.step_range), options.max_points_per_series);
  } else {
    drawn.shown = downsample_min_max(points_in_range(series.points, options.step_range), options.max_points_per_series);
  }
  return drawn;
}

// A group's band: the area between its highest and lowest values, faded in its colour.
void append_band(std::string& svg, const ChartSeries& series, const DrawnSeries& drawn, const Frame& frame) {
  std::string points;
  auto add = [&](double x, double value) {
    const double px = frame.x(x), py = frame.y(value);
    if (std::isfinite(px) && std::isfinite(py))
      fmt::format_to(std::back_inserter(points), "{}{:.1f},{:.1f}", points.empty() ? "" : " ", px, py);
  };
  for (const auto& [x, value] : drawn.band_high)
    if (std::isfinite(value)) add(x, value);
  for (auto it = drawn.band_low.rbegin(); it != drawn.band_low.rend(); ++it)
    if (std::isfinite(it->second)) add(it->first, it->second);
  if (points.empty()) return;
  fmt::format_to(
      std::back_inserter(svg),
      "<polygon class=\"band\" fill=\"{}\" fill-opacity=\"0.2\" stroke=\"none\" points=\"{}\"><title>{}</title>"
      "</polygon>\n",
      escape_html(series.colour), points, escape_html(series.label));
}

// A reference line across the plot at its value, dashed, its label at its right end.
void append_reference_line(std::string& svg, const ReferenceLine& line, const Frame& frame) {
  const double y = frame.y(line.value);
  if (!std::isfinite(y)) return;
  fmt::format_to(std::back_inserter(svg),
                 "<g class=\"reference-line\" data-value=\"{:.6g}\"><line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" "
                 "y2=\"{:.1f}\" stroke=\"{}\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/><text x=\"{:.1f}\" "
                 "y=\"{:.1f}\" text-anchor=\"end\" fill=\"{}\">{}</text></g>\n",
                 line.value, frame.left, frame.right, y, y, escape_html(line.colour), frame.right - 4, y - 4,
                 escape_html(line.colour), escape_html(line.label));
}

// Grid lines, the two axes, tick labels and the x axis's label; ticks are (axis value, label).
void append_axes(std::string& svg, const Frame& frame, const Ticks& x_ticks, const Ticks& y_ticks,
                 const std::string& x_label) {
  auto out = std::back_inserter(svg);
  svg += "<g class=\"grid\" stroke=\"#e6e6e6\" stroke-width=\"1\">\n";
  for (const auto& [v, label] : y_ticks)
    fmt::format_to(out, "<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>\n", frame.left, frame.right,
                   frame.axis_y(v), frame.axis_y(v));
  for (const auto& [v, label] : x_ticks)
    fmt::format_to(out, "<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>\n", frame.x(v), frame.x(v),
                   frame.top, frame.bottom);
  svg += "</g>\n";
  fmt::format_to(out,
                 "<g class=\"axes\" stroke=\"#444\" stroke-width=\"1\"><line x1=\"{0}\" x2=\"{0}\" y1=\"{1}\" "
                 "y2=\"{2}\"/><line x1=\"{0}\" x2=\"{3}\" y1=\"{2}\" y2=\"{2}\"/></g>\n",
                 frame.left, frame.top, frame.bottom, frame.right);
  svg += "<g class=\"ticks\" fill=\"#444\">\n";
  for (const auto& [v, label] : y_ticks)
    fmt::format_to(out, "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" dy=\"0.35em\">{}</text>\n", frame.left - 6,
                   frame.axis_y(v), escape_html(label));
  for (const auto& [v, label] : x_ticks)
    fmt::format_to(out, "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", frame.x(v),
                   frame.bottom + 16, escape_html(label));
  fmt::format_to(out, "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#666\">{}</text>\n",
                 (frame.left + frame.right) / 2, frame.bottom + 32, escape_html(x_label));
  svg += "</g>\n";
}

}  // namespace

std::string render_line_chart(const std::vector<ChartSeries>& series, const ChartOptions& options) {
  std::vector<DrawnSeries> drawn;
  for (const auto& one : series) drawn.push_back(drawn_series(one, options));
  bool log_y = options.y_scale == YScale::log;
  if (options.y_scale == YScale::automatic) {
    std::vector<ChartSeries> visible;
    for (std::size_t i = 0; i < series.size(); ++i) visible.push_back({"", "", "", drawn[i].shown});
    log_y = wants_log_scale(visible);
  }
  // The extent of what is drawn: on a log axis, the positive values only.
  Extent steps, values;
  for (const auto& one : drawn) {
    for (const SeriesPoints* points : {&one.shown, &one.raw, &one.band_low, &one.band_high}) {
      for (const auto& [step, value] : *points) {
        if (!std::isfinite(value) || (log_y && value <= 0)) continue;
        steps.add(static_cast<double>(step));
        values.add(value);
      }
    }
  }
  for (const ReferenceLine& line : options.reference_lines)
    if (std::isfinite(line.value) && !values.empty() && !(log_y && line.value <= 0)) values.add(line.value);
  log_y = log_y && !values.empty();

  const int width = std::max(options.width, 200);
  const int legend_columns = std::max(1, static_cast<int>((width - kMarginLeft) / kLegendItemWidth));
  const int legend_rows = static_cast<int>((series.size() + legend_columns - 1) / legend_columns);
  Frame frame{};
  frame.left = kMarginLeft;
  frame.right = width - kMarginRight;
  frame.top = kMarginTop;
  frame.bottom = kMarginTop + std::max(options.plot_height, 60);
  frame.log_y = log_y;
  const double legend_top = frame.bottom + kXAxisBand + 8;
  const double note_top = legend_top + legend_rows * kLegendRowHeight;
  const double height = note_top + (options.legend_note.empty() ? 0 : kLegendRowHeight) + 4;

  std::string svg;
  auto out = std::back_inserter(svg);
  fmt::format_to(out,
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"{0}\" height=\"{1}\" "
                 "viewBox=\"0 0 {0} {1}\" role=\"img\" aria-label=\"{2}\" font-family=\"system-ui, sans-serif\" "
                 "font-size=\"11\">\n",
                 width, height, escape_html(options.title));
  fmt::format_to(out, "<text x=\"{}\" y=\"20\" font-size=\"14\" font-weight=\"600\" fill=\"#222\">{}</text>\n",
                 frame.left, escape_html(options.title));
  if (log_y) {
    fmt::format_to(out, "<text class=\"scale\" x=\"{}\" y=\"20\" text-anchor=\"end\" fill=\"#666\">log</text>\n",
                   frame.right);
  }

  if (values.empty()) {
    fmt::format_to(out,
                   "<rect x=\"{0}\" y=\"{1}\" width=\"{2}\" height=\"{3}\" fill=\"none\" stroke=\"#bbb\"/>\n"
                   "<text x=\"{4}\" y=\"{5}\" text-anchor=\"middle\" fill=\"#888\">no finite values</text>\n",
                   frame.left, frame.top, frame.right - frame.left, frame.bottom - frame.top,
                   (frame.left + frame.right) / 2, (frame.top + frame.bottom) / 2);
  } else {
    // x (the zoomed range when given): a short range is widened to a few steps (a second of time) so a single
    // point sits mid-axis.
    double x_low = options.step_range ? options.step_range->first : steps.low;
    double x_high = options.step_range ? options.step_range->last : steps.high;
    const double shortest = options.x_axis == XAxis::step ? 4 : 1;
    if (x_high - x_low < shortest) {
      x_low = options.x_axis == XAxis::step ? std::floor((x_low + x_high) / 2 - 2) : (x_low + x_high - shortest) / 2;
      if (steps.low >= 0) x_low = std::max(0.0, x_low);
      x_high = x_low + shortest;
    }
    frame.x_low = x_low;
    frame.x_high = x_high;

    // y: (value or log10 value, label) pairs.
    std::vector<std::pair<double, std::string>> y_ticks;
    if (log_y) {
      const int low_exponent = static_cast<int>(std::floor(std::log10(values.low)));
      int high_exponent = static_cast<int>(std::ceil(std::log10(values.high)));
      const int decade_step = std::max(1, (high_exponent - low_exponent + 5) / 6);
      while ((high_exponent - low_exponent) % decade_step) ++high_exponent;
      for (int e = low_exponent; e <= high_exponent; e += decade_step) y_ticks.emplace_back(e, format_decade(e));
      frame.y_low = low_exponent;
      frame.y_high = high_exponent;
    } else {
      double y_low = values.low, y_high = values.high;
      const double magnitude = std::max(std::abs(y_low), std::abs(y_high));
      if (!(y_high - y_low > 1e-9 * magnitude)) {  // constant, up to rounding
        const double pad = magnitude > 0 && std::isfinite(magnitude) ? magnitude * 0.1 : 1;
        y_low -= pad;
        y_high += pad;
      }
      if (std::isfinite(y_high - y_low)) {
        // Ticks come from the data's range; the axis adds a small margin so curves do not run along its edges.
        const AxisTicks covering = nice_ticks(y_low, y_high, 5);
        const double margin = (y_high - y_low) * kValueMargin;
        y_low -= margin;
        y_high += margin;
        const AxisTicks ticks = ticks_within(covering, y_low, y_high);
        const double largest = std::max(std::abs(ticks.values.front()), std::abs(ticks.values.back()));
        for (double v : ticks.values) y_ticks.emplace_back(v, format_linear_tick(v, ticks.step, largest));
      } else {
        y_ticks = {{y_low, fmt::format("{:.3g}", y_low)}, {y_high, fmt::format("{:.3g}", y_high)}};
      }
      frame.y_low = y_low;
      frame.y_high = y_high;
    }

    append_axes(svg, frame, x_tick_labels(options.x_axis, x_low, x_high), y_ticks, x_axis_title(options.x_axis));
    if (options.hover_data) {
      fmt::format_to(out,
                     "<rect class=\"plot-frame\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" "
                     "data-x=\"{} {}\" data-y=\"{:.9g} {:.9g}\" data-log=\"{}\"/>\n",
                     frame.left, frame.top, frame.right - frame.left, frame.bottom - frame.top, frame.x_low,
                     frame.x_high, frame.y_low, frame.y_high, log_y ? 1 : 0);
    }

    for (std::size_t i = 0; i < series.size(); ++i) append_band(svg, series[i], drawn[i], frame);
    for (std::size_t i = 0; i < series.size(); ++i) {
      if (options.hover_data) {
        fmt::format_to(out,
                       "<g class=\"series\" data-label=\"{}\" data-colour=\"{}\" data-steps=\"{}\" "
                       "data-values=\"{}\"",
                       escape_html(series[i].label), escape_html(series[i].colour), steps_attribute(drawn[i].shown),
                       values_attribute(drawn[i].shown));
        svg += ">\n";
      }
      if (!drawn[i].raw.empty()) append_series(svg, series[i], drawn[i].raw, frame, true);
      append_series(svg, series[i], drawn[i].shown, frame, false);
      if (options.hover_data) svg += "</g>\n";
    }
    for (const ReferenceLine& line : options.reference_lines) append_reference_line(svg, line, frame);
  }

  svg += "<g class=\"legend\">\n";
  for (std::size_t i = 0; i < series.size(); ++i) {
    const double x = frame.left + static_cast<double>(i % legend_columns) * kLegendItemWidth;
    const double y = legend_top + static_cast<double>(i / legend_columns) * kLegendRowHeight;
    fmt::format_to(out,
                   "<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-width=\"3\"", x,
                   x + 22, y, y, escape_html(series[i].colour));
    if (!series[i].dash_pattern.empty()) {
      fmt::format_to(out, " stroke-dasharray=\"{}\"", escape_html(series[i].dash_pattern));
    }
    fmt::format_to(out, "/><text x=\"{:.1f}\" y=\"{:.1f}\" dy=\"0.35em\" fill=\"#222\">{}<title>{}</title></text>\n",
                   x + 28, y, escape_html(shorten(series[i].label, kLegendLabelChars)), escape_html(series[i].label));
  }
  if (!options.legend_note.empty())
    fmt::format_to(out, "<text class=\"legend-note\" x=\"{:.1f}\" y=\"{:.1f}\" dy=\"0.35em\" fill=\"#555\">{}</text>\n",
                   frame.left, note_top, escape_html(options.legend_note));
  svg += "</g>\n</svg>\n";
  return svg;
}

std::string render_scatter_chart(const std::vector<ScatterPoint>& points, const ScatterOptions& options) {
  const bool categorical = !options.categories.empty();
  auto x_of = [&](double x) { return options.log_x && !categorical ? std::log10(x) : x; };
  Extent xs, ys;
  for (const ScatterPoint& point : points) {
    if (!std::isfinite(point.y) || !std::isfinite(x_of(point.x))) continue;
    xs.add(x_of(point.x));
    ys.add(point.y);
  }
  const int width = std::max(options.width, 200);
  Frame frame{};
  frame.left = kMarginLeft;
  frame.right = width - kMarginRight;
  frame.top = kMarginTop;
  frame.bottom = kMarginTop + std::max(options.plot_height, 60);
  const double height = frame.bottom + kXAxisBand + 4;
  std::string svg;
  auto out = std::back_inserter(svg);
  fmt::format_to(out,
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"{0}\" height=\"{1}\" "
                 "viewBox=\"0 0 {0} {1}\" role=\"img\" aria-label=\"{2}\" font-family=\"system-ui, sans-serif\" "
                 "font-size=\"11\">\n",
                 width, height, escape_html(options.title));
  fmt::format_to(out, "<text x=\"{}\" y=\"20\" font-size=\"14\" font-weight=\"600\" fill=\"#222\">{}</text>\n",
                 frame.left, escape_html(options.title));
  if (ys.empty()) {
    fmt::format_to(out,
                   "<rect x=\"{0}\" y=\"{1}\" width=\"{2}\" height=\"{3}\" fill=\"none\" stroke=\"#bbb\"/>\n"
                   "<text x=\"{4}\" y=\"{5}\" text-anchor=\"middle\" fill=\"#888\">no finite values</text>\n</svg>\n",
                   frame.left, frame.top, frame.right - frame.left, frame.bottom - frame.top,
                   (frame.left + frame.right) / 2, (frame.top + frame.bottom) / 2);
    return svg;
  }
  // x: categories at 0..n-1 with half a slot of room, else the data range with a margin.
  Ticks x_ticks;
  if (categorical) {
    frame.x_low = -0.5;
    frame.x_high = static_cast<double>(options.categories.size()) - 0.5;
    for (std::size_t i = 0; i < options.categories.size(); ++i)
      x_ticks.emplace_back(static_cast<double>(i), shorten(options.categories[i], 12));
  } else {
    double low = xs.low, high = xs.high;
    if (!(high - low > 1e-12 * std::max(1.0, std::abs(high)))) low -= 0.5, high += 0.5;
    const double margin = (high - low) * 0.05;
    frame.x_low = low - margin;
    frame.x_high = high + margin;
    const AxisTicks ticks = ticks_within(nice_ticks(low, high, 5), frame.x_low, frame.x_high);
    const double largest = std::max(std::abs(ticks.values.front()), std::abs(ticks.values.back()));
    for (double v : ticks.values)
      x_ticks.emplace_back(
          v, options.log_x ? fmt::format("{:.3g}", std::pow(10.0, v)) : format_linear_tick(v, ticks.step, largest));
  }
  double y_low = ys.low, y_high = ys.high;
  if (!(y_high - y_low > 1e-12 * std::max(1.0, std::abs(y_high)))) y_low -= 0.5, y_high += 0.5;
  const AxisTicks covering = nice_ticks(y_low, y_high, 5);
  const double margin = (y_high - y_low) * kValueMargin;
  frame.y_low = y_low - margin;
  frame.y_high = y_high + margin;
  const AxisTicks y_ticks = ticks_within(covering, frame.y_low, frame.y_high);
  const double y_largest = std::max(std::abs(y_ticks.values.front()), std::abs(y_ticks.values.back()));

  Ticks y_labels;
  for (double v : y_ticks.values) y_labels.emplace_back(v, format_linear_tick(v, y_ticks.step, y_largest));
  append_axes(svg, frame, x_ticks, y_labels, options.x_label + (options.log_x && !categorical ? " (log)" : ""));
  for (const ScatterPoint& point : points) {
    if (!std::isfinite(point.y) || !std::isfinite(x_of(point.x))) continue;
    const std::string colour = escape_html(point.colour);
    fmt::format_to(out, "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4.5\" {}><title>{}</title></circle>\n",
                   frame.x(x_of(point.x)), frame.y(point.y),
                   point.hollow ? fmt::format("fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"", colour)
                                : fmt::format("fill=\"{}\" fill-opacity=\"0.85\"", colour),
                   escape_html(point.label));
  }
  svg += "</svg>\n";
  return svg;
}

std::string render_parallel_coordinates(const std::vector<ParallelAxis>& axes, const std::vector<ParallelLine>& lines,
                                        const ParallelOptions& options) {
  const int width = std::max(options.width, 200);
  const double left = 50, right = width - 50.0, top = kMarginTop + 14;
  const double bottom = top + std::max(options.plot_height, 60);
  const double height = bottom + 34;
  std::string svg;
  auto out = std::back_inserter(svg);
  fmt::format_to(out,
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"{0}\" height=\"{1}\" "
                 "viewBox=\"0 0 {0} {1}\" role=\"img\" aria-label=\"{2}\" font-family=\"system-ui, sans-serif\" "
                 "font-size=\"11\">\n",
                 width, height, escape_html(options.title));
  fmt::format_to(out, "<text x=\"{}\" y=\"20\" font-size=\"14\" font-weight=\"600\" fill=\"#222\">{}</text>\n",
                 kMarginLeft, escape_html(options.title));
  // Each axis: where it stands, and its value range (log10 units on a log axis).
  const std::size_t count = axes.size();
  auto axis_x = [&](std::size_t a) {
    return count == 1 ? (left + right) / 2 : left + (right - left) * static_cast<double>(a) / (count - 1);
  };
  auto axis_value = [&](std::size_t a, double v) {
    if (!axes[a].categories.empty() || !axes[a].log_scale) return v;
    return v > 0 ? std::log10(v) : std::numeric_limits<double>::quiet_NaN();
  };
  std::vector<Extent> extents(count);
  for (std::size_t a = 0; a < count; ++a) {
    if (!axes[a].categories.empty()) {
      extents[a].add(0);
      extents[a].add(static_cast<double>(axes[a].categories.size()) - 1);
    }
    for (const ParallelLine& line : lines)
      if (a < line.values.size() && std::isfinite(axis_value(a, line.values[a])))
        extents[a].add(axis_value(a, line.values[a]));
  }
  auto y_of = [&](std::size_t a, double v) {
    const Extent& e = extents[a];
    const double span = e.high - e.low;
    if (!(span > 0)) return (top + bottom) / 2;
    return bottom - (axis_value(a, v) - e.low) / span * (bottom - top);
  };
  auto label_of = [&](std::size_t a, double axis_units) {
    return axes[a].log_scale && axes[a].categories.empty() ? fmt::format("{:.3g}", std::pow(10.0, axis_units))
                                                           : fmt::format("{:.4g}", axis_units);
  };
  // Lines first, the emphasised ones last (on top), then the axes over them.
  for (int pass = 0; pass < 2; ++pass) {
    for (const ParallelLine& line : lines) {
      if (line.emphasised != (pass == 1)) continue;
      std::string points;
      for (std::size_t a = 0; a < count; ++a) {
        const double v = a < line.values.size() ? line.values[a] : std::numeric_limits<double>::quiet_NaN();
        if (!std::isfinite(axis_value(a, v))) continue;
        fmt::format_to(std::back_inserter(points), "{}{:.1f},{:.1f}", points.empty() ? "" : " ", axis_x(a), y_of(a, v));
      }
      if (points.find(' ') != std::string::npos)
        fmt::format_to(out,
                       "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"{}\" stroke-opacity=\"{}\" "
                       "points=\"{}\"><title>{}</title></polyline>\n",
                       escape_html(line.colour), line.emphasised ? 3 : 1.5, line.emphasised ? 1 : 0.7, points,
                       escape_html(line.label));
    }
  }
  for (std::size_t a = 0; a < count; ++a) {
    const double x = axis_x(a);
    fmt::format_to(out, "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#444\"/>\n", x, top,
                   bottom);
    fmt::format_to(out,
                   "<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" font-weight=\"600\" fill=\"#222\">{}</text>\n",
                   x, top - 8, escape_html(shorten(axes[a].name, 18)));
    if (extents[a].empty()) continue;
    if (!axes[a].categories.empty()) {
      for (std::size_t c = 0; c < axes[a].categories.size(); ++c)
        fmt::format_to(out, "<text x=\"{:.1f}\" y=\"{:.1f}\" dy=\"0.35em\" fill=\"#444\">{}</text>\n", x + 4,
                       y_of(a, static_cast<double>(c)), escape_html(shorten(axes[a].categories[c], 12)));
    } else {
      fmt::format_to(out, "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#444\">{}</text>\n", x,
                     bottom + 14, escape_html(label_of(a, extents[a].low)));
      if (extents[a].high > extents[a].low)
        fmt::format_to(out, "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#444\">{}</text>\n", x,
                       bottom + 28, escape_html("to " + label_of(a, extents[a].high)));
    }
  }
  svg += "</svg>\n";
  return svg;
}

std::string render_bar_chart(const std::vector<Bar>& bars, const BarOptions& options) {
  constexpr double kLabelWidth = 130, kRowHeight = 22, kValueWidth = 50;
  const int width = std::max(options.width, 240);
  const double top = kMarginTop, bar_left = kLabelWidth, bar_right = width - kValueWidth;
  const double height = top + std::max<double>(1, bars.size()) * kRowHeight + 8;
  double largest = options.max_value > 0 ? options.max_value : 1;
  for (const Bar& bar : bars)
    if (std::isfinite(bar.value)) largest = std::max(largest, bar.value);
  std::string svg;
  auto out = std::back_inserter(svg);
  fmt::format_to(out,
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"{0}\" height=\"{1}\" "
                 "viewBox=\"0 0 {0} {1}\" role=\"img\" aria-label=\"{2}\" font-family=\"system-ui, sans-serif\" "
                 "font-size=\"11\">\n",
                 width, height, escape_html(options.title));
  fmt::format_to(out, "<text x=\"8\" y=\"20\" font-size=\"14\" font-weight=\"600\" fill=\"#222\">{}</text>\n",
                 escape_html(options.title));
  if (bars.empty())
    fmt::format_to(out, "<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#888\">no values</text>\n", bar_left, top + 14);
  for (std::size_t i = 0; i < bars.size(); ++i) {
    const double y = top + static_cast<double>(i) * kRowHeight;
    const double value = std::isfinite(bars[i].value) ? std::max(0.0, bars[i].value) : 0;
    const double length = (bar_right - bar_left) * value / largest;
    fmt::format_to(
        out,
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" dy=\"0.35em\" fill=\"#222\">{}</text>\n"
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"><title>{}</title></rect>\n"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" dy=\"0.35em\" fill=\"#444\">{:.2f}</text>\n",
        bar_left - 6, y + kRowHeight / 2, escape_html(shorten(bars[i].label, 20)), bar_left, y + 4, length,
        kRowHeight - 8, escape_html(bars[i].colour), escape_html(bars[i].note), bar_left + length + 4,
        y + kRowHeight / 2, value);
  }
  svg += "</svg>\n";
  return svg;
}

std::string render_histogram_chart(double low, double high, const std::vector<int64_t>& counts,
                                   const HistogramOptions& options) {
  const int width = std::max(options.width, 240);
  const double height = kMarginTop + options.plot_height + kXAxisBand + 8;
  Frame frame{kMarginLeft, width - kMarginRight, kMarginTop, kMarginTop + options.plot_height, low, high, 0, 1};
  std::string svg;
  auto out = std::back_inserter(svg);
  fmt::format_to(out,
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart histogram\" width=\"{0}\" height=\"{1}\" "
                 "viewBox=\"0 0 {0} {1}\" role=\"img\" aria-label=\"{2}\" font-family=\"system-ui, sans-serif\" "
                 "font-size=\"11\">\n",
                 width, height, escape_html(options.title));
  fmt::format_to(out, "<text x=\"8\" y=\"20\" font-size=\"14\" font-weight=\"600\" fill=\"#222\">{}</text>\n",
                 escape_html(options.title));
  int64_t largest = 0;
  for (int64_t count : counts) largest = std::max(largest, count);
  if (counts.empty() || !(high > low) || !std::isfinite(low) || !std::isfinite(high)) {
    fmt::format_to(out,
                   "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#888\">no finite values</text>\n",
                   (frame.left + frame.right) / 2, (frame.top + frame.bottom) / 2);
    svg += "</svg>\n";
    return svg;
  }
  const AxisTicks y_ticks = nice_ticks(0, static_cast<double>(std::max<int64_t>(largest, 1)), 4);
  frame.y_high = y_ticks.values.back();
  Ticks y_labels, x_labels;
  for (double v : y_ticks.values) y_labels.emplace_back(v, format_linear_tick(v, y_ticks.step, frame.y_high));
  const AxisTicks x_ticks = ticks_within(nice_ticks(low, high, 6), low, high);
  const double x_largest = std::max(std::abs(x_ticks.values.front()), std::abs(x_ticks.values.back()));
  for (double v : x_ticks.values) x_labels.emplace_back(v, format_linear_tick(v, x_ticks.step, x_largest));
  append_axes(svg, frame, x_labels, y_labels, "value");
  const double bin = (high - low) / static_cast<double>(counts.size());
  svg += "<g class=\"bins\">\n";
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const double from = low + bin * static_cast<double>(i), to = from + bin;
    const double top = frame.axis_y(static_cast<double>(counts[i]));
    fmt::format_to(out,
                   "<rect class=\"bin\" x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\" "
                   "data-count=\"{}\"><title>[{:.6g}, {:.6g}{}: {}</title></rect>\n",
                   frame.x(from), top, std::max(0.0, frame.x(to) - frame.x(from) - 0.5), frame.bottom - top,
                   escape_html(options.colour), counts[i], from, to, i + 1 == counts.size() ? "]" : ")", counts[i]);
  }
  svg += "</g>\n</svg>\n";
  return svg;
}

}  // namespace runner::report
