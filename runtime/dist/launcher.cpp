// The local launcher: fork/exec of the ranks, their output, forwarded signals and the stop of all ranks when one fails.
#include "runtime/dist/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <optional>
#include <random>
#include <fmt/format.h>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "runtime/core/child_process.h"
#include "runtime/core/clock.h"
#include "runtime/core/device.h"
#include "runtime/core/exit_status.h"
#include "runtime/core/terminal_text.h"
#include "runtime/dist/failure_report.h"

namespace runner::dist {
namespace {

// A port that can be bound on `host` now: `port`, or with 0 one the kernel gives from its ephemeral range. Nothing
// when it is taken; a std::runtime_error when no socket can be made or the bind fails otherwise.
std::optional<int> bindable_port(const std::string& host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(fmt::format("launcher: no socket for a free port: {}", std::strerror(errno)));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) address.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof(address);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int error = errno;
    ::close(fd);
    if (error == EADDRINUSE) return std::nullopt;
    throw std::runtime_error(fmt::format("launcher: cannot find a free port on {}: {}", host, std::strerror(error)));
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

struct Rank {
  int number = 0;
  pid_t pid = -1;
  int output = -1;      // read end of its stdout+stderr (ranks > 0)
  std::string partial;  // a line not yet ended
  std::deque<std::string> lines;
  bool running = true;
  int status = 0;
  int end_order = 0;         // 1 for the first rank seen to end
  bool signalled = false;    // the launcher sent it a signal before it ended
  std::string failure_file;  // where it reports its failure (RUNNER_FAILURE_FILE)
  std::optional<FailureReport> report;
};

// A directory for the ranks' failure reports, removed with what is in it.
class FailureFiles {
 public:
  FailureFiles() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/runner-nproc-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr)
      throw std::runtime_error(fmt::format("launcher: cannot make a directory for the ranks' failure reports ({}): {}",
                                           pattern, std::strerror(errno)));
    directory_ = pattern;
  }
  ~FailureFiles() {
    for (const std::string& file : files_) ::unlink(file.c_str());
    ::rmdir(directory_.c_str());
  }
  FailureFiles(const FailureFiles&) = delete;
  FailureFiles& operator=(const FailureFiles&) = delete;
  std::string file_of(int rank) {
    files_.push_back(fmt::format("{}/rank-{}.json", directory_, rank));
    return files_.back();
  }

 private:
  std::string directory_;
  std::vector<std::string> files_;
};

std::optional<FailureReport> read_failure_report(const std::string& path) {
  std::ifstream file(path);
  if (!file) return std::nullopt;
  std::stringstream text;
  text << file.rdbuf();
  return parse_failure_report(text.str());
}

std::string first_line(const std::string& text) { return core::terminal_text(text.substr(0, text.find('\n'))); }

void keep_line(Rank& rank, std::string line, int kept) {
  rank.lines.push_back(std::move(line));
  while (static_cast<int>(rank.lines.size()) > kept) rank.lines.pop_front();
}

// Reads what rank's output has; returns false at its end.
bool drain(Rank& rank, int kept) {
  char buffer[4096];
  const ssize_t n = ::read(rank.output, buffer, sizeof(buffer));
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
  if (n <= 0) {
    if (!rank.partial.empty()) keep_line(rank, std::move(rank.partial), kept);
    rank.partial.clear();
    return false;
  }
  for (ssize_t i = 0; i < n; ++i) {
    const char c = buffer[i];
    if (c == '\n' || c == '\r') {
      if (!rank.partial.empty()) keep_line(rank, std::move(rank.partial), kept);
      rank.partial.clear();
    } else {
      rank.partial.push_back(c);
    }
  }
  return true;
}

struct FirstFailure {
  int rank = -1;
  std::string how;  // "exited with status 1, the first rank to fail: train.lua:7: ..."
};

// The rank whose failure came first, by the ranks' own reports: the earliest that is not a consequence of a failed
// collective; else a rank killed by a signal the launcher did not send; else, when a collective timed out, a rank
// that had not failed by then (hung or stopped); else one that ended badly without a report; else `first_ended`.
FirstFailure first_failed_rank(const std::vector<Rank>& ranks, int first_ended) {
  std::vector<FailureReport> reports;
  for (const Rank& rank : ranks)
    if (rank.report) reports.push_back(*rank.report);
  const auto ended = [&](int number) { return core::how_it_ended(ranks[static_cast<size_t>(number)].status); };
  if (const FailureReport* first = first_failure(reports))
    return {first->rank, ended(first->rank) + ", the first rank to fail: " + first_line(first->message)};
  const auto first_of = [&](auto&& predicate) {
    const Rank* found = nullptr;
    for (const Rank& rank : ranks)
      if (predicate(rank) && (!found || rank.end_order < found->end_order)) found = &rank;
    return found ? found->number : -1;
  };
  if (const int killed = first_of([](const Rank& rank) { return WIFSIGNALED(rank.status) && !rank.signalled; });
      killed >= 0)
    return {killed, ended(killed)};
  if (const FailureReport* timed_out = first_timeout(reports)) {
    const std::vector<int> absent = ranks_absent_at(*timed_out, reports, static_cast<int>(ranks.size()));
    if (!absent.empty())
      return {absent.front(),
              fmt::format("did not take part in {} for {:g} s (hung or stopped): rank {} timed out "
                          "waiting for it; then it {}",
                          timed_out->collective, timed_out->timeout_seconds, timed_out->rank, ended(absent.front()))};
  }
  const auto bad = [](const Rank& rank) { return !(WIFEXITED(rank.status) && WEXITSTATUS(rank.status) == 0); };
  if (const int silent = first_of([&](const Rank& rank) { return bad(rank) && !rank.report; }); silent >= 0)
    return {silent, ended(silent)};
  return {first_ended, ended(first_ended)};
}

