// The runner command line: run a Lua experiment script, a code string or the REPL.
#include <cstdio>
#include <cstring>
#include <fmt/format.h>
#include <string>
#include <vector>

#include "bindings/data_command.h"
#include "bindings/lua_host.h"
#include "runtime/cli/index_commands.h"
#include "runtime/core/logging.h"
#include "runtime/core/version.h"

namespace {

using runner::bindings::kExitError;
using runner::bindings::kExitOk;
using runner::bindings::kExitUsage;

constexpr const char* kUsage = R"(usage: runner [options] SCRIPT.lua [key=value ...] [-- script args]
       runner [options] -i SCRIPT.lua [key=value ...]   run the script, then the REPL with its globals
       runner [options] -e 'lua code'                   run a code string
       runner [options] repl                            interactive REPL
       runner data pack DIR OUT.npy --size N            preprocess an image folder into a .npy array
       runner runs | show | compare | query | report | rm | gc ...   the run index (below)
       runner --help | --version

options:
  --log-level LEVEL   trace, debug, info (default), warn, error or off
  --resume RUN        continue that run (an id, a name or `last`) from its latest good checkpoint
  --fresh             start a new run even when an ended run of the script with the same config could
                      be continued (by default runner.start continues it)
  -h, --help          this help
  --version           versions of runner, LibTorch, CUDA, LuaJIT and SQLite

key=value overrides the defaults the script declares with config { ... }; values are parsed by the
type of the default. Exit status: 0 success, 1 error in the script, 2 usage error, 130 interrupted
(Ctrl-C; 143 for SIGTERM, 129 for SIGHUP, 138 for SIGUSR1). A training loop that checkpoints
(run:restore) finishes its step on the first signal, saves a checkpoint and exits with 0 (SIGTERM,
SIGUSR1, SIGHUP) or 130 (Ctrl-C).
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
  std::string log_level = "info";
  std::string resume;  // --resume RUN
  bool fresh = false;  // --fresh
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

Command parse_command(int argc, char** argv) {
  Command command;
  int i = 1;
  auto value_of = [&](const std::string& option) -> std::string {
    if (i + 1 >= argc) throw UsageError(option + " needs a value");
    return argv[++i];
  };
  for (; i < argc && command.script.empty(); ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") command.help = true;
    else if (arg == "--version") command.version = true;
    else if (arg == "-i") command.interactive = true;
    else if (arg == "-e") {
      command.code = value_of(arg);
      command.has_code = true;
    } else if (arg == "--log-level") command.log_level = value_of(arg);
    else if (arg.rfind("--log-level=", 0) == 0) command.log_level = arg.substr(12);
    else if (arg == "--resume") command.resume = value_of(arg);
    else if (arg.rfind("--resume=", 0) == 0) command.resume = arg.substr(9);
    else if (arg == "--fresh") command.fresh = true;
    else if (arg == "repl" && !command.has_code) command.repl = true;
    else if (!arg.empty() && arg[0] == '-') throw UsageError("unknown option '" + arg + "'");
    else command.script = arg;
  }
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      command.script_args.assign(argv + i + 1, argv + argc);
      break;
    }
    if (arg.find('=') == std::string::npos || arg[0] == '=')
      throw UsageError("expected key=value after the script, got '" + arg + "' (use -- before script arguments)");
    command.overrides.push_back(arg);
  }
  if (!command.help && !command.version && !command.repl && !command.has_code && command.script.empty())
    throw UsageError("no script given");
  if (command.interactive && command.script.empty() && !command.has_code)
    throw UsageError("-i needs a script or -e code");
  if (command.fresh && !command.resume.empty()) throw UsageError("--fresh and --resume exclude each other");
  return command;
}

void print_version() {
  const auto info = runner::core::version_info();
  std::printf("runner %s\n", info.runner.c_str());
  std::printf("LibTorch %s\n", info.libtorch.c_str());
  if (info.cuda_runtime.empty()) std::printf("CUDA: not built in\n");
  else std::printf("CUDA %s: %s\n", info.cuda_runtime.c_str(), info.cuda_available ? "available" : "not available (no device)");
  for (size_t i = 0; i < info.cuda_devices.size(); ++i) std::printf("  cuda:%zu %s\n", i, info.cuda_devices[i].c_str());
  std::printf("%s\n", LUAJIT_VERSION);
  std::printf("SQLite %s\n", info.sqlite.c_str());
}

int run(const Command& command) {
  runner::bindings::LuaHost host;
  if (command.fresh || !command.resume.empty()) {
    lua_State* L = host.state();
    lua_getglobal(L, "runner");
    if (command.fresh) lua_pushboolean(L, 0);
    else lua_pushstring(L, command.resume.c_str());
    lua_setfield(L, -2, "command_line_resume");
    lua_pop(L, 1);
  }
  int status = kExitOk;
  if (command.has_code) {
    status = host.run_string(command.code);
  } else if (!command.script.empty()) {
    status = host.run_file(command.script, command.overrides, command.script_args);
  }
  host.end_run(host.exit_requested() ? host.exit_status() : status);
  if (host.exit_requested()) return host.exit_status();
  if (command.repl || command.interactive) {
    status = runner::bindings::run_repl(host);
    host.end_run(status);
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  // Progress lines reach a log file or a pipe as they are printed, not when a buffer fills.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc >= 2 && std::strcmp(argv[1], "data") == 0) {
    runner::core::init_logging("info");
    const int status = runner::bindings::run_data_command(argc - 1, argv + 1);
    runner::core::flush_logs();
    std::fflush(stdout);
    return status;
  }
  if (argc >= 2 && runner::cli::is_index_command(argv[1])) {
    const int status = runner::cli::run_index_command(argc - 1, argv + 1);
    std::fflush(stdout);
    return status;
  }
  Command command;
  try {
    command = parse_command(argc, argv);
    runner::core::init_logging(command.log_level);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "runner: %s\n\n%s", error.what(), kUsage);
    return kExitUsage;
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
    status = run(command);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "runner: %s\n", error.what());
  }
  runner::core::flush_logs();
  std::fflush(stdout);
  return status;
}
