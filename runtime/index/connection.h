// The two implementations of database.h's Connection: an SQLite file and a PostgreSQL server (libpq).
#pragma once

#include <memory>
#include <string>

#include "runtime/index/database.h"

namespace runner::index {

std::unique_ptr<Connection> open_sqlite_connection(const std::string& path, OpenMode mode, int busy_timeout_ms);

// `shown` is the URL without its password (error messages name it). A read-only connection sets
// default_transaction_read_only. A server that cannot be reached is an IndexError naming it.
std::unique_ptr<Connection> open_postgresql_connection(const std::string& url, const std::string& shown,
                                                       bool read_only);

// A postgresql:// or postgres:// URL with its password replaced by "***".
std::string url_without_password(const std::string& url);

// The error for a statement that would write, in both dialects: "the index is read-only here: ...".
std::string refused_write_message(const std::string& sql);

}  // namespace runner::index
