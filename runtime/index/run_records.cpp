// What the index records of a run beside its row: metrics read back, checkpoints, inputs, interventions,
// histograms, artifacts and evaluations.
#include "runtime/index/run_records.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <limits>
#include <map>

#include "runtime/core/json_text.h"
#include "runtime/core/utf8_text.h"
#include "runtime/index/run_store.h"

namespace runner::index {
namespace {

MetricPoint read_point(const Statement& s, int first) {
  return {s.integer(first), s.is_null(first + 1) ? std::numeric_limits<double>::quiet_NaN() : s.real(first + 1),
          s.real(first + 2)};
}

}  // namespace

std::vector<LatestMetric> latest_metrics(Database& db, int64_t run) {
  Statement statement = db.prepare("SELECT key, step, value, time FROM metric_latest WHERE run = ? ORDER BY key");
  statement.bind(1, run);
  std::vector<LatestMetric> metrics;
  while (statement.step()) metrics.push_back({statement.text(0), read_point(statement, 1)});
  return metrics;
}

std::optional<double> latest_metric(Database& db, int64_t run, const std::string& key) {
  Statement statement = db.prepare("SELECT value FROM metric_latest WHERE run = ? AND key = ?");
  statement.bind(1, run).bind(2, key);
  if (!statement.step()) return std::nullopt;
  return statement.is_null(0) ? std::numeric_limits<double>::quiet_NaN() : statement.real(0);
}

std::vector<MetricPoint> metric_series(Database& db, int64_t run, const std::string& key) {
  Statement statement = db.prepare("SELECT step, value, time FROM metrics WHERE run = ? AND key = ? ORDER BY step");
  statement.bind(1, run).bind(2, key);
  std::vector<MetricPoint> points;
  while (statement.step()) points.push_back(read_point(statement, 0));
  return points;
}

int64_t add_checkpoint(Database& db, const CheckpointRecord& checkpoint) {
  return with_transaction(
      db,
      [&] {
        Statement replaced = db.prepare("DELETE FROM checkpoints WHERE run = ? AND path = ?");
        replaced.bind(1, checkpoint.run).bind(2, checkpoint.path);
        replaced.run();
        Statement insert = db.prepare(
            "INSERT INTO checkpoints (run, step, path, bytes, hash, metric, metric_value, kept, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING checkpoint");
        insert.bind(1, checkpoint.run).bind(2, checkpoint.step).bind(3, checkpoint.path).bind(4, checkpoint.bytes);
        insert.bind(5, checkpoint.hash).bind(6, checkpoint.metric).bind(7, checkpoint.metric_value);
        insert.bind(8, static_cast<int64_t>(checkpoint.kept))
            .bind(9, checkpoint.created_at ? checkpoint.created_at : now_seconds());
        insert.step();
        const int64_t id = insert.integer(0);
        insert.reset();
        Statement file = db.prepare("INSERT INTO checkpoint_files (checkpoint, name, bytes, hash) VALUES (?, ?, ?, ?)");
        for (const auto& f : checkpoint.files) {
          file.bind(1, id).bind(2, f.name).bind(3, f.bytes).bind(4, f.hash);
          file.run();
        }
        return id;
      },
      TransactionScope::own_rows);
}

void set_checkpoint_kept(Database& db, int64_t checkpoint, bool kept) {
  with_transaction(
      db,
      [&] {
        Statement statement = db.prepare("UPDATE checkpoints SET kept = ? WHERE checkpoint = ?");
        statement.bind(1, static_cast<int64_t>(kept)).bind(2, checkpoint);
        statement.run();
      },
      TransactionScope::own_rows);
}

void delete_checkpoint(Database& db, int64_t checkpoint) {
  with_transaction(
      db,
      [&] {
        Statement statement = db.prepare("DELETE FROM checkpoints WHERE checkpoint = ?");
        statement.bind(1, checkpoint);
        statement.run();
      },
      TransactionScope::own_rows);
}

std::vector<CheckpointRecord> checkpoints(Database& db, int64_t run) {
  Statement statement = db.prepare(
      "SELECT checkpoint, run, step, path, bytes, hash, metric, metric_value, kept, created_at FROM checkpoints "
      "WHERE run = ? ORDER BY step, checkpoint");
  statement.bind(1, run);
  std::vector<CheckpointRecord> records;
  while (statement.step()) {
    CheckpointRecord c;
    c.checkpoint = statement.integer(0);
    c.run = statement.integer(1);
    c.step = statement.integer(2);
    c.path = statement.text(3);
    c.bytes = statement.integer(4);
    c.hash = statement.text(5);
    c.metric = statement.optional_text(6);
    c.metric_value = statement.optional_real(7);
    c.kept = statement.integer(8) != 0;
    c.created_at = statement.real(9);
    records.push_back(std::move(c));
  }
  Statement files = db.prepare("SELECT name, bytes, hash FROM checkpoint_files WHERE checkpoint = ? ORDER BY name");
  for (auto& c : records) {
    files.bind(1, c.checkpoint);
    while (files.step()) c.files.push_back({files.text(0), files.integer(1), files.text(2)});
    files.reset();
  }
  return records;
}

int64_t add_artifact(Database& db, const ArtifactRecord& artifact) {
  return with_transaction(
      db,
      [&] {
        // One row per file, as for checkpoints: a retry after a lost answer replaces its first try's.
        Statement replaced = db.prepare("DELETE FROM artifacts WHERE run = ? AND path = ?");
        replaced.bind(1, artifact.run).bind(2, artifact.path);
        replaced.run();
        Statement insert = db.prepare(
            "INSERT INTO artifacts (run, step, kind, name, path, bytes, created_at) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "RETURNING artifact");
        insert.bind(1, artifact.run).bind(2, artifact.step).bind(3, artifact.kind).bind(4, artifact.name);
        insert.bind(5, artifact.path).bind(6, artifact.bytes);
        insert.bind(7, artifact.created_at ? artifact.created_at : now_seconds());
        insert.step();
        const int64_t id = insert.integer(0);
        insert.reset();
        return id;
      },
      TransactionScope::own_rows);
}

std::map<std::string, ConfigChange> config_changes(const std::vector<InterventionRecord>& interventions) {
  std::map<std::string, ConfigChange> changes;
  for (const InterventionRecord& intervention : interventions)
    for (const std::string& change : intervention.changes) {
      const std::size_t equals = change.find(" = ");
      if (change.rfind("config.", 0) != 0 || equals == std::string::npos) continue;
      ConfigChange& now = changes[change.substr(7, equals - 7)];
      now.text = change.substr(equals + 3);
      now.step = intervention.step;
      if (now.text == "true" || now.text == "false") {
        now.value = now.text == "true";
      } else if (now.text == "nil") {
        now.value = nullptr;
      } else if (now.text.size() >= 2 && now.text.front() == '"' && now.text.back() == '"') {
        now.value = now.text.substr(1, now.text.size() - 2);
      } else {
        char* end = nullptr;
        const double number = std::strtod(now.text.c_str(), &end);
        now.value = end != now.text.c_str() && *end == '\0' ? nlohmann::json(number) : nlohmann::json(now.text);
      }
    }
  return changes;
}

void add_evaluation_metrics(Database& db, int64_t run, int64_t step, const std::map<std::string, double>& values,
                            double time) {
  with_transaction(
      db,
      [&] {
        for (const auto& [key, value] : values) {
          core::require_utf8(key, "metric key");
          Statement insert = db.prepare(
              "INSERT INTO metrics (run, key, step, value, time) VALUES (?, ?, ?, ?, ?) ON CONFLICT (run, key, step) "
              "DO UPDATE SET value = excluded.value, time = excluded.time");
          insert.bind(1, run).bind(2, key).bind(3, step).bind(4, value).bind(5, time);
          insert.run();
          Statement latest = db.prepare(
              "INSERT INTO metric_latest (run, key, step, value, time) VALUES (?, ?, ?, ?, ?) ON CONFLICT (run, key) "
              "DO UPDATE SET step = excluded.step, value = excluded.value, time = excluded.time "
              "WHERE excluded.step >= metric_latest.step");
          latest.bind(1, run).bind(2, key).bind(3, step).bind(4, value).bind(5, time);
          latest.run();
        }
      },
      TransactionScope::own_rows);
}

namespace {
std::vector<ArtifactRecord> query_artifacts(Database& db, const std::string& sql, int64_t run,
                                            const std::optional<std::string>& kind) {
  Statement statement = db.prepare(sql);
  statement.bind(1, run);
  if (kind) statement.bind(2, *kind);
  std::vector<ArtifactRecord> records;
  while (statement.step()) {
    records.push_back({statement.integer(0), statement.integer(1), statement.integer(2), statement.text(3),
                       statement.text(4), statement.text(5), statement.integer(6), statement.real(7)});
  }
  return records;
}
}  // namespace

std::vector<ArtifactRecord> artifacts(Database& db, int64_t run) {
  return query_artifacts(db,
                         "SELECT artifact, run, step, kind, name, path, bytes, created_at FROM artifacts WHERE run = ? "
                         "ORDER BY name, step, artifact",
                         run, std::nullopt);
}

void add_input(Database& db, int64_t run, const InputRecord& input) {
  with_transaction(
      db,
      [&] {
        Statement insert = db.prepare(
            "INSERT INTO inputs (run, attempt, kind, path, bytes, modified_at, detail, recorded_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run, attempt, kind, path) DO UPDATE SET bytes = "
            "excluded.bytes, "
            "modified_at = excluded.modified_at, detail = excluded.detail, recorded_at = excluded.recorded_at");
        insert.bind(1, run).bind(2, input.attempt).bind(3, input.kind).bind(4, input.path);
        if (input.bytes)
          insert.bind(5, *input.bytes);
        else
          insert.bind_null(5);
        if (input.modified_at)
          insert.bind(6, *input.modified_at);
        else
          insert.bind_null(6);
        insert.bind(7, core::json_text(input.detail)).bind(8, now_seconds());
        insert.run();
      },
      TransactionScope::own_rows);
}

std::vector<InputRecord> run_inputs(Database& db, int64_t run) {
  Statement select = db.prepare(
      "SELECT attempt, kind, path, bytes, modified_at, detail FROM inputs WHERE run = ? ORDER BY attempt, recorded_at");
  select.bind(1, run);
  std::vector<InputRecord> inputs;
  while (select.step()) {
    InputRecord input;
    input.attempt = select.integer(0);
    input.kind = select.text(1);
    input.path = select.text(2);
    input.bytes = select.optional_integer(3);
    input.modified_at = select.optional_real(4);
    input.detail = nlohmann::json::parse(select.text(5), nullptr, false);
    inputs.push_back(std::move(input));
  }
  return inputs;
}

void add_intervention(Database& db, int64_t run, const InterventionRecord& intervention) {
  with_transaction(db, [&] {
    Statement insert = db.prepare("INSERT INTO interventions (run, step, time, chunk, changes) VALUES (?, ?, ?, ?, ?)");
    insert.bind(1, run).bind(2, intervention.step).bind(3, intervention.time).bind(4, intervention.chunk);
    insert.bind(5, core::json_text(nlohmann::json(intervention.changes)));
    insert.run();
  });
}

void add_histogram(Database& db, int64_t run, const HistogramRecord& histogram) {
  with_transaction(db, [&] {
    Statement insert = db.prepare(
        "INSERT INTO histograms (run, key, step, time, low, high, counts, nonfinite) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (run, key, step) DO UPDATE SET time = excluded.time, low = excluded.low, high = excluded.high, "
        "counts = excluded.counts, nonfinite = excluded.nonfinite");
    insert.bind(1, run).bind(2, histogram.key).bind(3, histogram.step).bind(4, histogram.time);
    if (histogram.low && histogram.high) {
      insert.bind(5, *histogram.low).bind(6, *histogram.high);
    } else {
      insert.bind_null(5);
      insert.bind_null(6);
    }
    insert.bind(7, core::json_text(nlohmann::json(histogram.counts))).bind(8, histogram.nonfinite);
    insert.run();
  });
}

std::map<std::string, std::vector<int64_t>> histogram_steps(Database& db, int64_t run) {
  Statement select = db.prepare("SELECT key, step FROM histograms WHERE run = ? ORDER BY key, step");
  select.bind(1, run);
  std::map<std::string, std::vector<int64_t>> steps;
  while (select.step()) steps[select.text(0)].push_back(select.integer(1));
  return steps;
}

std::optional<HistogramRecord> load_histogram(Database& db, int64_t run, const std::string& key, int64_t step) {
  Statement select =
      db.prepare("SELECT time, low, high, counts, nonfinite FROM histograms WHERE run = ? AND key = ? AND step = ?");
  select.bind(1, run).bind(2, key).bind(3, step);
  if (!select.step()) return std::nullopt;
  HistogramRecord histogram{
      key, step, select.real(0), select.optional_real(1), select.optional_real(2), {}, select.integer(4)};
  const nlohmann::json counts = nlohmann::json::parse(select.text(3), nullptr, false);
  if (counts.is_array())
    for (const nlohmann::json& count : counts)
      if (count.is_number_integer()) histogram.counts.push_back(count.get<int64_t>());
  return histogram;
}

std::vector<InterventionRecord> interventions(Database& db, int64_t run) {
  Statement select =
      db.prepare("SELECT step, time, chunk, changes FROM interventions WHERE run = ? ORDER BY time, intervention");
  select.bind(1, run);
  std::vector<InterventionRecord> records;
  while (select.step()) {
    InterventionRecord record;
    record.step = select.integer(0);
    record.time = select.real(1);
    record.chunk = select.text(2);
    const nlohmann::json changes = nlohmann::json::parse(select.text(3), nullptr, false);
    if (changes.is_array())
      for (const nlohmann::json& change : changes)
        record.changes.push_back(change.is_string() ? change.get<std::string>() : core::json_text(change));
    records.push_back(std::move(record));
  }
  return records;
}

}  // namespace runner::index
