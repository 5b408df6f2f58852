// What is recorded of a run beside its own row (run_store.h): its metrics read back, checkpoints, inputs, runner
// attach's interventions, histograms, artifacts and evaluations. All functions take an open index.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/index/database.h"

namespace runner::index {

struct MetricPoint {
  int64_t step;
  double value;  // NaN where a non-finite NaN was logged (stored as NULL)
  double time;
};
struct LatestMetric {
  std::string key;
  MetricPoint point;
};
std::vector<LatestMetric> latest_metrics(Database& db, int64_t run);
std::optional<double> latest_metric(Database& db, int64_t run, const std::string& key);
std::vector<MetricPoint> metric_series(Database& db, int64_t run, const std::string& key);

struct CheckpointFile {
  std::string name;  // relative to the checkpoint directory
  int64_t bytes = 0;
  std::string hash;  // sha256, hex
};
struct CheckpointRecord {
  int64_t checkpoint = 0;
  int64_t run = 0;
  int64_t step = 0;
  std::string path;  // relative to the run directory
  int64_t bytes = 0;
  std::string hash;
  std::optional<std::string> metric;
  std::optional<double> metric_value;
  bool kept = true;
  double created_at = 0;
  std::vector<CheckpointFile> files;
};
int64_t add_checkpoint(Database& db, const CheckpointRecord& checkpoint);
void set_checkpoint_kept(Database& db, int64_t checkpoint, bool kept);
// Deletes a checkpoint's rows (its files' with it): once its files are deleted, the index forgets it.
void delete_checkpoint(Database& db, int64_t checkpoint);
std::vector<CheckpointRecord> checkpoints(Database& db, int64_t run);

// What an attempt of a run read (the inputs table): its data and VAE as resolved, and what identifies them.
struct InputRecord {
  int64_t attempt = 0;
  std::string kind;                                  // data, vae
  std::string path;                                  // absolute
  std::optional<int64_t> bytes;                      // a file's size; none for a folder
  std::optional<double> modified_at;                 // the file's or folder's
  nlohmann::json detail = nlohmann::json::object();  // e.g. the encode manifest's source and VAE hash
};
// Replaces the attempt's record of the same kind and path.
void add_input(Database& db, int64_t run, const InputRecord& input);
// Attempt by attempt, in the order they were recorded.
std::vector<InputRecord> run_inputs(Database& db, int64_t run);

// A chunk of `runner attach` that changed a running run (the interventions table): the step after which it ran,
// when, its text, and what it changed ("train:set_lr(0.01)", "local lr", "config.lr = 0.01", ...).
struct InterventionRecord {
  int64_t step = 0;
  double time = 0;
  std::string chunk;
  std::vector<std::string> changes;
};
void add_intervention(Database& db, int64_t run, const InterventionRecord& intervention);
// In the order they happened.
std::vector<InterventionRecord> interventions(Database& db, int64_t run);
// The config values runner attach changed (changes "config.KEY = VALUE"), the latest of each key: the value as
// written, as JSON (a number, true or false, a string; null for nil) and the step after which it changed.
struct ConfigChange {
  std::string text;
  nlohmann::json value;
  int64_t step = 0;
};
std::map<std::string, ConfigChange> config_changes(const std::vector<InterventionRecord>& interventions);

// A histogram of a tensor logged with run:log (the histograms table): `counts` in equal bins over [low, high]
// (none, and no counts, when no value was finite), and how many values were NaN or infinite.
struct HistogramRecord {
  std::string key;
  int64_t step = 0;
  double time = 0;
  std::optional<double> low, high;
  std::vector<int64_t> counts;
  int64_t nonfinite = 0;
};
// Replaces the histogram of the same key and step.
void add_histogram(Database& db, int64_t run, const HistogramRecord& histogram);
// Each key's steps with a histogram, in order.
std::map<std::string, std::vector<int64_t>> histogram_steps(Database& db, int64_t run);
std::optional<HistogramRecord> load_histogram(Database& db, int64_t run, const std::string& key, int64_t step);

struct ArtifactRecord {
  int64_t artifact = 0;
  int64_t run = 0;
  int64_t step = 0;
  std::string kind;  // image, file
  std::string name;
  std::string path;  // relative to the run directory
  int64_t bytes = 0;
  double created_at = 0;
};
int64_t add_artifact(Database& db, const ArtifactRecord& artifact);
// Values measured of a run after the fact (runner sample's scores of a checkpoint) as its metrics at `step`: each
// replaces a value of the same key and step, and is the key's latest unless a later step has one. The run's own
// step and heartbeat are left as they are.
void add_evaluation_metrics(Database& db, int64_t run, int64_t step, const std::map<std::string, double>& values,
                            double time);
std::vector<ArtifactRecord> artifacts(Database& db, int64_t run);
// The newest artifact of each name of a kind.

}  // namespace runner::index
