// Inline SVG charts of metric series (step on x, value on y) and of sweep results: the one chart implementation
// of the HTML reports and of the dashboard (`runner serve`), which requests the same SVG and adds hover and zoom.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace runner::report {

// (x, value), sorted by x: the step, or seconds on a time axis (XAxis).
using SeriesPoints = std::vector<std::pair<double, double>>;

// Escapes &, <, >, " and ' so the text is safe both as element content and as a quoted attribute value
// (in HTML and in inline SVG).
std::string escape_html(std::string_view text);

struct ChartSeries {
  std::string label;         // legend and hover text
  std::string colour;        // CSS colour, e.g. "#1f77b4"
  std::string dash_pattern;  // SVG stroke-dasharray; empty draws a solid line
  SeriesPoints points;       // non-finite values break the line
  // A group's spread around its line (runs grouped by config): a filled area up to band_high and down to band_low
  // (each sorted by x, finite values only); both empty draw none.
  SeriesPoints band_low, band_high;
};

// A horizontal dashed line at a value, labelled (a metric's floor: `swd_floor` beside `swd`).
struct ReferenceLine {
  double value = 0;
  std::string label;
  std::string colour;
};

// automatic: logarithmic when wants_log_scale says so. log: values <= 0 are left out (gaps).
enum class YScale { automatic, linear, log };

struct StepRange {
  double first = 0;  // the x values shown (steps, or seconds on a time axis), both included
  double last = 0;
};

// What a line chart's x is: the step; the time, Unix seconds drawn as local clock times (W&B's "wall time"); or
// seconds since the run started, drawn as a duration (its "relative time").
enum class XAxis { step, wall_time, relative_time };
// The axis a user names: "step", "time" (wall time) or "relative"; none for any other name.
std::optional<XAxis> x_axis_named(std::string_view name);

struct ChartOptions {
  std::string title;
  int width = 580;
  int plot_height = 260;  // the plot area; the legend below it adds rows as needed
  std::size_t max_points_per_series = 2000;
  YScale y_scale = YScale::automatic;
  // In [0, 1): each series is drawn faded and, over it, its exponential moving average with this weight,
  // debiased at the start (TensorBoard's and W&B's smoothing); 0 draws the values only. A series of fewer than 30
  // values is drawn unsmoothed, with a marker at each value.
  double smoothing = 0;
  XAxis x_axis = XAxis::step;
  std::optional<StepRange> step_range;  // zoom: only these x values; none: all
  // For the dashboard's hover and zoom: the plot area as an unpainted <rect class="plot-frame"> with its axes'
  // ranges (data-x: first and last x, data-y: lowest and highest value, in log10 units when data-log is 1), and
  // each series in a <g class="series"> with data-label, data-colour, data-steps and data-values (the values drawn:
  // smoothed ones with smoothing). The drawing is the same without them.
  bool hover_data = false;
  std::vector<ReferenceLine> reference_lines;  // drawn within the y axis, which stretches to hold them
  std::string legend_note;                     // a line under the legend (what a group's line and band show)
};

// The exponential moving average of the finite values with weight `smoothing`, divided by 1 - smoothing^n after n
// values (so the first values are not pulled towards 0); non-finite values stay as they are and leave the average
// unchanged.
SeriesPoints smoothed(const SeriesPoints& points, double smoothing);

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

// An axis of a parallel-coordinates chart: a parameter or the objective.
struct ParallelAxis {
  std::string name;
  bool log_scale = false;               // values drawn on a log10 axis (all must be positive)
  std::vector<std::string> categories;  // non-empty: a line's value on this axis is an index into these
};

// One trial: a value per axis (NaN where it has none: the line goes from the axis before to the one after).
struct ParallelLine {
  std::vector<double> values;
  std::string colour;
  bool emphasised = false;  // drawn thicker and on top (the best trial)
  std::string label;        // hover text
};

struct ParallelOptions {
  std::string title;
  int width = 820;
  int plot_height = 240;
};

// One <svg> element: a vertical axis per ParallelAxis, left to right, each scaled to its lines' values (with its
// lowest and highest value, or its categories, as labels), and one polyline per line. Never emits "nan" or "inf".
std::string render_parallel_coordinates(const std::vector<ParallelAxis>& axes, const std::vector<ParallelLine>& lines,
                                        const ParallelOptions& options);

struct Bar {
  std::string label;
  double value = 0;  // finite and >= 0
  std::string colour;
  std::string note;  // hover text
};

struct BarOptions {
  std::string title;
  double max_value = 1;  // the value axis runs from 0 to this (or to the largest value when larger)
  int width = 400;
};

// One <svg> element: a horizontal bar per entry, labelled on the left, its value written after it.
std::string render_bar_chart(const std::vector<Bar>& bars, const BarOptions& options);

struct HistogramOptions {
  std::string title;
  std::string colour = "#1f77b4";
  int width = 580;
  int plot_height = 200;
};

// One <svg> element: a histogram (TensorBoard's, one step of it): a bar per count in equal bins over [low, high]
// (x: the value, y: the count), each a <rect class="bin" data-count="N"> titled with its interval; "no finite
// values" without bins or a range.
std::string render_histogram_chart(double low, double high, const std::vector<int64_t>& counts,
                                   const HistogramOptions& options);

}  // namespace runner::report
