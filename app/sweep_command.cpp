// `runner sweep FILE.lua | --join SWEEP | show SWEEP`: the sweep file is read in a Lua host (bindings/sweep_file.h),
// checked against the experiment script's config (read by a second host that stops at its config { ... }),
// recorded in the index, and run by a worker (runtime/sweep).
#include "app/sweep_command.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <string>
#include <unistd.h>
#include <variant>

#include "bindings/lua_host.h"
#include "bindings/sweep_file.h"
#include "runtime/cli/command_line.h"
#include "runtime/cli/index_commands.h"
#include "runtime/core/exit_status.h"
#include "runtime/core/terminal_text.h"
#include "runtime/index/index_database.h"
#include "runtime/sweep/asha.h"
#include "runtime/sweep/samplers.h"
#include "runtime/sweep/sweep_worker.h"
#include "runtime/sweep/trial_store.h"

namespace runner::app {
namespace {

constexpr const char* kUsage =
    R"(usage: runner sweep SWEEP.lua       create the sweep (or continue it) and run its trials here
       runner sweep --dry-run SWEEP.lua
                                     check the file against the script's config and show the first
                                     trials' command lines; records and runs nothing
       runner sweep --join SWEEP     run trials of a sweep of the index as another worker (same host)
       runner sweep show SWEEP [--csv|--json]
                                     its trials sorted by the objective, the best one's command line
       runner sweep rm SWEEP... [--force]
                                     delete sweeps with their trials' runs and files
       runner sweeps [--csv|--json]  table of sweeps
A sweep file returns runner.sweep { script = ..., parameters = ..., metric = ..., ... } (see the README).
Trials are runs of the script (runner runs --sweep SWEEP); their output is in RUNNER_HOME/sweeps/NAME/.
)";

// The script's config keys, read by running it up to its config { ... }.
std::variant<sweep::ScriptConfig, int> script_config(const sweep::SweepSpec& spec) {
  bindings::LuaHost host;
  host.want_config();
  const int status = host.run_file(spec.script, {}, {});
  if (status != core::kExitOk) {
    std::fprintf(stderr, "runner: %s: the script %s failed before its config { ... } (above)\n", spec.where.c_str(),
                 spec.script.c_str());
    return status;
  }
  const std::optional<std::string> reported = host.reported_config();
  if (!reported)
    throw cli::UsageError(
        fmt::format("{}: the script {} declares no config {{ ... }} for the sweep to set", spec.where, spec.script));
  const sweep::ScriptConfig config = sweep::parse_script_config(nlohmann::json::parse(*reported));
  if (config.empty())
    throw cli::UsageError(
        fmt::format("{}: the script {} declares no config {{ ... }} for the sweep to set", spec.where, spec.script));
  return config;
}

// The checks of `runner sweep FILE` before it records anything, made by --dry-run too: the definition
// against the script's config, the slots of this host, and a stored sweep of the same name (when the index
// exists; a dry run creates nothing). Prints the warnings. Returns the exit status of a script that failed.
std::variant<sweep::SweepSpec, int> checked_sweep(const std::string& file) {
  const auto definition = bindings::read_sweep_file(file);
  if (const int* status = std::get_if<int>(&definition)) return *status;
  sweep::SweepSpec spec = sweep::parse_sweep(std::get<nlohmann::json>(definition));
  const auto config = script_config(spec);
  if (const int* status = std::get_if<int>(&config)) return *status;
  sweep::check_against_config(spec, std::get<sweep::ScriptConfig>(config));
  sweep::sweep_slots(spec);
  const std::string home = index::home_directory();
  if (::access(index::index_path(home).c_str(), F_OK) == 0) {
    index::Database db = index::open_index_for_reading(home);
    sweep::same_definition(db, spec);
  }
  if (const std::string warning = sweep::rung_warning(spec); !warning.empty())
    std::fprintf(stderr, "runner sweep: %s\n", core::terminal_text(warning).c_str());
  return spec;
}

void print_plan(const sweep::SweepSpec& spec) {
  std::printf("sweep %s: %lld trials (%s) of %s; %s (%s)\n", spec.name.c_str(), static_cast<long long>(spec.trials),
              sweep::method_name(spec.method), spec.script.c_str(), spec.metric.c_str(), spec.minimize ? "min" : "max");
  if (spec.asha) {
    std::string rungs;
    for (std::int64_t step : sweep::rung_steps(*spec.asha)) rungs += (rungs.empty() ? "" : ", ") + std::to_string(step);
    std::printf("ASHA: rungs at steps %s of %lld, the best 1/%d of each goes on\n", rungs.c_str(),
                static_cast<long long>(spec.asha->max_steps), spec.asha->reduction);
  }
  const std::int64_t shown = std::min<std::int64_t>(spec.trials, 5);
  const bool adaptive = spec.method == sweep::Method::tpe;
  std::printf("the first %lld trials%s:\n", static_cast<long long>(shown),
              adaptive ? " (TPE: random until 10 results)" : "");
  for (std::int64_t t = 0; t < shown; ++t) {
    std::string line = "  runner " + spec.script;
    for (const std::string& item : sweep::trial_overrides(spec, sweep::suggest(spec, t, {}))) line += " " + item;
    std::printf("%s\n", core::terminal_text(line).c_str());
  }
}

std::string absolute_home() {
  std::string home = index::home_directory();
  index::open_index_for_writing(home);  // creates it
  char* resolved = ::realpath(home.c_str(), nullptr);
  if (resolved) {
    home = resolved;
    std::free(resolved);
  }
  return home;
}

int run(int argc, char** argv) {
  if (argc >= 2 && (std::strcmp(argv[1], "show") == 0 || std::strcmp(argv[1], "rm") == 0))
    return cli::run_index_command(argc, argv);
  cli::CommandOptions accepted;
  accepted.values = {{"--join", "a sweep (a name or number)"}};
  accepted.flags = {"--dry-run"};
  accepted.max_positionals = 1;
  const cli::CommandLine line = cli::parse_command_line(argc, argv, accepted);
  if (line.help) {
    std::fputs(kUsage, stdout);
    return core::kExitOk;
  }
  const std::string file = line.positional.empty() ? "" : line.positional[0];
  const std::string join = line.value("--join").value_or("");
  const bool dry_run = line.has("--dry-run");
  if (file.empty() == join.empty()) throw cli::UsageError("give a sweep file or --join SWEEP (one of them)");
  if (dry_run && file.empty()) throw cli::UsageError("--dry-run needs a sweep file");

  if (!join.empty()) {
    const std::string home = absolute_home();
    index::Database db = index::open_index_for_writing(home);
    const sweep::SweepRecord record = sweep::load_sweep(db, join);
    return sweep::run_sweep_worker(home, record);
  }
  const auto checked = checked_sweep(file);
  if (const int* status = std::get_if<int>(&checked)) return *status;
  const sweep::SweepSpec& spec = std::get<sweep::SweepSpec>(checked);
  if (dry_run) {
    print_plan(spec);
    return core::kExitOk;
  }
  const std::string home = absolute_home();
  index::Database db = index::open_index_for_writing(home);
  const sweep::SweepRecord record = sweep::open_sweep(db, spec);
  return sweep::run_sweep_worker(home, record);
}

}  // namespace

int run_sweep_command(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const cli::UsageError& error) {
    return cli::print_usage_error("sweep", error.what(), kUsage);
  } catch (const sweep::SweepError& error) {
    std::fprintf(stderr, "runner sweep: %s\n", core::terminal_text(error.what()).c_str());
    return core::kExitUsage;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "runner sweep: %s\n", core::terminal_text(error.what()).c_str());
    return core::kExitError;
  }
}

}  // namespace runner::app
