// One read-only statement over the index, with its columns and rows: the backend runs it in its dialect.
#include "runtime/index/read_query.h"

#include <fmt/format.h>

#include "runtime/index/connection.h"

namespace runner::index {
namespace {

std::string first_word(const std::string& sql) {
  const size_t start = sql.find_first_not_of(" \t\r\n");
  if (start == std::string::npos) return "";
  const size_t end = sql.find_first_of(" \t\r\n(;", start);
  return sql.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

}  // namespace

std::string refused_write_message(const std::string& sql) {
  return fmt::format("the index is read-only here: this statement would modify it ({}); queries can only read",
                     first_word(sql));
}

QueryResult run_read_query(Database& db, const std::string& sql, const std::vector<SqlValue>& parameters,
                           const QueryLimits& limits) {
  return db.connection().read_query(sql, parameters, limits);
}

}  // namespace runner::index
