// The self-contained HTML report of one or more runs: run table, metric charts, config diff, latest samples.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/report/svg_chart.h"

namespace runner::report {

struct ReportImage {
  std::string name;      // artifact name, e.g. "samples"
  int64_t step = 0;      // training step it was written at
  std::string png_path;  // an existing PNG file, embedded as a base64 data: URI
};

struct ReportRun {
  std::string id;       // e.g. "k3f9a2b1"
  std::string name;     // e.g. "quickstart-3"
  std::string status;   // running | finished | failed | interrupted
  std::string started;  // already formatted, e.g. "2026-11-22 14:03"
  double duration_seconds = 0;
  int64_t step = 0;
  nlohmann::json config;                        // object: key -> number/bool/string/array
  nlohmann::json summary;                       // object: key -> number/string
  std::map<std::string, SeriesPoints> metrics;  // key -> (step, value) sorted by step; NaN values possible
  std::optional<std::string> error;             // why a failed or interrupted run ended
  std::vector<std::string> tags;
  std::optional<std::string> note;
  std::vector<ReportImage> images;  // every image grid, in any order
  // The run's colour and line style (run_colour_slot of its number in the index); none (a run built by hand): its
  // position among the runs drawn.
  std::optional<std::size_t> colour_slot;
};

// Runs drawn as one curve per metric: the mean of their values at each x, over a band from the lowest to the
// highest of them (runs of several seeds, grouped by config as `runner runs --group` groups them).
struct CurveGroup {
  std::string label;              // e.g. "lr=0.01"
  std::vector<std::size_t> runs;  // positions in the report's runs
};

struct ReportOptions {
  std::string title = "runner report";
  std::string generated_at;  // shown under the title when not empty
  std::size_t max_points_per_series = 2000;
  XAxis x_axis = XAxis::step;      // what the runs' series are over (load_report_run's x)
  std::vector<CurveGroup> groups;  // none: a curve per run
};

// The whole page: one HTML5 document with inline CSS and SVG, no script and no external URL. Reads the PNG
// files; throws std::runtime_error whose message starts with the path of a PNG that cannot be read or is
// not a PNG.
std::string render_html_report(const std::vector<ReportRun>& runs, const ReportOptions& options);

// render_html_report written atomically through core::AtomicFileWriter (whose errors name `path`).
void write_html_report(const std::string& path, const std::vector<ReportRun>& runs, const ReportOptions& options);

// The chart of metric `key` over the runs, each in its run colour (run_colour; dashed beyond ten runs), titled
// `key`: the one the report shows, and the dashboard (which sets hover_data, zoom, smoothing and the scale). With
// groups, a mean line and a min..max band per group in the colour of its first run, the legend saying so. A run's
// floor of the metric (`KEY_floor`: its summary value, else its latest logged value) is a dashed horizontal line
// labelled "KEY_floor VALUE".
std::string render_metric_chart(const std::vector<ReportRun>& runs, const std::string& key, ChartOptions options,
                                const std::vector<CurveGroup>& groups = {});

// The reports' stylesheet (also the sweep report's and the dashboard's).
const char* report_style();

// Standard base64 (RFC 4648, with '=' padding).
std::string base64_encode(std::string_view bytes);

// matplotlib's tab10 colour of the run at this colour slot (cycling after ten).
const std::string& run_colour(std::size_t run_index);
// A run's colour slot: its number in the index (index::RunRecord::run, from 1) less one, so that a run has the same
// colour in every report and on every page of the dashboard, wherever it stands among the runs shown.
std::size_t run_colour_slot(std::int64_t run_number);

// The order metrics are shown in (the report's charts, the dashboard's columns and charts): "loss" first when
// present, then the script's other metrics by name, those with a name prefix ("eval/") first, so each prefix's keys
// come together, then runner's own timings (the trainer's time/*) by name, then the run's system metrics (sys/*,
// run/system_metrics.h) by name.
std::vector<std::string> ordered_metric_keys(std::set<std::string> keys);
// The charts' sections: consecutive keys of that order that share a prefix (the text up to and including the first
// '/': "eval/", "time/"; "" for none), each with a heading in the report and on the dashboard's run page.
struct MetricSection {
  std::string prefix;
  std::vector<std::string> keys;
};
std::vector<MetricSection> metric_sections(const std::vector<std::string>& ordered_keys);
// Metric keys of all runs, in that order.
std::vector<std::string> metric_keys(const std::vector<ReportRun>& runs);

}  // namespace runner::report
