// Child runner processes (data-parallel ranks, sweep trials): started from this program's own executable in
// their own process group, ended with SIGTERM when their parent dies, and how they ended in words.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace runner::core {

struct ChildProcess {
  std::vector<std::string> arguments;              // after the program name
  std::map<std::string, std::string> environment;  // set in the child (an empty value sets it empty)
  int output_fd = -1;                              // the child's stdout and stderr; -1: this process's
  std::vector<int> cpus;                           // the CPUs it may run on (its affinity); empty: this process's
};

// fork + exec of /proc/self/exe. The child gets its own process group (terminal signals reach the parent,
// which forwards them), SIGTERM when the parent dies, default signal handlers and `environment`. Throws
// std::runtime_error when fork fails; an exec failure ends the child with status 1 and a message.
pid_t start_child(const ChildProcess& child);

// The stop signals (SIGINT, SIGTERM, SIGHUP, SIGUSR1) of a process that forwards them to its children: while it
// lives, each one is written to a non-blocking pipe for the parent's poll loop; the previous handlers come back
// when it is destroyed. One at a time per process.
class StopSignalPipe {
 public:
  StopSignalPipe();  // throws std::runtime_error when no pipe can be made
  ~StopSignalPipe();
  StopSignalPipe(const StopSignalPipe&) = delete;
  StopSignalPipe& operator=(const StopSignalPipe&) = delete;
  int fd() const { return read_fd_; }  // readable when a signal arrived
  std::vector<int> take();             // the signals that arrived since the last call, in order

 private:
  int read_fd_ = -1;
  struct sigaction* previous_;
};

// "exited with status 3", "was killed by signal 9 (SIGKILL)"
std::string how_it_ended(int wait_status);
// The status as a shell shows it: the exit code, or 128 + the signal.
int exit_status_of(int wait_status);

}  // namespace runner::core
