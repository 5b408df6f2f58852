// The runner index: where it lives (RUNNER_HOME), its schema and migrations, and opening it safely.
#pragma once

#include <optional>
#include <span>
#include <string>

#include "runtime/core/launch_context.h"
#include "runtime/index/database.h"
#include "runtime/index/index_schema.h"

namespace runner::index {

// Where the index is, as the launch context says: `home` (RUNNER_HOME, else ./runs) holds one directory per run,
// and index.db unless `url` (RUNNER_INDEX or --index: a postgresql:// URL) puts the index on a PostgreSQL server.
struct IndexLocation {
  std::string home;
  std::string url;  // "" for the SQLite file in `home`

  // What messages call the index: its file, or its URL without the password.
  std::string shown() const;
};

// The launch's index (LaunchContext::home and ::index_url); a URL of another kind is an IndexError.
IndexLocation index_location(const core::LaunchContext& context);
std::string index_path(const std::string& home);

// Applies the migrations newer than the database's user_version, each in its own immediate transaction
// (so concurrent openers apply each at most once). Throws IndexError for a database from a newer schema or
// an SQLite file that has tables but no runner schema. Returns the version now in the database.
int migrate(Database& db, std::span<const Migration> migrations);

// Opens the index for writing: creates the file (and `home`) when missing, sets WAL mode, synchronous
// NORMAL, foreign keys, and migrates. Errors are IndexError with the path. With a `url`, connects to that
// server (creating `home`, where run folders live) and migrates its schema.
Database open_index_for_writing(const IndexLocation& where);

// Opens the index read-only for queries and reports. A missing file, a file that is not a runner index,
// or a newer schema is an IndexError; an older schema is first migrated through a writable connection.
Database open_index_for_reading(const IndexLocation& where);
// The same when there is an index to read; none when `home` has no index.db, or the PostgreSQL database has no
// runner schema yet (one with other tables is refused as open_index_for_reading refuses it).
std::optional<Database> open_index_if_any(const IndexLocation& where);

// PRAGMA quick_check of the whole database, once per process and file (about 0.15 s for 2 million metric
// values): IndexError naming the database and the first problem. Both ways of opening the index run it, so
// every command that opens a damaged index says so, and none writes to it.
void check_integrity(Database& db);

}  // namespace runner::index
