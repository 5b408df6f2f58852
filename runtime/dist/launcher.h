// `runner --nproc N`: starts N local ranks of the same command, forwards stop signals to them, and when one
// fails stops the others and says which rank failed first (by the ranks' failure reports), how, and its last lines.
#pragma once

#include <string>
#include <vector>

namespace runner::dist {

struct LaunchOptions {
  int nproc = 1;                       // local ranks
  std::vector<std::string> arguments;  // each rank's command line after the program name (no --nproc)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;             // 0: a free port of this host
  double kill_grace_seconds = 10;  // after a rank fails: SIGTERM to the others, SIGKILL this much later
  int kept_lines = 40;             // the last lines of each rank > 0 kept to show on failure
};

// "auto": one rank per visible CUDA device, 1 without one; else a whole number >= 1, at most one rank per
// visible GPU (without one, per CPU core) unless `oversubscribe`. Throws std::invalid_argument naming the value.
int parse_nproc(const std::string& text, bool oversubscribe = false);

// What `--nproc auto` chose and why, said on the console before the ranks start: "--nproc auto: 4 ranks, one per
// visible GPU", or on a host without one "--nproc auto: no GPU is visible, so 1 rank on the CPU (...)".
std::string describe_auto_nproc();

// Runs the ranks to their end and returns the launcher's exit status: 0 when every rank exited with 0;
// else the status of the rank that failed first (128 + signal for a rank killed by a signal). The first failure
// is the earliest failure report (dist/failure_report.h) that is not a consequence of a failed collective; else a
// rank killed by a signal the launcher did not send; else a rank that a timed-out collective waited for; else the
// first rank to end badly. Rank 0 writes to this process's stdout and stderr; the other ranks' lines are kept and
// shown, prefixed "[rank R]", when a rank fails. Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, RUNNER_FAILURE_FILE and, unless set, OMP_NUM_THREADS (the cores shared out on the
// CPU, 1 per GPU rank).
int launch_local_ranks(const LaunchOptions& options);

// A port for a job's store that is free on `host` now, chosen below the kernel's ephemeral range as torchrun's 29500
// is (else one the kernel gives).
int free_store_port(const std::string& host);

}  // namespace runner::dist
