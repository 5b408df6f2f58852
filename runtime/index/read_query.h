// Read-only SQL over the index for `runner query` and runner.query: one statement, writes refused.
#pragma once

#include <string>
#include <vector>

#include "runtime/index/database.h"

namespace runner::index {

// Runs one SELECT (or other read-only statement) with `parameters` bound to ?1, ?2, ... (on PostgreSQL also
// $1, $2, ...), in the index's SQL dialect: SQLite's, or PostgreSQL's for an index there (inside a READ ONLY
// transaction with statement_timeout).
// Throws IndexError: "SQL error: ..." for malformed SQL, "... is read-only ..." for a statement that would
// write, "one statement at a time" for several, "the query ran longer than N s ..." past the time limit.
QueryResult run_read_query(Database& db, const std::string& sql, const std::vector<SqlValue>& parameters = {},
                           const QueryLimits& limits = {});

}  // namespace runner::index
