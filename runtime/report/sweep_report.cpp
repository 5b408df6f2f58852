// The sweep report page and its charts: summary, best trial, objective by parameter, importance, parallel
// coordinates, ASHA rungs, curves, trial table.
#include "runtime/report/sweep_report.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "runtime/core/atomic_file.h"
#include "runtime/core/json_text.h"
#include "runtime/report/html_report.h"
#include "runtime/sweep/parameter_importance.h"

namespace runner::report {
namespace {

constexpr const char* kFinished = "#1f77b4";
constexpr const char* kBest = "#d62728";
constexpr const char* kStopped = "#8c8c8c";

std::string value_text(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_float()) return fmt::format("{:.6g}", value.get<double>());
  return core::json_text(value);
}

std::string colour_of(const SweepReport& report, const SweepReportTrial& trial) {
  if (report.best_trial && *report.best_trial == trial.trial) return kBest;
  return trial.status == "finished" ? kFinished : kStopped;
}

// A finished trial's colour by its objective's rank among the finished trials: dark blue for the best, light for
// the worst.
std::string rank_colour(double quality) {
  const int light[3] = {0xc6, 0xdb, 0xef}, dark[3] = {0x08, 0x30, 0x6b};
  std::string colour = "#";
  for (int c = 0; c < 3; ++c)
    colour += fmt::format("{:02x}", static_cast<int>(std::lround(light[c] + (dark[c] - light[c]) * quality)));
  return colour;
}

// A parameter's value as a chart coordinate: the index of its category, or the number; none otherwise.
std::optional<double> coordinate(const SweepReportParameter& parameter, const nlohmann::json& params) {
  if (!params.contains(parameter.name)) return std::nullopt;
  const nlohmann::json& value = params[parameter.name];
  if (!parameter.categories.empty()) {
    const std::string text = value_text(value);
    for (size_t i = 0; i < parameter.categories.size(); ++i)
      if (parameter.categories[i] == text) return static_cast<double>(i);
    return std::nullopt;
  }
  if (value.is_number()) return value.get<double>();
  return std::nullopt;
}

}  // namespace

std::vector<std::string> objective_charts(const SweepReport& report) {
  std::vector<std::string> charts;
  for (const SweepReportParameter& parameter : report.parameters) {
    std::vector<ScatterPoint> points;
    for (const SweepReportTrial& trial : report.trials) {
      const std::optional<double> x = coordinate(parameter, trial.params);
      if (!trial.value || !x) continue;
      points.push_back({*x, *trial.value, colour_of(report, trial), trial.status != "finished",
                        fmt::format("trial {} ({}): {} = {}, {} {:.6g}", trial.trial, trial.status, parameter.name,
                                    value_text(trial.params[parameter.name]), report.metric, *trial.value)});
    }
    ScatterOptions options;
    options.title = report.metric + " by " + parameter.name;
    options.x_label = parameter.name;
    options.log_x = parameter.log_scale;
    options.categories = parameter.categories;
    charts.push_back(render_scatter_chart(points, options));
  }
  return charts;
}

std::string importance_chart(const SweepReport& report) {
  std::vector<Bar> bars;
  for (const SweepReportParameter& parameter : report.parameters)
    if (parameter.importance)
      bars.push_back({parameter.name, *parameter.importance, kFinished,
                      fmt::format("{}: {:.3f}", parameter.name, *parameter.importance)});
  std::stable_sort(bars.begin(), bars.end(), [](const Bar& a, const Bar& b) { return a.value > b.value; });
  BarOptions options;
  options.title = "parameter importance";
  return render_bar_chart(bars, options);
}

