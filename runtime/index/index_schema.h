// The index's schema, as the migrations that build it: the SQL text of each step in SQLite's and PostgreSQL's dialect.
#pragma once

#include <span>

namespace runner::index {

// One step of the schema: applied in a transaction that also records the version (PRAGMA user_version in
// SQLite, the runner_schema table in PostgreSQL). `postgresql` is the same step in PostgreSQL's dialect; an
// index there starts at schema 8 (whose text creates every table), so the steps before have none.
struct Migration {
  int version;
  const char* sql;
  const char* postgresql;
};

// The schema this runner writes and reads (docs/index-schema.md describes it).
std::span<const Migration> schema_migrations();
int schema_version();

}  // namespace runner::index
