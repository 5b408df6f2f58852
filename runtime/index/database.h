// The index's database connection, one interface over SQLite and PostgreSQL: connections, statements with
// `?` / `?N` parameters, write transactions and the few places where the two dialects differ. It knows nothing
// of runs; index_database.h builds the runner index on it. Callers never learn which server they talk to.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace runner::index {

// what() is one line naming the database (its path, or its URL without the password) and what failed.
struct IndexError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The connection to a PostgreSQL server broke (the server restarted, the network dropped), or a statement timed out
// waiting for a lock that a session this process lost may have held (ended since): nothing of the transaction it
// interrupted was committed. with_transaction() reconnects and runs the transaction again.
struct IndexConnectionLost : IndexError {
  using IndexError::IndexError;
};

// A read-only connection to a PostgreSQL server could not be made (no such host, the server down): said at once,
// where a writer waits for the server.
struct IndexUnreachable : IndexError {
  using IndexError::IndexError;
};

// read_only_immutable reads a file that nothing can change (a read-only medium): no locks, no -shm file.
enum class OpenMode { read_only, read_only_immutable, read_write, read_write_create };

enum class Backend { sqlite, postgresql };

// Who else may write while a transaction runs. `index`: none (SQLite's BEGIN IMMEDIATE; on PostgreSQL an
// advisory lock that every such transaction takes, held until its commit, round trips included), for the few whose
// decision reads the whole index (a run's generated name, the schema, removals). `own_rows`: a transaction that
// writes only rows of its own run, trial or worker, or that locks the rows its decision reads (Database::lock_rows:
// a sweep's row for its claims, a trial's row for its end, a run's row for its resume), which on PostgreSQL runs
// beside the others under row locks; SQLite still serialises it.
enum class TransactionScope { index, own_rows };

// A value bound to a parameter.
struct BoundValue {
  enum class Kind { null, integer, real, text } kind = Kind::null;
  int64_t integer = 0;
  double real = 0;
  std::string text;
};

// The column types of a row, as SQLite names them (a PostgreSQL column maps onto the nearest).
enum class ColumnType { integer, real, text, null };

// A value of a row read by run_read_query: NULL, an integer, a real or text.
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

// One backend's prepared statement.
class StatementImpl {
 public:
  virtual ~StatementImpl() = default;
  virtual void bind(int position, BoundValue value) = 0;
  virtual bool step() = 0;
  virtual void reset() = 0;
  virtual int column_count() const = 0;
  virtual std::string column_name(int column) const = 0;
  virtual ColumnType column_type(int column) const = 0;
  virtual int64_t integer(int column) const = 0;
  virtual double real(int column) const = 0;
  virtual std::string text(int column) const = 0;
};

// One backend's connection.
class Connection {
 public:
  virtual ~Connection() = default;
  virtual Backend backend() const = 0;
  virtual void execute(std::string_view sql) = 0;
  virtual std::unique_ptr<StatementImpl> prepare(std::string_view sql) = 0;
  virtual int changes() const = 0;
  virtual void begin(TransactionScope scope) = 0;
  virtual void commit() = 0;
  virtual void rollback() noexcept = 0;
  // Makes a broken connection usable again (PostgreSQL), waiting for the server up to a limit; an
  // IndexError when it does not come back. A connection that is not broken stays as it is.
  virtual void reconnect() = 0;
  // read_query.h's run_read_query in this backend's terms (its header says what it refuses).
  virtual QueryResult read_query(const std::string& sql, const std::vector<SqlValue>& parameters,
                                 const QueryLimits& limits) = 0;
  // After many rows were deleted: SQLite truncates its write-ahead log and refreshes its statistics; a
  // PostgreSQL server does this itself.
  virtual void tidy_after_deleting() = 0;
};

class Statement;

class Database {
 public:
  // An SQLite file. Busy waits up to `busy_timeout_ms` for other writers before SQLITE_BUSY (which is then
  // retried by Transaction). A missing file opened without _create is an IndexError.
  Database(const std::string& path, OpenMode mode, int busy_timeout_ms = 60000);
  // A PostgreSQL database given by a libpq URL (postgresql://user@host:port/dbname?...). A read-only
  // connection runs every transaction READ ONLY.
  static Database postgresql(const std::string& url, bool read_only);
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;
  Database(Database&& other) noexcept;
  Database& operator=(Database&& other) = delete;

