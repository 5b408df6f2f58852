// The index commands of the runner CLI: runs, show, compare, query, report, rm, gc, tag, note, consolidate, sweeps,
// sweep show, sweep rm (`runner serve` is runtime/serve/serve_command.h, reporting errors the same way).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/index/database.h"
#include "runtime/index/run_store.h"
#include "runtime/report/svg_chart.h"

namespace runner::cli {

bool is_index_command(const std::string& name);
// argv[0] is the command name. Prints results on stdout and one-line errors on stderr
// ("runner show: no run matches 'x' ..."). Returns 0, 1 (an error) or 2 (a usage error).
int run_index_command(int argc, char** argv);

// Runs `command` as run_index_command runs the index commands: its usage errors are printed with the index
// commands' usage (exit status 2), its other errors as one line "runner NAME: ..." (1).
int run_reporting_errors(const std::string& name, int (*command)(int, char**), int argc, char** argv);

// Each command with argv[0] its name; they throw UsageError (command_line.h) or index::IndexError.
int runs_command(int argc, char** argv);         // runs_commands.cpp
int show_command(int argc, char** argv);         // runs_commands.cpp
int compare_command(int argc, char** argv);      // runs_commands.cpp
int query_command(int argc, char** argv);        // index_commands.cpp
int report_command(int argc, char** argv);       // index_commands.cpp
int rm_command(int argc, char** argv);           // index_commands.cpp
int gc_command(int argc, char** argv);           // index_commands.cpp
int tag_command(int argc, char** argv);          // index_commands.cpp
int note_command(int argc, char** argv);         // index_commands.cpp
int sweeps_command(int argc, char** argv);       // sweep_commands.cpp
int consolidate_command(int argc, char** argv);  // checkpoint_commands.cpp
// argv[0] is "show".
int sweep_show_command(int argc, char** argv);  // sweep_commands.cpp
int sweep_rm_command(int argc, char** argv);    // sweep_commands.cpp
// `runner report SWEEP`: whether `reference` names a sweep and no run, and its report (sweep_commands.cpp).
bool is_sweep_reference(index::Database& db, const std::string& reference);
void write_sweep_report(index::Database& db, const std::string& reference, const std::string& output,
                        report::XAxis curves_x);

// The usage text of all index commands, for `runner --help`.
const char* index_commands_usage();

}  // namespace runner::cli