std::string parallel_coordinates_chart(const SweepReport& report) {
  std::vector<ParallelAxis> axes;
  for (const SweepReportParameter& parameter : report.parameters)
    axes.push_back({parameter.name, parameter.log_scale, parameter.categories});
  axes.push_back({report.metric, false, {}});
  std::vector<double> finished_values;
  for (const SweepReportTrial& trial : report.trials)
    if (trial.status == "finished" && trial.value && std::isfinite(*trial.value))
      finished_values.push_back(*trial.value);
  std::sort(finished_values.begin(), finished_values.end());
  std::vector<ParallelLine> lines;
  for (const SweepReportTrial& trial : report.trials) {
    ParallelLine line;
    for (const SweepReportParameter& parameter : report.parameters)
      line.values.push_back(coordinate(parameter, trial.params).value_or(NAN));
    line.values.push_back(trial.value.value_or(NAN));
    line.emphasised = report.best_trial && *report.best_trial == trial.trial;
    if (line.emphasised) {
      line.colour = kBest;
    } else if (trial.status == "finished" && trial.value && finished_values.size() > 1) {
      // 1 for the best value, 0 for the worst.
      const double position =
          static_cast<double>(std::lower_bound(finished_values.begin(), finished_values.end(), *trial.value) -
                              finished_values.begin()) /
          static_cast<double>(finished_values.size() - 1);
      line.colour = rank_colour(report.minimize ? 1 - position : position);
    } else {
      line.colour = trial.status == "finished" ? kFinished : kStopped;
    }
    line.label = fmt::format("trial {} ({}){}", trial.trial, trial.status,
                             trial.value ? fmt::format(": {} {:.6g}", report.metric, *trial.value) : "");
    lines.push_back(std::move(line));
  }
  ParallelOptions options;
  options.title = "parameters and " + report.metric;
  return render_parallel_coordinates(axes, lines, options);
}

std::string rungs_chart(const SweepReport& report) {
  int highest = 0;
  for (const SweepReportRung& row : report.rungs) highest = std::max(highest, row.rung);
  if (highest == 0) return "";
  std::vector<std::string> categories;
  for (int rung = 1; rung <= highest; ++rung) {
    std::int64_t step = 0;
    for (const SweepReportRung& row : report.rungs)
      if (row.rung == rung) step = row.step;
    categories.push_back(fmt::format("{}: step {}", rung, step));
  }
  // A trial went on from a rung when it reached the next one or finished.
  auto went_on = [&](const SweepReportRung& row) {
    for (const SweepReportRung& other : report.rungs)
      if (other.trial == row.trial && other.rung == row.rung + 1) return true;
    for (const SweepReportTrial& trial : report.trials)
      if (trial.trial == row.trial && trial.status == "finished") return true;
    return false;
  };
  std::vector<ScatterPoint> points;
  for (const SweepReportRung& row : report.rungs) {
    const bool promoted = went_on(row);
    points.push_back({static_cast<double>(row.rung - 1), row.value, promoted ? kFinished : kStopped, !promoted,
                      fmt::format("trial {} at rung {} (step {}): {} {:.6g}{}", row.trial, row.rung, row.step,
                                  report.metric, row.value, promoted ? ", went on" : ", stopped here")});
  }
  ScatterOptions options;
  options.title = "ASHA rungs: " + report.metric;
  options.x_label = "rung: the step it is measured at";
  options.categories = categories;
  options.width = 120 + 140 * highest;
  return render_scatter_chart(points, options);
}

std::string curves_chart(const SweepReport& report, const ChartOptions& given) {
  std::vector<ChartSeries> series;
  size_t colour = 0;
  for (const SweepReportTrial& trial : report.trials) {
    if (trial.curve.empty()) continue;
    ChartSeries one;
    one.label = fmt::format("trial {}{}", trial.trial, trial.status == "finished" ? "" : " (" + trial.status + ")");
    const bool best = report.best_trial && *report.best_trial == trial.trial;
    if (best) {
      one.colour = kBest;
    } else if (trial.status == "finished") {
      // The runs' palette without the best trial's red, so that no other trial looks like the best.
      do {
        one.colour = run_colour(colour++);
      } while (one.colour == kBest);
    } else {
      one.colour = kStopped;
    }
    if (trial.status != "finished") one.dash_pattern = "4 3";
    one.points = trial.curve;
    series.push_back(std::move(one));
  }
  ChartOptions options = given;
  options.title = report.metric + " of every trial";
  options.x_axis = report.curves_x;
  options.width = 820;
  return render_line_chart(series, options);
}

