// `runner consolidate`: a sharded checkpoint's files written whole.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>

#include "runtime/ckpt/checkpoint_directory.h"
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
  std::vector<index::CheckpointRecord> kept;
  for (index::CheckpointRecord& c : index::checkpoints(db, run.run))
    if (c.kept) kept.push_back(std::move(c));
  std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  if (kept.empty()) throw std::invalid_argument(fmt::format("run {} ({}) has no checkpoint", run.name, run.id));
  const index::CheckpointRecord* chosen = &kept.back();
  if (const auto step = arguments.value("--step")) {
    const std::int64_t wanted = parse_count("--step", *step);
    chosen = nullptr;
    std::vector<std::string> steps;
    for (const auto& c : kept) {
      steps.push_back(std::to_string(c.step));
      if (c.step == wanted) chosen = &c;
    }
    if (!chosen)
      throw std::invalid_argument(
          fmt::format("run {} has no checkpoint of step {} (it has {})", run.name, wanted, fmt::join(steps, ", ")));
  }
  const std::string run_dir = command_index().home + "/" + run.dir;
  std::vector<ckpt::CheckpointFileRecord> files;
  for (const auto& f : chosen->files) files.push_back({f.name, f.bytes, f.hash});
  const std::vector<std::string> problems = ckpt::verify_checkpoint(run_dir, chosen->path, files);
  if (!problems.empty())
    throw std::invalid_argument(
        fmt::format("{}/{} is damaged, nothing was written: {}", run_dir, chosen->path, fmt::join(problems, "; ")));
  const auto out = arguments.value("-o") ? arguments.value("-o") : arguments.value("--out");
  const std::string out_dir = out ? *out : fmt::format("{}-step-{}", run.name, chosen->step);
  const std::vector<std::string> written = ckpt::write_consolidated(run_dir + "/" + chosen->path, out_dir);
  const std::string text = fmt::format("{}: {} of run {} ({}) step {}, whole\n", core::terminal_text(out_dir),
                                       fmt::join(written, ", "), core::terminal_text(run.name), run.id, chosen->step);
  std::fputs(text.c_str(), stdout);
  return 0;
}

}  // namespace runner::cli
