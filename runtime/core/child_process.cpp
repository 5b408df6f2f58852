// fork/exec of child runner processes and their wait statuses in words.
#include "runtime/core/child_process.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <fmt/format.h>
#include <stdexcept>

#include "runtime/core/exit_status.h"

namespace runner::core {

pid_t start_child(const ChildProcess& child) {
  std::vector<std::string> args{"runner"};
  args.insert(args.end(), child.arguments.begin(), child.arguments.end());
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
  if (pid > 0) return pid;
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::_exit(exit_status_for_signal(SIGTERM));
  for (int s : {SIGINT, SIGTERM, SIGUSR1, SIGHUP, SIGCHLD, SIGPIPE}) std::signal(s, SIG_DFL);
  if (child.output_fd >= 0) {
    ::dup2(child.output_fd, STDOUT_FILENO);
    ::dup2(child.output_fd, STDERR_FILENO);
    if (child.output_fd > STDERR_FILENO) ::close(child.output_fd);
  }
  for (const auto& [name, value] : child.environment) ::setenv(name.c_str(), value.c_str(), 1);
  if (!child.cpus.empty()) {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    for (const int cpu : child.cpus) CPU_SET(cpu, &mask);
    if (::sched_setaffinity(0, sizeof mask, &mask) != 0)
      std::fprintf(stderr, "runner: cannot pin the child process to its CPUs: %s\n", std::strerror(errno));
  }
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  ::execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "runner: the child process could not start: %s\n", std::strerror(errno));
  ::_exit(kExitError);
}

namespace {

constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
int stop_pipe_write = -1;
struct sigaction previous_actions[std::size(kStopSignals)];

void write_stop_signal(int signal_number) {
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  const int saved = errno;
  [[maybe_unused]] const ssize_t written = ::write(stop_pipe_write, &byte, 1);
  errno = saved;
}

}  // namespace

StopSignalPipe::StopSignalPipe() : previous_(previous_actions) {
  int fds[2] = {-1, -1};
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
    throw std::runtime_error(fmt::format("cannot make a pipe for stop signals: {}", std::strerror(errno)));
  read_fd_ = fds[0];
  stop_pipe_write = fds[1];
  struct sigaction action {};
  action.sa_handler = write_stop_signal;
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &action, &previous_[i]);
}

StopSignalPipe::~StopSignalPipe() {
  for (size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &previous_[i], nullptr);
  ::close(read_fd_);
  ::close(stop_pipe_write);
  stop_pipe_write = -1;
}

std::vector<int> StopSignalPipe::take() {
  std::vector<int> signals;
  unsigned char byte = 0;
  while (::read(read_fd_, &byte, 1) == 1) signals.push_back(byte);
  return signals;
}

std::string how_it_ended(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    const int number = WTERMSIG(wait_status);
    const char* name = sigabbrev_np(number);
    return fmt::format("was killed by signal {} (SIG{})", number, name ? name : "?");
  }
  return fmt::format("exited with status {}", WEXITSTATUS(wait_status));
}

int exit_status_of(int wait_status) {
  return WIFSIGNALED(wait_status) ? exit_status_for_signal(WTERMSIG(wait_status)) : WEXITSTATUS(wait_status);
}

}  // namespace runner::core
