// `runner consolidate`: a sharded checkpoint's files written whole.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>

#include "runtime/ckpt/checkpoint_store.h"
#include "runtime/ckpt/sharded_checkpoint.h"
#include "runtime/cli/command_support.h"
#include "runtime/cli/index_commands.h"
#include "runtime/core/terminal_text.h"
#include "runtime/index/run_store.h"

namespace runner::cli {

int consolidate_command(int argc, char** argv) {
  const ParsedArguments arguments = parse_arguments(argc, argv, {"--step", "-o", "--out"}, {"--sweep"});
  if (arguments.positional.size() != 1) throw UsageError("expected one RUN");
  index::Database db = index::open_index_for_reading(command_index());
  const index::RunRecord run = index::resolve_run(db, arguments.positional[0], last_among(arguments));
  std::optional<std::int64_t> step;
  if (const auto text = arguments.value("--step")) step = parse_count("--step", *text);
  const std::string run_dir = command_index().home + "/" + run.dir;
  const ckpt::RestoreChoice choice = ckpt::require_checkpoint(db, run.run, run.name, run_dir, step);
  const auto out = arguments.value("-o") ? arguments.value("-o") : arguments.value("--out");
  const std::string out_dir = out ? *out : fmt::format("{}-step-{}", run.name, choice.checkpoint->step);
  const std::vector<std::string> written = ckpt::write_consolidated(choice.directory, out_dir);
  const std::string text =
      fmt::format("{}: {} of run {} ({}) step {}, whole\n", core::terminal_text(out_dir), fmt::join(written, ", "),
                  core::terminal_text(run.name), run.id, choice.checkpoint->step);
  std::fputs(text.c_str(), stdout);
  return 0;
}

}  // namespace runner::cli