  // Runs statements without parameters or results (several, separated by ';').
  void execute(std::string_view sql);
  Statement prepare(std::string_view sql);
  // Rows changed by the latest INSERT, UPDATE or DELETE.
  int changes() const;
  bool read_only() const { return read_only_; }
  // The path, or the URL without its password: what error messages name.
  const std::string& path() const { return path_; }
  Backend backend() const { return connection_->backend(); }
  Connection& connection() { return *connection_; }

  // The dialect differences the index's own SQL needs, in one place.
  // The larger of two SQL expressions: max(a, b) in SQLite, GREATEST(a, b) in PostgreSQL.
  std::string greatest(std::string_view a, std::string_view b) const;
  // Appended to a SELECT whose rows the transaction will change: FOR UPDATE SKIP LOCKED on PostgreSQL (rows
  // another transaction is changing are left to it), nothing on SQLite (whose writers never overlap).
  const char* lock_rows_skipping_locked() const;
  // Appended to a SELECT of rows that must not change before the transaction commits: FOR SHARE on PostgreSQL (a
  // writer of those rows waits for this transaction, and this one reads what such a writer committed), nothing on
  // SQLite.
  const char* lock_rows_shared() const;
  // Appended to a SELECT of rows the transaction decides on and changes: FOR UPDATE on PostgreSQL (others that lock
  // or change them wait for this transaction's commit), nothing on SQLite.
  const char* lock_rows() const;

  // A check run at the start of every write transaction on this connection, once it holds its locks, before its
  // body (index/writer_fence.h installs the process's fence). What it throws ends the transaction.
  void set_write_check(std::function<void(Database&)> check) { write_check_ = std::move(check); }
  void run_write_check() {
    if (write_check_) write_check_(*this);
  }

 private:
  Database(std::unique_ptr<Connection> connection, std::string path, bool read_only);
  std::unique_ptr<Connection> connection_;
  std::string path_;
  bool read_only_ = false;
  std::function<void(Database&)> write_check_;
};

// A prepared statement. bind() positions are 1-based as in SQLite; column() positions 0-based.
class Statement {
 public:
  explicit Statement(std::unique_ptr<StatementImpl> impl);
  Statement(Database& db, std::string_view sql);
  ~Statement();
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
  ColumnType column_type(int column) const;
  int64_t integer(int column) const;
  double real(int column) const;
  std::string text(int column) const;
  std::optional<double> optional_real(int column) const;
  std::optional<int64_t> optional_integer(int column) const;
  std::optional<std::string> optional_text(int column) const;

 private:
  std::unique_ptr<StatementImpl> impl_;
};

// A write transaction (TransactionScope says who else may write meanwhile). SQLite: BEGIN IMMEDIATE, retried
// while other writers hold the lock (up to 10 minutes in all). Rolls back unless committed.
class Transaction {
 public:
  explicit Transaction(Database& db, TransactionScope scope = TransactionScope::index);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  void commit();

 private:
  Database& db_;
  bool open_ = false;
};

// Runs `body` inside a Transaction and commits; returns body's result. A transaction that a lost PostgreSQL
// connection interrupted (nothing of it committed) runs again once the connection is back, and so does one that
// waited for a lock of a session this process lost.
template <typename Body>
auto with_transaction(Database& db, Body&& body, TransactionScope scope = TransactionScope::index) {
  for (int attempt = 1;; ++attempt) {
    try {
      Transaction transaction(db, scope);
      if constexpr (std::is_void_v<decltype(body())>) {
        body();
        transaction.commit();
        return;
      } else {
        auto result = body();
        transaction.commit();
        return result;
      }
    } catch (const IndexConnectionLost&) {
      if (attempt >= 5) throw;
      db.connection().reconnect();
    }
  }
}

}  // namespace runner::index
