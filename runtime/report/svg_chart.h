// Inline SVG line charts of metric series (step on x, value on y) for the HTML report.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace runner::report {

using SeriesPoints = std::vector<std::pair<int64_t, double>>;  // (step, value), sorted by step

// Escapes &, <, >, " and ' so the text is safe both as element content and as a quoted attribute value
// (in HTML and in inline SVG).
std::string escape_html(std::string_view text);

struct ChartSeries {
  std::string label;         // legend and hover text
  std::string colour;        // CSS colour, e.g. "#1f77b4"
  std::string dash_pattern;  // SVG stroke-dasharray; empty draws a solid line
  SeriesPoints points;       // non-finite values break the line
};

struct ChartOptions {
  std::string title;
  int width = 580;
  int plot_height = 260;  // the plot area; the legend below it adds rows as needed
  std::size_t max_points_per_series = 2000;
};

// Evenly spaced ticks at multiples of 1, 2 or 5 x 10^k that cover [low, high]; first and last tick are the
// axis bounds (they may lie outside the data).
struct AxisTicks {
  double step = 1;
  std::vector<double> values;
};
// low < high; target_intervals is about how many intervals the range is split into.
AxisTicks nice_ticks(double low, double high, int target_intervals = 5);

// A logarithmic y axis is used when every finite value is positive and max/min exceeds 100.
bool wants_log_scale(const std::vector<ChartSeries>& series);

// Keeps the first and last point and, for buckets of consecutive points, the minimum and maximum finite
// value (so spikes survive) and the first non-finite point (so gaps survive). Returns the points unchanged
// when there are at most max_points; otherwise at most max_points (>= 8) points, in step order.
SeriesPoints downsample_min_max(const SeriesPoints& points, std::size_t max_points);

// One <svg> element: title, axes with tick labels, grid lines, one polyline per unbroken run of finite points
// (a lone point is a dot), and a legend naming each series in its colour. Never emits "nan" or "inf".
std::string render_line_chart(const std::vector<ChartSeries>& series, const ChartOptions& options);

// A point of a scatter chart: x is a number (or, with categories, the index of one), y a value.
struct ScatterPoint {
  double x = 0;
  double y = 0;
  std::string colour;   // CSS colour
  bool hollow = false;  // drawn as a ring (e.g. a trial stopped early)
  std::string label;    // hover text
};

struct ScatterOptions {
  std::string title;
  std::string x_label;
  bool log_x = false;                   // x values are drawn on a log10 axis (all must be positive)
  std::vector<std::string> categories;  // non-empty: x is an index into these, drawn as labelled positions
  int width = 400;
  int plot_height = 220;
};

// One <svg> element: axes with ticks (x numeric, log or categorical; y linear), one circle per finite point.
// Never emits "nan" or "inf".
std::string render_scatter_chart(const std::vector<ScatterPoint>& points, const ScatterOptions& options);

}  // namespace runner::report