core::ChildProcess rank_process(const LaunchOptions& options, int rank, int port, int output_fd,
                                const std::string& failure_file) {
  core::ChildProcess child;
  child.arguments = options.arguments;
  child.output_fd = output_fd;
  child.environment = {{"RUNNER_FAILURE_FILE", failure_file},
                       {"RANK", std::to_string(rank)},
                       {"LOCAL_RANK", std::to_string(rank)},
                       {"WORLD_SIZE", std::to_string(options.nproc)},
                       {"LOCAL_WORLD_SIZE", std::to_string(options.nproc)},
                       {"MASTER_ADDR", options.master_addr},
                       {"MASTER_PORT", std::to_string(port)}};
  if (!std::getenv("OMP_NUM_THREADS")) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    child.environment["OMP_NUM_THREADS"] = std::to_string(std::max(1u, cores / static_cast<unsigned>(options.nproc)));
  }
  return child;
}

}  // namespace

// The port of the job's store. Chosen below the kernel's ephemeral range (ip_local_port_range), as torchrun's 29500
// is: the ports in that range are given to every outgoing connection and port-0 bind on the host, so one found free
// there could be taken before rank 0 binds it.
int free_store_port(const std::string& host) {
  int ephemeral_start = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_start;
  const int high = ephemeral_start - 1, low = std::max(1024, high - 10000);
  if (high - low >= 100) {
    std::mt19937 random(std::random_device{}());
    std::uniform_int_distribution<int> pick(low, high);
    for (int attempt = 0; attempt < 100; ++attempt)
      if (const std::optional<int> port = bindable_port(host, pick(random))) return *port;
  }
  if (const std::optional<int> port = bindable_port(host, 0)) return *port;
  throw std::runtime_error(fmt::format("launcher: cannot find a free port on {}", host));
}

int parse_nproc(const std::string& text, bool oversubscribe) {
  const int gpus = core::cuda_device_count();
  if (text == "auto") return std::max(1, gpus);
  int value = 0;
  try {
    size_t used = 0;
    value = std::stoi(text, &used);
    if (used != text.size()) value = 0;
  } catch (const std::exception&) {
    value = 0;
  }
  if (value < 1)
    throw std::invalid_argument(fmt::format("--nproc must be a whole number >= 1 or auto, got '{}'", text));
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (!oversubscribe && gpus > 0 && value > gpus)
    throw std::invalid_argument(
        fmt::format("--nproc {} is more ranks than the {} visible GPU{} (a rank each); "
                    "--oversubscribe starts them anyway",
                    value, gpus, gpus == 1 ? "" : "s"));
  if (!oversubscribe && gpus <= 0 && value > cores)
    throw std::invalid_argument(
        fmt::format("--nproc {} is more ranks than this host's {} CPU cores (ranks on the CPU "
                    "share them); --oversubscribe starts them anyway",
                    value, cores));
  return value;
}

std::string describe_auto_nproc() {
  const int gpus = core::cuda_device_count();
  if (gpus > 0) return fmt::format("--nproc auto: {} rank{}, one per visible GPU", gpus, gpus == 1 ? "" : "s");
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return fmt::format(
      "--nproc auto: no GPU is visible, so 1 rank on the CPU (auto starts one rank per GPU; --nproc N "
      "starts N ranks that share this host's {} CPU core{})",
      cores, cores == 1 ? "" : "s");
}

