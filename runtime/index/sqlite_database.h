// A thin RAII layer over the SQLite C API: connections, prepared statements and immediate transactions.
// It knows nothing of runs; index_database.h builds the runner index on it.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

struct sqlite3;
struct sqlite3_stmt;

namespace runner::index {

// what() is one line naming the database path and what failed.
struct IndexError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// read_only_immutable reads a file that nothing can change (a read-only medium): no locks, no -shm file.
enum class OpenMode { read_only, read_only_immutable, read_write, read_write_create };

class Statement;

class Database {
 public:
  // Busy waits up to `busy_timeout_ms` for other writers before SQLITE_BUSY (which is then retried by
  // Transaction). A missing file opened without _create is an IndexError.
  Database(const std::string& path, OpenMode mode, int busy_timeout_ms = 60000);
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;
  Database(Database&& other) noexcept;
  Database& operator=(Database&& other) = delete;

  // Runs statements without results (several, separated by ';').
  void execute(std::string_view sql);
  Statement prepare(std::string_view sql);
  int64_t last_insert_rowid() const;
  int changes() const;
  bool read_only() const { return mode_ == OpenMode::read_only || mode_ == OpenMode::read_only_immutable; }
  const std::string& path() const { return path_; }
  sqlite3* handle() const { return db_; }
  // Throws IndexError "<path>: <context>: <sqlite message>" for a non-OK result code.
  [[noreturn]] void fail(int code, std::string_view context) const;

 private:
  sqlite3* db_ = nullptr;
  std::string path_;
  OpenMode mode_;
};

// A prepared statement. bind() positions are 1-based as in SQLite; column() positions 0-based.
class Statement {
 public:
  Statement(Database& db, std::string_view sql);
  ~Statement();
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  Statement(Statement&& other) noexcept;
  Statement& operator=(Statement&& other) = delete;

  Statement& bind(int position, int64_t value);
  Statement& bind(int position, int value) { return bind(position, static_cast<int64_t>(value)); }
  Statement& bind(int position, double value);
  Statement& bind(int position, std::string_view value);
  Statement& bind(int position, const char* value) { return bind(position, std::string_view(value)); }
  Statement& bind(int position, const std::string& value) { return bind(position, std::string_view(value)); }
  Statement& bind_null(int position);
  template <typename T>
  Statement& bind(int position, const std::optional<T>& value) {
    return value ? bind(position, *value) : bind_null(position);
  }

  // Advances to the next row; false when done. Errors throw IndexError.
  bool step();
  // Runs a statement that returns no rows (or ignores them) and resets it for reuse.
  void run();
  void reset();

  int column_count() const;
  std::string column_name(int column) const;
  bool is_null(int column) const;
  // SQLITE_INTEGER, SQLITE_FLOAT, SQLITE_TEXT, SQLITE_BLOB or SQLITE_NULL of the current row's value.
  int column_type(int column) const;
  int64_t integer(int column) const;
  double real(int column) const;
  std::string text(int column) const;
  std::optional<double> optional_real(int column) const;
  std::optional<int64_t> optional_integer(int column) const;
  std::optional<std::string> optional_text(int column) const;
  // True when the statement does not write to the database (sqlite3_stmt_readonly).
  bool read_only() const;
  bool done() const { return statement_ == nullptr; }

 private:
  Database* db_;
  sqlite3_stmt* statement_ = nullptr;
};

// BEGIN IMMEDIATE ... COMMIT: takes the write lock up front, so a transaction never fails half-way with
// "database is locked" when another process writes at the same time. BEGIN keeps retrying while other
// writers hold the lock (up to 10 minutes in all). Rolls back unless committed.
class Transaction {
 public:
  explicit Transaction(Database& db);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  void commit();

 private:
  Database& db_;
  bool open_ = false;
};

// Runs `body` inside a Transaction and commits; returns body's result.
template <typename Body>
auto with_transaction(Database& db, Body&& body) {
  Transaction transaction(db);
  if constexpr (std::is_void_v<decltype(body())>) {
    body();
    transaction.commit();
  } else {
    auto result = body();
    transaction.commit();
    return result;
  }
}

}  // namespace runner::index
