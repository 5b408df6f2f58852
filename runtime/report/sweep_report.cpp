// The sweep report page: summary, best trial, objective-by-parameter scatter charts, curves, trial table.
#include "runtime/report/sweep_report.h"

#include <cmath>
#include <fmt/format.h>

#include "runtime/core/atomic_file.h"
#include "runtime/report/html_report.h"

namespace runner::report {
namespace {

constexpr const char* kFinished = "#1f77b4";
constexpr const char* kBest = "#d62728";
constexpr const char* kStopped = "#8c8c8c";

std::string value_text(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_float()) return fmt::format("{:.6g}", value.get<double>());
  return value.dump();
}

std::string colour_of(const SweepReport& report, const SweepReportTrial& trial) {
  if (report.best_trial && *report.best_trial == trial.trial) return kBest;
  return trial.status == "finished" ? kFinished : kStopped;
}

void append_scatter_charts(std::string& html, const SweepReport& report) {
  html +=
      "<h2>The objective against each parameter</h2>\n<p class=\"note\">Filled: finished trials (the best in "
      "red); rings: trials ASHA stopped at a rung, at their last rung value.</p>\n<div class=\"charts\">\n";
  for (const SweepReportParameter& parameter : report.parameters) {
    std::vector<ScatterPoint> points;
    for (const SweepReportTrial& trial : report.trials) {
      if (!trial.value || !trial.params.contains(parameter.name)) continue;
      const nlohmann::json& value = trial.params[parameter.name];
      double x = 0;
      if (!parameter.categories.empty()) {
        const std::string text = value_text(value);
        for (size_t i = 0; i < parameter.categories.size(); ++i)
          if (parameter.categories[i] == text) x = static_cast<double>(i);
      } else if (value.is_number()) {
        x = value.get<double>();
      } else {
        continue;
      }
      points.push_back({x, *trial.value, colour_of(report, trial), trial.status != "finished",
                        fmt::format("trial {} ({}): {} = {}, {} {:.6g}", trial.trial, trial.status, parameter.name,
                                    value_text(value), report.metric, *trial.value)});
    }
    ScatterOptions options;
    options.title = report.metric + " by " + parameter.name;
    options.x_label = parameter.name;
    options.log_x = parameter.log_scale;
    options.categories = parameter.categories;
    html += render_scatter_chart(points, options);
  }
  html += "</div>\n";
}

void append_curves(std::string& html, const SweepReport& report) {
  std::vector<ChartSeries> series;
  size_t colour = 0;
  for (const SweepReportTrial& trial : report.trials) {
    if (trial.curve.empty()) continue;
    ChartSeries one;
    one.label = fmt::format("trial {}{}", trial.trial, trial.status == "finished" ? "" : " (" + trial.status + ")");
    one.colour = trial.status == "finished" ? run_colour(colour++) : kStopped;
    if (report.best_trial && *report.best_trial == trial.trial) one.colour = kBest;
    if (trial.status != "finished") one.dash_pattern = "4 3";
    one.points = trial.curve;
    series.push_back(std::move(one));
  }
  ChartOptions options;
  options.title = report.metric + " of every trial";
  options.width = 820;
  html += "<h2>Learning curves</h2>\n<div class=\"charts\">\n" + render_line_chart(series, options) + "</div>\n";
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
  append_scatter_charts(html, report);
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
