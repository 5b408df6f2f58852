// The SQLite connection of the index: a file opened through the SQLite C API, immediate transactions and errors
// that name the file.
#include <sqlite3.h>

#include <cerrno>
#include <chrono>
#include <fmt/format.h>
#include <thread>

#include "runtime/core/clock.h"
#include "runtime/core/storage_full.h"
#include "runtime/index/connection.h"

namespace runner::index {
namespace {

// A file: URI for `path` (https://sqlite.org/uri.html): '%', '?' and '#' are percent-encoded.
std::string file_uri(const std::string& path, std::string_view parameters) {
  std::string uri = "file:";
  for (const char c : path) {
    if (c == '%' || c == '?' || c == '#') {
      uri += fmt::format("%{:02X}", static_cast<unsigned char>(c));
    } else {
      uri += c;
    }
  }
  return uri + "?" + std::string(parameters);
}

bool is_damage(int code) { return (code & 0xff) == SQLITE_NOTADB || (code & 0xff) == SQLITE_CORRUPT; }

// A write that failed for want of space: SQLITE_FULL (ENOSPC), or SQLite's failed write, which is how it reports
// EDQUOT and EFBIG (its errno is not kept reliably, so every failed write of the index counts).
void note_storage_error(int code) {
  if ((code & 0xff) == SQLITE_FULL || code == SQLITE_IOERR_WRITE) core::note_write_error(ENOSPC);
}

class SqliteConnection;

class SqliteStatement final : public StatementImpl {
 public:
  SqliteStatement(SqliteConnection& db, std::string_view sql);
  ~SqliteStatement() override { sqlite3_finalize(statement_); }

  void bind(int position, BoundValue value) override;
  bool step() override;
  void reset() override {
    sqlite3_reset(statement_);
    sqlite3_clear_bindings(statement_);
  }
  int column_count() const override { return sqlite3_column_count(statement_); }
  std::string column_name(int column) const override { return sqlite3_column_name(statement_, column); }
  ColumnType column_type(int column) const override {
    switch (sqlite3_column_type(statement_, column)) {
      case SQLITE_INTEGER:
        return ColumnType::integer;
      case SQLITE_FLOAT:
        return ColumnType::real;
      case SQLITE_NULL:
        return ColumnType::null;
      default:
        return ColumnType::text;
    }
  }
  int64_t integer(int column) const override { return sqlite3_column_int64(statement_, column); }
  double real(int column) const override { return sqlite3_column_double(statement_, column); }
  std::string text(int column) const override {
    const auto* data = reinterpret_cast<const char*>(sqlite3_column_text(statement_, column));
    return data ? std::string(data, static_cast<size_t>(sqlite3_column_bytes(statement_, column))) : std::string();
  }

 private:
  SqliteConnection& db_;
  sqlite3_stmt* statement_ = nullptr;
};

class SqliteConnection final : public Connection {
 public:
  SqliteConnection(const std::string& path, OpenMode mode, int busy_timeout_ms) : path_(path) {
    int flags = SQLITE_OPEN_NOMUTEX;
    std::string name = path;
    switch (mode) {
      case OpenMode::read_only:
        flags |= SQLITE_OPEN_READONLY;
        break;
      case OpenMode::read_only_immutable:
        flags |= SQLITE_OPEN_READONLY | SQLITE_OPEN_URI;
        name = file_uri(path, "mode=ro&immutable=1");
        break;
      case OpenMode::read_write:
        flags |= SQLITE_OPEN_READWRITE;
        break;
      case OpenMode::read_write_create:
        flags |= SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
        break;
    }
    const int code = sqlite3_open_v2(name.c_str(), &db_, flags, nullptr);
    if (code != SQLITE_OK) {
      const std::string message = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(code);
      sqlite3_close_v2(db_);
      db_ = nullptr;
      throw IndexError(fmt::format("{}: cannot open the database: {}", path, message));
    }
    sqlite3_extended_result_codes(db_, 1);
    sqlite3_busy_timeout(db_, busy_timeout_ms);
  }
  ~SqliteConnection() override { sqlite3_close_v2(db_); }

  Backend backend() const override { return Backend::sqlite; }
  sqlite3* handle() const { return db_; }
  const std::string& path() const { return path_; }

