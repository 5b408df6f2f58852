// `runner runs --where EXPRESSION`: a small filter language over a run's config values, metrics, tags, status
// and name, parsed and evaluated by runner (no SQL is passed through, so it reads the same on SQLite and
// PostgreSQL).
//
//   expression := and ('or' and)*          and := unary ('and' unary)*
//   unary      := 'not' unary | '(' expression ')' | KEY OP VALUE
//   OP         := < <= > >= = !=           VALUE := a number (1e-3, -2, true = 1, false = 0) | 'text' | "text"
//
// KEY is `tag` (a run has it: `tag = 'baseline'`; `tag != 'x'`: it has not), `status` (as `runner runs` shows
// it), `name`, or a config key or metric (letters, digits, '_', '.', '/', '-'): the run's config value when its
// config has the key, else its summary value, else its latest logged value. A run without the key, or whose value
// is not of the kind compared with (a number, a text), does not match that comparison; `not` turns that around.
// Words are matched without regard to case (`AND`), keys and texts exactly.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "runtime/index/database.h"
#include "runtime/index/run_store.h"

namespace runner::report {

// A wrong expression, or a key that no run has: the commands show it as a usage error, the dashboard as a bad
// request.
struct WhereError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// A value a key has for one run: none, a number or a text.
using WhereValue = std::variant<std::monostate, double, std::string>;

// What an expression reads of a run.
struct WhereRun {
  std::string name;
  std::string status;
  std::vector<std::string> tags;
  std::function<WhereValue(const std::string& key)> value;  // a config key's or metric's value
};

class RunWhere {
 public:
  // Parses `text`; a syntax error is a WhereError "--where '<text>': <what> at column N" (columns count from 1).
  explicit RunWhere(std::string text);
  ~RunWhere();
  RunWhere(RunWhere&&) noexcept;
  RunWhere& operator=(RunWhere&&) noexcept;

  // The config keys and metrics the expression compares (not tag, status or name).
  std::set<std::string> keys() const;
  // A WhereError "--where '<text>': unknown key 'K' at column N (...)" for the first key not in `known` (the
  // config keys and metrics of the runs), with a suggestion for a misspelt one.
  void check_keys(const std::set<std::string>& known) const;
  bool matches(const WhereRun& run) const;

  struct Node;

 private:
  std::string text_;
  std::unique_ptr<Node> root_;
};

// The runs among `runs` that `where` matches (`runner runs --where`, the dashboard's runs filter), their status as
// of `now`; a key of `where` that is no config key or metric of any of them is a WhereError.
std::vector<index::RunRecord> runs_where(index::Database& db, std::vector<index::RunRecord> runs, const RunWhere& where,
                                         double now);

}  // namespace runner::report
