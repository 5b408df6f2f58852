// The interactive REPL: libedit line editing, history and tab completion on a terminal; plain
// line-by-line input otherwise (so tests can pipe into it). `=expr` and bare expressions print their
// values through runner.pretty; an incomplete chunk continues on the next line; Ctrl-C stops the
// running chunk (a compiled loop of pure Lua too) and keeps the REPL; SIGTERM, SIGHUP and SIGUSR1 stop it and
// end the REPL. The same loop reads the lines of runner attach (app/attach_command.cpp).
#include <editline/readline.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "app/repl.h"
#include "bindings/repl_session.h"
#include "runtime/core/launch_context.h"

namespace runner::app {
namespace {

using bindings::LuaHost;
using core::kExitOk;

ReplTarget* completion_target = nullptr;
std::vector<std::string> completion_matches;

char* completion_generator(const char* text, int state) {
  if (state == 0) completion_matches = completion_target->completions(text);
  if (static_cast<size_t>(state) >= completion_matches.size()) return nullptr;
  return strdup(completion_matches[static_cast<size_t>(state)].c_str());
}

int watched_descriptor = -1;

// libedit's key reader while the target watches a descriptor: a key from the terminal, or EOF (as Ctrl-D) once
// the descriptor is readable.
int read_key_or_watched(FILE*) {
  pollfd descriptors[2] = {{STDIN_FILENO, POLLIN, 0}, {watched_descriptor, POLLIN, 0}};
  while (true) {
    if (::poll(descriptors, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return EOF;
    }
    if (descriptors[0].revents != 0) {
      unsigned char key = 0;
      const ssize_t count = ::read(STDIN_FILENO, &key, 1);
      if (count == 1) return key;
      if (count < 0 && errno == EINTR) continue;
      return EOF;
    }
    if (descriptors[1].revents != 0) return EOF;
  }
}

char** complete(const char* text, int, int) {
  rl_completion_append_character = '\0';
  return rl_completion_matches(text, completion_generator);
}

class LineReader {
 public:
  LineReader(ReplTarget& target, const std::string& history)
      : interactive_(isatty(STDIN_FILENO) && isatty(STDOUT_FILENO)), history_(history) {
    if (!interactive_) return;
    completion_target = &target;
    rl_readline_name = "runner";
    rl_basic_word_break_characters = " \t\n\"\\'`><=;+-*/%^~#{}()[],";
    rl_attempted_completion_function = complete;
    rl_catch_signals = 0;  // SIGINT at the prompt is ignored (see read); libedit must not re-raise it
    if (target.watched_descriptor() >= 0) {
      watched_descriptor = target.watched_descriptor();
      previous_getc_ = rl_getc_function;
      rl_getc_function = read_key_or_watched;
    }
    stifle_history(1000);
    if (!history_.empty()) read_history(history_.c_str());
  }
  ~LineReader() {
    if (interactive_ && !history_.empty()) write_history(history_.c_str());
    completion_target = nullptr;
    if (previous_getc_) rl_getc_function = previous_getc_;
    watched_descriptor = -1;
  }

  std::optional<std::string> read(const char* prompt) {
    if (!interactive_) {
      std::string line;
      if (!std::getline(std::cin, line)) return std::nullopt;
      return line;
    }
    // Ctrl-C at the prompt is ignored rather than ending the process; it interrupts running chunks.
    const auto previous = std::signal(SIGINT, SIG_IGN);
    char* line = readline(prompt);
    std::signal(SIGINT, previous);
    if (!line) {
      std::fputs("\n", stdout);
      return std::nullopt;
    }
    std::string text(line);
    std::free(line);
    return text;
  }

  void remember(const std::string& chunk) {
    if (interactive_ && !chunk.empty()) add_history(chunk.c_str());
  }

  bool interactive() const { return interactive_; }

 private:
  bool interactive_;
  std::string history_;
  int (*previous_getc_)(FILE*) = nullptr;
};

// The REPL of this process: chunks run in its host.
class HostTarget : public ReplTarget {
 public:
  explicit HostTarget(LuaHost& host) : host_(host) {}
  bindings::ReplOutcome run_chunk(const std::string& chunk) override { return bindings::run_repl_chunk(host_, chunk); }
  std::vector<std::string> completions(const std::string& text) override {
    return bindings::repl_completions(host_, text);
  }
  bool ended() const override { return host_.exit_requested(); }

 private:
  LuaHost& host_;
};

}  // namespace

int run_repl(ReplTarget& target, const std::string& banner, const std::string& history) {
  LineReader reader(target, history);
  int status = kExitOk;
  if (reader.interactive() && !banner.empty()) std::printf("%s\n", banner.c_str());
  while (!target.ended()) {
    auto line = reader.read("> ");
    if (!line) break;
    if (target.command(*line)) {
      reader.remember(*line);
      continue;
    }
    std::string typed = *line;  // what history keeps, `=` included
    std::string chunk = *line;
    if (!chunk.empty() && chunk[0] == '=') chunk = chunk.substr(1);
    // An expression is printed; an incomplete chunk continues on the next line.
    bindings::ReplOutcome outcome = target.run_chunk(chunk);
    while (outcome.kind == bindings::ReplOutcome::Kind::incomplete) {
      auto more = reader.read(">> ");
      if (!more) {
        outcome = {bindings::ReplOutcome::Kind::syntax_error, kExitOk, "stdin: unexpected end of input", ""};
        break;
      }
      chunk += "\n" + *more;
      typed += "\n" + *more;
      outcome = target.run_chunk(chunk);
    }
    reader.remember(typed);
    if (outcome.kind == bindings::ReplOutcome::Kind::syntax_error) {
      std::fprintf(stderr, "%s\n", outcome.message.c_str());
      continue;
    }
    std::fflush(stdout);
    // Only Ctrl-C comes back to the prompt: a hang-up or a kill must end the session, not leave it reading.
    if (core::is_interrupt_status(outcome.status) && outcome.status != core::kExitInterrupted) {
      status = outcome.status;
      break;
    }
  }
  return status;
}

int run_repl(LuaHost& host) {
  HostTarget target(host);
  host.interrupt_compiled_loops(true);
  const std::string banner =
      std::string("runner REPL (") + bindings::luajit_version() + "): =expr prints, Tab completes, Ctrl-D exits";
  const int status = run_repl(target, banner, core::launch_context().repl_history);
  host.interrupt_compiled_loops(false);
  return host.exit_requested() ? host.exit_status() : status;
}

}  // namespace runner::app
