// The start policy of a run: what runner.start asks for, resolved against the index and the launch
// context — resume or fork, parent, seed, script hash and git state — into a RunContext.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "runtime/core/launch_context.h"
#include "runtime/index/metric_writer.h"
#include "runtime/run/run_context.h"

namespace runner::run {

// runner.start's resume option: true (continue the latest run of this script with this exact config that has
// a kept checkpoint when it was interrupted or failed; after a finished one, or none, start a new run), false
// (always a new run), or a run reference (continue that run, finished or not).
using ResumeRequest = std::variant<bool, std::string>;

struct StartRequest {
  std::string script;       // the script's path as given; empty for code strings
  std::string script_text;  // its text (hashed, copied into the run directory)
  std::string name;         // empty: "<script stem>-<n>"
  nlohmann::json config = nlohmann::json::object();
  nlohmann::json versions = nlohmann::json::object();
  std::string device = "cpu";
  std::optional<int64_t> seed;  // given: used (also on resume); else a resumed run's own, else fresh
  std::string parent;           // a run reference, or empty
  std::string fork;             // a run reference: a new run that starts from that run's checkpoint
  ResumeRequest resume = true;
  index::MetricWriterOptions writer;
  double system_metrics_seconds = 10;  // RunStart::system_metrics_seconds
};

// The script's repository revision and whether tracked files differ from it; both empty outside a git
// repository or without git.
struct GitState {
  std::optional<std::string> revision;
  std::optional<bool> dirty;
};
GitState git_state(const std::string& directory);

// Resolves the request in one opening of the launch's index (index::index_location(launch)): the command line's
// resume policy (launch.resume: --fresh, --resume RUN) wins over request.resume; a fork never resumes unless the
// command line says so; references that match no run (or several) throw index::IndexError.
std::unique_ptr<RunContext> start_run(const StartRequest& request, const core::LaunchContext& launch);

}  // namespace runner::run
