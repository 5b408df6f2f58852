// The self-contained HTML report of a sweep: the best trial and its command line, the objective against
// each parameter, the parameters' importance, parallel coordinates, the ASHA rungs, the learning curves of every
// trial (those ASHA stopped early dashed), and the trials. The dashboard shows the same charts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/report/svg_chart.h"

namespace runner::report {

struct SweepReportParameter {
  std::string name;
  bool log_scale = false;               // drawn on a log axis (log-uniform, log int)
  std::vector<std::string> categories;  // a list of values that are not all numbers: drawn by position
  std::optional<double> importance;     // sweep::parameter_importance over the finished trials
};

struct SweepReportTrial {
  std::int64_t trial = 0;
  std::string status;  // finished, pruned, paused, running, stopped, failed
  std::optional<double> value;
  std::int64_t step = 0;
  int rung = 0;
  std::string run_id;
  nlohmann::json params = nlohmann::json::object();
  SeriesPoints curve;  // the metric over the report's curves_x
  std::string error;
};

// An ASHA result: the trial's objective at a rung (counting from 1), measured at `step`.
struct SweepReportRung {
  std::int64_t trial = 0;
  int rung = 0;
  std::int64_t step = 0;
  double value = 0;
};

struct SweepReport {
  std::string name;  // the sweep's
  std::string title;
  std::string generated_at;
  std::string status;   // as shown: running, stopped (no live worker holds it), finished, failed
  std::string summary;  // one line: status, method, trials, metric and mode, pruner
  std::string metric;
  bool minimize = true;
  std::vector<SweepReportParameter> parameters;
  std::vector<SweepReportTrial> trials;  // in the order the table shows them
  bool asha = false;                     // whether the sweep prunes with ASHA
  std::vector<SweepReportRung> rungs;    // empty without ASHA
  std::optional<std::int64_t> best_trial;
  std::string best_command;
  XAxis curves_x = XAxis::step;  // what the trials' curves are over
};

// The page's charts, each one <svg>: the objective against each parameter (one per parameter, in order), the
// parameters' importance, parallel coordinates (the parameters and the objective), the ASHA rungs' results, and
// the learning curves.
std::vector<std::string> objective_charts(const SweepReport& report);
std::string importance_chart(const SweepReport& report);
std::string parallel_coordinates_chart(const SweepReport& report);
std::string rungs_chart(const SweepReport& report);
std::string curves_chart(const SweepReport& report, const ChartOptions& options = {});

std::string render_sweep_report(const SweepReport& report);
// Written atomically (core::AtomicFileWriter, whose errors name `path`).
void write_sweep_report(const std::string& path, const SweepReport& report);

}  // namespace runner::report
