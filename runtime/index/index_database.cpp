// The index's location, its migration to the schema (index_schema.h) and the pragmas every connection gets.
#include "runtime/index/index_database.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <mutex>
#include <set>

#include "runtime/core/launch_context.h"
#include "runtime/index/connection.h"
#include "runtime/index/writer_fence.h"

namespace runner::index {
namespace {

bool postgresql(const Database& db) { return db.backend() == Backend::postgresql; }

int64_t count_of(Database& db, const char* sql) {
  Statement statement = db.prepare(sql);
  statement.step();
  return statement.integer(0);
}

// The schema version: PRAGMA user_version in SQLite, the runner_schema table in PostgreSQL (none: 0).
int user_version(Database& db) {
  if (postgresql(db)) {
    if (count_of(db,
                 "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename = "
                 "'runner_schema'") == 0)
      return 0;
    return static_cast<int>(count_of(db, "SELECT coalesce(max(version), 0) FROM runner_schema"));
  }
  return static_cast<int>(count_of(db, "PRAGMA user_version"));
}

int table_count(Database& db) {
  if (postgresql(db))
    return static_cast<int>(count_of(db, "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()"));
  return static_cast<int>(count_of(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table'"));
}

void check_version(Database& db, int version, int supported) {
  if (version > supported)
    throw IndexError(
        fmt::format("{}: the index has schema version {}, newer than this runner supports ({}); "
                    "use a newer runner",
                    db.path(), version, supported));
}

// PRAGMA application_id of a runner index: "rnnr".
constexpr int64_t kApplicationId = 0x726e6e72;

int64_t application_id(Database& db) {
  Statement statement = db.prepare("PRAGMA application_id");
  statement.step();
  return statement.integer(0);
}

// Indexes made before the application id was set are recognised by their tables and the runs columns.
bool has_runner_schema(Database& db) {
  return count_of(db,
                  "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN "
                  "('runs', 'metrics', 'metric_latest', 'checkpoints', 'artifacts')") == 5 &&
         count_of(db,
                  "SELECT count(*) FROM pragma_table_info('runs') WHERE name IN "
                  "('id', 'name', 'status', 'config', 'script_hash', 'heartbeat_at', 'dir')") == 7;
}

void check_is_index(Database& db, int version) {
  const auto foreign = [&] {
    return IndexError(fmt::format("{}: not a runner index ({} database without the runner schema)", db.path(),
                                  postgresql(db) ? "a PostgreSQL" : "an SQLite"));
  };
  if (postgresql(db)) {
    if (version == 0 && table_count(db) > 0) throw foreign();
    return;
  }
  if (version == 0) {
    if (table_count(db) > 0) throw foreign();
    return;
  }
  const int64_t id = application_id(db);
  if (id == kApplicationId) return;
  if (id != 0 || !has_runner_schema(db)) throw foreign();
}

void make_directories(const std::string& path) {
  std::string prefix;
  size_t position = 0;
  while (position != std::string::npos) {
    position = path.find('/', position + 1);
    prefix = path.substr(0, position);
    if (prefix.empty()) continue;
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST)
      throw IndexError(fmt::format("{}: cannot create the directory: {}", prefix, std::strerror(errno)));
  }
}

bool file_exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

int64_t file_size(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 ? static_cast<int64_t>(info.st_size) : 0;
}

// On a read-only medium (an archived results folder, a read-only mount) SQLite cannot create the WAL's
// -shm file, so the index is read as immutable; a WAL left there with changes in it cannot be read so.
OpenMode reading_mode(const std::string& home, const std::string& path) {
  if (::access(home.c_str(), W_OK) == 0 || file_exists(path + "-shm")) return OpenMode::read_only;
  if (file_size(path + "-wal") > 0)
    throw IndexError(
        fmt::format("{}: the index is on a read-only medium and its write-ahead log ({}-wal) holds "
                    "changes that cannot be read without a {}-shm file; copy the folder to a "
                    "writable place to read it",
                    path, path, path));
  return OpenMode::read_only_immutable;
}

}  // namespace

IndexLocation index_location(const core::LaunchContext& context) {
  const std::string& url = context.index_url;
  if (!url.empty() && url.rfind("postgresql://", 0) != 0 && url.rfind("postgres://", 0) != 0)
    throw IndexError(
        fmt::format("RUNNER_INDEX / --index '{}' is not a postgresql:// URL (leave it unset for the SQLite "
                    "index in RUNNER_HOME)",
                    url_without_password(url)));
  return {context.home, url};
}

std::string index_path(const std::string& home) { return home + "/index.db"; }

std::string IndexLocation::shown() const { return url.empty() ? index_path(home) : url_without_password(url); }

int migrate(Database& db, std::span<const Migration> migrations) {
  const int latest = migrations.empty() ? 0 : migrations.back().version;
  int version = user_version(db);
  check_version(db, version, latest);
  check_is_index(db, version);
  for (const Migration& migration : migrations) {
    if (migration.version <= version) continue;
    // Under the index lock: a schema change may touch every table. Retried after a lost connection: a try whose
    // commit went through (its answer lost) left the version recorded, which the retry reads as another process's
    // migration.
    version = with_transaction(db, [&] {
      const int current = user_version(db);  // another process may have migrated meanwhile
      if (current >= migration.version) return current;
      check_is_index(db, current);
      if (postgresql(db)) {
        if (migration.postgresql) db.execute(migration.postgresql);
        db.execute(fmt::format(
            "CREATE TABLE IF NOT EXISTS runner_schema (version INTEGER NOT NULL); DELETE FROM runner_schema; "
            "INSERT INTO runner_schema (version) VALUES ({})",
            migration.version));
      } else {
        db.execute(migration.sql);
        db.execute(
            fmt::format("PRAGMA user_version = {}; PRAGMA application_id = {}", migration.version, kApplicationId));
      }
      return migration.version;
    });
  }
  return version;
}

Database open_index_for_writing(const IndexLocation& where) {
  const std::string& home = where.home;
  make_directories(home);
  if (!where.url.empty()) {
    Database db = Database::postgresql(where.url, false);
    migrate(db, schema_migrations());
    fence_this_process(db);
    return db;
  }
  Database db(index_path(home), OpenMode::read_write_create);
  // A foreign or newer database is refused before anything (even the journal mode) is changed in it.
  const int version = user_version(db);
  check_version(db, version, schema_version());
  check_is_index(db, version);
  check_integrity(db);
  // journal_mode needs the lock that a concurrent creator may hold: the busy timeout covers it.
  {
    Statement mode = db.prepare("PRAGMA journal_mode = WAL");
    mode.step();
    if (mode.text(0) != "wal") throw IndexError(fmt::format("{}: cannot switch to WAL mode", db.path()));
  }
  db.execute("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON");
  migrate(db, schema_migrations());
  if (application_id(db) != kApplicationId) db.execute(fmt::format("PRAGMA application_id = {}", kApplicationId));
  fence_this_process(db);
  return db;
}

void check_integrity(Database& db) {
  if (postgresql(db)) return;  // the server keeps its own files whole
  // Once per process and file: a command or a run opens its index many times, and the scan reads every page.
  static std::mutex mutex;
  static std::set<std::string> checked;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (checked.count(db.path())) return;
  }
  Statement check = db.prepare("PRAGMA quick_check(1)");
  check.step();
  std::string result = check.text(0);
  if (result != "ok") {
    // SQLite's report is "*** in database main ***\nPage 68: ...": one line, without the banner.
    const std::string banner = "*** in database main ***\n";
    if (result.rfind(banner, 0) == 0) result.erase(0, banner.size());
    for (char& c : result)
      if (c == '\n') c = ' ';
    throw IndexError(
        fmt::format("{}: the index is damaged ({}); nothing was written. Recover with sqlite3 {} .recover, "
                    "or move it aside to start a new index",
                    db.path(), result, db.path()));
  }
  std::lock_guard<std::mutex> lock(mutex);
  checked.insert(db.path());
}

Database open_index_for_reading(const IndexLocation& where) {
  const std::string& home = where.home;
  if (!where.url.empty()) {
    {
      Database db = Database::postgresql(where.url, true);
      const int version = user_version(db);
      check_version(db, version, schema_version());
      check_is_index(db, version);
      if (version == 0)
        throw IndexError(
            fmt::format("{}: no runner index in this database yet (a script that calls runner.start "
                        "creates it)",
                        db.path()));
      if (version == schema_version()) return db;
    }
    open_index_for_writing(where);  // an older schema: migrate, then read
    return Database::postgresql(where.url, true);
  }
  const std::string path = index_path(home);
  if (!file_exists(path))
    throw IndexError(
        fmt::format("{}: no runner index here (RUNNER_HOME is '{}'; a script that calls runner.start "
                    "creates it)",
                    path, home));
  const OpenMode mode = reading_mode(home, path);
  {
    Database db(path, mode);
    const int version = user_version(db);
    check_version(db, version, schema_version());
    check_is_index(db, version);
    if (version == 0) throw IndexError(fmt::format("{}: not a runner index (an empty database)", path));
    if (version == schema_version()) {
      check_integrity(db);
      db.execute("PRAGMA query_only = ON");
      return db;
    }
    if (mode == OpenMode::read_only_immutable)
      throw IndexError(
          fmt::format("{}: the index has schema version {} (this runner reads {}) and is on a "
                      "read-only medium, so it cannot be upgraded; copy the folder to a writable "
                      "place to read it",
                      path, version, schema_version()));
  }
  open_index_for_writing(where);  // an older schema: migrate, then read
  Database db(path, mode);
  db.execute("PRAGMA query_only = ON");
  return db;
}

std::optional<Database> open_index_if_any(const IndexLocation& where) {
  if (!where.url.empty()) {
    {
      Database db = Database::postgresql(where.url, true);
      const int version = user_version(db);
      check_version(db, version, schema_version());
      check_is_index(db, version);
      if (version == 0) return std::nullopt;
    }
    return open_index_for_reading(where);
  }
  if (!file_exists(index_path(where.home))) return std::nullopt;
  return open_index_for_reading(where);
}

}  // namespace runner::index
