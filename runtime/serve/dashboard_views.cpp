// The dashboard's JSON pages and SVG charts, read from the index through the commands' read functions.
#include "runtime/serve/dashboard_views.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <system_error>

#include "runtime/cli/run_groups.h"
#include "runtime/core/json_text.h"
#include "runtime/index/run_records.h"
#include "runtime/index/run_store.h"
#include "runtime/report/html_report.h"
#include "runtime/report/run_loading.h"
#include "runtime/report/run_where.h"
#include "runtime/report/svg_chart.h"
#include "runtime/report/sweep_loading.h"
#include "runtime/report/sweep_report.h"
#include "runtime/sweep/parameter_importance.h"
#include "runtime/sweep/trial_store.h"
#include "runtime/core/local_time_text.h"
#include "runtime/core/number_text.h"
#include "runtime/core/utf8_text.h"

namespace runner::serve {
namespace {

std::vector<std::string> all_of(const QueryParameters& parameters, const std::string& name) {
  std::vector<std::string> values;
  const auto [first, last] = parameters.equal_range(name);
  for (auto it = first; it != last; ++it) values.push_back(it->second);
  return values;
}

std::optional<std::string> one_of(const QueryParameters& parameters, const std::string& name) {
  const auto found = parameters.find(name);
  if (found == parameters.end() || found->second.empty()) return std::nullopt;
  return found->second;
}

std::string required(const QueryParameters& parameters, const std::string& name) {
  if (auto value = one_of(parameters, name)) return *value;
  throw BadRequest(fmt::format("the request needs the parameter '{}'", name));
}

double number_parameter(const QueryParameters& parameters, const std::string& name, double fallback) {
  const std::optional<std::string> text = one_of(parameters, name);
  if (!text) return fallback;
  try {
    std::size_t used = 0;
    const double value = std::stod(*text, &used);
    if (used == text->size() && std::isfinite(value)) return value;
  } catch (const std::exception&) {
  }
  throw BadRequest(fmt::format("parameter '{}': expected a number, got '{}'", name, *text));
}

// A run reference as `runner show` takes it; a reference that matches no run is NotFound.
index::RunRecord find_run(index::Database& db, const std::string& reference) {
  try {
    return index::resolve_run(db, reference, index::LastAmong::all_runs);
  } catch (const index::IndexError& error) {
    throw NotFound(error.what());
  }
}

report::SweepReport find_sweep(index::Database& db, const std::string& reference,
                               report::XAxis curves_x = report::XAxis::step) {
  try {
    return report::load_sweep_report(db, reference, curves_x);
  } catch (const index::IndexError& error) {
    throw NotFound(error.what());
  }
}

nlohmann::json number_or_text(double value) {
  return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(core::number_text(value));
}

// The chart options a request gives: x axis, scale, smoothing, from/to and width, with hover data.
report::ChartOptions chart_options(const QueryParameters& parameters) {
  report::ChartOptions options;
  options.hover_data = true;
  const std::string scale = one_of(parameters, "scale").value_or("auto");
  if (scale == "log")
    options.y_scale = report::YScale::log;
  else if (scale == "linear")
    options.y_scale = report::YScale::linear;
  else if (scale != "auto")
    throw BadRequest(fmt::format("parameter 'scale': expected auto, linear or log, got '{}'", scale));
  const std::string x = one_of(parameters, "x").value_or("step");
  const std::optional<report::XAxis> x_axis = report::x_axis_named(x);
  if (!x_axis) throw BadRequest(fmt::format("parameter 'x': expected step, time or relative, got '{}'", x));
  options.x_axis = *x_axis;
  options.smoothing = number_parameter(parameters, "smoothing", 0);
  if (!(options.smoothing >= 0 && options.smoothing < 1))
    throw BadRequest(fmt::format("parameter 'smoothing': expected a number in [0, 1), got {}", options.smoothing));
  if (one_of(parameters, "from") || one_of(parameters, "to")) {
    const double first = number_parameter(parameters, "from", 0), last = number_parameter(parameters, "to", 0);
    if (!(last > first)) throw BadRequest(fmt::format("a zoom needs from < to, got {} and {}", first, last));
    options.step_range = report::StepRange{first, last};
  }
  options.width = static_cast<int>(std::clamp(number_parameter(parameters, "width", 580), 240.0, 2400.0));
  return options;
}

// The page's JSON with its version: `signature` is what the version digests.
nlohmann::json versioned(nlohmann::json page, const nlohmann::json& signature) {
  page["version"] = digest(core::json_text(signature));
  return page;
}

// A note as the runs list shows it: its first 200 bytes (the run's page has it whole), so that a long one does not
// weigh on every poll of the list.
std::string note_in_list(const std::string& note) {
  constexpr std::size_t kShown = 200;
  return note.size() <= kShown ? note : std::string(core::utf8_prefix(note, kShown)) + "\u2026";
}

}  // namespace

std::string digest(const std::string& text) {
  std::uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return fmt::format("{:016x}", hash);
}

nlohmann::json runs_page(index::Database& db, const QueryParameters& parameters) {
  const double now = index::now_seconds();
  const std::map<std::int64_t, std::string> sweep_names = sweep::sweep_names(db);
  nlohmann::json runs = nlohmann::json::array(), durations = nlohmann::json::object();
  std::set<std::string> keys;
  std::vector<index::RunRecord> records = index::list_runs(db, {});
  if (const std::optional<std::string> where = one_of(parameters, "where")) {
    try {
      records = report::runs_where(db, std::move(records), report::RunWhere(*where), now);
    } catch (const report::WhereError& error) {
      throw BadRequest(error.what());
    }
  }
  for (const index::RunRecord& record : records) {
    nlohmann::json metrics = nlohmann::json::object();
    for (const index::LatestMetric& latest : index::latest_metrics(db, record.run)) {
      metrics[latest.key] = number_or_text(latest.point.value);
      keys.insert(latest.key);
    }
    const auto sweep = record.sweep ? sweep_names.find(*record.sweep) : sweep_names.end();
    runs.push_back({{"id", record.id},
                    {"name", record.name},
                    {"colour", report::run_colour(report::run_colour_slot(record.run))},
                    {"status", index::effective_status(record, now)},
                    {"script", record.script},
                    {"started_at", record.started_at},
                    {"started", core::local_time_text(record.started_at).substr(0, 16)},
                    {"step", record.step},
                    {"world_size", record.world_size},
                    {"device", record.device},
                    {"sweep", sweep != sweep_names.end() ? nlohmann::json(sweep->second) : nlohmann::json(nullptr)},
                    {"trial", record.trial ? nlohmann::json(*record.trial) : nlohmann::json(nullptr)},
                    {"metrics", metrics},
                    {"summary", record.summary},
                    {"config", record.config},
                    {"tags", record.tags},
                    {"note", record.note ? nlohmann::json(note_in_list(*record.note)) : nlohmann::json(nullptr)}});
    durations[record.id] = index::duration_seconds(record, now);
  }
  nlohmann::json page = {{"runs", runs}, {"metric_keys", report::ordered_metric_keys(std::move(keys))}};
  const nlohmann::json signature = page;
  page["durations"] = durations;
  return versioned(page, signature);
}

nlohmann::json run_page(index::Database& db, const QueryParameters& parameters) {
  const index::RunRecord record = find_run(db, required(parameters, "run"));
  nlohmann::json run = report::run_json(db, record, index::now_seconds());
  run["colour"] = report::run_colour(report::run_colour_slot(record.run));
  if (record.sweep) {
    const auto names = sweep::sweep_names(db);
    if (const auto found = names.find(*record.sweep); found != names.end()) run["sweep_name"] = found->second;
  }
  const nlohmann::json signature = {{"status", run["status"]},
                                    {"step", run["step"]},
                                    {"metrics", run["metrics"]},
                                    {"checkpoints", run["checkpoints"]},
                                    {"artifacts", run["artifacts"]},
                                    {"attempts", run["attempts"]},
                                    {"error", run["error"]},
                                    {"summary", run["summary"]},
                                    {"ended_at", run["ended_at"]},
                                    {"config", run["config"]},
                                    {"tags", run["tags"]},
                                    {"note", run["note"]},
                                    {"interventions", run["interventions"]},
                                    {"histograms", run["histograms"]}};
  std::set<std::string> keys;
  for (const auto& [key, latest] : run["metrics"].items()) keys.insert(key);
  const std::vector<std::string> ordered = report::ordered_metric_keys(std::move(keys));
  nlohmann::json sections = nlohmann::json::array();
  for (const report::MetricSection& section : report::metric_sections(ordered))
    sections.push_back({{"prefix", section.prefix}, {"keys", section.keys}});
  return versioned({{"run", run}, {"metric_keys", ordered}, {"metric_sections", sections}}, signature);
}

nlohmann::json compare_page(index::Database& db, const QueryParameters& parameters) {
  const std::vector<std::string> references = all_of(parameters, "run");
  if (references.empty()) throw BadRequest("compare needs one or more run=RUN parameters");
  const double now = index::now_seconds();
  nlohmann::json runs = nlohmann::json::array();
  std::vector<index::RunRecord> records;
  std::set<std::string> keys, config_keys;
  for (std::size_t i = 0; i < references.size(); ++i) {
    records.push_back(find_run(db, references[i]));
    const index::RunRecord& record = records.back();
    nlohmann::json metrics = nlohmann::json::object();
    for (const index::LatestMetric& latest : index::latest_metrics(db, record.run)) {
      keys.insert(latest.key);
      metrics[latest.key] = {{"step", latest.point.step}, {"value", number_or_text(latest.point.value)}};
    }
    if (record.config.is_object())
      for (const auto& [key, value] : record.config.items()) config_keys.insert(key);
    nlohmann::json images = nlohmann::json::array();
    for (const index::ArtifactRecord& artifact : index::artifacts(db, record.run))
      if (artifact.kind == "image")
        images.push_back({{"name", artifact.name}, {"step", artifact.step}, {"path", artifact.path}});
    runs.push_back({{"id", record.id},
                    {"name", record.name},
                    {"status", index::effective_status(record, now)},
                    {"step", record.step},
                    {"colour", report::run_colour(report::run_colour_slot(record.run))},
                    {"metrics", metrics},
                    {"images", images}});
  }
  nlohmann::json config = nlohmann::json::array();
  for (const std::string& key : config_keys) {
    nlohmann::json values = nlohmann::json::array();
    bool differs = false;
    for (const index::RunRecord& record : records) {
      const nlohmann::json value =
          record.config.is_object() && record.config.contains(key) ? record.config[key] : nlohmann::json(nullptr);
      differs = differs || (!values.empty() && value != values[0]);
      values.push_back(value);
    }
    config.push_back({{"key", key}, {"values", values}, {"differs", differs}});
  }
  const nlohmann::json page = {
      {"runs", runs}, {"metric_keys", report::ordered_metric_keys(std::move(keys))}, {"config", config}};
  return versioned(page, page);
}

nlohmann::json groups_page(index::Database& db, const QueryParameters& parameters) {
  std::vector<index::RunRecord> records;
  for (const std::string& list : all_of(parameters, "runs")) {
    std::size_t start = 0;
    while (start <= list.size()) {
      const std::size_t comma = std::min(list.find(',', start), list.size());
      if (comma > start) records.push_back(find_run(db, list.substr(start, comma - start)));
      start = comma + 1;
    }
  }
  std::set<std::string> keys;
  std::vector<std::map<std::string, double>> latest(records.size());
  for (std::size_t r = 0; r < records.size(); ++r)
    for (const index::LatestMetric& metric : index::latest_metrics(db, records[r].run)) {
      latest[r][metric.key] = metric.point.value;
      keys.insert(metric.key);
    }
  const std::vector<std::string> metric_keys = report::ordered_metric_keys(std::move(keys));
  std::vector<const index::RunRecord*> members;
  std::vector<std::vector<std::optional<double>>> values;
  for (std::size_t r = 0; r < records.size(); ++r) {
    members.push_back(&records[r]);
    values.emplace_back();
    for (const std::string& key : metric_keys) {
      const auto found = latest[r].find(key);
      values.back().push_back(found == latest[r].end() ? std::nullopt : std::optional(found->second));
    }
  }
  const cli::RunGrouping grouping = cli::group_runs_by(members, values, std::nullopt);
  nlohmann::json groups = nlohmann::json::array();
  for (const cli::RunGroup& group : grouping.groups) {
    nlohmann::json runs = nlohmann::json::array(), metrics = nlohmann::json::object(), key = nlohmann::json::object();
    for (const index::RunRecord* member : group.runs) runs.push_back(member->id);
    for (std::size_t k = 0; k < grouping.keys.size(); ++k) key[grouping.keys[k]] = group.key[k];
    for (std::size_t m = 0; m < metric_keys.size(); ++m)
      if (group.metrics[m].count)
        metrics[metric_keys[m]] = {
            {"mean", number_or_text(group.metrics[m].mean)},
            {"std", group.metrics[m].count > 1 ? number_or_text(group.metrics[m].std) : nlohmann::json(nullptr)},
            {"count", group.metrics[m].count}};
    groups.push_back({{"label", cli::group_label(group, grouping.keys)},
                      {"key", key},
                      {"runs", runs},
                      {"colour", report::run_colour(report::run_colour_slot(group.runs.front()->run))},
                      {"metrics", metrics}});
  }
  const nlohmann::json page = {{"keys", grouping.keys}, {"metric_keys", metric_keys}, {"groups", groups}};
  return versioned(page, page);
}

nlohmann::json sweeps_page(index::Database& db, const QueryParameters&) {
  nlohmann::json sweeps = nlohmann::json::array();
  for (const sweep::SweepRecord& record : sweep::list_sweeps(db)) {
    const report::SweepReport sweep = report::load_sweep_report(db, record.name);
    std::map<std::string, int> statuses;
    for (const report::SweepReportTrial& trial : sweep.trials) ++statuses[trial.status];
    nlohmann::json best = nullptr;
    for (const report::SweepReportTrial& trial : sweep.trials)
      if (sweep.best_trial && trial.trial == *sweep.best_trial && trial.value)
        best = {{"trial", trial.trial}, {"value", number_or_text(*trial.value)}, {"run", trial.run_id}};
    sweeps.push_back({{"name", record.name},
                      {"sweep", record.sweep},
                      {"status", sweep.status},
                      {"summary", sweep.summary},
                      {"metric", sweep.metric},
                      {"minimize", sweep.minimize},
                      {"trials", sweep.trials.size()},
                      {"statuses", statuses},
                      {"best", best},
                      {"created", core::local_time_text(record.created_at).substr(0, 16)}});
  }
  const nlohmann::json page = {{"sweeps", sweeps}};
  return versioned(page, page);
}

nlohmann::json sweep_page(index::Database& db, const QueryParameters& parameters) {
  const report::SweepReport sweep = find_sweep(db, required(parameters, "sweep"));
  nlohmann::json parameters_json = nlohmann::json::array();
  for (const report::SweepReportParameter& parameter : sweep.parameters)
    parameters_json.push_back(
        {{"name", parameter.name},
         {"log_scale", parameter.log_scale},
         {"categories", parameter.categories},
         {"importance", parameter.importance ? nlohmann::json(*parameter.importance) : nlohmann::json(nullptr)}});
  nlohmann::json trials = nlohmann::json::array();
  for (const report::SweepReportTrial& trial : sweep.trials)
    trials.push_back({{"trial", trial.trial},
                      {"status", trial.status},
                      {"value", trial.value ? number_or_text(*trial.value) : nlohmann::json(nullptr)},
                      {"step", trial.step},
                      {"rung", trial.rung},
                      {"run", trial.run_id},
                      {"params", trial.params},
                      {"error", trial.error},
                      {"points", trial.curve.size()}});
  nlohmann::json rungs = nlohmann::json::array();
  for (const report::SweepReportRung& row : sweep.rungs)
    rungs.push_back(
        {{"trial", row.trial}, {"rung", row.rung}, {"step", row.step}, {"value", number_or_text(row.value)}});
  const nlohmann::json page = {
      {"name", sweep.name},
      {"status", sweep.status},
      {"summary", sweep.summary},
      {"metric", sweep.metric},
      {"minimize", sweep.minimize},
      {"parameters", parameters_json},
      {"trials", trials},
      {"asha", sweep.asha},
      {"rungs", rungs},
      {"best_trial", sweep.best_trial ? nlohmann::json(*sweep.best_trial) : nlohmann::json(nullptr)},
      {"best_command", sweep.best_command},
      {"importance_method", sweep::kImportanceMethod}};
  return versioned(page, page);
}

std::string metric_chart(index::Database& db, const std::string& home, const QueryParameters& parameters) {
  const std::string key = required(parameters, "key");
  const std::vector<std::string> references = all_of(parameters, "run");
  if (references.empty()) throw BadRequest("a metric chart needs one or more run=RUN parameters");
  const double now = index::now_seconds();
  const report::ChartOptions options = chart_options(parameters);
  std::vector<report::ReportRun> runs;
  std::vector<index::RunRecord> records;
  for (const std::string& reference : references) {
    records.push_back(find_run(db, reference));
    runs.push_back(report::load_report_run(db, home, records.back(), std::vector<std::string>{key, key + "_floor"}, now,
                                           options.x_axis));
  }
  std::vector<report::CurveGroup> groups;
  if (one_of(parameters, "group").value_or("0") == "1") {
    std::vector<const index::RunRecord*> members;
    for (const index::RunRecord& record : records) members.push_back(&record);
    const cli::RunGrouping grouping =
        cli::group_runs_by(members, std::vector<std::vector<std::optional<double>>>(members.size()), std::nullopt);
    for (const cli::RunGroup& group : grouping.groups) {
      report::CurveGroup curves{cli::group_label(group, grouping.keys), {}};
      for (const index::RunRecord* member : group.runs)
        curves.runs.push_back(static_cast<std::size_t>(member - records.data()));
      groups.push_back(std::move(curves));
    }
  }
  return report::render_metric_chart(runs, key, options, groups);
}

std::string histogram_chart(index::Database& db, const QueryParameters& parameters) {
  const index::RunRecord record = find_run(db, required(parameters, "run"));
  const std::string key = required(parameters, "key");
  const double step = number_parameter(parameters, "step", 0);
  if (!one_of(parameters, "step") || step != std::floor(step))
    throw BadRequest(
        fmt::format("parameter 'step': expected a whole number, got '{}'", one_of(parameters, "step").value_or("")));
  const std::optional<index::HistogramRecord> histogram =
      index::load_histogram(db, record.run, key, static_cast<int64_t>(step));
  if (!histogram)
    throw NotFound(
        fmt::format("run {} has no histogram '{}' at step {}", record.name, key, static_cast<int64_t>(step)));
  report::HistogramOptions options;
  options.title = histogram->nonfinite
                      ? fmt::format("{} at step {} ({} not finite)", key, histogram->step, histogram->nonfinite)
                      : fmt::format("{} at step {}", key, histogram->step);
  options.width = static_cast<int>(std::clamp(number_parameter(parameters, "width", 580), 240.0, 2400.0));
  return report::render_histogram_chart(histogram->low.value_or(0), histogram->high.value_or(0), histogram->counts,
                                        options);
}

std::string sweep_chart(index::Database& db, const QueryParameters& parameters) {
  const std::string chart = required(parameters, "chart");
  const report::ChartOptions options = chart_options(parameters);
  const report::SweepReport sweep = find_sweep(db, required(parameters, "sweep"), options.x_axis);
  if (chart == "importance") return report::importance_chart(sweep);
  if (chart == "parallel") return report::parallel_coordinates_chart(sweep);
  if (chart == "rungs") {
    const std::string rungs = report::rungs_chart(sweep);
    if (!rungs.empty()) return rungs;
    throw NotFound(fmt::format("sweep {} has no ASHA rung results: {}", sweep.name,
                               sweep.asha ? "no trial has reached a rung yet" : "it does not prune with ASHA"));
  }
  if (chart == "curves") return report::curves_chart(sweep, options);
  if (chart == "objective") {
    const std::string name = required(parameters, "param");
    const std::vector<std::string> charts = report::objective_charts(sweep);
    for (std::size_t i = 0; i < sweep.parameters.size(); ++i)
      if (sweep.parameters[i].name == name) return charts[i];
    throw NotFound(fmt::format("sweep {} has no parameter '{}'", sweep.name, name));
  }
  throw BadRequest(
      fmt::format("parameter 'chart': expected objective, importance, parallel, rungs or curves, got '{}'", chart));
}

namespace {

// Whether the resolved `path` lies strictly inside the resolved `folder`.
bool lies_inside(const std::filesystem::path& path, const std::filesystem::path& folder) {
  const std::filesystem::path relative = path.lexically_relative(folder);
  return !relative.empty() && relative != "." && *relative.begin() != "..";
}

}  // namespace

std::string image_file(index::Database& db, const std::string& home, const QueryParameters& parameters) {
  namespace fs = std::filesystem;
  const index::RunRecord record = find_run(db, required(parameters, "run"));
  const std::string path = required(parameters, "path");
  for (const index::ArtifactRecord& artifact : index::artifacts(db, record.run)) {
    if (artifact.kind != "image" || artifact.path != path) continue;
    // The index and the run folders may be written by others (a shared PostgreSQL index, a copied folder): only
    // a regular file whose resolved path, symlinks and `..` followed, lies in the run's folder inside RUNNER_HOME.
    std::error_code error;
    const fs::path home_folder = fs::canonical(home, error);
    const fs::path run_folder = error ? fs::path() : fs::canonical(home_folder / record.dir, error);
    if (error || !lies_inside(run_folder, home_folder))
      throw NotFound(fmt::format("run {}'s folder is not inside RUNNER_HOME", record.name));
    const fs::path file = fs::canonical(run_folder / artifact.path, error);
    if (error || !lies_inside(file, run_folder) || !fs::is_regular_file(file, error))
      throw NotFound(fmt::format("run {} has no image file '{}' inside its folder", record.name, path));
    return file.string();
  }
  throw NotFound(fmt::format("run {} has no image '{}' in the index", record.name, path));
}

}  // namespace runner::serve
