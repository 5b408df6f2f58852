// `runner sweep FILE.lua [--slurm N] | --join SWEEP | show SWEEP`: the sweep file is read in a Lua host
// (bindings/sweep_file.h), checked against the experiment script's config (read by a second host that stops at its
// config { ... }), recorded in the index, and run by a worker here or by the tasks of a Slurm job (runtime/sweep).
#include "app/sweep_command.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <string>
#include <unistd.h>
#include <variant>

#include "bindings/lua_host.h"
#include "bindings/sweep_file.h"
#include "runtime/cli/command_line.h"
#include "runtime/cli/command_support.h"
#include "runtime/cli/index_commands.h"
#include "runtime/core/exit_status.h"
#include "runtime/core/launch_context.h"
#include "runtime/core/terminal_text.h"
#include "runtime/index/index_database.h"
#include "runtime/sweep/asha.h"
#include "runtime/sweep/samplers.h"
#include "runtime/sweep/slurm_job.h"
#include "runtime/sweep/sweep_worker.h"
#include "runtime/sweep/trial_store.h"

namespace runner::app {
namespace {

constexpr const char* kUsage =
    R"(usage: runner sweep SWEEP.lua       create the sweep (or continue it) and run its trials here
       runner sweep --dry-run SWEEP.lua
                                     check the file against the script's config and show the first
                                     trials' command lines; records and runs nothing
       runner sweep --join SWEEP     run trials of a sweep of the index as another worker
       runner sweep SWEEP.lua --slurm N [--dry-run] [-- SBATCH-OPTIONS...]
                                     create the sweep (or continue it) and submit N workers as a Slurm job
                                     array, each `runner sweep --join` on the GPUs of its allocation; prints
                                     the job id (--dry-run: the job script, submitting nothing)
       runner sweep show SWEEP [--csv|--json]
                                     its trials sorted by the objective, the best one's command line
       runner sweep rm SWEEP... [--force]
                                     delete sweeps with their trials' runs and files
       runner sweeps [--csv|--json]  table of sweeps
A sweep file returns runner.sweep { script = ..., parameters = ..., metric = ..., ... } (see the README).
Workers on several hosts share RUNNER_HOME on a shared filesystem and the index (RUNNER_INDEX), which the job
script passes on; `runner sweep show SWEEP` lists the workers by host.
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
// against the script's config, the slots of this host (unless the workers run elsewhere), and a stored sweep of the
// same name (when the index exists, in RUNNER_HOME or on the PostgreSQL server; a dry run creates nothing, and goes on
// with a warning when the server cannot be reached). Prints the warnings. Returns the exit status of a script that
// failed.
std::variant<sweep::SweepSpec, int> checked_sweep(const std::string& file, bool slots_here, bool dry_run) {
  const auto definition = bindings::read_sweep_file(file);
  if (const int* status = std::get_if<int>(&definition)) return *status;
  sweep::SweepSpec spec = sweep::parse_sweep(std::get<nlohmann::json>(definition));
  const auto config = script_config(spec);
  if (const int* status = std::get_if<int>(&config)) return *status;
  sweep::check_against_config(spec, std::get<sweep::ScriptConfig>(config));
  if (slots_here) sweep::sweep_slots(spec);  // a Slurm job's slots are its allocation's
  try {
    if (std::optional<index::Database> db = index::open_index_if_any(cli::command_index()))
      sweep::same_definition(*db, spec);
  } catch (const index::IndexUnreachable& error) {
    if (!dry_run) throw;
    std::fprintf(stderr, "runner sweep: %s; the dry run goes on without comparing the file with a sweep stored there\n",
                 core::terminal_text(error.what()).c_str());
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

// The launch's index with its home made absolute (the trials run in other folders), created when missing.
index::IndexLocation absolute_index() {
  index::IndexLocation where = cli::command_index();
  index::open_index_for_writing(where);  // creates it
  if (char* resolved = ::realpath(where.home.c_str(), nullptr)) {
    where.home = resolved;
    std::free(resolved);
  }
  return where;
}

// --slurm N: the number of workers, 1 or more.
std::optional<int> slurm_workers(const cli::CommandLine& line) {
  const std::optional<std::string> text = line.value("--slurm");
  if (!text) return std::nullopt;
  int workers = 0;
  const auto [end, error] = std::from_chars(text->data(), text->data() + text->size(), workers);
  if (error != std::errc() || end != text->data() + text->size() || workers < 1)
    throw cli::UsageError(fmt::format("--slurm needs a number of workers, 1 or more; got '{}'", *text));
  return workers;
}

// The Slurm job array of `runner sweep FILE --slurm N`, with the absolute paths its tasks need.
sweep::SlurmJob slurm_job(const sweep::SweepSpec& spec, int workers, const index::IndexLocation& where,
                          const std::vector<std::string>& sbatch_options) {
  namespace fs = std::filesystem;
  sweep::SlurmJob job;
  job.sweep = spec.name;
  job.sweep_file = fs::absolute(spec.sweep_file).lexically_normal().string();
  job.workers = workers;
  job.runner = fs::read_symlink("/proc/self/exe").string();
  job.home = fs::absolute(where.home).lexically_normal().string();
  while (job.home.size() > 1 && job.home.back() == '/') job.home.pop_back();
  job.index_url = where.url;
  job.working_directory = fs::current_path().string();
  job.sbatch_options = sbatch_options;
  return job;
}

int run(int argc, char** argv) {
  if (argc >= 2 && (std::strcmp(argv[1], "show") == 0 || std::strcmp(argv[1], "rm") == 0))
    return cli::run_index_command(argc, argv);
  cli::CommandOptions accepted;
  accepted.values = {{"--join", "a sweep (a name or number)"}, {"--slurm", "a number of workers"}};
  accepted.flags = {"--dry-run"};
  accepted.max_positionals = 1;
  accepted.double_dash_passes_through = true;
  const cli::CommandLine line = cli::parse_command_line(argc, argv, accepted);
  if (line.help) {
    std::fputs(kUsage, stdout);
    return core::kExitOk;
  }
  const std::string file = line.positional.empty() ? "" : line.positional[0];
  const std::string join = line.value("--join").value_or("");
  const bool dry_run = line.has("--dry-run");
  const std::optional<int> slurm = slurm_workers(line);
  if (file.empty() == join.empty()) throw cli::UsageError("give a sweep file or --join SWEEP (one of them)");
  if (dry_run && file.empty()) throw cli::UsageError("--dry-run needs a sweep file");
  if (slurm && file.empty())
    throw cli::UsageError("--slurm needs a sweep file (its tasks run runner sweep --join themselves)");
  if (!line.passthrough.empty() && !slurm)
    throw cli::UsageError("the options after -- are sbatch's: give them with --slurm N");

  if (!join.empty()) {
    const index::IndexLocation where = absolute_index();
    index::Database db = index::open_index_for_writing(where);
    const sweep::SweepRecord record = sweep::load_sweep(db, join);
    return sweep::run_sweep_worker(where, record);
  }
  const auto checked = checked_sweep(file, !slurm, dry_run);
  if (const int* status = std::get_if<int>(&checked)) return *status;
  const sweep::SweepSpec& spec = std::get<sweep::SweepSpec>(checked);
  if (dry_run) {
    print_plan(spec);
    if (slurm) {
      const sweep::SlurmJob job = slurm_job(spec, *slurm, cli::command_index(), line.passthrough);
      std::printf(
          "\nthe job script (runner sweep --slurm writes it to %s and submits it with sbatch --parsable):\n\n%s",
          sweep::slurm_job_script_path(job).c_str(), sweep::slurm_job_script(job).c_str());
    }
    return core::kExitOk;
  }
  const index::IndexLocation where = absolute_index();
  const std::string& home = where.home;
  index::Database db = index::open_index_for_writing(where);
  if (slurm) {
    const sweep::SlurmJob job = slurm_job(spec, *slurm, where, line.passthrough);
    const std::string script = sweep::slurm_job_script(job);  // checks the options before the sweep is recorded
    const sweep::SweepRecord record = sweep::open_sweep(db, spec);
    std::filesystem::create_directories(home + "/sweeps/" + record.name);
    const std::string job_id = sweep::submit_slurm_job(sweep::slurm_job_script_path(job), script);
    std::printf("sweep %s: submitted Slurm job %s, %d worker%s (array tasks 0-%d), each runner sweep --join %s\n",
                record.name.c_str(), job_id.c_str(), *slurm, *slurm == 1 ? "" : "s", *slurm - 1, record.name.c_str());
    std::printf("job script %s; output in %s/sweeps/%s/slurm-%s_*.log; runner sweep show %s lists the workers\n",
                sweep::slurm_job_script_path(job).c_str(), home.c_str(), record.name.c_str(), job_id.c_str(),
                record.name.c_str());
    return core::kExitOk;
  }
  const sweep::SweepRecord record = sweep::open_sweep(db, spec);
  return sweep::run_sweep_worker(where, record);
}

}  // namespace

int run_sweep_command(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const cli::UsageError& error) {
    return cli::print_usage_error("sweep", error.what());
  } catch (const sweep::SweepError& error) {
    std::fprintf(stderr, "runner sweep: %s\n", core::terminal_text(error.what()).c_str());
    return core::kExitUsage;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "runner sweep: %s\n", core::terminal_text(error.what()).c_str());
    return core::kExitError;
  }
}

}  // namespace runner::app