int launch_local_ranks(const LaunchOptions& options) {
  const int port = options.master_port > 0 ? options.master_port : free_store_port(options.master_addr);
  FailureFiles failure_files;
  std::optional<core::StopSignalPipe> stop_signals(std::in_place);
  std::fflush(stdout);
  std::fflush(stderr);

  std::vector<Rank> ranks(static_cast<size_t>(options.nproc));
  for (int r = 0; r < options.nproc; ++r) {
    Rank& rank = ranks[static_cast<size_t>(r)];
    rank.number = r;
    rank.failure_file = failure_files.file_of(r);
    int pipe_fds[2] = {-1, -1};
    if (r > 0 && ::pipe2(pipe_fds, O_CLOEXEC) != 0)
      throw std::runtime_error(fmt::format("launcher: pipe: {}", std::strerror(errno)));
    rank.pid = core::start_child(rank_process(options, r, port, pipe_fds[1], rank.failure_file));
    if (r > 0) {
      ::close(pipe_fds[1]);
      rank.output = pipe_fds[0];
      ::fcntl(rank.output, F_SETFL, O_NONBLOCK);
    }
  }

  int failed = -1;  // the first rank seen to end badly
  int ended = 0;
  int stop_signal = 0;  // a stop signal forwarded to the ranks
  double kill_at = 0;   // when the ranks still running get SIGKILL (0: not scheduled)
  double failed_at = 0;
  auto running = [&] {
    int count = 0;
    for (const Rank& rank : ranks) count += rank.running ? 1 : 0;
    return count;
  };
  while (running() > 0) {
    std::vector<pollfd> fds{{stop_signals->fd(), POLLIN, 0}};
    std::vector<Rank*> owners{nullptr};
    for (Rank& rank : ranks) {
      if (rank.output < 0) continue;
      fds.push_back({rank.output, POLLIN, 0});
      owners.push_back(&rank);
    }
    ::poll(fds.data(), fds.size(), 100);
    if (fds[0].revents & POLLIN) {
      for (const int received : stop_signals->take()) {
        stop_signal = received;
        for (Rank& rank : ranks) {
          if (!rank.running) continue;
          ::kill(rank.pid, received);
          rank.signalled = true;
        }
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Rank& rank = *owners[i];
      if (!drain(rank, options.kept_lines)) {
        ::close(rank.output);
        rank.output = -1;
      }
    }
    int status = 0;
    pid_t pid = 0;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      for (Rank& rank : ranks) {
        if (rank.pid != pid) continue;
        rank.running = false;
        rank.status = status;
        rank.end_order = ++ended;
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        const bool stopped_by_request = stop_signal != 0 && core::is_interrupt_status(core::exit_status_of(status));
        if (!ok && !stopped_by_request && failed < 0) {
          failed = rank.number;
          failed_at = core::steady_seconds();
          kill_at = failed_at + options.kill_grace_seconds;
          for (Rank& other : ranks) {
            // A rank that has reported its own failure is ending by itself: a SIGTERM now would replace its exit
            // status by the signal's (the grace period's SIGKILL still applies).
            if (!other.running || read_failure_report(other.failure_file)) continue;
            ::kill(other.pid, SIGTERM);
            ::kill(other.pid, SIGCONT);  // a stopped rank acts on it too
            other.signalled = true;
          }
        }
      }
    }
    if (kill_at > 0 && core::steady_seconds() >= kill_at) {
      for (Rank& rank : ranks) {
        if (!rank.running) continue;
        ::kill(rank.pid, SIGKILL);
        rank.signalled = true;
      }
      kill_at = 0;
    }
  }
  for (Rank& rank : ranks) {
    while (rank.output >= 0 && drain(rank, options.kept_lines)) {
    }
    if (rank.output >= 0) ::close(rank.output);
  }
  stop_signals.reset();

  if (failed < 0) {  // every rank exited with 0, or stopped on a forwarded signal: rank 0's status comes first
    int result = core::exit_status_of(ranks.front().status);
    for (const Rank& rank : ranks)
      if (result == 0) result = core::exit_status_of(rank.status);
    return result;
  }
  for (Rank& rank : ranks) rank.report = read_failure_report(rank.failure_file);
  const FirstFailure first_failed = first_failed_rank(ranks, failed);
  const int first = first_failed.rank;
  const Rank& culprit = ranks[static_cast<size_t>(first)];
  std::string report =
      fmt::format("runner: rank {} of {} (pid {}) {}", first, options.nproc, culprit.pid, first_failed.how);
  if (first > 0 && !culprit.lines.empty()) {
    report += "; its last lines:\n";
    for (const std::string& line : culprit.lines)
      report += fmt::format("[rank {}] {}\n", first, core::terminal_text(line));
  } else {
    report += "\n";
  }
  for (const Rank& rank : ranks) {
    if (rank.number == first) continue;
    std::string own;
    if (rank.report)
      own = (rank.report->consequential ? ", as a consequence: " : ", with its own error: ") +
            first_line(rank.report->message);
    report += fmt::format("runner: rank {} {}{}{}\n", rank.number, core::how_it_ended(rank.status),
                          WIFSIGNALED(rank.status) && WTERMSIG(rank.status) == SIGKILL && rank.signalled
                              ? fmt::format(" (still running {:.0f} s after the failure)", options.kill_grace_seconds)
                              : " after the failure",
                          own);
  }
  std::fflush(stdout);
  std::fputs(report.c_str(), stderr);
  return core::exit_status_of(culprit.status) != 0 ? core::exit_status_of(culprit.status) : core::kExitError;
}

}  // namespace runner::dist
