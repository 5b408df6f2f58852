// `runner attach RUN`: the run is resolved through the index to its folder, whose socket (runtime/attach) the
// training process listens on; the REPL's lines (app/repl.cpp) go to it as eval requests and what the chunks print
// comes back (the training side: bindings/attach_session.cpp). Ctrl-D or `.detach` detaches; the run goes on.
// Ctrl-C while a chunk runs stops the chunk; pressed again before it answers, it detaches.
#include "app/attach_command.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <fmt/format.h>
#include <fcntl.h>
#include <string>
#include <system_error>
#include <unistd.h>

#include "app/repl.h"
#include "runtime/attach/attach_socket.h"
#include "runtime/cli/command_line.h"
#include "runtime/cli/command_support.h"
#include "runtime/core/clock.h"
#include "runtime/core/exit_status.h"
#include "runtime/core/launch_context.h"
#include "runtime/core/terminal_text.h"
#include "runtime/index/index_database.h"
#include "runtime/index/run_store.h"

namespace runner::app {
namespace {

constexpr const char* kUsage = R"(usage: runner attach RUN

A REPL in a running training process (RUN: an id, a unique id prefix, a name or `last`), on the host where its
rank 0 runs. Each chunk runs in the script between two steps (where train:step returns), with the script's
locals and train, model, loader, batch, loss, out (the step's result) and run: `=model.net[1].weight:norm()`,
`train:set_lr(1e-4)`, `run:checkpoint()`, `run:stop()`. The training waits only while a chunk runs.
Ctrl-C stops a running chunk (the run goes on); pressed again before the chunk stops (a long tensor operation),
it detaches. `.detach` or Ctrl-D detaches; the run goes on as if never attached. A session that sends nothing
for RUNNER_ATTACH_IDLE_TIMEOUT seconds (default 1800) is disconnected, so that another can attach. In a job of
several ranks, rank 0 answers chunks for at most half of RUNNER_DIST_TIMEOUT after a step (the other ranks wait
for it); a chunk still running then is stopped. Exit status: 0 detached, disconnected or the run ended, 1 the run
cannot be reached, 2 a usage error.
)";

// A wait longer than this for an answer says why nothing comes yet.
constexpr double kPatienceSeconds = 2.0;

volatile std::sig_atomic_t ctrl_c_pressed = 0;
volatile std::sig_atomic_t ctrl_c_wake_writer = -1;

void on_ctrl_c(int) {
  const int saved_errno = errno;
  ctrl_c_pressed = 1;
  if (ctrl_c_wake_writer >= 0) {
    [[maybe_unused]] const ssize_t written = ::write(ctrl_c_wake_writer, "!", 1);  // a full pipe wakes as well
  }
  errno = saved_errno;
}

// While one lives (a chunk's answer is awaited), Ctrl-C only sets ctrl_c_pressed and writes to a self-pipe that the
// wait for the answer watches: the wait ends however the signal falls (just before the wait starts, or on another
// thread than the one that waits).
class CtrlCWhileWaiting {
 public:
  CtrlCWhileWaiting() {
    if (::pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
    ctrl_c_pressed = 0;
    ctrl_c_wake_writer = pipe_[1];
    struct sigaction action {};
    action.sa_handler = on_ctrl_c;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &previous_);
  }
  ~CtrlCWhileWaiting() {
    sigaction(SIGINT, &previous_, nullptr);
    ctrl_c_wake_writer = -1;
    ::close(pipe_[0]);
    ::close(pipe_[1]);
  }
  CtrlCWhileWaiting(const CtrlCWhileWaiting&) = delete;
  CtrlCWhileWaiting& operator=(const CtrlCWhileWaiting&) = delete;

  int wake_descriptor() const { return pipe_[0]; }
  // Whether Ctrl-C was pressed since the last call; empties the pipe.
  bool take() {
    char drained[64];
    while (::read(pipe_[0], drained, sizeof drained) > 0) {
    }
    const bool pressed = ctrl_c_pressed != 0;
    ctrl_c_pressed = 0;
    return pressed;
  }