  // Throws IndexError "<path>: <context>: <sqlite message>" for a non-OK result code.
  [[noreturn]] void fail(int code, std::string_view context) const {
    note_storage_error(code);
    std::string message = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(code);
    if ((code & 0xff) == SQLITE_NOTADB) message = "the file is not an SQLite database (damaged or of another kind)";
    if ((code & 0xff) == SQLITE_CORRUPT) message = "the database file is damaged (" + message + ")";
    throw IndexError(fmt::format("{}: {}: {}", path_, context, message));
  }

  void execute(std::string_view sql) override {
    const std::string text(sql);
    char* error = nullptr;
    const int code = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &error);
    if (code != SQLITE_OK) {
      const std::string message = error ? error : sqlite3_errstr(code);
      sqlite3_free(error);
      note_storage_error(code);
      if (is_damage(code)) fail(code, "cannot read the index");
      throw IndexError(fmt::format("{}: {}", path_, message));
    }
  }

  std::unique_ptr<StatementImpl> prepare(std::string_view sql) override {
    return std::make_unique<SqliteStatement>(*this, sql);
  }

  int changes() const override { return sqlite3_changes(db_); }

  // BEGIN IMMEDIATE takes the write lock up front, so a transaction never fails half-way with "database is
  // locked" when another process writes at the same time; both scopes take it.
  void begin(TransactionScope) override {
    using clock = std::chrono::steady_clock;
    const auto deadline = clock::now() + std::chrono::minutes(10);
    auto pause = std::chrono::milliseconds(1);
    while (true) {
      const int code = sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
      if (code == SQLITE_OK) return;
      if ((code & 0xff) != SQLITE_BUSY || clock::now() > deadline) fail(code, "cannot start a write transaction");
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(100));
    }
  }

  void commit() override {
    const int code = sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
    if (code != SQLITE_OK) fail(code, "cannot commit");
  }

  void rollback() noexcept override { sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr); }

  void reconnect() override {}

  void tidy_after_deleting() override { execute("PRAGMA wal_checkpoint(TRUNCATE); PRAGMA optimize"); }

  QueryResult read_query(const std::string& sql, const std::vector<SqlValue>& parameters,
                         const QueryLimits& limits) override;

 private:
  sqlite3* db_ = nullptr;
  std::string path_;
};

SqliteStatement::SqliteStatement(SqliteConnection& db, std::string_view sql) : db_(db) {
  const char* tail = nullptr;
  const int code = sqlite3_prepare_v2(db.handle(), sql.data(), static_cast<int>(sql.size()), &statement_, &tail);
  if (code != SQLITE_OK) {
    if (is_damage(code)) db.fail(code, "cannot read the index");
    throw IndexError(fmt::format("{}: SQL error: {}", db.path(), sqlite3_errmsg(db.handle())));
  }
}

void SqliteStatement::bind(int position, BoundValue value) {
  int code = SQLITE_OK;
  switch (value.kind) {
    case BoundValue::Kind::null:
      code = sqlite3_bind_null(statement_, position);
      break;
    case BoundValue::Kind::integer:
      code = sqlite3_bind_int64(statement_, position, value.integer);
      break;
    case BoundValue::Kind::real:
      code = sqlite3_bind_double(statement_, position, value.real);
      break;
    case BoundValue::Kind::text:
      code = sqlite3_bind_text(statement_, position, value.text.data(), static_cast<int>(value.text.size()),
                               SQLITE_TRANSIENT);
      break;
  }
  if (code != SQLITE_OK) db_.fail(code, "bind");
}

bool SqliteStatement::step() {
  const int code = sqlite3_step(statement_);
  if (code == SQLITE_ROW) return true;
  if (code == SQLITE_DONE) return false;
  sqlite3_reset(statement_);
  db_.fail(code, "SQL error");
}

