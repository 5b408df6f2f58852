// One read-only statement over the index, with its columns and rows.
#include "runtime/index/read_query.h"

#include <sqlite3.h>

#include <cctype>
#include <fmt/format.h>

#include "runtime/core/clock.h"

namespace runner::index {
namespace {

std::string first_word(const std::string& sql) {
  const size_t start = sql.find_first_not_of(" \t\r\n");
  if (start == std::string::npos) return "";
  const size_t end = sql.find_first_of(" \t\r\n(;", start);
  return sql.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

}  // namespace

QueryResult run_read_query(Database& db, const std::string& sql, const std::vector<SqlValue>& parameters,
                           const QueryLimits& limits) {
  sqlite3_stmt* raw = nullptr;
  const char* tail = nullptr;
  const int code = sqlite3_prepare_v2(db.handle(), sql.c_str(), static_cast<int>(sql.size()), &raw, &tail);
  if (code != SQLITE_OK) {
    if ((code & 0xff) == SQLITE_NOTADB || (code & 0xff) == SQLITE_CORRUPT) db.fail(code, "cannot read the index");
    throw IndexError(fmt::format("SQL error: {}", sqlite3_errmsg(db.handle())));
  }
  struct Finalize {
    sqlite3_stmt* statement;
    ~Finalize() { sqlite3_finalize(statement); }
  } finalize{raw};
  if (!raw) throw IndexError("SQL error: the query is empty");
  if (tail && *tail) {
    // Whatever follows must compile to nothing: whitespace, ';' or comments.
    sqlite3_stmt* next = nullptr;
    const int next_code = sqlite3_prepare_v2(db.handle(), tail, -1, &next, nullptr);
    const bool another = next != nullptr || next_code != SQLITE_OK;
    sqlite3_finalize(next);
    if (another) throw IndexError("SQL error: give one statement at a time (found more after the first ';')");
  }
  // ATTACH, DETACH, BEGIN and pragmas that set a value count as read-only for SQLite (they change the
  // connection, not the file); none of them returns columns, as every read does.
  if (!sqlite3_stmt_readonly(raw) || sqlite3_column_count(raw) == 0)
    throw IndexError(
        fmt::format("the index is read-only here: this statement would modify it ({}); queries can "
                    "only read",
                    first_word(sql)));
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
  } deadline{db.handle(), core::steady_seconds() + limits.timeout_seconds};
  if (limits.timeout_seconds > 0) {
    sqlite3_progress_handler(
        db.handle(), 10000,
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
      if ((step & 0xff) == SQLITE_NOTADB || (step & 0xff) == SQLITE_CORRUPT) db.fail(step, "cannot read the index");
      throw IndexError(fmt::format("SQL error: {}", sqlite3_errmsg(db.handle())));
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

}  // namespace runner::index