 private:
  int pipe_[2] = {-1, -1};
  struct sigaction previous_ {};
};

class AttachedTarget : public ReplTarget {
 public:
  explicit AttachedTarget(attach::AttachClient& client) : client_(client) {}

  bindings::ReplOutcome run_chunk(const std::string& chunk) override {
    CtrlCWhileWaiting ctrl_c;
    ctrl_c_ = &ctrl_c;
    try {
      bindings::ReplOutcome outcome = await_chunk(chunk);
      ctrl_c_ = nullptr;
      return outcome;
    } catch (...) {
      ctrl_c_ = nullptr;
      throw;
    }
  }

  std::vector<std::string> completions(const std::string& text) override {
    std::vector<std::string> matches;
    if (!send({"complete", text})) return matches;
    while (std::optional<attach::Message> reply = receive()) {
      if (reply->kind != "completions") continue;
      std::size_t start = 0;
      for (std::size_t end; (end = reply->text.find('\n', start)) != std::string::npos; start = end + 1)
        matches.push_back(reply->text.substr(start, end - start));
      break;
    }
    return matches;
  }

  bool command(const std::string& line) override {
    const std::size_t first = line.find_first_not_of(" \t");
    const std::size_t last = line.find_last_not_of(" \t");
    if (first == std::string::npos || line.substr(first, last - first + 1) != ".detach") return false;
    detached_ = true;
    return true;
  }

  bool ended() const override { return detached_ || gone_; }
  int watched_descriptor() const override { return client_.descriptor(); }
  bool gone() const { return gone_; }
  bool stopping() const { return stopping_; }  // a chunk called run:stop()

  // After the REPL: reads what the training process said meanwhile (the run ended), if anything.
  void take_notice() {
    if (!gone_ && client_.wait_readable(0)) receive();
  }

 private:
  bindings::ReplOutcome await_chunk(const std::string& chunk) {
    bindings::ReplOutcome outcome;
    interrupt_sent_ = false;
    if (!send({"eval", chunk})) return outcome;
    while (std::optional<attach::Message> reply = receive()) {
      if (reply->kind == "output") {
        std::fwrite(reply->text.data(), 1, reply->text.size(), stdout);
      } else if (reply->kind == "stopping") {
        stopping_ = true;
      } else if (reply->kind == "done") {
        return outcome;
      } else if (reply->kind == "error") {
        std::fflush(stdout);
        std::fprintf(stderr, "%s\n", core::terminal_text(reply->text).c_str());
        outcome.status = core::kExitError;
        return outcome;
      } else if (reply->kind == "incomplete") {
        outcome.kind = bindings::ReplOutcome::Kind::incomplete;
        return outcome;
      } else if (reply->kind == "syntax_error") {
        outcome.kind = bindings::ReplOutcome::Kind::syntax_error;
        outcome.message = core::terminal_text(reply->text);
        return outcome;
      }
    }
    return outcome;
  }

  bool send(const attach::Message& message) {
    try {
      client_.send(message);
      return true;
    } catch (const attach::AttachError&) {
      return !receive_end();
    }
  }

  // The next message, with a word after a while that the training is still in its step; nothing once the training
  // process has ended the connection (said) or a second Ctrl-C detached.
  std::optional<attach::Message> receive() {
    const double start = core::steady_seconds();
    bool said_waiting = false;
    while (!client_.wait_readable(said_waiting ? -1 : std::max(0.0, start + kPatienceSeconds - core::steady_seconds()),
                                  ctrl_c_ ? ctrl_c_->wake_descriptor() : -1)) {
      if (ctrl_c_ && ctrl_c_->take()) {
        if (!take_ctrl_c()) return std::nullopt;
      } else if (!said_waiting) {
        std::fprintf(stderr, "(waiting: the run answers between two steps)\n");
        std::fflush(stderr);
        said_waiting = true;
      }
    }
    std::optional<attach::Message> message = client_.receive();
    if (message && message->kind != "ended" && message->kind != "disconnected") return message;
    gone_ = true;
    std::fflush(stdout);
    std::fprintf(stderr, "%s\n",
                 message ? core::terminal_text(message->text).c_str()
                         : "the training process closed the connection (the run ended)");
    return std::nullopt;
  }

