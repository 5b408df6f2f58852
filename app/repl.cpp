// The interactive REPL: libedit line editing, history and tab completion on a terminal; plain
// line-by-line input otherwise (so tests can pipe into it). `=expr` and bare expressions print their
// values through runner.pretty; an incomplete chunk continues on the next line; Ctrl-C stops the
// running chunk (a compiled loop of pure Lua too) and keeps the REPL; SIGTERM, SIGHUP and SIGUSR1 stop it and
// end the REPL.
#include <editline/readline.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "app/repl.h"

namespace runner::app {
namespace {

using bindings::LuaHost;
using core::kExitOk;

lua_State* completion_state = nullptr;
std::vector<std::string> completion_matches;

// The completions of `text` from runner.repl's complete(), run protected: a failing __index offers nothing.
void compute_matches(lua_State* L, const char* text) {
  completion_matches.clear();
  const int top = lua_gettop(L);
  lua_getglobal(L, "require");
  lua_pushstring(L, "runner.repl");
  if (lua_pcall(L, 1, 1, 0) == 0) {
    lua_getfield(L, -1, "complete");
    lua_pushstring(L, text);
    if (lua_pcall(L, 1, 1, 0) == 0 && lua_istable(L, -1)) {
      const int count = static_cast<int>(lua_objlen(L, -1));
      for (int i = 1; i <= count; ++i) {
        lua_rawgeti(L, -1, i);
        if (const char* match = lua_tostring(L, -1)) completion_matches.emplace_back(match);
        lua_pop(L, 1);
      }
    }
  }
  lua_settop(L, top);
}

char* completion_generator(const char* text, int state) {
  if (state == 0) compute_matches(completion_state, text);
  if (static_cast<size_t>(state) >= completion_matches.size()) return nullptr;
  return strdup(completion_matches[static_cast<size_t>(state)].c_str());
}

char** complete(const char* text, int, int) {
  rl_completion_append_character = '\0';
  return rl_completion_matches(text, completion_generator);
}

std::string history_path() {
  if (const char* path = std::getenv("RUNNER_HISTORY")) return path;
  const char* home = std::getenv("HOME");
  return home ? std::string(home) + "/.runner_history" : "";
}

class LineReader {
 public:
  explicit LineReader(lua_State* L) : interactive_(isatty(STDIN_FILENO) && isatty(STDOUT_FILENO)) {
    if (!interactive_) return;
    completion_state = L;
    rl_readline_name = "runner";
    rl_basic_word_break_characters = " \t\n\"\\'`><=;+-*/%^~#{}()[],";
    rl_attempted_completion_function = complete;
    rl_catch_signals = 0;  // SIGINT at the prompt is ignored (see read); libedit must not re-raise it
    stifle_history(1000);
    history_ = history_path();
    if (!history_.empty()) read_history(history_.c_str());
  }
  ~LineReader() {
    if (interactive_ && !history_.empty()) write_history(history_.c_str());
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
};

bool is_incomplete(lua_State* L) {
  const char* message = lua_tostring(L, -1);
  const char* eof = "'<eof>'";
  const size_t length = message ? std::strlen(message) : 0;
  return length >= std::strlen(eof) && std::strcmp(message + length - std::strlen(eof), eof) == 0;
}

// An expression is evaluated as an argument of a call rather than returned directly: a returned call
// would be a tail call, and errors inside it would lose their stdin:line position. The wrapper also
// counts the values so that trailing nils print.
// `own_line`: the closing parenthesis on a line of its own, for a chunk ending in a comment (which would
// swallow it); otherwise on the same line, so that an error in a one-line expression is at stdin:1.
std::string as_expression(const std::string& chunk, bool own_line) {
  return "return (function(...) return select('#', ...), ... end)(" + chunk + (own_line ? "\n)" : ")");
}

// Prints the values left above `base` through runner.pretty.print: an expression chunk leaves a count
// and then the values; a statement chunk leaves whatever it returned.
void print_results(lua_State* L, LuaHost& host, int base, bool expression) {
  int count = lua_gettop(L) - base;
  if (expression) {
    count = static_cast<int>(lua_tointeger(L, base + 1));
    lua_remove(L, base + 1);
    lua_settop(L, base + count);
  }
  if (count == 0) return;
  lua_getglobal(L, "runner");
  lua_getfield(L, -1, "pretty");
  lua_getfield(L, -1, "print");
  lua_insert(L, base + 1);
  lua_pop(L, 2);
  host.call(count, 0);
}

}  // namespace

int run_repl(LuaHost& host) {
  lua_State* L = host.state();
  LineReader reader(L);
  host.interrupt_compiled_loops(true);
  int status = kExitOk;
  if (reader.interactive())
    std::printf("runner REPL (%s): =expr prints, Tab completes, Ctrl-D exits\n", LUAJIT_VERSION);
  while (!host.exit_requested()) {
    auto line = reader.read("> ");
    if (!line) break;
    std::string typed = *line;  // what history keeps, `=` included
    std::string chunk = *line;
    if (!chunk.empty() && chunk[0] == '=') chunk = chunk.substr(1);
    const int base = lua_gettop(L);
    // An expression is printed: try it with `return` first, then as a statement, then read more lines
    // while the chunk is incomplete.
    bool loaded = false;
    bool expression = false;
    for (;;) {
      if (host.load_text(as_expression(chunk, false), "=stdin") == 0) {
        loaded = expression = true;
        break;
      }
      lua_pop(L, 1);
      if (host.load_text(as_expression(chunk, true), "=stdin") == 0) {
        loaded = expression = true;
        break;
      }
      lua_pop(L, 1);
      if (host.load_text(chunk, "=stdin") == 0) {
        loaded = true;
        break;
      }
      if (!is_incomplete(L)) break;
      lua_pop(L, 1);
      auto more = reader.read(">> ");
      if (!more) {
        lua_pushstring(L, "stdin: unexpected end of input");
        break;
      }
      chunk += "\n" + *more;
      typed += "\n" + *more;
    }
    reader.remember(typed);
    if (!loaded) {
      std::fprintf(stderr, "%s\n", lua_tostring(L, -1));
      lua_settop(L, base);
      continue;
    }
    const int chunk_status = host.call(0, LUA_MULTRET);
    if (chunk_status == kExitOk) print_results(L, host, base, expression);
    std::fflush(stdout);
    lua_settop(L, base);
    // Only Ctrl-C comes back to the prompt: a hang-up or a kill must end the session, not leave it reading.
    if (core::is_interrupt_status(chunk_status) && chunk_status != core::kExitInterrupted) {
      status = chunk_status;
      break;
    }
  }
  host.interrupt_compiled_loops(false);
  return host.exit_requested() ? host.exit_status() : status;
}

}  // namespace runner::app
