// Each rank's own account of its failure in a data-parallel job, so that the first rank to fail is the one named.
// A failing rank publishes its report before it leaves the process group: to the job's store, where rank 0
// (which writes the run's index row) reads the others', and to RUNNER_FAILURE_FILE, which `runner --nproc` reads
// (as torchrun's agent reads each worker's error file). An error that follows a failed collective is marked as a
// consequence of another rank's failure; the first failure is the earliest report that is not one.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace runner::dist {

struct FailureReport {
  int rank = 0;
  std::string message;         // as the rank printed it: "file:line: ..." and the traceback below it
  double time = 0;             // when it failed, in seconds since the epoch
  bool consequential = false;  // a collective had failed before: another rank failed, hung or lost the network
  std::string collective;      // that collective ("all_reduce"), when consequential
  bool timed_out = false;      // it timed out: some rank did not take part in it
  double timeout_seconds = 0;  // the collective timeout
};

std::string failure_report_json(const FailureReport& report);
// nullopt for text that is not a report (a file cut short).
std::optional<FailureReport> parse_failure_report(const std::string& text);

// This process's report of its error `message`, now; a consequence when one of its collectives failed before
// (the report then carries that failure's time).
FailureReport failure_report_of(const std::string& message);

// The earliest report that is not a consequence, unless a collective timed out before it (the ranks it waited for
// failed first, by hanging); nullptr when there is none such.
const FailureReport* first_failure(const std::vector<FailureReport>& reports);
// The earliest report of a collective that timed out; nullptr when none did.
const FailureReport* first_timeout(const std::vector<FailureReport>& reports);

// The ranks that had not failed by the time `timed_out`'s collective timed out: without a report in `reports`,
// or with a later one. `timed_out`'s own rank is not one of them.
std::vector<int> ranks_absent_at(const FailureReport& timed_out, const std::vector<FailureReport>& reports,
                                 int world_size);

// The run's error when rank `own.rank` failed with `own` and the other ranks reported `others`: `own.message`
// when it failed first (or nothing explains it); else the cause first ("rank 1 of 2 failed first: raise.lua:7:
// ...", "rank 1 of 2 did not take part in all_reduce for 300 s (hung or stopped): rank 0 timed out waiting at
// train.lua:9", "rank 1 of 2 ended without a failure report (killed by a signal or crashed)"), then a line for
// each other report ("rank 0, as a consequence: train.lua:9: all_reduce failed: ...").
std::string job_failure(const FailureReport& own, const std::vector<FailureReport>& others, int world_size);

// For the end of a rank of a data-parallel job (the process group joined) that failed with `message`: publishes
// its report and returns the error its run records (on rank 0 the job's first failure, job_failure(); the
// others record nothing). Waits up to `patience` for the other ranks' reports when this rank's error is a
// consequence and none of theirs explains it yet. Without a process group: publishes to the failure file only
// and returns `message`. Never throws (what cannot be published is logged).
std::string report_rank_failure(const std::string& message,
                                std::chrono::milliseconds patience = std::chrono::seconds(3));

// On rank 0 of a data-parallel job that was interrupted (`how`, e.g. "interrupted by signal 15 (Terminated)"):
// the run's error when another rank had already failed (the interruption was the launcher stopping the job
// after it); nullopt when none had.
std::optional<std::string> failure_behind_interruption(const std::string& how);

}  // namespace runner::dist
