// The one command line parser of the runner commands (runtime/cli/command_line.h): values, flags, positionals,
// "--", help, and the usage errors' texts.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "runtime/cli/command_line.h"

namespace {

using namespace runner;

cli::CommandLine parse(std::vector<std::string> args, const cli::CommandOptions& options) {
  args.insert(args.begin(), "cmd");
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  return cli::parse_command_line(static_cast<int>(argv.size()), argv.data(), options);
}

cli::CommandOptions index_like() {
  cli::CommandOptions options;
  options.values = {{"--limit", ""}, {"-o", ""}, {"--join", "a sweep (a name or number)"}};
  options.flags = {"--json", "--csv"};
  return options;
}

}  // namespace

TEST_CASE("the command line parser reads values, flags and positionals in any order", "[cli]") {
  const cli::CommandLine line =
      parse({"a", "--limit", "3", "--json", "b", "-o", "x.html", "--join=", "--", "--c"}, index_like());
  CHECK(line.positional == std::vector<std::string>{"a", "b", "--c"});
  CHECK(line.value("--limit") == "3");
  CHECK(line.value("-o") == "x.html");
  CHECK(line.value("--join") == "");  // an inline value may be empty
  CHECK(line.has("--json"));
  CHECK_FALSE(line.has("--csv"));
  CHECK_FALSE(line.help);
  CHECK(parse({"--limit=5", "--help", "--bogus"}, index_like()).help);  // help stops the parsing
}

TEST_CASE("the command line parser's usage errors", "[cli]") {
  CHECK_THROWS_WITH(parse({"--limit"}, index_like()), "--limit needs a value");
  CHECK_THROWS_WITH(parse({"--join"}, index_like()), "--join needs a sweep (a name or number)");
  CHECK_THROWS_WITH(parse({"--bogus"}, index_like()), "unknown option '--bogus'");
  CHECK_THROWS_WITH(parse({"--jsno"}, index_like()), "unknown option '--jsno'; did you mean '--json'?");
  CHECK_THROWS_WITH(parse({"--csv=1"}, index_like()), "--csv takes no value, got '--csv=1'");
  cli::CommandOptions two = index_like();
  two.max_positionals = 2;
  CHECK_THROWS_WITH(parse({"a", "b", "c"}, two), "unexpected argument 'c'");
}

TEST_CASE("the top-level command line ends its options at the script and passes what follows -- on", "[cli]") {
  cli::CommandOptions options;
  options.values = {{"-e", ""}, {"--profile", ""}};
  options.flags = {"--fresh"};
  options.options_end_at_first_positional = true;
  options.double_dash_ends_options = false;
  const cli::CommandLine line =
      parse({"--fresh", "--profile=3:5", "train.lua", "lr=0.1", "--fresh", "--", "x", "--y"}, options);
  CHECK(line.positional == std::vector<std::string>{"train.lua"});
  CHECK(line.after_positional == std::vector<std::string>{"lr=0.1", "--fresh"});
  CHECK(line.passthrough == std::vector<std::string>{"x", "--y"});
  CHECK(line.value("--profile") == "3:5");
  CHECK_THROWS_WITH(parse({"--", "train.lua"}, options), "unknown option '--'");
  CHECK_THROWS_WITH(parse({"--frsh"}, options), "unknown option '--frsh'; did you mean '--fresh'?");
}
