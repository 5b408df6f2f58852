// Read-only SQL over the index for `runner query` and runner.query: one statement, writes refused.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "runtime/index/sqlite_database.h"

namespace runner::index {

using SqlValue = std::variant<std::monostate, int64_t, double, std::string>;

struct QueryResult {
  std::vector<std::string> columns;
  std::vector<std::vector<SqlValue>> rows;
  bool truncated = false;  // more rows than QueryLimits::max_rows
};

struct QueryLimits {
  double timeout_seconds = 0;  // > 0: the statement is stopped after this long (an IndexError)
  int64_t max_rows = 0;        // > 0: at most this many rows are read (QueryResult::truncated tells)
};

// Runs one SELECT (or other read-only statement) with `parameters` bound to ?1, ?2, ...
// Throws IndexError: "SQL error: ..." for malformed SQL, "... is read-only ..." for a statement that would
// write, "one statement at a time" for several, "the query ran longer than N s ..." past the time limit.
QueryResult run_read_query(Database& db, const std::string& sql, const std::vector<SqlValue>& parameters = {},
                           const QueryLimits& limits = {});

}  // namespace runner::index