  // Ctrl-C while waiting: the first asks the training process to stop the chunk; the next detaches (returns
  // false), for a chunk that does not stop (inside one long C function).
  bool take_ctrl_c() {
    if (!interrupt_sent_ && send({"interrupt", ""})) {
      interrupt_sent_ = true;
      std::fprintf(stderr, "\nstopping the chunk (Ctrl-C again detaches; the run goes on)\n");
      std::fflush(stderr);
      return true;
    }
    detached_ = true;
    return false;
  }

  bool receive_end() {
    while (receive()) {
    }
    return true;
  }

  attach::AttachClient& client_;
  bool detached_ = false;
  bool gone_ = false;
  bool stopping_ = false;
  bool interrupt_sent_ = false;          // for the chunk that runs
  CtrlCWhileWaiting* ctrl_c_ = nullptr;  // while a chunk runs
};

int attach(const std::string& reference) {
  const index::IndexLocation where = cli::command_index();
  index::Database db = index::open_index_for_reading(where);
  const index::RunRecord run = index::resolve_run(db, reference);
  const std::string status = index::effective_status(run, static_cast<double>(std::time(nullptr)));
  if (status != "running")
    throw std::runtime_error(
        fmt::format("run {} is {}, not running: runner attach reaches a run while it trains", run.name, status));
  if (run.host != index::host_name())
    throw std::runtime_error(
        fmt::format("run {} runs on host {}: attach there (its socket is on that host)", run.name, run.host));
  const std::string socket = attach::attach_socket_path(where.home + "/" + run.dir);
  std::unique_ptr<attach::AttachClient> client;
  try {
    client = std::make_unique<attach::AttachClient>(socket);
  } catch (const attach::AttachError& error) {
    throw std::runtime_error(fmt::format("run {} does not listen for runner attach: {}", run.name, error.what()));
  }
  if (!client->wait_readable(kPatienceSeconds)) {
    std::fprintf(stderr, "connected; waiting for run %s to finish its current step\n", run.name.c_str());
    std::fflush(stderr);
  }
  const std::optional<attach::Message> hello = client->receive();
  if (!hello || hello->kind != "hello")
    throw std::runtime_error(fmt::format("run {}: {}", run.name,
                                         !hello                  ? "the run ended before it answered"
                                         : hello->kind == "busy" ? hello->text
                                                                 : "unexpected answer '" + hello->kind + "'"));
  AttachedTarget target(*client);
  std::string history;
  try {
    history = core::launch_context_from_environment().repl_history;
  } catch (const core::LaunchError&) {
    // A malformed launch variable concerns the training's ranks, not the history file: none is kept.
  }
  const std::string banner =
      core::terminal_text(hello->text) + "\n=expr prints, Tab completes, .detach or Ctrl-D detaches";
  run_repl(target, banner, history);
  target.take_notice();
  if (!target.gone()) {
    try {
      client->send({"detach", ""});
    } catch (const attach::AttachError&) {
    }
    std::fprintf(stderr, "detached from run %s (%s)\n", run.name.c_str(),
                 target.stopping() ? "it stops after its current step, with a checkpoint" : "it goes on");
  }
  return core::kExitOk;
}

}  // namespace

int run_attach_command(int argc, char** argv) {
  try {
    cli::CommandOptions options;
    options.max_positionals = 1;
    const cli::CommandLine line = cli::parse_command_line(argc, argv, options);
    if (line.help) {
      std::fputs(kUsage, stdout);
      return core::kExitOk;
    }
    if (line.positional.empty()) throw cli::UsageError("which run? give RUN (an id, a name or `last`)");
    return attach(line.positional[0]);
  } catch (const cli::UsageError& error) {
    return cli::print_usage_error("attach", error.what());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "runner attach: %s\n", core::terminal_text(error.what()).c_str());
    return core::kExitError;
  }
}

}  // namespace runner::app
