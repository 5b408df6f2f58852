// Database, Statement and Transaction over either backend's Connection, and the dialect differences.
#include "runtime/index/database.h"

#include "runtime/core/utf8_text.h"
#include "runtime/index/connection.h"

namespace runner::index {

Database::Database(const std::string& path, OpenMode mode, int busy_timeout_ms)
    : Database(open_sqlite_connection(path, mode, busy_timeout_ms), path,
               mode == OpenMode::read_only || mode == OpenMode::read_only_immutable) {}

Database::Database(std::unique_ptr<Connection> connection, std::string path, bool read_only)
    : connection_(std::move(connection)), path_(std::move(path)), read_only_(read_only) {}

Database Database::postgresql(const std::string& url, bool read_only) {
  const std::string shown = url_without_password(url);
  return Database(open_postgresql_connection(url, shown, read_only), shown, read_only);
}

Database::~Database() = default;

Database::Database(Database&& other) noexcept
    : connection_(std::move(other.connection_)),
      path_(std::move(other.path_)),
      read_only_(other.read_only_),
      write_check_(std::move(other.write_check_)) {}

void Database::execute(std::string_view sql) { connection_->execute(sql); }

Statement Database::prepare(std::string_view sql) { return Statement(connection_->prepare(sql)); }

int Database::changes() const { return connection_->changes(); }

std::string Database::greatest(std::string_view a, std::string_view b) const {
  return std::string(backend() == Backend::postgresql ? "GREATEST(" : "max(") + std::string(a) + ", " + std::string(b) +
         ")";
}

const char* Database::lock_rows_skipping_locked() const {
  return backend() == Backend::postgresql ? " FOR UPDATE SKIP LOCKED" : "";
}

const char* Database::lock_rows() const { return backend() == Backend::postgresql ? " FOR UPDATE" : ""; }

const char* Database::lock_rows_shared() const { return backend() == Backend::postgresql ? " FOR SHARE" : ""; }

Statement::Statement(std::unique_ptr<StatementImpl> impl) : impl_(std::move(impl)) {}
Statement::Statement(Database& db, std::string_view sql) : impl_(db.connection().prepare(sql)) {}
Statement::~Statement() = default;
Statement::Statement(Statement&& other) noexcept : impl_(std::move(other.impl_)) {}

Statement& Statement::bind(int position, int64_t value) {
  BoundValue bound;
  bound.kind = BoundValue::Kind::integer;
  bound.integer = value;
  impl_->bind(position, std::move(bound));
  return *this;
}

Statement& Statement::bind(int position, double value) {
  BoundValue bound;
  bound.kind = BoundValue::Kind::real;
  bound.real = value;
  impl_->bind(position, std::move(bound));
  return *this;
}

Statement& Statement::bind(int position, std::string_view value) {
  BoundValue bound;
  bound.kind = BoundValue::Kind::text;
  bound.text = core::utf8_escaped(value);  // the index holds UTF-8 only (PostgreSQL refuses other bytes)
  impl_->bind(position, std::move(bound));
  return *this;
}

Statement& Statement::bind_null(int position) {
  impl_->bind(position, BoundValue{});
  return *this;
}

bool Statement::step() { return impl_->step(); }

void Statement::run() {
  while (step()) {
  }
  reset();
}

void Statement::reset() { impl_->reset(); }
int Statement::column_count() const { return impl_->column_count(); }
std::string Statement::column_name(int column) const { return impl_->column_name(column); }
bool Statement::is_null(int column) const { return impl_->column_type(column) == ColumnType::null; }
ColumnType Statement::column_type(int column) const { return impl_->column_type(column); }
int64_t Statement::integer(int column) const { return impl_->integer(column); }
double Statement::real(int column) const { return impl_->real(column); }
// An index written before runner checked its texts may hold bytes that are not UTF-8.
std::string Statement::text(int column) const { return core::utf8_replaced(impl_->text(column)); }

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

Transaction::Transaction(Database& db, TransactionScope scope) : db_(db) {
  db.connection().begin(scope);
  try {
    db.run_write_check();
  } catch (...) {
    db.connection().rollback();
    throw;
  }
  open_ = true;
}

Transaction::~Transaction() {
  if (open_) db_.connection().rollback();
}

void Transaction::commit() {
  db_.connection().commit();
  open_ = false;
}

}  // namespace runner::index
