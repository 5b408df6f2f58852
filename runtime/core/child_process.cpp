// fork/exec of child runner processes and their wait statuses in words.
#include "runtime/core/child_process.h"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  ::execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "runner: the child process could not start: %s\n", std::strerror(errno));
  ::_exit(kExitError);
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
