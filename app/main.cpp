// The runner program: the subcommands' dispatch table, and running a Lua experiment script, a code string or
// the REPL with the process's launch context (command line and environment, parsed once).
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <optional>
#include <string>
#include <vector>

#include "app/attach_command.h"
#include "app/repl.h"
#include "app/sweep_command.h"
#include "bindings/lua_host.h"
#include "bindings/stdlib_dir.h"
#include "runtime/cli/command_line.h"
#include "runtime/cli/data_commands.h"
#include "runtime/cli/index_commands.h"
#include "runtime/core/exit_status.h"
#include "runtime/core/storage_full.h"
#include "runtime/core/launch_context.h"
#include "runtime/core/logging.h"
#include "runtime/core/version.h"
#include "runtime/core/terminal_text.h"
#include "runtime/core/device.h"
#include "runtime/dist/failure_report.h"
#include "runtime/dist/launcher.h"
#include "runtime/dist/process_group.h"
#include "runtime/serve/serve_command.h"
#include "runtime/train/step_profiler.h"

namespace {

using runner::core::kExitError;
using runner::core::kExitOk;
using runner::core::kExitUsage;

// Subcommands: `runner NAME args...` with argv[0] = NAME. Each prints its own errors and returns the
// exit status.
struct Subcommand {
  const char* name;
  int (*run)(int argc, char** argv);
  bool logging;  // set up logging (at info) before running
};

constexpr Subcommand kSubcommands[] = {
    {"data", runner::cli::run_data_command, true},      {"runs", runner::cli::run_index_command, false},
    {"show", runner::cli::run_index_command, false},    {"compare", runner::cli::run_index_command, false},
    {"query", runner::cli::run_index_command, false},   {"report", runner::cli::run_index_command, false},
    {"rm", runner::cli::run_index_command, false},      {"gc", runner::cli::run_index_command, false},
    {"tag", runner::cli::run_index_command, false},     {"note", runner::cli::run_index_command, false},
    {"sweeps", runner::cli::run_index_command, false},  {"consolidate", runner::cli::run_index_command, false},
    {"sweep", runner::app::run_sweep_command, true},    {"serve", runner::serve::run_serve_command, false},
    {"attach", runner::app::run_attach_command, false},
};

constexpr const char* kUsage = R"(usage: runner [options] SCRIPT.lua [key=value ...] [-- script args]
       runner [options] -i SCRIPT.lua [key=value ...]   run the script, then the REPL with its variables
       runner [options] -e 'lua code'                   run a code string
       runner [options] repl                            interactive REPL
       runner data pack DIR OUT.npy --size N            preprocess an image folder into a .npy array
       runner data encode IMAGES OUT.npy --vae VAE      images into VAE latents for data.latents
       runner data fid-stats IMAGES OUT.npz --weights PATH   FID reference statistics (runner data --help)
       runner sweep SWEEP.lua | --join SWEEP | show | rm SWEEP   hyperparameter sweeps (runner sweep --help)
       runner [--nproc N] sample RUN [options]          samples of a run's checkpoint (runner sample --help)
       runner runs | show | compare | query | report | tag | note | rm | gc | consolidate | sweeps | serve ...   the run index (below)
       runner attach RUN                                a REPL in a running training process (runner attach -h)
       runner --help | --version

options:
  --log-level LEVEL   trace, debug, info (default), warn, error or off
  --resume RUN        continue that run (an id, a name or `last`), finished or not, from its latest good
                      checkpoint
  --fresh             start a new run even when the latest run of the script with the same config was
                      interrupted or failed (by default runner.start continues it)
  --nproc N|auto      data parallel on this host: start N ranks of the script (auto: one per GPU); the
                      loader's batch is the global batch, each rank takes 1/N of it, so the learning rate
                      stays what it is for that batch at any N; see "Data parallel" in the README
  --oversubscribe     with --nproc: start more ranks than there are GPUs (without one, CPU cores)
  --profile A:B       record training steps A to B (or step A) with the Kineto profiler: a trace in the
                      run directory (Perfetto, chrome://tracing) and the top operators by self time
  --index URL         the run index on a PostgreSQL server (postgresql://user@host:port/db), as
                      RUNNER_INDEX=URL; also for the index and sweep commands. Unset: index.db in RUNNER_HOME
  --print-config      print the script's config keys (defaults, whole-number keys) as JSON, after checking
                      the key=value overrides, and stop there: nothing else of the script runs
  -h, --help          this help
  --version           versions of runner, LibTorch, CUDA, LuaJIT and SQLite

key=value overrides the defaults the script declares with config { ... }; values are parsed by the
type of the default. Exit status: 0 success, 1 error in the script, 2 usage error, 130 interrupted
(Ctrl-C; 143 for SIGTERM, 129 for SIGHUP, 138 for SIGUSR1). A training loop that checkpoints
(run:restore) stops on the first signal when it asks for its next step or batch (the current step and
its loop body, its logging included, run to the end), saves a checkpoint and exits with 0 (SIGTERM,
SIGUSR1, SIGHUP) or 130 (Ctrl-C). A script whose run could not be recorded whole (metric values lost
to a full disk, a failed final checkpoint) exits with 1.
)";

struct Command {
  bool help = false;
  bool version = false;
  bool interactive = false;
  bool repl = false;
  std::string code;
  bool has_code = false;
  std::string script;
  std::vector<std::string> overrides;
  std::vector<std::string> script_args;
  std::string log_level;      // --log-level; default info (warn on ranks > 0 of a data-parallel job)
  std::string resume;         // --resume RUN
  bool fresh = false;         // --fresh
  bool print_config = false;  // --print-config
  std::string profile;        // --profile A:B
  std::string nproc;          // --nproc N|auto
  bool nproc_given = false;
  bool oversubscribe = false;  // --oversubscribe
  int nproc_count = 0;
  std::string index_url;                    // --index URL
  std::vector<std::string> rank_arguments;  // argv after the program name without --nproc N
  bool builtin_script = false;              // `runner sample`: stdlib/commands/sample.lua, given every argument
};

using runner::cli::UsageError;

// Options before the script: those with a value and flags. `repl` as the first positional is the REPL.
runner::cli::CommandOptions command_options() {
  runner::cli::CommandOptions options;
  options.values = {{"-e", ""},        {"--log-level", ""}, {"--resume", ""},
                    {"--profile", ""}, {"--nproc", ""},     {"--index", ""}};
  options.flags = {"--version", "-i", "--fresh", "--print-config", "--oversubscribe"};
  options.options_end_at_first_positional = true;
  options.double_dash_ends_options = false;
  return options;
}

Command parse_command(int argc, char** argv) {
  Command command;
  const runner::cli::CommandLine line = runner::cli::parse_command_line(argc, argv, command_options());
  command.help = line.help;
  command.version = line.has("--version");
  command.interactive = line.has("-i");
  if (auto code = line.value("-e")) {
    command.code = *code;
    command.has_code = true;
  }
  command.log_level = line.value("--log-level").value_or("");
  command.resume = line.value("--resume").value_or("");
  command.fresh = line.has("--fresh");
  command.print_config = line.has("--print-config");
  command.profile = line.value("--profile").value_or("");
  command.index_url = line.value("--index").value_or("");
  command.nproc_given = line.values.count("--nproc") > 0;
  command.nproc = line.value("--nproc").value_or("");
  command.oversubscribe = line.has("--oversubscribe");
  if (!line.positional.empty()) {
    if (line.positional[0] == "repl" && !command.has_code) {
      command.repl = true;
      if (!line.after_positional.empty()) throw UsageError("unexpected argument '" + line.after_positional[0] + "'");
    } else if (line.positional[0] == "sample" && !std::filesystem::exists("sample")) {
      // runner [--nproc N] sample RUN ...: a script of runner's own, its options passed to it as they are.
      command.script = std::string(runner::bindings::stdlib_dir()) + "/commands/sample.lua";
      command.builtin_script = true;
    } else {
      command.script = line.positional[0];
      // `runner run x.lua`, as other tools spell it: the script comes first here.
      const auto& after = line.after_positional;
      if (command.script == "run" && !after.empty() && after[0].size() > 4 &&
          after[0].compare(after[0].size() - 4, 4, ".lua") == 0 && !std::filesystem::exists("run"))
        throw UsageError("'run' is not a command: the script comes first (runner " + after[0] + " key=value ...)");
    }
  }
  for (std::size_t i = 0; i < line.after_positional.size() && !command.builtin_script; ++i) {
    const std::string& arg = line.after_positional[i];
    if (arg.rfind("--", 0) == 0 && arg.size() > 2) {
      const auto options = command_options();
      const std::string name = arg.substr(0, arg.find('='));
      if (options.flags.count(name) || options.values.count(name))
        throw UsageError("got '" + arg + "' after the script: runner's options go before it (runner " + name +
                         " SCRIPT.lua ...)");
      // --steps 10 or --steps=10 for a config key: say how config keys are given.
      const std::string key = arg.substr(2, arg.find('=') - 2);
      const std::string value = arg.find('=') != std::string::npos     ? arg.substr(arg.find('=') + 1)
                                : i + 1 < line.after_positional.size() ? line.after_positional[i + 1]
                                                                       : "...";
      throw UsageError("expected key=value after the script, got '" + arg + "': did you mean " + key + "=" + value +
                       "? (script arguments go after --)");
    }
    if (arg.find('=') == std::string::npos || arg[0] == '=')
      throw UsageError("expected key=value after the script, got '" + arg + "' (use -- before script arguments)");
    command.overrides.push_back(arg);
  }
  command.script_args = line.passthrough;
  if (command.builtin_script)
    command.script_args.insert(command.script_args.begin(), line.after_positional.begin(), line.after_positional.end());
  if (command.help) return command;
  if (!command.version && !command.repl && !command.has_code && command.script.empty())
    throw UsageError("no script given");
  if (command.print_config && (command.script.empty() || command.interactive || !command.nproc.empty()))
    throw UsageError("--print-config needs a script (and no -i or --nproc)");
  if (command.interactive && command.script.empty() && !command.has_code)
    throw UsageError("-i needs a script or -e code");
  if (command.fresh && !command.resume.empty()) throw UsageError("--fresh and --resume exclude each other");
  if (!command.profile.empty()) {
    try {
      runner::train::parse_step_range(command.profile);
    } catch (const std::invalid_argument& error) {
      throw UsageError(std::string("--") + error.what());
    }
  }
  if (command.nproc_given && command.nproc.empty())
    throw UsageError("--nproc needs a value: a whole number >= 1 or auto, got ''");
  if (command.oversubscribe && !command.nproc_given) throw UsageError("--oversubscribe goes with --nproc N");
  if (!command.nproc.empty()) {
    if (command.script.empty() || command.interactive) throw UsageError("--nproc needs a script (and no -i)");
    command.nproc_count = runner::dist::parse_nproc(command.nproc, command.oversubscribe);
    for (int a = 1; a < argc; ++a) {
      const std::string arg = argv[a];
      if (arg == "--nproc")
        ++a;
      else if (arg.rfind("--nproc=", 0) != 0 && arg != "--oversubscribe")
        command.rank_arguments.push_back(arg);
    }
  }
  return command;
}

void print_version() {
  const auto info = runner::core::version_info();
  std::printf("runner %s\n", info.runner.c_str());
  std::printf("LibTorch %s\n", info.libtorch.c_str());
  if (info.cuda_runtime.empty())
    std::printf("CUDA: not built in\n");
  else
    std::printf("CUDA %s: %s\n", info.cuda_runtime.c_str(),
                info.cuda_available ? "available" : "not available (no device)");
  for (size_t i = 0; i < info.cuda_devices.size(); ++i) std::printf("  cuda:%zu %s\n", i, info.cuda_devices[i].c_str());
  std::printf("%s\n", runner::bindings::luajit_version());
  std::printf("SQLite %s\n", info.sqlite.c_str());
}

// The launch context: the environment's part, then the command line's.
runner::core::LaunchContext launch_context(const Command& command) {
  runner::core::LaunchContext context = runner::core::launch_context_from_environment();
  context.log_level = !command.log_level.empty() ? command.log_level : context.rank > 0 ? "warn" : "info";
  context.profile = command.profile;
  if (!command.index_url.empty()) context.index_url = command.index_url;
  if (command.fresh) context.resume = runner::core::ResumePolicy::fresh;
  if (!command.resume.empty()) {
    context.resume = runner::core::ResumePolicy::run;
    context.resume_run = command.resume;
  }
  return context;
}

int run(const Command& command) {
  runner::bindings::LuaHost host;
  int status = kExitOk;
  if (command.has_code) {
    status = host.run_string(command.code);
  } else if (!command.script.empty()) {
    if (command.interactive) host.keep_script_locals();
    if (command.print_config) host.want_config();
    status = host.run_file(command.script, command.overrides, command.script_args);
    if (command.print_config && status == kExitOk) {
      if (auto reported = host.reported_config()) std::printf("%s\n", reported->c_str());
      return status;
    }
  }
  status = host.end_run(host.exit_requested() ? host.exit_status() : status);
  if (host.exit_requested()) return status;
  if (command.repl || command.interactive) status = host.end_run(runner::app::run_repl(host));
  return status;
}

}  // namespace

// A subcommand's `--index URL` (or --index=URL) before its `--`, taken out of `arguments`: the index on a
// PostgreSQL server for this command (and the trials it starts), as RUNNER_INDEX=URL says.
std::optional<std::string> take_index_option(std::vector<char*>& arguments) {
  std::optional<std::string> url;
  for (size_t i = 1; i < arguments.size();) {
    const std::string arg = arguments[i];
    if (arg == "--") break;
    const auto at = arguments.begin() + static_cast<std::ptrdiff_t>(i);
    if (arg == "--index") {
      if (i + 1 >= arguments.size()) throw runner::cli::UsageError("--index needs a postgresql:// URL");
      url = arguments[i + 1];
      arguments.erase(at, at + 2);
    } else if (arg.rfind("--index=", 0) == 0) {
      url = arg.substr(8);
      arguments.erase(at);
    } else {
      ++i;
    }
  }
  return url;
}

int main(int argc, char** argv) {
  // Progress lines reach a log file or a pipe as they are printed, not when a buffer fills.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  for (const Subcommand& subcommand : kSubcommands) {
    if (argc < 2 || std::strcmp(argv[1], subcommand.name) != 0) continue;
    if (subcommand.logging) runner::core::init_logging("info");
    std::vector<char*> arguments(argv, argv + argc);
    try {
      runner::core::LaunchContext context = runner::core::launch_context_from_environment();
      if (const std::optional<std::string> url = take_index_option(arguments)) context.index_url = *url;
      runner::core::set_launch_context(context);
    } catch (const std::exception& error) {
      return runner::cli::print_usage_error("", error.what());
    }
    arguments.push_back(nullptr);
    argc = static_cast<int>(arguments.size()) - 1;
    argv = arguments.data();
    const int status = subcommand.run(argc - 1, argv + 1);
    runner::core::flush_logs();
    std::fflush(stdout);
    return status;
  }
  Command command;
  try {
    command = parse_command(argc, argv);
    const runner::core::LaunchContext context = launch_context(command);
    runner::core::init_logging(context.log_level);
    runner::core::set_launch_context(context);
  } catch (const std::exception& error) {
    return runner::cli::print_usage_error("", error.what());
  }
  if (command.help) {
    std::fputs(kUsage, stdout);
    std::fputs("\n", stdout);
    std::fputs(runner::cli::index_commands_usage(), stdout);
    return kExitOk;
  }
  if (command.version) {
    print_version();
    return kExitOk;
  }
  int status = kExitError;
  try {
    if (!command.nproc.empty()) {
      if (runner::core::launch_context().rank_variables) {
        std::fprintf(stderr,
                     "runner: --nproc starts its own ranks; it cannot run inside a launcher that set RANK / "
                     "WORLD_SIZE (torchrun, srun): leave --nproc out there\n");
        return kExitUsage;
      }
      if (command.nproc == "auto") std::fprintf(stderr, "runner: %s\n", runner::dist::describe_auto_nproc().c_str());
      runner::dist::LaunchOptions options;
      options.nproc = command.nproc_count;
      options.arguments = command.rank_arguments;
      return runner::dist::launch_local_ranks(options);
    }
    if (runner::core::launch_context().distributed()) {
      // A rank outlives the reader of its output (a launcher killed with -9): a write then fails with EPIPE
      // instead of killing the rank, and the SIGTERM of the launcher's death stops it after a checkpoint.
      std::signal(SIGPIPE, SIG_IGN);
      runner::dist::join_process_group(runner::core::parse_device("auto"));
    }
    status = run(command);
    runner::dist::leave_process_group();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "runner: %s\n", runner::core::terminal_text(error.what()).c_str());
    if (runner::core::launch_context().distributed()) runner::dist::report_rank_failure(error.what());
  }
  runner::core::flush_logs();
  std::fflush(stdout);
  if (status == kExitError && runner::core::storage_was_full()) {
    std::fprintf(stderr, "runner: exit status %d: a write failed for want of space (a sweep continues the trial)\n",
                 runner::core::kExitStorageFull);
    status = runner::core::kExitStorageFull;
  }
  return status;
}
