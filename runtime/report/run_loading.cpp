// What the index commands and the dashboard read of a run from the index: its JSON (`runner show --json`), its
// metric series and what its report shows.
#include "runtime/report/run_loading.h"

#include <algorithm>
#include <cmath>

#include "runtime/core/local_time_text.h"
#include "runtime/core/number_text.h"
#include "runtime/index/run_records.h"

namespace runner::report {
namespace {

template <typename T>
nlohmann::json or_null(const std::optional<T>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

nlohmann::json attempts_json(const index::RunRecord& run, const std::vector<index::AttemptRecord>& attempts,
                             double now) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& a : attempts) {
    out.push_back({{"attempt", a.attempt},
                   {"status", index::effective_attempt_status(run, a, now)},
                   {"config", a.config},
                   {"world_size", a.world_size},
                   {"hosts", a.hosts},
                   {"host", a.host},
                   {"pid", a.pid},
                   {"device", a.device},
                   {"seed", or_null(a.seed)},
                   {"script_hash", a.script_hash},
                   {"git_revision", or_null(a.git_revision)},
                   {"git_dirty", or_null(a.git_dirty)},
                   {"versions", a.versions},
                   {"start_step", or_null(a.start_step)},
                   {"end_step", or_null(a.end_step)},
                   {"started_at", or_null(a.started_at)},
                   {"ended_at", or_null(a.ended_at)},
                   {"error", or_null(a.error)}});
  }
  return out;
}

}  // namespace

nlohmann::json run_json(index::Database& db, const index::RunRecord& run, double now) {
  nlohmann::json out = {{"id", run.id},
                        {"name", run.name},
                        {"status", index::effective_status(run, now)},
                        {"script", run.script},
                        {"script_hash", run.script_hash},
                        {"config", run.config},
                        {"summary", run.summary},
                        {"versions", run.versions},
                        {"host", run.host},
                        {"pid", run.pid},
                        {"device", run.device},
                        {"world_size", run.world_size},
                        {"hosts", run.hosts},
                        {"dir", run.dir},
                        {"started_at", run.started_at},
                        {"duration", index::duration_seconds(run, now)},
                        {"wall_seconds", index::wall_seconds(run, now)},
                        {"attempts", run.attempts},
                        {"sweep", run.sweep ? nlohmann::json(*run.sweep) : nlohmann::json(nullptr)},
                        {"trial", run.trial ? nlohmann::json(*run.trial) : nlohmann::json(nullptr)},
                        {"step", run.step}};
  out["seed"] = run.seed ? nlohmann::json(*run.seed) : nlohmann::json(nullptr);
  out["git_revision"] = run.git_revision ? nlohmann::json(*run.git_revision) : nlohmann::json(nullptr);
  out["git_dirty"] = run.git_dirty ? nlohmann::json(*run.git_dirty) : nlohmann::json(nullptr);
  out["ended_at"] = run.ended_at ? nlohmann::json(*run.ended_at) : nlohmann::json(nullptr);
  out["error"] = run.error ? nlohmann::json(*run.error) : nlohmann::json(nullptr);
  out["parent"] = run.parent_id ? nlohmann::json(*run.parent_id) : nlohmann::json(nullptr);
  out["tags"] = run.tags;
  out["note"] = or_null(run.note);
  out["attempt_history"] = attempts_json(run, index::run_attempts(db, run.run), now);
  nlohmann::json inputs = nlohmann::json::array();
  for (const index::InputRecord& input : index::run_inputs(db, run.run))
    inputs.push_back({{"attempt", input.attempt},
                      {"kind", input.kind},
                      {"path", input.path},
                      {"bytes", or_null(input.bytes)},
                      {"modified_at", or_null(input.modified_at)},
                      {"detail", input.detail}});
  out["inputs"] = inputs;
  nlohmann::json metrics = nlohmann::json::object();
  for (const auto& latest : index::latest_metrics(db, run.run)) {
    metrics[latest.key] = {
        {"step", latest.point.step},
        {"value", std::isfinite(latest.point.value) ? nlohmann::json(latest.point.value)
                                                    : nlohmann::json(core::number_text(latest.point.value))}};
  }
  out["metrics"] = metrics;
  nlohmann::json checkpoints = nlohmann::json::array();
  for (const auto& c : index::checkpoints(db, run.run)) {
    checkpoints.push_back(
        {{"step", c.step},
         {"path", c.path},
         {"bytes", c.bytes},
         {"hash", c.hash},
         {"kept", c.kept},
         {"metric", c.metric ? nlohmann::json(*c.metric) : nlohmann::json(nullptr)},
         {"metric_value", c.metric_value ? nlohmann::json(*c.metric_value) : nlohmann::json(nullptr)}});
  }
  out["checkpoints"] = checkpoints;
  nlohmann::json artifacts = nlohmann::json::array();
  for (const auto& a : index::artifacts(db, run.run))
    artifacts.push_back({{"step", a.step}, {"kind", a.kind}, {"name", a.name}, {"path", a.path}, {"bytes", a.bytes}});
  out["artifacts"] = artifacts;
  nlohmann::json interventions = nlohmann::json::array();
  for (const index::InterventionRecord& i : index::interventions(db, run.run))
    interventions.push_back({{"step", i.step}, {"time", i.time}, {"chunk", i.chunk}, {"changes", i.changes}});
  out["interventions"] = interventions;
  out["histograms"] = index::histogram_steps(db, run.run);
  return out;
}

SeriesPoints metric_points(index::Database& db, const index::RunRecord& record, const std::string& key, XAxis x) {
  SeriesPoints points;
  for (const index::MetricPoint& point : index::metric_series(db, record.run, key)) {
    const double at = x == XAxis::step        ? static_cast<double>(point.step)
                      : x == XAxis::wall_time ? point.time
                                              : point.time - record.started_at;
    points.emplace_back(at, point.value);
  }
  if (x != XAxis::step)  // a resumed run's repeated steps were logged later than the steps after them
    std::stable_sort(points.begin(), points.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return points;
}

ReportRun load_report_run(index::Database& db, const std::string& home, const index::RunRecord& record,
                          const std::optional<std::vector<std::string>>& keys, double now, XAxis x) {
  ReportRun run;
  run.id = record.id;
  run.colour_slot = run_colour_slot(record.run);
  run.name = record.name;
  run.status = index::effective_status(record, now);
  run.started = core::local_time_text(record.started_at).substr(0, 16);
  run.duration_seconds = index::duration_seconds(record, now);
  run.step = record.step;
  run.config = record.config;
  run.summary = record.summary;
  run.tags = record.tags;
  run.note = record.note;
  std::vector<std::string> chosen;
  if (keys)
    chosen = *keys;
  else
    for (const auto& latest : index::latest_metrics(db, record.run)) chosen.push_back(latest.key);
  for (const auto& key : chosen) {
    auto& series = run.metrics[key];
    series = metric_points(db, record, key, x);
    if (series.empty()) run.metrics.erase(key);
  }
  if (run.status != "finished") run.error = record.error;
  for (const auto& artifact : index::artifacts(db, record.run))
    if (artifact.kind == "image")
      run.images.push_back({artifact.name, artifact.step, home + "/" + record.dir + "/" + artifact.path});
  return run;
}

}  // namespace runner::report
