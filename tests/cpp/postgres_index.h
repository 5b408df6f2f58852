// A test's own database on the test run's PostgreSQL server, and INDEX_TEST_CASE: a Catch2 case that runs on SQLite
// and again on PostgreSQL.
#pragma once

#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "runtime/core/launch_context.h"
#include "runtime/index/database.h"

namespace runner::testing {

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A fresh database on the PostgreSQL server of the test run, made the process's index (LaunchContext::index_url)
// while this lives: ctest starts the server (tests/cli/postgres_server.py start DIR, a fixture in
// tests/CMakeLists.txt) and names DIR in RUNNER_TEST_POSTGRES, where the script leaves the server's URL in `url`, or
// why there is none in `unavailable`.
class PostgresIndex {
 public:
  PostgresIndex() : saved_(runner::core::launch_context()) {
    const char* state = std::getenv("RUNNER_TEST_POSTGRES");
    if (!state || !*state) {
      reason_ =
          "no PostgreSQL server: RUNNER_TEST_POSTGRES is not set (ctest sets it to the folder of the server that "
          "tests/cli/postgres_server.py starts)";
      return;
    }
    const std::string folder = state;
    if (!std::filesystem::exists(folder + "/url")) {
      reason_ = std::filesystem::exists(folder + "/unavailable")
                    ? "no PostgreSQL server: " + read_text(folder + "/unavailable")
                    : "no PostgreSQL server: " + folder + "/url is missing";
      while (!reason_.empty() && reason_.back() == '\n') reason_.pop_back();
      return;
    }
    std::string url = read_text(folder + "/url");
    while (!url.empty() && (url.back() == '\n' || url.back() == '\r')) url.pop_back();
    admin_url_ = url;
    static int databases = 0;
    name_ = "index_test_" + std::to_string(::getpid()) + "_" + std::to_string(++databases);
    runner::index::Database::postgresql(admin_url_, false).execute("CREATE DATABASE " + name_);
    runner::core::LaunchContext context = saved_;
    context.index_url = admin_url_.substr(0, admin_url_.rfind('/') + 1) + name_;
    runner::core::set_launch_context(context);
  }
  ~PostgresIndex() {
    runner::core::set_launch_context(saved_);
    if (name_.empty()) return;
    try {
      runner::index::Database::postgresql(admin_url_, false)
          .execute("DROP DATABASE IF EXISTS " + name_ + " WITH (FORCE)");
    } catch (const std::exception&) {  // the server goes with its folder at the end of the run
    }
  }
  PostgresIndex(const PostgresIndex&) = delete;
  PostgresIndex& operator=(const PostgresIndex&) = delete;

  bool available() const { return !name_.empty(); }
  const std::string& reason() const { return reason_; }

 private:
  runner::core::LaunchContext saved_;
  std::string admin_url_;
  std::string name_;
  std::string reason_;
};

}  // namespace runner::testing

// A test case that runs on the SQLite index in its home directory and again, as "<name> (PostgreSQL)" tagged
// [postgresql], on a fresh database of the test run's PostgreSQL server; without a server that one says why it
// skips. The body opens the index with open_index_for_writing(runner::testing::index_at(home)), which takes the server
// from the launch context, so the same statements run against both.
#define INDEX_TEST_CASE(name, tags) INDEX_TEST_CASE_ON_BOTH(name, tags, INTERNAL_CATCH_UNIQUE_NAME(index_case_))
#define INDEX_TEST_CASE_ON_BOTH(name, tags, body)        \
  static void body();                                    \
  TEST_CASE(name, tags) { body(); }                      \
  TEST_CASE(name " (PostgreSQL)", tags "[postgresql]") { \
    const runner::testing::PostgresIndex server;         \
    if (!server.available()) {                           \
      WARN("SKIP: " << server.reason());                 \
      return;                                            \
    }                                                    \
    body();                                              \
  }                                                      \
  static void body()
