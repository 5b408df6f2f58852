// The start policy of a run: resume, fork, parent, seed, script hash and git state.
#include "runtime/run/run_start.h"

#include "runtime/dist/process_group.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <random>

#include "runtime/core/logging.h"
#include "runtime/core/shell_word.h"
#include "runtime/core/sha256.h"
#include "runtime/index/index_database.h"

namespace runner::run {
namespace {

// Runs a command; returns its stdout, or nothing when it fails.
std::optional<std::string> command_output(const std::string& command) {
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return std::nullopt;
  std::string output;
  std::array<char, 4096> buffer{};
  size_t got = 0;
  while ((got = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), got);
  if (::pclose(pipe) != 0) return std::nullopt;
  return output;
}

// A seed for a run that names none: below 2^31, so that it is exact in every number type a script uses.
int64_t fresh_seed() {
  std::random_device device;
  const auto now = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return static_cast<int64_t>((static_cast<uint64_t>(device()) ^ now) % 2147483647ULL);
}

}  // namespace

GitState git_state(const std::string& directory) {
  const std::string git = "git -C " + core::shell_word(directory.empty() ? "." : directory);
  GitState state;
  if (auto revision = command_output(git + " rev-parse HEAD 2>/dev/null")) {
    while (!revision->empty() && std::isspace(static_cast<unsigned char>(revision->back()))) revision->pop_back();
    if (!revision->empty()) state.revision = *revision;
  }
  if (state.revision) {
    if (auto status = command_output(git + " status --porcelain --untracked-files=no 2>/dev/null"))
      state.dirty = !status->empty();
  }
  return state;
}

namespace {

std::unique_ptr<RunContext> start_recorded_run(const StartRequest& request, const core::LaunchContext& launch,
                                               const index::IndexLocation& where, std::vector<std::string> hosts = {}) {
  index::Database db = index::open_index_for_writing(where);
  RunStart start;
  start.index = where;
  start.script_text = request.script_text;
  start.writer = request.writer;
  start.system_metrics_seconds = request.system_metrics_seconds;
  start.pause = launch.sweep_pause;
  index::NewRun& run = start.run;
  run.script = request.script;
  run.script_hash = request.script_text.empty() ? "" : core::sha256_hex(request.script_text);
  run.name = request.name;
  run.config = request.config;
  run.versions = request.versions;
  run.device = request.device;
  run.world_size = launch.world_size;
  run.hosts = std::move(hosts);
  run.sweep = launch.sweep;
  run.trial = launch.trial;
  if (!request.script.empty()) {
    const auto slash = request.script.rfind('/');
    const GitState git = git_state(slash == std::string::npos ? "." : request.script.substr(0, slash));
    run.git_revision = git.revision;
    run.git_dirty = git.dirty;
  }
  if (!request.fork.empty()) {
    start.fork = index::resolve_fork_source(db, request.fork);
    run.parent = start.fork->run;
  } else if (!request.parent.empty()) {
    run.parent = index::resolve_run(db, request.parent).run;
  }

  ResumeRequest resume = request.fork.empty() ? request.resume : ResumeRequest(false);
  if (launch.resume == core::ResumePolicy::fresh)
    resume = false;
  else if (launch.resume == core::ResumePolicy::run)
    resume = launch.resume_run;
  std::optional<index::RunRecord> resumed;
  if (const auto* reference = std::get_if<std::string>(&resume)) {
    resumed = index::resolve_run(db, *reference);
  } else if (std::get<bool>(resume)) {
    // The same command continues a run that stopped or failed; after a finished one it starts a new run.
    if (auto latest = index::latest_run_with_checkpoint(db, run.script, run.config)) {
      if (index::effective_status(*latest, index::now_seconds()) != "finished")
        resumed = std::move(latest);
      else
        core::log(core::LogLevel::info,
                  fmt::format("run {} of this script with this config finished; starting a new run "
                              "(`runner --resume {} ...` continues that one)",
                              latest->name, latest->name));
    }
  }
  if (resumed) start.resume = resumed->run;
  run.seed = request.seed               ? request.seed
             : resumed && resumed->seed ? resumed->seed
                                        : std::optional<int64_t>(fresh_seed());
  return std::make_unique<RunContext>(start, std::move(db));
}

}  // namespace

std::unique_ptr<RunContext> start_run(const StartRequest& request, const core::LaunchContext& launch) {
  const index::IndexLocation where = index::index_location(launch);
  dist::ProcessGroup* group = dist::process_group();
  if (!group || group->size() == 1) return start_recorded_run(request, launch, where);
  // Data parallel: rank 0 starts (or continues) the run and records it; the other ranks follow that run.
  std::vector<std::string> hosts;
  for (const std::string& host : group->all_gather_bytes(index::host_name()))
    if (std::find(hosts.begin(), hosts.end(), host) == hosts.end()) hosts.push_back(host);
  if (group->rank() == 0) {
    std::unique_ptr<RunContext> context;
    try {
      context = start_recorded_run(request, launch, where, std::move(hosts));
    } catch (const std::exception& error) {
      group->broadcast_text(std::string("!") + error.what(), 0);
      throw;
    }
    const auto& fork = context->fork();
    group->broadcast_text(fmt::format("{} {}", context->record().run, fork ? fork->run : 0), 0);
    return context;
  }
  const std::string message = group->broadcast_text("", 0);
  if (!message.empty() && message[0] == '!')
    throw std::runtime_error("rank 0 could not start the run: " + message.substr(1));
  long long run = 0, fork = 0;
  if (std::sscanf(message.c_str(), "%lld %lld", &run, &fork) != 2)
    throw std::runtime_error("rank 0 sent a run start this rank cannot read: " + message);
  return std::make_unique<RunContext>(where, run, fork ? std::optional<int64_t>(fork) : std::nullopt);
}

}  // namespace runner::run
