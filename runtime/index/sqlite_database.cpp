// SQLite connections, statements and immediate transactions with errors that name the database.
#include "runtime/index/sqlite_database.h"

#include <sqlite3.h>

#include <chrono>
#include <fmt/format.h>
#include <thread>

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

}  // namespace

Database::Database(const std::string& path, OpenMode mode, int busy_timeout_ms) : path_(path), mode_(mode) {
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

Database::~Database() {
  if (db_) sqlite3_close_v2(db_);
}

Database::Database(Database&& other) noexcept : db_(other.db_), path_(std::move(other.path_)), mode_(other.mode_) {
  other.db_ = nullptr;
}

void Database::fail(int code, std::string_view context) const {
  std::string message = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(code);
  if ((code & 0xff) == SQLITE_NOTADB) message = "the file is not an SQLite database (damaged or of another kind)";
  if ((code & 0xff) == SQLITE_CORRUPT) message = "the database file is damaged (" + message + ")";
  throw IndexError(fmt::format("{}: {}: {}", path_, context, message));
}

void Database::execute(std::string_view sql) {
  const std::string text(sql);
  char* error = nullptr;
  const int code = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &error);
  if (code != SQLITE_OK) {
    const std::string message = error ? error : sqlite3_errstr(code);
    sqlite3_free(error);
    if ((code & 0xff) == SQLITE_NOTADB || (code & 0xff) == SQLITE_CORRUPT) fail(code, "cannot read the index");
    throw IndexError(fmt::format("{}: {}", path_, message));
  }
}

Statement Database::prepare(std::string_view sql) { return Statement(*this, sql); }

int64_t Database::last_insert_rowid() const { return sqlite3_last_insert_rowid(db_); }

int Database::changes() const { return sqlite3_changes(db_); }

Statement::Statement(Database& db, std::string_view sql) : db_(&db) {
  const char* tail = nullptr;
  const int code = sqlite3_prepare_v2(db.handle(), sql.data(), static_cast<int>(sql.size()), &statement_, &tail);
  if (code != SQLITE_OK) {
    if ((code & 0xff) == SQLITE_NOTADB || (code & 0xff) == SQLITE_CORRUPT) db.fail(code, "cannot read the index");
    throw IndexError(fmt::format("{}: SQL error: {}", db.path(), sqlite3_errmsg(db.handle())));
  }
}

Statement::~Statement() {
  if (statement_) sqlite3_finalize(statement_);
}

Statement::Statement(Statement&& other) noexcept : db_(other.db_), statement_(other.statement_) {
  other.statement_ = nullptr;
}

Statement& Statement::bind(int position, int64_t value) {
  const int code = sqlite3_bind_int64(statement_, position, value);
  if (code != SQLITE_OK) db_->fail(code, "bind");
  return *this;
}

Statement& Statement::bind(int position, double value) {
  const int code = sqlite3_bind_double(statement_, position, value);
  if (code != SQLITE_OK) db_->fail(code, "bind");
  return *this;
}

Statement& Statement::bind(int position, std::string_view value) {
  const int code =
      sqlite3_bind_text(statement_, position, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
  if (code != SQLITE_OK) db_->fail(code, "bind");
  return *this;
}

Statement& Statement::bind_null(int position) {
  const int code = sqlite3_bind_null(statement_, position);
  if (code != SQLITE_OK) db_->fail(code, "bind");
  return *this;
}

bool Statement::step() {
  const int code = sqlite3_step(statement_);
  if (code == SQLITE_ROW) return true;
  if (code == SQLITE_DONE) return false;
  sqlite3_reset(statement_);
  db_->fail(code, "SQL error");
}

void Statement::run() {
  while (step()) {
  }
  reset();
}

void Statement::reset() {
  sqlite3_reset(statement_);
  sqlite3_clear_bindings(statement_);
}

int Statement::column_count() const { return sqlite3_column_count(statement_); }
std::string Statement::column_name(int column) const { return sqlite3_column_name(statement_, column); }
bool Statement::is_null(int column) const { return sqlite3_column_type(statement_, column) == SQLITE_NULL; }
int Statement::column_type(int column) const { return sqlite3_column_type(statement_, column); }
int64_t Statement::integer(int column) const { return sqlite3_column_int64(statement_, column); }
double Statement::real(int column) const { return sqlite3_column_double(statement_, column); }

std::string Statement::text(int column) const {
  const auto* data = reinterpret_cast<const char*>(sqlite3_column_text(statement_, column));
  return data ? std::string(data, static_cast<size_t>(sqlite3_column_bytes(statement_, column))) : std::string();
}

std::optional<double> Statement::optional_real(int column) const {
  if (is_null(column)) return std::nullopt;
  return real(column);
}

std::optional<int64_t> Statement::optional_integer(int column) const {
  if (is_null(column)) return std::nullopt;
  return integer(column);
}

std::optional<std::string> Statement::optional_text(int column) const {
  if (is_null(column)) return std::nullopt;
  return text(column);
}

bool Statement::read_only() const { return sqlite3_stmt_readonly(statement_) != 0; }

Transaction::Transaction(Database& db) : db_(db) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::minutes(10);
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    const int code = sqlite3_exec(db.handle(), "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
    if (code == SQLITE_OK) break;
    if ((code & 0xff) != SQLITE_BUSY || clock::now() > deadline) db.fail(code, "cannot start a write transaction");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
  open_ = true;
}

Transaction::~Transaction() {
  if (open_) sqlite3_exec(db_.handle(), "ROLLBACK", nullptr, nullptr, nullptr);
}

void Transaction::commit() {
  const int code = sqlite3_exec(db_.handle(), "COMMIT", nullptr, nullptr, nullptr);
  if (code != SQLITE_OK) db_.fail(code, "cannot commit");
  open_ = false;
}

}  // namespace runner::index
