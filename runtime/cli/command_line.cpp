// The one command line parser and usage error of the runner commands.
#include "runtime/cli/command_line.h"

#include <cstdio>
#include <fmt/format.h>

#include "runtime/core/did_you_mean.h"
#include "runtime/core/exit_status.h"
#include "runtime/core/terminal_text.h"

namespace runner::cli {

std::optional<std::string> CommandLine::value(const std::string& option) const {
  auto found = values.find(option);
  if (found == values.end()) return std::nullopt;
  return found->second;
}

CommandLine parse_command_line(int argc, char** argv, const CommandOptions& options) {
  CommandLine parsed;
  bool options_done = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (options.options_end_at_first_positional && !parsed.positional.empty()) {
      if (arg == "--") {
        parsed.passthrough.assign(argv + i + 1, argv + argc);
        break;
      }
      parsed.after_positional.push_back(arg);
      continue;
    }
    if (options_done || arg.size() < 2 || arg[0] != '-') {
      if (options.max_positionals && parsed.positional.size() >= *options.max_positionals)
        throw UsageError(fmt::format("unexpected argument '{}'", arg));
      parsed.positional.push_back(arg);
      continue;
    }
    if (arg == "--" && options.double_dash_passes_through) {
      parsed.passthrough.assign(argv + i + 1, argv + argc);
      break;
    }
    if (arg == "--" && options.double_dash_ends_options) {
      options_done = true;
      continue;
    }
    if (arg == "-h" || arg == "--help") {
      parsed.help = true;
      return parsed;
    }
    std::string name = arg;
    std::optional<std::string> inline_value;
    if (const auto equals = arg.find('='); equals != std::string::npos && arg.rfind("--", 0) == 0) {
      name = arg.substr(0, equals);
      inline_value = arg.substr(equals + 1);
    }
    if (const auto valued = options.values.find(name); valued != options.values.end()) {
      if (inline_value) {
        parsed.values[name] = *inline_value;
      } else {
        if (i + 1 >= argc)
          throw UsageError(fmt::format("{} needs {}", name, valued->second.empty() ? "a value" : valued->second));
        parsed.values[name] = argv[++i];
      }
    } else if (options.flags.count(name)) {
      if (inline_value) throw UsageError(fmt::format("{} takes no value, got '{}'", name, arg));
      parsed.flags.insert(name);
    } else {
      std::vector<std::string> known(options.flags.begin(), options.flags.end());
      for (const auto& [option, what] : options.values) known.push_back(option);
      throw UsageError(fmt::format("unknown option '{}'{}", name, core::did_you_mean(name, known)));
    }
  }
  return parsed;
}

int print_usage_error(const std::string& command, const std::string& message) {
  const std::string name = command.empty() ? "runner" : "runner " + command;
  std::fprintf(stderr, "%s: %s\nsee '%s --help'\n", name.c_str(), core::terminal_text(message).c_str(), name.c_str());
  return core::kExitUsage;
}

}  // namespace runner::cli