namespace {

void append_sweep_charts(std::string& html, const SweepReport& report) {
  html +=
      "<h2>The objective against each parameter</h2>\n<p class=\"note\">Filled: finished trials (the best in "
      "red); rings: trials ASHA stopped at a rung, at their last rung value.</p>\n<div class=\"charts\">\n";
  for (const std::string& chart : objective_charts(report)) html += chart;
  html += "</div>\n<h2>Parameter importance</h2>\n<p class=\"note\">" + escape_html(sweep::kImportanceMethod) +
          ".</p>\n<div class=\"charts\">\n" + importance_chart(report) + "</div>\n";
  html +=
      "<h2>Parallel coordinates</h2>\n<p class=\"note\">One line per trial through its parameters and its "
      "objective: finished trials from light (worst) to dark blue (best), the best in red, the others grey.</p>\n"
      "<div class=\"charts\">\n" +
      parallel_coordinates_chart(report) + "</div>\n";
  if (const std::string rungs = rungs_chart(report); !rungs.empty())
    html +=
        "<h2>ASHA rungs</h2>\n<p class=\"note\">Each trial's objective at each rung it reached: filled, it went "
        "on; rings, ASHA stopped it there.</p>\n<div class=\"charts\">\n" +
        rungs + "</div>\n";
}

void append_curves(std::string& html, const SweepReport& report) {
  html += "<h2>Learning curves</h2>\n<div class=\"charts\">\n" + curves_chart(report) + "</div>\n";
}

void append_table(std::string& html, const SweepReport& report) {
  html += "<h2>Trials</h2>\n<div class=\"table-wrap\"><table>\n<thead><tr><th>trial</th><th>status</th><th>" +
          escape_html(report.metric) + "</th><th>step</th><th>rung</th><th>run</th>";
  for (const SweepReportParameter& parameter : report.parameters)
    html += "<th>" + escape_html(parameter.name) + "</th>";
  html += "<th>error</th></tr></thead>\n<tbody>\n";
  for (const SweepReportTrial& trial : report.trials) {
    const bool best = report.best_trial && *report.best_trial == trial.trial;
    const std::string status_class =
        trial.status == "finished" || trial.status == "failed" || trial.status == "running" ? trial.status : "other";
    fmt::format_to(
        std::back_inserter(html),
        "<tr><td class=\"num\">{}{}</td><td><span class=\"status status-{}\">{}</span></td><td class=\"num\">{}</td>"
        "<td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"id\">{}</td>",
        trial.trial, best ? " \u2605" : "", status_class, escape_html(trial.status),
        trial.value ? fmt::format("{:.6g}", *trial.value) : "-", trial.step, trial.rung, escape_html(trial.run_id));
    for (const SweepReportParameter& parameter : report.parameters)
      html += "<td class=\"mono\">" +
              (trial.params.contains(parameter.name) ? escape_html(value_text(trial.params[parameter.name])) : "-") +
              "</td>";
    html += "<td>" + escape_html(trial.error) + "</td></tr>\n";
  }
  html += "</tbody></table></div>\n";
}

}  // namespace

std::string render_sweep_report(const SweepReport& report) {
  std::string html;
  auto out = std::back_inserter(html);
  fmt::format_to(out,
                 "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                 "<title>{}</title>\n<style>{}</style>\n</head>\n<body>\n",
                 escape_html(report.title), report_style());
  fmt::format_to(out, "<header>\n<h1>{}</h1>\n<p class=\"meta\">{}{}</p>\n</header>\n", escape_html(report.title),
                 escape_html(report.summary),
                 report.generated_at.empty() ? "" : " \u00b7 generated " + escape_html(report.generated_at));
  html += "<h2>Best trial</h2>\n";
  if (report.best_trial) {
    for (const SweepReportTrial& trial : report.trials) {
      if (trial.trial != *report.best_trial) continue;
      fmt::format_to(out, "<p>trial {} (run <span class=\"mono\">{}</span>): {} {:.6g}</p>\n", trial.trial,
                     escape_html(trial.run_id), escape_html(report.metric), trial.value.value_or(NAN));
    }
    fmt::format_to(
        out, "<p class=\"note\">Its command line:</p>\n<pre class=\"mono\" style=\"white-space: pre-wrap\">{}</pre>\n",
        escape_html(report.best_command));
  } else {
    html += "<p class=\"note\">No trial has finished yet.</p>\n";
  }
  append_sweep_charts(html, report);
  append_curves(html, report);
  append_table(html, report);
  html += "</body>\n</html>\n";
  return html;
}

void write_sweep_report(const std::string& path, const SweepReport& report) {
  const std::string html = render_sweep_report(report);
  core::AtomicFileWriter file(path);
  file.write(html.data(), html.size(), "the sweep report");
  file.commit();
}

}  // namespace runner::report