QueryResult SqliteConnection::read_query(const std::string& sql, const std::vector<SqlValue>& parameters,
                                         const QueryLimits& limits) {
  sqlite3_stmt* raw = nullptr;
  const char* tail = nullptr;
  const int code = sqlite3_prepare_v2(db_, sql.c_str(), static_cast<int>(sql.size()), &raw, &tail);
  if (code != SQLITE_OK) {
    if (is_damage(code)) fail(code, "cannot read the index");
    throw IndexError(fmt::format("SQL error: {}", sqlite3_errmsg(db_)));
  }
  struct Finalize {
    sqlite3_stmt* statement;
    ~Finalize() { sqlite3_finalize(statement); }
  } finalize{raw};
  if (!raw) throw IndexError("SQL error: the query is empty");
  if (tail && *tail) {
    // Whatever follows must compile to nothing: whitespace, ';' or comments.
    sqlite3_stmt* next = nullptr;
    const int next_code = sqlite3_prepare_v2(db_, tail, -1, &next, nullptr);
    const bool another = next != nullptr || next_code != SQLITE_OK;
    sqlite3_finalize(next);
    if (another) throw IndexError("SQL error: give one statement at a time (found more after the first ';')");
  }
  // ATTACH, DETACH, BEGIN and pragmas that set a value count as read-only for SQLite (they change the
  // connection, not the file); none of them returns columns, as every read does.
  if (!sqlite3_stmt_readonly(raw) || sqlite3_column_count(raw) == 0) throw IndexError(refused_write_message(sql));
  if (static_cast<int>(parameters.size()) != sqlite3_bind_parameter_count(raw))
    throw IndexError(fmt::format("SQL error: the query has {} parameters but {} values were given",
                                 sqlite3_bind_parameter_count(raw), parameters.size()));
  for (size_t i = 0; i < parameters.size(); ++i) {
    const int position = static_cast<int>(i + 1);
    const SqlValue& value = parameters[i];
    if (std::holds_alternative<int64_t>(value))
      sqlite3_bind_int64(raw, position, std::get<int64_t>(value));
    else if (std::holds_alternative<double>(value))
      sqlite3_bind_double(raw, position, std::get<double>(value));
    else if (std::holds_alternative<std::string>(value)) {
      const auto& text = std::get<std::string>(value);
      sqlite3_bind_text(raw, position, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
    }
  }
  // The progress handler runs every few thousand virtual machine steps and stops the statement past the deadline.
  struct Deadline {
    sqlite3* handle;
    double at;
    bool passed = false;
    ~Deadline() { sqlite3_progress_handler(handle, 0, nullptr, nullptr); }
  } deadline{db_, core::steady_seconds() + limits.timeout_seconds};
  if (limits.timeout_seconds > 0) {
    sqlite3_progress_handler(
        db_, 10000,
        [](void* data) {
          auto* d = static_cast<Deadline*>(data);
          d->passed = core::steady_seconds() > d->at;
          return d->passed ? 1 : 0;
        },
        &deadline);
  }
  QueryResult result;
  for (int c = 0; c < sqlite3_column_count(raw); ++c) result.columns.emplace_back(sqlite3_column_name(raw, c));
  while (true) {
    const int step = sqlite3_step(raw);
    if (step == SQLITE_DONE) break;
    if (step != SQLITE_ROW && deadline.passed) {
      throw IndexError(fmt::format("the query ran longer than {:g} s and was stopped (--timeout SECONDS allows more)",
                                   limits.timeout_seconds));
    }
    if (step != SQLITE_ROW) {
      if (is_damage(step)) fail(step, "cannot read the index");
      throw IndexError(fmt::format("SQL error: {}", sqlite3_errmsg(db_)));
    }
    std::vector<SqlValue> row;
    for (int c = 0; c < static_cast<int>(result.columns.size()); ++c) {
      switch (sqlite3_column_type(raw, c)) {
        case SQLITE_INTEGER:
          row.emplace_back(static_cast<int64_t>(sqlite3_column_int64(raw, c)));
          break;
        case SQLITE_FLOAT:
          row.emplace_back(sqlite3_column_double(raw, c));
          break;
        case SQLITE_NULL:
          row.emplace_back(std::monostate{});
          break;
        default: {
          const auto* data = static_cast<const char*>(sqlite3_column_blob(raw, c));
          row.emplace_back(std::string(data ? data : "", static_cast<size_t>(sqlite3_column_bytes(raw, c))));
        }
      }
    }
    if (limits.max_rows > 0 && static_cast<int64_t>(result.rows.size()) == limits.max_rows) {
      result.truncated = true;
      break;
    }
    result.rows.push_back(std::move(row));
  }
  return result;
}

}  // namespace

std::unique_ptr<Connection> open_sqlite_connection(const std::string& path, OpenMode mode, int busy_timeout_ms) {
  return std::make_unique<SqliteConnection>(path, mode, busy_timeout_ms);
}

}  // namespace runner::index
