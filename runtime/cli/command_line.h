// The command line of every runner command (`runner`, `runner sweep`, `runner data ...`, the index commands):
// one parser over a declared set of options, and one usage error printed one way.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace runner::cli {

// A wrong command line: printed as "runner CMD: message", a blank line and the command's usage, exit status 2
// (print_usage_error).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What a command accepts. An argument that starts with '-' (and is not "-" alone) is an option: a declared
// value option takes the next argument ("--size 64") or its inline value ("--size=64", also empty), a flag
// takes none; anything else is "unknown option '--x'" with a did-you-mean among the declared options. The
// other arguments are positionals.
struct CommandOptions {
  // Options with a value -> what the value is, for "--join needs a sweep (a name or number)"; "" reads "a value".
  std::map<std::string, std::string> values;
  std::set<std::string> flags;
  // "-h" / "--help" among the options stop the parsing with CommandLine::help set (they are always known).
  // More positionals than this are "unexpected argument 'x'".
  std::optional<std::size_t> max_positionals;
  // `runner SCRIPT.lua key=value ...`: the first positional ends the options; what follows it is kept in
  // CommandLine::after_positional as given, up to a "--", whose followers are CommandLine::passthrough.
  bool options_end_at_first_positional = false;
  // A "--" ends the options: every later argument is a positional (the index commands, `runner rm -- -odd`).
  bool double_dash_ends_options = true;
  // A "--" ends the command line instead: the arguments after it are CommandLine::passthrough, for another
  // program (`runner sweep FILE --slurm N -- SBATCH-OPTIONS`).
  bool double_dash_passes_through = false;
};

struct CommandLine {
  std::vector<std::string> positional;
  std::map<std::string, std::string> values;  // the last one given of each value option
  std::set<std::string> flags;
  std::vector<std::string> after_positional;  // options_end_at_first_positional: the arguments after the first
                                              // positional, up to "--"
  std::vector<std::string> passthrough;       // options_end_at_first_positional or double_dash_passes_through:
                                              // the arguments after "--"
  bool help = false;                          // -h / --help was given (parsing stopped there)

  bool has(const std::string& flag) const { return flags.count(flag) > 0; }
  std::optional<std::string> value(const std::string& option) const;
};

// Parses argv[1..argc-1] (argv[0] is the command's name). Throws UsageError.
CommandLine parse_command_line(int argc, char** argv, const CommandOptions& options);

// Prints "runner COMMAND: message" and "see 'runner COMMAND --help'" on stderr ("runner: message" for an empty
// command; control characters of the message escaped), two lines that the usage does not push off the screen,
// and returns the exit status of a usage error, 2.
int print_usage_error(const std::string& command, const std::string& message);

}  // namespace runner::cli
