// Tests of runtime/index: the SQLite run index (migrations, opening), runs and their lookup, the background
// metric writer, read-only queries, run removal and gc, and the active run context.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <future>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/ckpt/checkpoint_store.h"
#include "runtime/core/disk_usage.h"
#include "runtime/core/exit_status.h"
#include "runtime/core/launch_context.h"
#include "tests/cpp/postgres_index.h"
#include "tests/cpp/temp_directory.h"
#include "tests/cpp/test_index_location.h"
#include "runtime/index/final_status.h"
#include "runtime/index/index_database.h"
#include "runtime/index/metric_writer.h"
#include "runtime/index/read_query.h"
#include "runtime/run/run_context.h"
#include "runtime/run/system_metrics.h"
#include "runtime/index/run_removal.h"
#include "runtime/index/run_records.h"
#include "runtime/index/run_store.h"
#include "runtime/index/database.h"
#include "runtime/index/writer_fence.h"

using namespace runner::index;
using Catch::Contains;
using Catch::StartsWith;
using runner::run::RunContext;
using runner::run::RunStart;

namespace {

namespace fs = std::filesystem;

using runner::testing::remove_tree;

// A fresh home directory for the index, deleted with everything in it at the end of the test.
struct TempHome : runner::testing::TempDir {
  TempHome() : TempDir("index-test") {}
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_file(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

bool exists(const std::string& path) { return fs::exists(fs::symlink_status(path)); }

// The message of the IndexError that `body` throws; fails the test for no exception or another type.
std::string index_error(const std::function<void()>& body) {
  try {
    body();
  } catch (const IndexError& error) {
    return error.what();
  } catch (const std::exception& error) {
    FAIL("expected an IndexError, got another exception: " << error.what());
  }
  FAIL("expected an IndexError, nothing was thrown");
  return {};
}

int64_t scalar(Database& db, const std::string& sql) {
  Statement statement = db.prepare(sql);
  REQUIRE(statement.step());
  return statement.integer(0);
}

double scalar_real(Database& db, const std::string& sql) {
  Statement statement = db.prepare(sql);
  REQUIRE(statement.step());
  return statement.real(0);
}

std::string scalar_text(Database& db, const std::string& sql) {
  Statement statement = db.prepare(sql);
  REQUIRE(statement.step());
  return statement.text(0);
}

bool table_exists(Database& db, const std::string& table) {
  Statement statement = db.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?");
  statement.bind(1, table);
  return statement.step();
}

NewRun new_run(const std::string& script = "experiments/foo.lua", const std::string& name = "") {
  NewRun run;
  run.name = name;
  run.script = script;
  run.script_hash = "0123abcd";
  run.config = {{"lr", 0.001}, {"batch", 64}, {"model", {{"kind", "unet"}, {"channels", {64, 128}}}}};
  run.device = "cpu";
  run.seed = 7;
  return run;
}

int64_t count_for_run(Database& db, const std::string& table, int64_t run) {
  return scalar(db, "SELECT count(*) FROM " + table + " WHERE run = " + std::to_string(run));
}

// A pid that belonged to a process of this host that has exited (and been waited for).
int64_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  return child;
}

template <typename Condition>
bool eventually(Condition condition, double seconds = 5.0) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return condition();
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Opening and migrating

TEST_CASE("a fresh index is created with the current schema, and migrating again changes nothing", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path + "/nested/home";
  {
    Database db = open_index_for_writing(runner::testing::index_at(home));
    CHECK(db.path() == home + "/index.db");
    CHECK(index_path(home) == home + "/index.db");
    CHECK(scalar(db, "PRAGMA user_version") == schema_version());
    CHECK(schema_version() == schema_migrations().back().version);
    CHECK(scalar_text(db, "PRAGMA journal_mode") == "wal");
    CHECK(scalar(db, "PRAGMA foreign_keys") == 1);
    for (const char* table : {"runs", "metrics", "metric_latest", "checkpoints", "checkpoint_files", "artifacts"})
      CHECK(table_exists(db, table));
    create_run(db, new_run(), home);
  }
  CHECK(fs::is_directory(home));

  Database db = open_index_for_writing(runner::testing::index_at(home));
  Database observer(index_path(home), OpenMode::read_only);
  const int64_t data_version = scalar(observer, "PRAGMA data_version");
  CHECK(migrate(db, schema_migrations()) == schema_version());
  CHECK(migrate(db, schema_migrations()) == schema_version());
  CHECK(scalar(observer, "PRAGMA data_version") == data_version);  // nothing was committed
  CHECK(scalar(db, "PRAGMA user_version") == schema_version());
  CHECK(scalar(db, "SELECT count(*) FROM runs") == 1);
}

TEST_CASE("migrate applies only the missing steps of a migration list", "[index]") {
  TempHome tmp;
  const std::string path = tmp.path + "/custom.db";
  static constexpr Migration kFirst[] = {{1, "CREATE TABLE first (x INTEGER)"}};
  static constexpr Migration kBoth[] = {{1, "CREATE TABLE first (x INTEGER)"},
                                        {2, "CREATE TABLE second (y TEXT); INSERT INTO first VALUES (42)"}};
  {
    Database db(path, OpenMode::read_write_create);
    CHECK(migrate(db, kFirst) == 1);
    CHECK(scalar(db, "PRAGMA user_version") == 1);
    CHECK(table_exists(db, "first"));
    CHECK_FALSE(table_exists(db, "second"));
  }
  Database db(path, OpenMode::read_write);
  CHECK(migrate(db, kBoth) == 2);  // step 1 again would fail: "table first already exists"
  CHECK(scalar(db, "PRAGMA user_version") == 2);
  CHECK(table_exists(db, "first"));
  CHECK(table_exists(db, "second"));
  CHECK(scalar(db, "SELECT count(*) FROM first") == 1);
  CHECK(migrate(db, kBoth) == 2);
  CHECK(scalar(db, "SELECT count(*) FROM first") == 1);

  // Older list than the database: refused.
  CHECK_THAT(index_error([&] { migrate(db, kFirst); }), Contains("newer than this runner supports"));
}

TEST_CASE("a migration that fails leaves the database at the previous version", "[index]") {
  TempHome tmp;
  const std::string path = tmp.path + "/custom.db";
  static constexpr Migration kBroken[] = {{1, "CREATE TABLE first (x INTEGER)"},
                                          {2, "CREATE TABLE second (y TEXT); THIS IS NOT SQL"}};
  Database db(path, OpenMode::read_write_create);
  CHECK_THAT(index_error([&] { migrate(db, kBroken); }), StartsWith(path + ": "));
  CHECK(scalar(db, "PRAGMA user_version") == 1);
  CHECK(table_exists(db, "first"));
  CHECK_FALSE(table_exists(db, "second"));
}

TEST_CASE("an index from a newer runner is refused and left byte-identical", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  const std::string path = index_path(home);
  {
    Database db = open_index_for_writing(runner::testing::index_at(home));
    create_run(db, new_run(), home);
    db.execute("PRAGMA user_version = " + std::to_string(schema_version() + 5));
  }
  REQUIRE_FALSE(exists(path + "-wal"));
  const std::string before = read_file(path);
  REQUIRE(!before.empty());

  const std::string reading = index_error([&] { open_index_for_reading(runner::testing::index_at(home)); });
  CHECK_THAT(reading, StartsWith(path + ": "));
  CHECK_THAT(reading, Contains("newer than this runner supports"));
  CHECK(read_file(path) == before);

  const std::string writing = index_error([&] { open_index_for_writing(runner::testing::index_at(home)); });
  CHECK_THAT(writing, StartsWith(path + ": "));
  CHECK_THAT(writing, Contains("newer than this runner supports"));
  CHECK(read_file(path) == before);

  {
    Database db(path, OpenMode::read_write);
    CHECK_THAT(index_error([&] { migrate(db, schema_migrations()); }), Contains("newer than this runner supports"));
  }
  CHECK(read_file(path) == before);
}

TEST_CASE("an SQLite file without the runner schema is not an index", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  const std::string path = index_path(home);
  {
    Database db(path, OpenMode::read_write_create);
    db.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, caption TEXT); INSERT INTO photos VALUES (1, 'cat')");
  }
  const std::string before = read_file(path);

  const std::string reading = index_error([&] { open_index_for_reading(runner::testing::index_at(home)); });
  CHECK_THAT(reading, StartsWith(path + ": "));
  CHECK_THAT(reading, Contains("not a runner index"));
  CHECK(read_file(path) == before);

  const std::string writing = index_error([&] { open_index_for_writing(runner::testing::index_at(home)); });
  CHECK_THAT(writing, StartsWith(path + ": "));
  CHECK_THAT(writing, Contains("not a runner index"));

  Database db(path, OpenMode::read_write);
  CHECK_THAT(index_error([&] { migrate(db, schema_migrations()); }), Contains("not a runner index"));
  CHECK_FALSE(table_exists(db, "runs"));
  CHECK(scalar(db, "PRAGMA user_version") == 0);
  CHECK(scalar(db, "SELECT count(*) FROM photos") == 1);
}

TEST_CASE("an SQLite file without the runner schema is not changed by an attempt to open it for writing", "[index]") {
  // A user's own database that happens to be called index.db: runner refuses it, and must not convert it
  // (e.g. to WAL mode) on the way.
  TempHome tmp;
  const std::string path = index_path(tmp.path);
  {
    Database db(path, OpenMode::read_write_create);
    db.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, caption TEXT); INSERT INTO photos VALUES (1, 'cat')");
  }
  const std::string before = read_file(path);
  CHECK_THAT(index_error([&] { open_index_for_writing(runner::testing::index_at(tmp.path)); }),
             Contains("not a runner index"));
  CHECK(read_file(path) == before);
  Database db(path, OpenMode::read_only);
  CHECK(scalar_text(db, "PRAGMA journal_mode") == "delete");
}

TEST_CASE("a file of random bytes named index.db is reported with its path and left unchanged", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  const std::string path = index_path(home);
  std::mt19937 generator(1234);
  std::string bytes(8192, '\0');
  for (char& c : bytes) c = static_cast<char>(generator() & 0xff);
  write_file(path, bytes);

  const std::string reading = index_error([&] { open_index_for_reading(runner::testing::index_at(home)); });
  CHECK_THAT(reading, StartsWith(path + ": "));
  CHECK_THAT(reading, Contains("not an SQLite database"));
  CHECK(read_file(path) == bytes);

  const std::string writing = index_error([&] { open_index_for_writing(runner::testing::index_at(home)); });
  CHECK_THAT(writing, StartsWith(path + ": "));
  CHECK_THAT(writing, Contains("not an SQLite database"));
  CHECK(read_file(path) == bytes);
}

TEST_CASE("reading an index that does not exist says so and creates nothing", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path + "/nowhere";
  const std::string message = index_error([&] { open_index_for_reading(runner::testing::index_at(home)); });
  CHECK_THAT(message, StartsWith(home + "/index.db: no runner index here"));
  CHECK_THAT(message, Contains("'" + home + "'"));
  CHECK_FALSE(exists(home));

  // An empty file is not an index either.
  write_file(tmp.path + "/empty/index.db", "");
  CHECK_THAT(index_error([&] { open_index_for_reading(runner::testing::index_at(tmp.path + "/empty")); }),
             Contains("not a runner index"));
}

TEST_CASE("an index opened for reading reads but refuses writes", "[index]") {
  TempHome tmp;
  {
    Database db = open_index_for_writing(runner::testing::index_at(tmp.path));
    create_run(db, new_run(), tmp.path);
  }
  Database db = open_index_for_reading(runner::testing::index_at(tmp.path));
  CHECK(db.read_only());
  CHECK(scalar(db, "SELECT count(*) FROM runs") == 1);
  CHECK_THROWS_AS(db.execute("DELETE FROM runs"), IndexError);
  CHECK(scalar(db, "SELECT count(*) FROM runs") == 1);
}

// ---------------------------------------------------------------------------------------------------------
// Runs

INDEX_TEST_CASE("create_run names runs after the script and gives them fresh ids", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  Database db = open_index_for_writing(runner::testing::index_at(home));

  const RunRecord first = create_run(db, new_run("experiments/foo.lua"), home);
  const RunRecord second = create_run(db, new_run("experiments/foo.lua"), home);
  CHECK(first.name == "foo-1");
  CHECK(second.name == "foo-2");
  CHECK(first.dir == "foo-1");
  CHECK(first.status == "running");
  CHECK(first.script == "experiments/foo.lua");
  CHECK(first.script_hash == "0123abcd");
  CHECK(first.config == new_run().config);
  CHECK(first.device == "cpu");
  CHECK(first.seed == std::optional<int64_t>(7));
  CHECK(first.pid == static_cast<int64_t>(::getpid()));
  CHECK(first.host == host_name());
  CHECK_FALSE(first.ended_at.has_value());
  CHECK(first.heartbeat_at == first.started_at);
  CHECK(std::abs(first.started_at - now_seconds()) < 60);
  CHECK(effective_status(first, now_seconds()) == "running");

  // A directory of that name (not in the index) is skipped too.
  fs::create_directories(home + "/foo-3");
  CHECK(create_run(db, new_run("experiments/foo.lua"), home).name == "foo-4");
  CHECK(create_run(db, new_run("other/bar.lua"), home).name == "bar-1");

  CHECK(create_run(db, new_run("x.lua", "baseline"), home).name == "baseline");
  const std::string taken = index_error([&] { create_run(db, new_run("x.lua", "baseline"), home); });
  CHECK_THAT(taken, Contains("a run named 'baseline' already exists"));
  const std::string taken_dir = index_error([&] { create_run(db, new_run("x.lua", "foo-3"), home); });
  CHECK_THAT(taken_dir, StartsWith(home + "/foo-3: the run directory already exists"));

  CHECK(index_error([&] { create_run(db, new_run("x.lua", "a/b"), home); }) ==
        "run name 'a/b' is not allowed: use letters, digits, '_', '-' and '.'");
  CHECK_THAT(index_error([&] { create_run(db, new_run("x.lua", "../up"), home); }), Contains("is not allowed"));
  CHECK_THAT(index_error([&] { create_run(db, new_run("x.lua", "last"), home); }), Contains("is not allowed"));
  CHECK_THAT(index_error([&] { create_run(db, new_run("x.lua", ".hidden"), home); }), Contains("is not allowed"));
  CHECK_FALSE(exists(home + "/a"));
  CHECK(scalar(db, "SELECT count(*) FROM runs") == 5);
}

INDEX_TEST_CASE("run ids are 8 characters of [0-9a-z] and unique", "[index]") {
  TempHome tmp;
  Database db = open_index_for_writing(runner::testing::index_at(tmp.path));
  std::set<std::string> ids;
  for (int i = 0; i < 60; ++i) {
    const RunRecord run = create_run(db, new_run(), tmp.path);
    REQUIRE(run.id.size() == 8);
    for (char c : run.id) REQUIRE(((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z')));
    ids.insert(run.id);
  }
  CHECK(ids.size() == 60);
  CHECK(scalar(db, "SELECT count(DISTINCT id) FROM runs") == 60);
  CHECK(scalar(db, "SELECT count(DISTINCT name) FROM runs") == 60);
}

INDEX_TEST_CASE("resolve_run finds runs by id, name, last and unique prefix", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  Database db = open_index_for_writing(runner::testing::index_at(home));

  CHECK_THAT(index_error([&] { resolve_run(db, "last"); }), Contains("there are no runs yet"));

  const RunRecord a = create_run(db, new_run("a.lua", "alpha"), home);
  const RunRecord b = create_run(db, new_run("b.lua", "beta"), home);
  // Start times decide `last`, not insertion order.
  db.execute("UPDATE runs SET started_at = started_at + 100 WHERE run = " + std::to_string(a.run));

  CHECK(resolve_run(db, a.id).run == a.run);
  CHECK(resolve_run(db, b.id).run == b.run);
  CHECK(resolve_run(db, "alpha").run == a.run);
  CHECK(resolve_run(db, "beta").id == b.id);
  CHECK(resolve_run(db, "last").run == a.run);
  db.execute("UPDATE runs SET started_at = started_at + 200 WHERE run = " + std::to_string(b.run));
  CHECK(resolve_run(db, "last").run == b.run);

  // Keep creating runs until two ids share their first character (at most 37 by pigeonhole).
  std::vector<RunRecord> runs{a, b};
  std::string shared;
  while (shared.empty()) {
    runs.push_back(create_run(db, new_run("many.lua"), home));
    REQUIRE(runs.size() <= 40);
    for (size_t i = 0; i + 1 < runs.size() && shared.empty(); ++i)
      if (runs[i].id[0] == runs.back().id[0]) shared = runs.back().id.substr(0, 1);
  }
  const std::string ambiguous = index_error([&] { resolve_run(db, shared); });
  CHECK_THAT(ambiguous, StartsWith("run prefix '" + shared + "' is ambiguous: it matches "));

  // A unique prefix: the shortest prefix of a run's id that no other id starts with.
  for (const RunRecord& run : runs) {
    for (size_t length = 1; length < 8; ++length) {
      const std::string prefix = run.id.substr(0, length);
      bool unique = true;
      for (const RunRecord& other : runs) unique = unique && (other.run == run.run || !other.id.starts_with(prefix));
      if (!unique) continue;
      INFO("prefix " << prefix << " of " << run.id);
      CHECK(resolve_run(db, prefix).run == run.run);
      break;
    }
  }

  const std::string unknown = index_error([&] { resolve_run(db, "zz-not-a-run"); });
  CHECK_THAT(unknown, StartsWith("no run matches 'zz-not-a-run'"));
  CHECK_THROWS_AS(resolve_run(db, ""), IndexError);

  // A name that is another run's id.
  create_run(db, new_run("c.lua", a.id), home);
  CHECK_THAT(index_error([&] { resolve_run(db, a.id); }), Contains("is ambiguous"));
}

TEST_CASE("effective_status shows running rows of dead or silent processes as interrupted", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  Database db = open_index_for_writing(runner::testing::index_at(home));
  const RunRecord live = create_run(db, new_run("live.lua"), home);
  const RunRecord dead = create_run(db, new_run("dead.lua"), home);
  const RunRecord silent = create_run(db, new_run("silent.lua"), home);
  const RunRecord done = create_run(db, new_run("done.lua"), home);

  const double now = now_seconds();
  db.execute("UPDATE runs SET pid = " + std::to_string(dead_pid()) + " WHERE run = " + std::to_string(dead.run));
  db.execute("UPDATE runs SET heartbeat_at = " + std::to_string(now - kStaleAfterSeconds - 5) +
             " WHERE run = " + std::to_string(silent.run));
  finish_run(db, done.run, "finished", std::nullopt);

  CHECK(effective_status(load_run(db, live.run), now) == "running");
  CHECK(effective_status(load_run(db, dead.run), now) == "interrupted");
  CHECK(effective_status(load_run(db, silent.run), now) == "interrupted");
  CHECK(effective_status(load_run(db, done.run), now) == "finished");
  // The stored status is still `running` until reaped.
  CHECK(load_run(db, dead.run).status == "running");

  // The same process on another host: only the heartbeat counts.
  RunRecord elsewhere = load_run(db, dead.run);
  elsewhere.host = "some-other-host.invalid";
  CHECK(effective_status(elsewhere, now) == "running");

  RunFilter only_running;
  only_running.status = "running";
  const auto running = list_runs(db, only_running);
  REQUIRE(running.size() == 1);
  CHECK(running[0].run == live.run);

  CHECK(reap_stale_runs(db, now, home) == 2);
  for (const RunRecord& run : {load_run(db, dead.run), load_run(db, silent.run)}) {
    CHECK(run.status == "interrupted");
    REQUIRE(run.ended_at.has_value());
    CHECK(*run.ended_at == run.heartbeat_at);
    REQUIRE(run.error.has_value());
    CHECK_THAT(*run.error, Contains("the process stopped without finishing the run"));
  }
  CHECK(load_run(db, live.run).status == "running");
  CHECK(load_run(db, done.run).status == "finished");
  CHECK(reap_stale_runs(db, now, home) == 0);
}

TEST_CASE("a final status the index could not take is recorded from the run's reserved file", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  Database db = open_index_for_writing(runner::testing::index_at(home));
  const RunRecord full = create_run(db, new_run("full.lua"), home);
  const RunRecord blank = create_run(db, new_run("blank.lua"), home);
  for (const RunRecord& run : {full, blank}) {
    REQUIRE(::mkdir((home + "/" + run.dir).c_str(), 0777) == 0);
    reserve_final_status(home + "/" + run.dir);
    db.execute("UPDATE runs SET pid = " + std::to_string(dead_pid()) + " WHERE run = " + std::to_string(run.run));
  }
  CHECK(std::filesystem::file_size(home + "/" + full.dir + "/" + kFinalStatusFile) == kFinalStatusBytes);
  CHECK_FALSE(read_final_status(home + "/" + full.dir));  // blank until written
  const std::string long_error = "disk full: " + std::string(10000, 'x');
  write_final_status(home + "/" + full.dir, {"failed", long_error, 1234.5});
  CHECK(std::filesystem::file_size(home + "/" + full.dir + "/" + kFinalStatusFile) == kFinalStatusBytes);  // in place
  const auto written = read_final_status(home + "/" + full.dir);
  REQUIRE(written);
  CHECK(written->status == "failed");
  REQUIRE(written->error);
  CHECK_THAT(*written->error, StartsWith("disk full: xxx"));
  CHECK(written->error->size() < kFinalStatusBytes);
  // Writing needs the reserved file: nothing is created where none was reserved.
  CHECK_THROWS_AS(write_final_status(home + "/nowhere", {"failed", std::nullopt, 1}), IndexError);

  CHECK(reap_stale_runs(db, now_seconds(), home) == 2);
  const RunRecord recorded = load_run(db, full.run);
  CHECK(recorded.status == "failed");
  REQUIRE(recorded.ended_at);
  CHECK(*recorded.ended_at == 1234.5);
  REQUIRE(recorded.error);
  CHECK_THAT(*recorded.error, StartsWith("disk full: xxx"));
  CHECK(load_run(db, blank.run).status == "interrupted");  // a blank file: the process died without a word
}

INDEX_TEST_CASE("finish_run, merge_summary and record_heartbeat update the run", "[index]") {
  TempHome tmp;
  Database db = open_index_for_writing(runner::testing::index_at(tmp.path));
  const RunRecord run = create_run(db, new_run(), tmp.path);
  merge_summary(db, run.run, {{"fid", 12.5}, {"note", "a"}});
  merge_summary(db, run.run, {{"note", "b"}, {"best_step", 400}});
  record_heartbeat(db, run.run, 300, run.started_at + 10);
  record_heartbeat(db, run.run, 200, run.started_at + 20);  // the step never goes back
  RunRecord loaded = load_run(db, run.run);
  CHECK(loaded.summary == nlohmann::json({{"fid", 12.5}, {"note", "b"}, {"best_step", 400}}));
  CHECK(loaded.step == 300);
  CHECK(loaded.heartbeat_at == Approx(run.started_at + 20));
  CHECK(duration_seconds(loaded, run.started_at + 20) == Approx(20).margin(1e-6));

  finish_run(db, run.run, "failed", std::string("out of memory"));
  loaded = load_run(db, run.run);
  CHECK(loaded.status == "failed");
  CHECK(loaded.error == std::optional<std::string>("out of memory"));
  REQUIRE(loaded.ended_at.has_value());
  CHECK(*loaded.ended_at >= loaded.started_at);
}

INDEX_TEST_CASE("runs keep tags once each, lose the ones removed, and a note", "[index]") {
  TempHome tmp;
  Database db = open_index_for_writing(runner::testing::index_at(tmp.path));
  const RunRecord run = create_run(db, new_run(), tmp.path);
  const RunRecord other = create_run(db, new_run(), tmp.path);
  CHECK(load_run(db, run.run).tags.empty());
  add_run_tags(db, run.run, {"baseline", "cifar-10"});
  add_run_tags(db, run.run, {"baseline", "v1.2"});
  add_run_tags(db, other.run, {"other"});
  CHECK(load_run(db, run.run).tags == std::vector<std::string>{"baseline", "cifar-10", "v1.2"});
  CHECK(resolve_run(db, run.id).tags == std::vector<std::string>{"baseline", "cifar-10", "v1.2"});
  const std::vector<RunRecord> listed = list_runs(db, {});
  REQUIRE(listed.size() == 2);
  CHECK(listed[0].tags == std::vector<std::string>{"other"});
  CHECK(listed[1].tags == std::vector<std::string>{"baseline", "cifar-10", "v1.2"});

  CHECK(index_error([&] {
          add_run_tags(db, run.run, {"fine", "not fine"});
        }) == "tag name 'not fine' is not allowed: use letters, digits, '_', '-' and '.'");
  CHECK(index_error([&] {
          remove_run_tags(db, run.run, {"v1.2", "cifar"});
        }) == "run " + run.name + " has no tag 'cifar' (its tags: baseline, cifar-10, v1.2)");
  CHECK(load_run(db, run.run).tags == std::vector<std::string>{"baseline", "cifar-10", "v1.2"});  // nothing changed
  remove_run_tags(db, run.run, {"v1.2", "baseline"});
  CHECK(load_run(db, run.run).tags == std::vector<std::string>{"cifar-10"});

  CHECK_FALSE(load_run(db, run.run).note.has_value());
  set_run_note(db, run.run, std::string("lr too high; diverged at 3k"));
  CHECK(load_run(db, run.run).note == std::optional<std::string>("lr too high; diverged at 3k"));
  set_run_note(db, run.run, std::string());
  CHECK_FALSE(load_run(db, run.run).note.has_value());

  Statement remove = db.prepare("DELETE FROM runs WHERE run = ?");
  remove.bind(1, run.run);
  remove.run();
  CHECK(scalar(db, "SELECT count(*) FROM run_tags") == 1);  // the other run's
}

namespace {

// Each table's columns with their types, "table.column type", in order: the schema as both backends describe it.
std::vector<std::string> table_columns(Database& db) {
  Statement statement = db.prepare(
      db.backend() == Backend::postgresql
          ? "SELECT table_name, column_name, data_type FROM information_schema.columns WHERE table_schema = "
            "current_schema() AND table_name != 'runner_schema' ORDER BY table_name, ordinal_position"
          : "SELECT m.name, p.name, p.type FROM sqlite_master m, pragma_table_info(m.name) p WHERE m.type = 'table' "
            "ORDER BY m.name, p.cid");
  std::vector<std::string> columns;
  while (statement.step()) columns.push_back(statement.text(0) + "." + statement.text(1) + " " + statement.text(2));
  return columns;
}

// The columns that schema versions 13 (interventions), 14 (histograms) and 15 (trials.out_of_space) add, as
// table_columns() writes them.
std::vector<std::string> columns_of_versions_13_to_15(bool postgresql) {
  const std::string integer = postgresql ? "bigint" : "INTEGER", real = postgresql ? "double precision" : "REAL",
                    text = postgresql ? "text" : "TEXT";
  return {"interventions.intervention " + integer,
          "interventions.run " + integer,
          "interventions.step " + integer,
          "interventions.time " + real,
          "interventions.chunk " + text,
          "interventions.changes " + text,
          "histograms.run " + integer,
          "histograms.key " + text,
          "histograms.step " + integer,
          "histograms.time " + real,
          "histograms.low " + real,
          "histograms.high " + real,
          "histograms.counts " + text,
          "histograms.nonfinite " + integer,
          "trials.out_of_space " + integer};
}

// The migrations up to and including `version`.
std::span<const Migration> migrations_to(int version) {
  const auto migrations = schema_migrations();
  for (std::size_t i = 0; i < migrations.size(); ++i)
    if (migrations[i].version == version) return migrations.first(i + 1);
  FAIL("no migration to version " << version);
  return {};
}

}  // namespace

INDEX_TEST_CASE(
    "an index of schema 9 gains the tags table, the note column, the trials' generation and claim, the runs' "
    "start key, the interventions and histograms tables and the trials' out_of_space, and nothing else changes",
    "[index]") {
  TempHome tmp;
  const std::string url = runner::core::launch_context().index_url;
  std::vector<std::string> before;
  {
    Database db =
        url.empty() ? Database(index_path(tmp.path), OpenMode::read_write_create) : Database::postgresql(url, false);
    CHECK(migrate(db, migrations_to(9)) == 9);
    db.execute(
        "INSERT INTO runs (id, name, status, config, host, pid, dir, started_at, heartbeat_at, step) VALUES "
        "('abcd1234', 'old-1', 'finished', '{\"lr\":0.1}', 'host', 1, 'old-1', 100, 150, 30)");
    before = table_columns(db);
  }
  Database db = open_index_for_writing(runner::testing::index_at(tmp.path));
  CHECK(scalar(db, url.empty() ? "PRAGMA user_version" : "SELECT max(version) FROM runner_schema") == schema_version());
  std::vector<std::string> after = table_columns(db);
  const std::vector<std::string> added =
      url.empty() ? std::vector<std::string>{"runs.note TEXT",    "run_tags.run INTEGER",
                                             "run_tags.tag TEXT", "trials.generation INTEGER",
                                             "trials.claim TEXT", "runs.start_key TEXT"}
                  : std::vector<std::string>{"runs.note text",           "run_tags.run bigint", "run_tags.tag text",
                                             "trials.generation bigint", "trials.claim text",   "runs.start_key text"};
  std::vector<std::string> expected = before;
  for (const std::string& column : added) expected.push_back(column);
  for (const std::string& column : columns_of_versions_13_to_15(!url.empty())) expected.push_back(column);
  std::sort(expected.begin(), expected.end());
  std::sort(after.begin(), after.end());
  CHECK(after == expected);
  const RunRecord old = resolve_run(db, "old-1");
  CHECK(old.tags.empty());
  CHECK_FALSE(old.note.has_value());
  CHECK(old.config == nlohmann::json({{"lr", 0.1}}));
  CHECK(old.step == 30);
  add_run_tags(db, old.run, {"archived"});
  CHECK(load_run(db, old.run).tags == std::vector<std::string>{"archived"});
}

INDEX_TEST_CASE("each start and resume is an attempt that keeps what it ran with and how it ended", "[index]") {
  TempHome tmp;
  Database db = open_index_for_writing(runner::testing::index_at(tmp.path));
  const RunRecord run = create_run(db, new_run(), tmp.path);
  set_attempt_start(db, run.run, 0);
  finish_run(db, run.run, "failed", std::string("boom"));
  NewRun bigger = new_run();
  bigger.config["batch"] = 128;
  bigger.world_size = 2;
  bigger.hosts = {"a", "b"};
  reopen_run(db, run.run, bigger);
  set_attempt_start(db, run.run, 40);
  // A process killed mid-attempt: the next start ends it as interrupted at its last heartbeat.
  db.execute("UPDATE runs SET pid = " + std::to_string(dead_pid()) + " WHERE run = " + std::to_string(run.run));
  CHECK(reap_stale_runs(db, now_seconds(), tmp.path) == 1);

  std::vector<AttemptRecord> attempts = run_attempts(db, run.run);
  REQUIRE(attempts.size() == 2);
  CHECK(attempts[0].status == "failed");
  CHECK(attempts[0].error == std::optional<std::string>("boom"));
  CHECK(attempts[0].config["batch"] == 64);
  CHECK(attempts[0].world_size == 1);
  CHECK(attempts[0].start_step == std::optional<int64_t>(0));
  CHECK(attempts[1].status == "interrupted");
  CHECK(attempts[1].config["batch"] == 128);
  CHECK(attempts[1].hosts == std::vector<std::string>{"a", "b"});
  CHECK(attempts[1].start_step == std::optional<int64_t>(40));
  REQUIRE(attempts[0].ended_at.has_value());
  REQUIRE(attempts[1].started_at.has_value());
  CHECK(*attempts[0].ended_at <= *attempts[1].started_at);
  CHECK(load_run(db, run.run).config["batch"] == 128);  // the run's row: its latest attempt

  // A third attempt taken back leaves the run as the second one ended it.
  reopen_run(db, run.run, new_run());
  const RunRecord restored = drop_latest_attempt(db, run.run, 3);
  CHECK(restored.status == "interrupted");
  CHECK(restored.attempts == 2);
  CHECK(restored.config["batch"] == 128);
  CHECK(restored.world_size == 2);
  CHECK(restored.ended_at == attempts[1].ended_at);
  CHECK(run_attempts(db, run.run).size() == 2);
  CHECK(drop_latest_attempt(db, run.run, 3).attempts == 2);  // taken back already: nothing changes
  const RunRecord single = create_run(db, new_run(), tmp.path);
  CHECK_THAT(index_error([&] { drop_latest_attempt(db, single.run, 1); }), Contains("has no attempt before attempt 1"));
}

namespace {

// The exit status of a child process that holds `fence` on the index at `home` and then writes through connections of
// its own (`write`): 0 when the writes went through.
int exit_status_holding(const std::string& home, const RunFence& fence, const std::function<void(Database&)>& write) {
  const pid_t child = ::fork();
  if (child == 0) {
    try {
      Database db = open_index_for_writing(runner::testing::index_at(home));
      const HeldAttempt held(db, fence);
      write(db);
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);
  }
  REQUIRE(child > 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  return WEXITSTATUS(status);
}

}  // namespace

INDEX_TEST_CASE("a run's writer holds its attempt: once the run is resumed elsewhere it stops without writing",
                "[index]") {
  TempHome tmp;
  Database db = open_index_for_writing(runner::testing::index_at(tmp.path));
  const RunRecord run = create_run(db, new_run(), tmp.path);
  const RunFence first{run.run, run.name, 1}, second{run.run, run.name, 2};
  auto summary_from = [&](const RunFence& fence) {
    return [&](Database& db) { merge_summary(db, run.run, {{"from_attempt", fence.attempt}}); };
  };
  const std::string run_dir = tmp.path + "/" + run.dir;
  fs::create_directories(run_dir);
  const std::vector<runner::ckpt::CheckpointFileContent> files = {{"model.safetensors", {{"w", at::ones({4})}}, {}}};
  auto checkpoint = [&](Database&) {
    runner::ckpt::CheckpointSaver saver(runner::testing::index_at(tmp.path), run.run, run_dir, {});
    saver.submit({10, files});
    saver.wait();
  };
  with_transaction(db, [&] { CHECK_FALSE(run_resumed_elsewhere(db, first).has_value()); });
  CHECK(exit_status_holding(tmp.path, first, summary_from(first)) == 0);
  CHECK(load_run(db, run.run).summary == nlohmann::json({{"from_attempt", 1}}));

  // Resumed by another process (this test's, from this host): attempt 2 is the run's writer now.
  finish_run(db, run.run, "interrupted", std::nullopt);
  reopen_run(db, run.run, new_run());
  with_transaction(db, [&] {
    CHECK(run_resumed_elsewhere(db, first) ==
          "run foo-1 was resumed by host " + host_name() +
              " (attempt 2, this process has attempt 1); this process stops without writing");
    CHECK_FALSE(run_resumed_elsewhere(db, second).has_value());
  });
  CHECK(exit_status_holding(tmp.path, first, summary_from(first)) == runner::core::kExitTakenOver);
  CHECK(load_run(db, run.run).summary == nlohmann::json({{"from_attempt", 1}}));
  // A checkpoint of attempt 1 leaves nothing in the run folder, not even its partial directory.
  CHECK(exit_status_holding(tmp.path, first, checkpoint) == runner::core::kExitTakenOver);
  CHECK_FALSE(exists(run_dir + "/checkpoints"));
  CHECK(count_for_run(db, "checkpoints", run.run) == 0);
  CHECK(exit_status_holding(tmp.path, second, summary_from(second)) == 0);
  CHECK(load_run(db, run.run).summary == nlohmann::json({{"from_attempt", 2}}));
  CHECK(exit_status_holding(tmp.path, second, checkpoint) == 0);
  CHECK(exists(run_dir + "/checkpoints/step-0000010/model.safetensors"));
  CHECK(count_for_run(db, "checkpoints", run.run) == 1);
  if (db.backend() == Backend::sqlite) {  // an attempt held on another index (another home's) fences nothing here
    TempHome elsewhere;
    Database other = open_index_for_writing(runner::testing::index_at(elsewhere.path));
    const HeldAttempt held(other, first);
    merge_summary(db, run.run, {{"unfenced", true}});
  }

  finish_run(db, run.run, "finished", std::nullopt);
  remove_run(db, tmp.path, load_run(db, run.run));
  with_transaction(db, [&] {
    CHECK(run_resumed_elsewhere(db, first) ==
          "run foo-1 is no longer in the index; this process stops without writing");
  });
}

// ---------------------------------------------------------------------------------------------------------
// The metric writer

INDEX_TEST_CASE("text that is not UTF-8: a note or a key typed is refused, an error from the world is escaped",
                "[index]") {
  TempHome tmp;
  Database db = open_index_for_writing(runner::testing::index_at(tmp.path));
  const RunRecord run = create_run(db, new_run(), tmp.path);
  CHECK_THROWS_WITH(set_run_note(db, run.run, std::string("caf\xe9 au lait")),
                    "the note is not valid UTF-8 (byte 0xe9 at offset 3 of \"caf\\xe9 au lait\")");
  CHECK_FALSE(load_run(db, run.run).note.has_value());
  set_run_note(db, run.run, std::string("caf\xc3\xa9"));  // valid UTF-8 goes in as it is
  CHECK(load_run(db, run.run).note == std::optional<std::string>("caf\xc3\xa9"));
  {
    MetricWriter writer(runner::testing::index_at(tmp.path), run.run);
    CHECK_THROWS_WITH(writer.log("loss\xff", 1, 0.5, now_seconds()),
                      "metric key is not valid UTF-8 (byte 0xff at offset 4 of \"loss\\xff\")");
    writer.log("loss", 1, 0.5, now_seconds());
    writer.close();
    CHECK(writer.rows_written() == 1);
  }
  // A damaged file's Latin-1 name in the error: the run is failed, with the error's bytes escaped.
  finish_run(db, run.run, "failed", std::string("photos/caf\xe9.jpg: not a JPEG"));
  const RunRecord failed = load_run(db, run.run);
  CHECK(failed.status == "failed");
  CHECK(failed.error == std::optional<std::string>("photos/caf\\xe9.jpg: not a JPEG"));
}

TEST_CASE("an index that already holds bytes that are not UTF-8 reads them as U+FFFD", "[index]") {
  TempHome tmp;
  Database db = open_index_for_writing(runner::testing::index_at(tmp.path));
  if (db.backend() != Backend::sqlite) return;  // PostgreSQL never holds such bytes
  const RunRecord run = create_run(db, new_run(), tmp.path);
  // As an older runner wrote them: SQLite stores any bytes in a TEXT column.
  db.prepare("UPDATE runs SET note = CAST(x'ff6f6b' AS TEXT), error = CAST(x'6572c0' AS TEXT) WHERE run = " +
             std::to_string(run.run))
      .run();
  const RunRecord read = load_run(db, run.run);
  CHECK(read.note == std::optional<std::string>("\xEF\xBF\xBDok"));
  CHECK(read.error == std::optional<std::string>("er\xEF\xBF\xBD"));
  CHECK(nlohmann::json{{"note", *read.note}}.dump() ==
        "{\"note\":\"\xEF\xBF\xBDok\"}");  // valid: dump() throws otherwise
}

TEST_CASE("a system reading that fails is left out of its sample and the other readings go on", "[index]") {
  TempHome tmp;
  Database db = open_index_for_writing(runner::testing::index_at(tmp.path));
  const RunRecord run = create_run(db, new_run(), tmp.path);
  MetricWriter writer(runner::testing::index_at(tmp.path), run.run);
  std::atomic<int> meminfo_reads{0};
  std::atomic<std::int64_t> step{0};
  runner::run::SystemMetricsOptions options;
  options.interval_seconds = 0.02;
  // /proc/meminfo is damaged for its first 3 readings, and /proc/self/status for every one.
  options.read_proc_file = [&](const std::string& path) -> std::string {
    if (path == "/proc/meminfo" && ++meminfo_reads <= 3) return "MemTotal: lots\n";
    if (path == "/proc/self/status") throw std::runtime_error(path + ": cannot read it: gone");
    return runner::system::read_proc_file(path);
  };
  {
    runner::run::SystemMetrics metrics(
        writer, [&] { return ++step; }, options);
    while (meminfo_reads < 8) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    metrics.stop();
  }
  writer.flush();
  const auto count = [&](const std::string& key) {
    return scalar(db, "SELECT count(*) FROM metrics WHERE key = '" + key + "' AND run = " + std::to_string(run.run));
  };
  const int64_t samples = count("sys/steps_per_second");
  CHECK(samples >= 7);
  CHECK(count("sys/cpu_percent") == samples);
  CHECK(count("sys/host_cpu_percent") <= samples);
  CHECK(count("sys/host_memory_available_mib") == samples - 3);
  CHECK(count("sys/host_memory_used_mib") == samples - 3);
  CHECK(count("sys/rss_mib") == 0);
  CHECK(count("sys/peak_rss_mib") == 0);
  writer.close();
}

INDEX_TEST_CASE("the metric writer stores every logged value", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  Database db = open_index_for_writing(runner::testing::index_at(home));
  const RunRecord run = create_run(db, new_run(), home);

  MetricWriter writer(runner::testing::index_at(home), run.run);
  const char* keys[] = {"loss", "lr", "grad_norm"};
  const double time = now_seconds();
  for (int i = 0; i < 10000; ++i) writer.log(keys[i % 3], i, i * 0.5, time);
  writer.flush();
  CHECK(writer.rows_written() == 10000);
  CHECK(count_for_run(db, "metrics", run.run) == 10000);
  CHECK(scalar(db, "SELECT count(*) FROM metrics WHERE key = 'loss'") == 3334);
  CHECK(scalar(db, "SELECT count(*) FROM metrics WHERE key = 'lr'") == 3333);
  CHECK(scalar(db, "SELECT count(*) FROM metrics WHERE key = 'grad_norm'") == 3333);
  CHECK(scalar_real(db, "SELECT value FROM metrics WHERE key = 'lr' AND step = 9997") == 9997 * 0.5);

  const auto series = metric_series(db, run.run, "grad_norm");
  REQUIRE(series.size() == 3333);
  CHECK(series.front().step == 2);
  CHECK(series.back().step == 9998);
  CHECK(series.back().value == 4999.0);
  CHECK(series.back().time == time);

  const auto latest = latest_metrics(db, run.run);
  REQUIRE(latest.size() == 3);
  CHECK(latest[0].key == "grad_norm");
  CHECK(latest[0].point.step == 9998);
  CHECK(latest[1].key == "loss");
  CHECK(latest[1].point.step == 9999);
  CHECK(latest[1].point.value == 4999.5);
  CHECK(latest[2].key == "lr");
  CHECK(latest[2].point.step == 9997);
  CHECK(latest_metric(db, run.run, "loss") == std::optional<double>(4999.5));
  CHECK_FALSE(latest_metric(db, run.run, "missing").has_value());
  writer.close();
  CHECK(writer.rows_written() == 10000);
}

INDEX_TEST_CASE("the metric writer keeps the later value of a step, NaN as NULL and the highest step as latest",
                "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  Database db = open_index_for_writing(runner::testing::index_at(home));
  const RunRecord run = create_run(db, new_run(), home);
  MetricWriter writer(runner::testing::index_at(home), run.run);
  const double time = now_seconds();

  SECTION("the same step twice in one batch and across batches") {
    writer.log("loss", 5, 1.0, time);
    writer.log("loss", 5, 2.0, time + 1);
    writer.flush();
    auto series = metric_series(db, run.run, "loss");
    REQUIRE(series.size() == 1);
    CHECK(series[0].value == 2.0);
    CHECK(series[0].time == time + 1);
    CHECK(latest_metric(db, run.run, "loss") == std::optional<double>(2.0));

    writer.log("loss", 5, 3.0, time + 2);
    writer.flush();
    series = metric_series(db, run.run, "loss");
    REQUIRE(series.size() == 1);
    CHECK(series[0].value == 3.0);
    CHECK(latest_metric(db, run.run, "loss") == std::optional<double>(3.0));
  }

  SECTION("NaN is stored as NULL and read back as NaN; infinities are kept") {
    writer.log("loss", 1, std::numeric_limits<double>::quiet_NaN(), time);
    writer.log("loss", 2, std::numeric_limits<double>::infinity(), time);
    writer.log("loss", 3, -std::numeric_limits<double>::infinity(), time);
    writer.log("loss", 4, 0.25, time);
    writer.log("bad", 9, std::numeric_limits<double>::quiet_NaN(), time);
    writer.flush();
    CHECK(scalar(db, "SELECT value IS NULL FROM metrics WHERE key = 'loss' AND step = 1") == 1);
    CHECK(scalar(db, "SELECT count(*) FROM metrics WHERE value IS NULL") == 2);
    CHECK(scalar(db, "SELECT value IS NULL FROM metric_latest WHERE key = 'bad'") == 1);
    const auto series = metric_series(db, run.run, "loss");
    REQUIRE(series.size() == 4);
    CHECK(std::isnan(series[0].value));
    CHECK(series[1].value == std::numeric_limits<double>::infinity());
    CHECK(series[2].value == -std::numeric_limits<double>::infinity());
    CHECK(series[3].value == 0.25);
    const auto bad = latest_metric(db, run.run, "bad");
    REQUIRE(bad.has_value());
    CHECK(std::isnan(*bad));
  }

  SECTION("a lower step logged later does not replace the latest value") {
    writer.log("loss", 10, 1.0, time);
    writer.flush();
    writer.log("loss", 5, 2.0, time + 1);
    writer.flush();
    CHECK(latest_metric(db, run.run, "loss") == std::optional<double>(1.0));
    // Within one batch as well.
    writer.log("acc", 20, 0.9, time);
    writer.log("acc", 7, 0.1, time + 1);
    writer.flush();
    const auto latest = latest_metrics(db, run.run);
    REQUIRE(latest.size() == 2);
    CHECK(latest[0].key == "acc");
    CHECK(latest[0].point.step == 20);
    CHECK(latest[0].point.value == 0.9);
    CHECK(latest[1].key == "loss");
    CHECK(latest[1].point.step == 10);
    CHECK(latest[1].point.value == 1.0);
    CHECK(metric_series(db, run.run, "loss").size() == 2);
    CHECK(metric_series(db, run.run, "acc").size() == 2);
  }

  SECTION("one-element tensors are stored with their value") {
    writer.log("zero_dim", 1, at::scalar_tensor(2.5, at::kFloat), time);
    writer.log("one_element", 1, at::tensor({0.125}, at::kDouble), time);
    writer.log("integer", 1, at::scalar_tensor(7, at::kLong), time);
    writer.log("grad", 1, at::scalar_tensor(1.5).requires_grad_(), time);
    writer.log("half", 1, at::scalar_tensor(0.5, at::kHalf), time);
    REQUIRE_THROWS_WITH(writer.log("vector", 1, at::ones({2}), time),
                        "metric 'vector' must be a number or a one-element tensor, got 2 elements");
    writer.flush();
    CHECK(latest_metric(db, run.run, "zero_dim") == std::optional<double>(2.5));
    CHECK(latest_metric(db, run.run, "one_element") == std::optional<double>(0.125));
    CHECK(latest_metric(db, run.run, "integer") == std::optional<double>(7.0));
    CHECK(latest_metric(db, run.run, "grad") == std::optional<double>(1.5));
    CHECK(latest_metric(db, run.run, "half") == std::optional<double>(0.5));
    CHECK_FALSE(latest_metric(db, run.run, "vector").has_value());
    CHECK(count_for_run(db, "metrics", run.run) == 5);
  }

  SECTION("a tensor changed in place after log() keeps the value it had when logged") {
    // The usual accumulator pattern of a training loop: log the running total, then reset it.
    at::Tensor total = at::scalar_tensor(4.0, at::kDouble);
    writer.log("loss_sum", 1, total, time);
    total.zero_();
    total.add_(9.0);
    writer.log("loss_sum", 2, total, time);
    total.zero_();
    writer.flush();
    const auto series = metric_series(db, run.run, "loss_sum");
    REQUIRE(series.size() == 2);
    CHECK(series[0].value == 4.0);
    CHECK(series[1].value == 9.0);
  }

  SECTION("logging after close is an error; close is idempotent") {
    writer.log("loss", 1, 1.0, time);
    writer.close();
    writer.close();
    CHECK(count_for_run(db, "metrics", run.run) == 1);
    CHECK_THAT(index_error([&] { writer.log("loss", 2, 1.0, time); }),
               Catch::Equals("metrics cannot be logged after the run has finished"));
    CHECK_THAT(index_error([&] { writer.log("loss", 2, at::scalar_tensor(1.0), time); }),
               Catch::Equals("metrics cannot be logged after the run has finished"));
    writer.flush();  // nothing queued: returns
    CHECK(count_for_run(db, "metrics", run.run) == 1);
  }
}

INDEX_TEST_CASE("the metric writer keeps the run's heartbeat and step fresh", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  Database db = open_index_for_writing(runner::testing::index_at(home));
  const RunRecord run = create_run(db, new_run(), home);
  const std::string where = " FROM runs WHERE run = " + std::to_string(run.run);

  MetricWriterOptions options;
  options.flush_interval_seconds = 0.05;
  options.heartbeat_seconds = 0.05;
  MetricWriter writer(runner::testing::index_at(home), run.run, options);
  writer.set_step(42);
  CHECK(eventually([&] { return scalar(db, "SELECT step" + where) == 42; }));
  const double first = scalar_real(db, "SELECT heartbeat_at" + where);
  CHECK(first > run.heartbeat_at);
  // Heartbeats continue with nothing logged.
  CHECK(eventually([&] { return scalar_real(db, "SELECT heartbeat_at" + where) > first; }));
  writer.set_step(100);
  CHECK(eventually([&] { return scalar(db, "SELECT step" + where) == 100; }));
  writer.close();
  CHECK(load_run(db, run.run).step == 100);
}

TEST_CASE("the metric writer flushes on its timer without flush()", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  int64_t run = 0;
  {
    Database db = open_index_for_writing(runner::testing::index_at(home));
    run = create_run(db, new_run(), home).run;
  }
  MetricWriterOptions options;
  options.flush_interval_seconds = 0.05;
  MetricWriter writer(runner::testing::index_at(home), run, options);
  for (int i = 0; i < 25; ++i) writer.log("loss", i, 1.0 / (i + 1), now_seconds());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  Database reader = open_index_for_reading(runner::testing::index_at(home));
  // 0.5 s is ten flush intervals; allow a loaded machine a little more before failing.
  CHECK(eventually([&] { return count_for_run(reader, "metrics", run) == 25; }, 2.0));
  CHECK(writer.rows_written() == 25);
}

TEST_CASE("the metric writer waits when too much is queued and loses nothing", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  Database db = open_index_for_writing(runner::testing::index_at(home));
  const RunRecord run = create_run(db, new_run(), home);
  MetricWriterOptions options;
  options.flush_rows = 64;
  options.max_queued_rows = 100;
  options.flush_interval_seconds = 3600;  // the writer wakes only for a full batch, flush() or close()
  options.heartbeat_seconds = 3600;
  MetricWriter writer(runner::testing::index_at(home), run.run, options);
  writer.log("warmup", 0, 0.0, now_seconds());
  writer.flush();

  // Another connection holds the write lock: the writer takes one batch and stalls on it, the queue fills
  // behind it, and the producer must wait.
  std::optional<Transaction> lock(std::in_place, db);
  constexpr int kRows = 1000;
  std::atomic<int> logged{0};
  std::atomic<bool> done{false};
  std::string failure;
  std::thread producer([&] {
    try {
      for (int i = 0; i < kRows; ++i) {
        writer.log("loss", i, i, now_seconds());
        ++logged;
      }
    } catch (const std::exception& error) {
      failure = error.what();
    }
    done = true;
  });
  CHECK(eventually([&] { return logged >= static_cast<int>(options.max_queued_rows); }));
  // A producer that does not wait gets through all its rows in far less than this.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK_FALSE(done);
  CHECK(logged <= static_cast<int>(2 * options.max_queued_rows));  // the stalled batch and a full queue
  CHECK(writer.rows_written() == 1);

  lock->commit();
  lock.reset();
  CHECK(eventually([&] { return done.load(); }, 60.0));
  producer.join();
  CHECK(failure == "");
  CHECK(logged == kRows);
  writer.close();
  CHECK(writer.rows_written() == kRows + 1);
  const std::string rows = "SELECT count(*) FROM metrics WHERE run = " + std::to_string(run.run);
  CHECK(scalar(db, rows) == kRows + 1);
  CHECK(scalar(db, rows + " AND key = 'loss' AND value = step AND step BETWEEN 0 AND " + std::to_string(kRows - 1)) ==
        kRows);
}

TEST_CASE("a metric writer whose run is gone reports the failure on flush", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  Database db = open_index_for_writing(runner::testing::index_at(home));
  const RunRecord run = create_run(db, new_run(), home);
  MetricWriter writer(runner::testing::index_at(home), run.run);
  writer.log("loss", 1, 1.0, now_seconds());
  writer.flush();
  db.execute("DELETE FROM runs");  // e.g. `runner rm` of a live run
  writer.log("loss", 2, 1.0, now_seconds());
  CHECK_THAT(index_error([&] { writer.flush(); }), Contains("FOREIGN KEY"));
  CHECK_THROWS_AS(writer.close(), IndexError);
  CHECK(scalar(db, "SELECT count(*) FROM metrics") == 0);
}

INDEX_TEST_CASE("two metric writers on one index from two threads write everything", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  Database db = open_index_for_writing(runner::testing::index_at(home));
  const RunRecord first = create_run(db, new_run(), home);
  const RunRecord second = create_run(db, new_run(), home);

  constexpr int kRows = 20000;
  std::exception_ptr failures[2];
  uint64_t written[2] = {0, 0};
  auto work = [&](int index, int64_t run) {
    try {
      MetricWriterOptions options;
      options.flush_rows = 200;
      options.flush_interval_seconds = 0.01;
      MetricWriter writer(runner::testing::index_at(home), run, options);
      for (int i = 0; i < kRows; ++i) {
        writer.log(i % 2 ? "loss" : "lr", i, static_cast<double>(i) * (index + 1), now_seconds());
        writer.set_step(i);
      }
      writer.close();
      written[index] = writer.rows_written();
    } catch (...) {
      failures[index] = std::current_exception();
    }
  };
  std::thread a(work, 0, first.run);
  std::thread b(work, 1, second.run);
  a.join();
  b.join();
  for (const auto& failure : failures) {
    if (!failure) continue;
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& error) {
      FAIL("a writer failed: " << error.what());
    }
  }
  CHECK(written[0] == kRows);
  CHECK(written[1] == kRows);
  CHECK(count_for_run(db, "metrics", first.run) == kRows);
  CHECK(count_for_run(db, "metrics", second.run) == kRows);
  CHECK(scalar_real(db, "SELECT value FROM metrics WHERE run = " + std::to_string(second.run) +
                            " AND key = 'loss' AND step = 19999") == 2.0 * 19999);
  CHECK(load_run(db, first.run).step == kRows - 1);
  CHECK(load_run(db, second.run).step == kRows - 1);
  CHECK(latest_metric(db, first.run, "loss") == std::optional<double>(19999.0));
}

// ---------------------------------------------------------------------------------------------------------
// Read-only queries

// A RUNNER_INDEX_* setting of the launch context, set while this lives (the index reads them at each connection).
class ScopedSecondsSetting {
 public:
  ScopedSecondsSetting(const char* name, const char* value) : saved_(runner::core::launch_context()) {
    runner::core::LaunchContext context = saved_;
    context.seconds_settings[name] = value;
    runner::core::set_launch_context(context);
  }
  ~ScopedSecondsSetting() { runner::core::set_launch_context(saved_); }
  ScopedSecondsSetting(const ScopedSecondsSetting&) = delete;
  ScopedSecondsSetting& operator=(const ScopedSecondsSetting&) = delete;

 private:
  runner::core::LaunchContext saved_;
};

// A variable of the process's environment, set while this lives (libpq reads PGOPTIONS at each connection).
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnvironment() { saved_ ? ::setenv(name_, saved_->c_str(), 1) : ::unsetenv(name_); }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

TEST_CASE("a writer silent inside its transaction loses it after RUNNER_INDEX_IDLE_TIMEOUT and the others go on",
          "[index][postgresql]") {
  const runner::testing::PostgresIndex server;
  if (!server.available()) {
    WARN("SKIP: " << server.reason());
    return;
  }
  const ScopedSecondsSetting idle("RUNNER_INDEX_IDLE_TIMEOUT", "1");
  TempHome tmp;
  Database silent = open_index_for_writing(runner::testing::index_at(tmp.path));
  Database other = open_index_for_writing(runner::testing::index_at(tmp.path));
  // The silent writer takes the index lock with its transaction, then sends nothing (a process stopped, a network
  // gone): the other writer's transaction waits for the lock until the server ends the silent session.
  std::optional<Transaction> held(std::in_place, silent);
  std::future<RunRecord> created =
      std::async(std::launch::async, [&] { return create_run(other, new_run("experiments/other.lua"), tmp.path); });
  const bool went_on = created.wait_for(std::chrono::seconds(120)) == std::future_status::ready;
  if (!went_on) held.reset();  // ends the wait, so that the test can fail
  REQUIRE(went_on);
  CHECK(created.get().name == "other-1");
  // The silent writer finds its transaction ended by the server: nothing of it was committed, and its next
  // transaction runs on a new connection.
  CHECK_THROWS_AS(held->commit(), IndexConnectionLost);
  held.reset();
  CHECK(create_run(silent, new_run("experiments/silent.lua"), tmp.path).name == "silent-1");
  CHECK(scalar(other, "SELECT count(*) FROM runs") == 2);
}

TEST_CASE("a session's timeouts are runner's, RUNNER_INDEX_* over them, PGOPTIONS over those and the URL's over all",
          "[index][postgresql]") {
  const runner::testing::PostgresIndex server;
  if (!server.available()) {
    WARN("SKIP: " << server.reason());
    return;
  }
  const auto setting = [](const std::string& url, const char* name) {
    Database db = Database::postgresql(url, true);
    return scalar_text(db, std::string("SHOW ") + name);
  };
  const std::string url = runner::core::launch_context().index_url;
  CHECK(setting(url, "statement_timeout") == "10min");
  CHECK(setting(url, "idle_in_transaction_session_timeout") == "1min");
  {
    const ScopedSecondsSetting statement("RUNNER_INDEX_STATEMENT_TIMEOUT", "5");
    const ScopedSecondsSetting idle("RUNNER_INDEX_IDLE_TIMEOUT", "2.5");
    CHECK(setting(url, "statement_timeout") == "5s");
    CHECK(setting(url, "idle_in_transaction_session_timeout") == "2500ms");
    const ScopedEnvironment pgoptions("PGOPTIONS", "-c statement_timeout=7s");
    CHECK(setting(url, "statement_timeout") == "7s");
    CHECK(setting(url + "?options=-c%20statement_timeout%3D9s", "statement_timeout") == "9s");
    CHECK(setting(url + "?options=-c%20statement_timeout%3D9s", "idle_in_transaction_session_timeout") == "2500ms");
  }
  const ScopedSecondsSetting connect("RUNNER_INDEX_CONNECT_TIMEOUT", "0");
  CHECK(index_error([&] { setting(url, "statement_timeout"); }) ==
        "RUNNER_INDEX_CONNECT_TIMEOUT='0' is not a number of seconds > 0");
}

TEST_CASE("a writer that waits for the index lock past RUNNER_INDEX_STATEMENT_TIMEOUT fails naming it",
          "[index][postgresql]") {
  const runner::testing::PostgresIndex server;
  if (!server.available()) {
    WARN("SKIP: " << server.reason());
    return;
  }
  const ScopedSecondsSetting statement_timeout("RUNNER_INDEX_STATEMENT_TIMEOUT", "1");
  TempHome tmp;
  Database holder = open_index_for_writing(runner::testing::index_at(tmp.path));
  Database waiter = open_index_for_writing(runner::testing::index_at(tmp.path));
  std::optional<Transaction> held(std::in_place, holder);
  std::future<std::string> failure = std::async(std::launch::async, [&]() -> std::string {
    try {
      create_run(waiter, new_run("experiments/waiter.lua"), tmp.path);
    } catch (const IndexError& error) {
      return error.what();
    }
    return "no IndexError";
  });
  const bool gave_up = failure.wait_for(std::chrono::seconds(120)) == std::future_status::ready;
  if (!gave_up) held.reset();  // ends the wait, so that the test can fail
  REQUIRE(gave_up);
  CHECK(failure.get() ==
        runner::core::launch_context().index_url +
            ": canceling statement due to statement timeout (RUNNER_INDEX_STATEMENT_TIMEOUT, or statement_timeout in "
            "the URL's options; a wait for another writer's transaction counts)");
  // The failed BEGIN was rolled back: the waiter's next transaction runs once the lock is free.
  held.reset();
  CHECK(create_run(waiter, new_run("experiments/waiter.lua"), tmp.path).name == "waiter-1");
}

TEST_CASE("a transaction held between its round trips holds up no writer of another run", "[index][postgresql]") {
  const runner::testing::PostgresIndex server;
  if (!server.available()) {
    WARN("SKIP: " << server.reason());
    return;
  }
  const ScopedSecondsSetting statement_timeout("RUNNER_INDEX_STATEMENT_TIMEOUT", "5");
  TempHome tmp;
  Database db = open_index_for_writing(runner::testing::index_at(tmp.path));
  const RunRecord first = create_run(db, new_run(), tmp.path);
  const RunRecord second = create_run(db, new_run(), tmp.path);
  // A summary of the first run whose client stalls inside its transaction (a slow client, a paused host): held at the
  // start of its body until the other run's writes are done.
  Database stalled = open_index_for_writing(runner::testing::index_at(tmp.path));
  std::promise<void> inside, go_on;
  std::shared_future<void> released = go_on.get_future().share();
  stalled.set_write_check([&](Database&) {
    inside.set_value();
    released.wait();
  });
  std::future<void> held = std::async(std::launch::async, [&] {
    merge_summary(stalled, first.run, nlohmann::json{{"held", 1}});
  });
  inside.get_future().wait();
  std::string failure;
  try {  // a wait for the stalled transaction's lock ends with the statement timeout (5 s)
    merge_summary(db, second.run, nlohmann::json{{"score", 2}});
    CheckpointRecord checkpoint;
    checkpoint.run = second.run;
    checkpoint.step = 10;
    checkpoint.path = "checkpoints/step-0000010";
    checkpoint.hash = "abc";
    add_checkpoint(db, checkpoint);
    finish_run(db, second.run, "finished", std::nullopt);
  } catch (const IndexError& error) {
    failure = error.what();
  }
  go_on.set_value();
  held.get();
  CHECK(failure == "");
  CHECK(load_run(db, second.run).status == "finished");
  CHECK(load_run(db, second.run).summary == nlohmann::json{{"score", 2}});
  CHECK(checkpoints(db, second.run).size() == 1);
  CHECK(load_run(db, first.run).summary == nlohmann::json{{"held", 1}});
}

TEST_CASE("a server that stops answering mid-session is given up after the statement timeout and 10 s more",
          "[index][postgresql]") {
  const runner::testing::PostgresIndex server;
  if (!server.available()) {
    WARN("SKIP: " << server.reason());
    return;
  }
  const ScopedSecondsSetting statement_timeout("RUNNER_INDEX_STATEMENT_TIMEOUT", "1");
  TempHome tmp;
  Database db = open_index_for_writing(runner::testing::index_at(tmp.path));
  // The server process of this session stops (a hung server: its host still answers TCP, keepalives included).
  const auto backend = static_cast<pid_t>(scalar(db, "SELECT pg_backend_pid()"));
  REQUIRE(::kill(backend, SIGSTOP) == 0);
  struct Resume {
    pid_t pid;
    ~Resume() { ::kill(pid, SIGCONT); }
  } resume{backend};
  std::future<std::string> failure = std::async(std::launch::async, [&]() -> std::string {
    try {
      Statement(db, "SELECT count(*) FROM runs").step();
    } catch (const IndexConnectionLost& error) {
      return error.what();
    }
    return "no IndexConnectionLost";
  });
  const bool gave_up = failure.wait_for(std::chrono::seconds(120)) == std::future_status::ready;
  if (!gave_up) ::kill(backend, SIGCONT);  // ends the wait, so that the test can fail
  REQUIRE(gave_up);
  CHECK_THAT(failure.get(),
             Contains(": the connection to the index was lost: the index server at 127.0.0.1:") &&
                 Contains(" did not answer in 11s (RUNNER_INDEX_STATEMENT_TIMEOUT, or statement_timeout in the URL's "
                          "options, and 10 s more)"));
  // The next statement connects again.
  ::kill(backend, SIGCONT);
  CHECK(scalar(db, "SELECT count(*) FROM runs") == 0);
}

TEST_CASE("run_read_query returns columns and typed rows and refuses writes", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  int64_t run = 0;
  std::string id;
  {
    Database db = open_index_for_writing(runner::testing::index_at(home));
    const RunRecord record = create_run(db, new_run("q.lua", "query-me"), home);
    run = record.run;
    id = record.id;
    create_run(db, new_run("q.lua", "other"), home);
  }

  for (bool writable : {false, true}) {
    INFO("writable connection: " << writable);
    Database db = writable ? open_index_for_writing(runner::testing::index_at(home))
                           : open_index_for_reading(runner::testing::index_at(home));

    QueryResult result = run_read_query(db, "SELECT 1 AS i, 2.5 AS r, 'text' AS t, NULL AS n, x'4142' AS b");
    REQUIRE(result.columns == std::vector<std::string>{"i", "r", "t", "n", "b"});
    REQUIRE(result.rows.size() == 1);
    const auto& row = result.rows[0];
    CHECK(std::get<int64_t>(row[0]) == 1);
    CHECK(std::get<double>(row[1]) == 2.5);
    CHECK(std::get<std::string>(row[2]) == "text");
    CHECK(std::holds_alternative<std::monostate>(row[3]));
    CHECK(std::get<std::string>(row[4]) == "AB");

    result = run_read_query(db, "SELECT name, status FROM runs ORDER BY name");
    CHECK(result.columns == std::vector<std::string>{"name", "status"});
    REQUIRE(result.rows.size() == 2);
    CHECK(std::get<std::string>(result.rows[0][0]) == "other");
    CHECK(std::get<std::string>(result.rows[1][1]) == "running");

    result = run_read_query(db, "SELECT run, name FROM runs WHERE id = ?1 AND run = ?2", {id, run});
    REQUIRE(result.rows.size() == 1);
    CHECK(std::get<int64_t>(result.rows[0][0]) == run);
    CHECK(std::get<std::string>(result.rows[0][1]) == "query-me");
    result = run_read_query(db, "SELECT ?1 * 2, ?2 IS NULL", {SqlValue(1.25), SqlValue(std::monostate{})});
    CHECK(std::get<double>(result.rows[0][0]) == 2.5);
    CHECK(std::get<int64_t>(result.rows[0][1]) == 1);
    CHECK_THAT(index_error([&] { run_read_query(db, "SELECT ?1", {}); }), StartsWith("SQL error:"));

    result = run_read_query(db, "SELECT * FROM runs WHERE 0;  ");
    CHECK(result.rows.empty());
    CHECK(result.columns.size() > 10);

    const std::string deleting = index_error([&] { run_read_query(db, "DELETE FROM runs"); });
    CHECK_THAT(deleting, Contains("read-only"));
    CHECK_THAT(index_error([&] { run_read_query(db, "UPDATE runs SET name = 'x'"); }), Contains("read-only"));
    CHECK_THAT(index_error([&] { run_read_query(db, "DROP TABLE metrics"); }), Contains("read-only"));
    CHECK_THAT(index_error([&] { run_read_query(db, "SELEC name FROM runs"); }), StartsWith("SQL error:"));
    CHECK_THAT(index_error([&] { run_read_query(db, "SELECT nope FROM runs"); }), StartsWith("SQL error:"));
    CHECK_THAT(index_error([&] { run_read_query(db, "SELECT 1; SELECT 2"); }), Contains("one statement at a time"));
    CHECK_THAT(index_error([&] { run_read_query(db, "SELECT 1; DELETE FROM runs"); }),
               Contains("one statement at a time"));
    CHECK_THAT(index_error([&] { run_read_query(db, "   "); }), StartsWith("SQL error:"));
    CHECK(scalar(db, "SELECT count(*) FROM runs") == 2);
    CHECK(table_exists(db, "metrics"));
  }
}

TEST_CASE("run_read_query accepts a comment after the statement", "[index]") {
  TempHome tmp;
  {
    Database db = open_index_for_writing(runner::testing::index_at(tmp.path));
    create_run(db, new_run(), tmp.path);
  }
  Database db = open_index_for_reading(runner::testing::index_at(tmp.path));
  QueryResult result;
  CHECK_NOTHROW(result = run_read_query(db, "SELECT count(*) AS n FROM runs -- how many runs"));
  CHECK(result.rows.size() == 1);
  // A comment after the final ';' is not a second statement either.
  result = {};
  CHECK_NOTHROW(result = run_read_query(db, "SELECT count(*) AS n FROM runs; -- how many runs"));
  CHECK(result.rows.size() == 1);
  result = {};
  CHECK_NOTHROW(result = run_read_query(db, "SELECT count(*) AS n FROM runs;\n/* done */\n"));
  CHECK(result.rows.size() == 1);
  CHECK_THAT(index_error([&] { run_read_query(db, "SELECT 1; -- note\nSELECT 2"); }),
             Contains("one statement at a time"));
}

// ---------------------------------------------------------------------------------------------------------
// Removal and garbage collection

namespace {

// A run with a directory, metrics, an artifact and a checkpoint of two files.
RunRecord populated_run(Database& db, const std::string& home, const std::string& name) {
  const RunRecord run = create_run(db, new_run("exp.lua", name), home);
  const std::string dir = home + "/" + run.dir;
  write_file(dir + "/config.json", "{}");
  write_file(dir + "/script.lua", "-- script\n");
  write_file(dir + "/images/s-0000001.png", std::string(100, 'p'));
  write_file(dir + "/checkpoints/step-1/model.safetensors", std::string(1000, 'm'));
  write_file(dir + "/checkpoints/step-1/optim.safetensors", std::string(500, 'o'));
  {
    MetricWriter writer(runner::testing::index_at(home), run.run);
    for (int i = 0; i < 30; ++i) writer.log(i % 2 ? "loss" : "lr", i, i, now_seconds());
  }
  add_artifact(db, {0, run.run, 1, "image", "s", "images/s-0000001.png", 100, 0});
  CheckpointRecord checkpoint;
  checkpoint.run = run.run;
  checkpoint.step = 1;
  checkpoint.path = "checkpoints/step-1";
  checkpoint.bytes = 1500;
  checkpoint.hash = "abc";
  checkpoint.files = {{"model.safetensors", 1000, "h1"}, {"optim.safetensors", 500, "h2"}};
  add_checkpoint(db, checkpoint);
  return run;
}

struct RowCounts {
  int64_t runs, metrics, latest, artifacts, checkpoints, checkpoint_files;
  bool operator==(const RowCounts&) const = default;
};

RowCounts row_counts(Database& db, int64_t run) {
  const std::string r = std::to_string(run);
  return {
      scalar(db, "SELECT count(*) FROM runs WHERE run = " + r),
      count_for_run(db, "metrics", run),
      count_for_run(db, "metric_latest", run),
      count_for_run(db, "artifacts", run),
      count_for_run(db, "checkpoints", run),
      scalar(db, "SELECT count(*) FROM checkpoint_files f JOIN checkpoints c USING (checkpoint) WHERE c.run = " + r)};
}

// The disk space a tree holds: its files' and folders' allocated blocks, as `stat` reports them.
uint64_t allocated_bytes(const std::string& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) return 0;
  uint64_t total = static_cast<uint64_t>(info.st_blocks) * 512;
  if (S_ISDIR(info.st_mode))
    for (const auto& entry : fs::recursive_directory_iterator(path))
      if (::lstat(entry.path().c_str(), &info) == 0) total += static_cast<uint64_t>(info.st_blocks) * 512;
  return total;
}

std::string describe(const RowCounts& c) {
  return std::to_string(c.runs) + " " + std::to_string(c.metrics) + " " + std::to_string(c.latest) + " " +
         std::to_string(c.artifacts) + " " + std::to_string(c.checkpoints) + " " + std::to_string(c.checkpoint_files);
}

}  // namespace

INDEX_TEST_CASE("remove_run deletes the run's rows and directory and nothing else", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  Database db = open_index_for_writing(runner::testing::index_at(home));
  const RunRecord gone = populated_run(db, home, "gone");
  const RunRecord kept = populated_run(db, home, "kept");
  const RowCounts full{1, 30, 2, 1, 1, 2};
  REQUIRE(describe(row_counts(db, gone.run)) == describe(full));
  const int64_t checkpoints_before = scalar(db, "SELECT count(*) FROM checkpoint_files");
  const uint64_t gone_bytes = allocated_bytes(home + "/gone");
  REQUIRE(gone_bytes >= 2 + 10 + 100 + 1000 + 500);

  const RemovedRun removed = remove_run(db, home, gone);
  CHECK(removed.id == gone.id);
  CHECK(removed.name == "gone");
  CHECK(removed.metrics == 30);
  CHECK(removed.checkpoints == 1);
  CHECK(removed.artifacts == 1);
  CHECK(removed.bytes == gone_bytes);

  CHECK(describe(row_counts(db, gone.run)) == describe(RowCounts{0, 0, 0, 0, 0, 0}));
  CHECK(scalar(db, "SELECT count(*) FROM checkpoint_files") == checkpoints_before - 2);
  CHECK_FALSE(exists(home + "/gone"));
  CHECK(fs::is_empty(home + "/.trash"));
  CHECK_THAT(index_error([&] { resolve_run(db, gone.id); }), StartsWith("no run matches"));

  CHECK(describe(row_counts(db, kept.run)) == describe(full));
  CHECK(exists(home + "/kept/checkpoints/step-1/model.safetensors"));
  CHECK(resolve_run(db, "kept").run == kept.run);

  // A run whose directory is already gone is removed too.
  remove_tree(home + "/kept");
  const RemovedRun second = remove_run(db, home, kept);
  CHECK(second.bytes == 0);
  CHECK(describe(row_counts(db, kept.run)) == describe(RowCounts{0, 0, 0, 0, 0, 0}));
  CHECK(scalar(db, "SELECT count(*) FROM runs") == 0);
}

TEST_CASE("collect_garbage finishes removals, drops rotated checkpoints, finds orphans", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  Database db = open_index_for_writing(runner::testing::index_at(home));

  // A removal that stopped after the directory was moved to the trash.
  const RunRecord half = populated_run(db, home, "half");
  const std::string trash_entry = half.id + "-" + half.dir;
  fs::create_directories(home + "/.trash");
  fs::rename(home + "/half", home + "/.trash/" + trash_entry);
  const uint64_t trash_bytes = allocated_bytes(home + "/.trash/" + trash_entry);

  // A run with one kept checkpoint and one rotated out.
  const RunRecord rotating = populated_run(db, home, "rotating");
  write_file(home + "/rotating/checkpoints/step-2.safetensors", std::string(300, 'x'));
  CheckpointRecord dropped;
  dropped.run = rotating.run;
  dropped.step = 2;
  dropped.path = "checkpoints/step-2.safetensors";
  dropped.bytes = 300;
  dropped.hash = "def";
  dropped.files = {{"step-2.safetensors", 300, "h3"}};
  const int64_t dropped_id = add_checkpoint(db, dropped);
  set_checkpoint_kept(db, dropped_id, false);
  // And one whose files rotation deleted but whose row an older runner left: nothing left to list or free.
  CheckpointRecord rotated = dropped;
  rotated.step = 3;
  rotated.path = "checkpoints/step-3.safetensors";
  rotated.files = {{"step-3.safetensors", 300, "h4"}};
  const int64_t rotated_id = add_checkpoint(db, rotated);
  set_checkpoint_kept(db, rotated_id, false);
  const uint64_t dropped_bytes = allocated_bytes(home + "/rotating/checkpoints/step-2.safetensors");

  // A run of a process that died, with no directory.
  const RunRecord stale = create_run(db, new_run("stale.lua", "stale"), home);
  db.execute("UPDATE runs SET pid = " + std::to_string(dead_pid()) + " WHERE run = " + std::to_string(stale.run));

  // An orphan run directory, and a folder that is not a run.
  write_file(home + "/orphan/config.json", "{}");
  write_file(home + "/orphan/script.lua", "-- orphan\n");
  write_file(home + "/data/config.json", "{}");
  const uint64_t orphan_bytes = allocated_bytes(home + "/orphan");

  auto snapshot = [&] {
    return describe(row_counts(db, half.run)) + "|" + describe(row_counts(db, rotating.run)) + "|" +
           load_run(db, stale.run).status;
  };
  const std::string before = snapshot();

  SECTION("dry run reports everything and changes nothing") {
    const GarbageReport report = collect_garbage(db, home, true, true);
    CHECK(report.finished_removals == std::vector<std::string>{trash_entry});
    CHECK(report.dropped_checkpoints == std::vector<std::string>{"rotating/checkpoints/step-2.safetensors"});
    CHECK(report.orphan_directories == std::vector<std::string>{"orphan"});
    CHECK(report.interrupted_runs == std::vector<std::string>{"stale"});
    CHECK_THAT(report.missing_directories, Catch::VectorContains(std::string("stale")));
    CHECK(report.bytes_freed == trash_bytes + dropped_bytes + orphan_bytes);

    CHECK(snapshot() == before);
    CHECK(exists(home + "/.trash/" + trash_entry + "/checkpoints/step-1/model.safetensors"));
    CHECK(exists(home + "/rotating/checkpoints/step-2.safetensors"));
    CHECK(exists(home + "/orphan/script.lua"));
    CHECK(exists(home + "/data/config.json"));
  }

  SECTION("a real run deletes; orphans only when asked") {
    GarbageReport report = collect_garbage(db, home, false, false);
    CHECK(report.finished_removals == std::vector<std::string>{trash_entry});
    CHECK(report.dropped_checkpoints == std::vector<std::string>{"rotating/checkpoints/step-2.safetensors"});
    CHECK(report.orphan_directories == std::vector<std::string>{"orphan"});
    CHECK(report.interrupted_runs == std::vector<std::string>{"stale"});
    CHECK(report.missing_directories == std::vector<std::string>{"stale"});
    CHECK(report.bytes_freed == trash_bytes + dropped_bytes);

    // The half-removed run: rows and trash entry gone.
    CHECK(describe(row_counts(db, half.run)) == describe(RowCounts{0, 0, 0, 0, 0, 0}));
    CHECK_FALSE(exists(home + "/.trash/" + trash_entry));
    // The rotated checkpoint: file and rows gone; the kept one untouched.
    CHECK_FALSE(exists(home + "/rotating/checkpoints/step-2.safetensors"));
    CHECK(exists(home + "/rotating/checkpoints/step-1/model.safetensors"));
    const auto remaining = checkpoints(db, rotating.run);
    REQUIRE(remaining.size() == 1);
    CHECK(remaining[0].path == "checkpoints/step-1");
    CHECK(remaining[0].files.size() == 2);
    CHECK(scalar(db, "SELECT count(*) FROM checkpoint_files WHERE checkpoint = " + std::to_string(dropped_id)) == 0);
    CHECK(scalar(db, "SELECT count(*) FROM checkpoint_files WHERE checkpoint = " + std::to_string(rotated_id)) == 0);
    CHECK(describe(row_counts(db, rotating.run)) == describe(RowCounts{1, 30, 2, 1, 1, 2}));
    // The dead run is marked.
    CHECK(load_run(db, stale.run).status == "interrupted");
    // The orphan stays without remove_orphans.
    CHECK(exists(home + "/orphan/script.lua"));

    report = collect_garbage(db, home, false, true);
    CHECK(report.finished_removals.empty());
    CHECK(report.dropped_checkpoints.empty());
    CHECK(report.interrupted_runs.empty());
    CHECK(report.orphan_directories == std::vector<std::string>{"orphan"});
    CHECK(report.bytes_freed == orphan_bytes);
    CHECK_FALSE(exists(home + "/orphan"));
    CHECK(exists(home + "/data/config.json"));
    CHECK(exists(home + "/rotating/script.lua"));
    CHECK(exists(index_path(home)));
  }
}

TEST_CASE("the space freed is the blocks released: a file also linked from elsewhere counts nothing", "[index]") {
  TempHome tmp;
  const std::string tree = tmp.path + "/tree";
  write_file(tree + "/a.bin", std::string(10000, 'a'));
  write_file(tmp.path + "/outside.bin", std::string(20000, 'b'));
  REQUIRE(::link((tmp.path + "/outside.bin").c_str(), (tree + "/linked.bin").c_str()) == 0);
  REQUIRE(::link((tree + "/a.bin").c_str(), (tree + "/a-again.bin").c_str()) == 0);  // both links inside: once
  struct stat folder {
  }, file{};
  REQUIRE(::lstat(tree.c_str(), &folder) == 0);
  REQUIRE(::lstat((tree + "/a.bin").c_str(), &file) == 0);
  CHECK(file.st_blocks * 512 >= 10000);
  CHECK(runner::core::disk_usage(tree) == static_cast<uint64_t>(folder.st_blocks + file.st_blocks) * 512);
  CHECK(runner::core::disk_usage(tmp.path + "/missing") == 0);
}

TEST_CASE("a paused sweep trial's run keeps only its latest checkpoint, a pruned one none", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  Database db = open_index_for_writing(runner::testing::index_at(home));
  const RunRecord run = populated_run(db, home, "trial");  // checkpoints/step-1
  write_file(home + "/trial/checkpoints/step-2.safetensors", std::string(300, 'x'));
  CheckpointRecord later;
  later.run = run.run;
  later.step = 2;
  later.path = "checkpoints/step-2.safetensors";
  later.bytes = 300;
  later.hash = "def";
  later.files = {{"step-2.safetensors", 300, "h3"}};
  add_checkpoint(db, later);
  auto listed = [&] {
    std::vector<std::string> paths;
    for (const CheckpointRecord& c : checkpoints(db, run.run)) paths.push_back(c.path + (c.kept ? "" : " (dropped)"));
    return paths;
  };
  // A finished run keeps what rotation kept.
  CHECK(unneeded_checkpoints(db, load_run(db, run.run)).empty());
  db.execute("UPDATE runs SET status = 'paused' WHERE run = " + std::to_string(run.run));
  GarbageReport report;
  drop_checkpoints(db, home, load_run(db, run.run), false, report);
  CHECK(report.dropped_checkpoints == std::vector<std::string>{"trial/checkpoints/step-1"});
  CHECK(listed() == std::vector<std::string>{"checkpoints/step-2.safetensors"});
  CHECK_FALSE(exists(home + "/trial/checkpoints/step-1"));
  CHECK(exists(home + "/trial/checkpoints/step-2.safetensors"));

  db.execute("UPDATE runs SET status = 'pruned' WHERE run = " + std::to_string(run.run));
  const uint64_t last_bytes = allocated_bytes(home + "/trial/checkpoints/step-2.safetensors");
  report = collect_garbage(db, home, true, false);
  CHECK(report.dropped_checkpoints == std::vector<std::string>{"trial/checkpoints/step-2.safetensors"});
  CHECK(report.bytes_freed == last_bytes);
  CHECK(listed() == std::vector<std::string>{"checkpoints/step-2.safetensors"});  // a dry run changes nothing
  report = collect_garbage(db, home, false, false);
  CHECK(report.dropped_checkpoints == std::vector<std::string>{"trial/checkpoints/step-2.safetensors"});
  CHECK(listed().empty());
  CHECK_FALSE(exists(home + "/trial/checkpoints/step-2.safetensors"));
  // Its metrics, samples and files stay.
  CHECK(describe(row_counts(db, run.run)) == describe(RowCounts{1, 30, 2, 1, 0, 0}));
  CHECK(exists(home + "/trial/images/s-0000001.png"));
}

// ---------------------------------------------------------------------------------------------------------
// The run context

namespace {

RunStart run_start(const std::string& home, const std::string& name = "") {
  RunStart start;
  start.index = runner::testing::index_at(home);
  start.run = new_run("experiments/foo.lua", name);
  start.script_text = "local x = 1\n-- ü and a tab\t\nprint(x)\n";
  start.writer.flush_interval_seconds = 0.05;
  start.writer.heartbeat_seconds = 0.05;
  return start;
}

}  // namespace

TEST_CASE("a run context creates the run directory with script, config and log", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  const RunStart start = run_start(home);
  {
    RunContext context(start);
    CHECK(context.record().name == "foo-1");
    CHECK(context.record().status == "running");
    CHECK(context.directory() == home + "/foo-1");
    CHECK(context.home() == home);
    CHECK_FALSE(context.finished());
    CHECK(read_file(home + "/foo-1/script.lua") == start.script_text);
    CHECK(nlohmann::json::parse(read_file(home + "/foo-1/config.json")) == start.run.config);
    CHECK(exists(home + "/foo-1/log.txt"));

    context.metrics().log("loss", 3, 0.5, now_seconds());
    context.merge_summary({{"fid", 3.25}});
    context.finish("failed", "boom");
    CHECK(context.finished());
    CHECK(context.record().status == "failed");
    CHECK(context.record().error == std::optional<std::string>("boom"));
    context.finish("finished");  // idempotent: the first status stays
    CHECK(context.record().status == "failed");
    CHECK_THAT(index_error([&] { context.metrics().log("loss", 4, 0.5, now_seconds()); }),
               Catch::Equals("metrics cannot be logged after the run has finished"));
  }
  Database db = open_index_for_reading(runner::testing::index_at(home));
  const RunRecord run = resolve_run(db, "foo-1");
  CHECK(run.status == "failed");
  CHECK(run.error == std::optional<std::string>("boom"));
  CHECK(run.ended_at.has_value());
  CHECK(run.summary == nlohmann::json({{"fid", 3.25}}));
  CHECK(latest_metric(db, run.run, "loss") == std::optional<double>(0.5));

  // The next context gets the next name.
  RunContext next(start);
  CHECK(next.record().name == "foo-2");
  next.finish("finished");
  CHECK(next.record().status == "finished");
  CHECK_FALSE(next.record().error.has_value());
}

TEST_CASE("a run context destroyed before finish records an interrupted run", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  {
    RunContext context(run_start(home, "early"));
    context.metrics().log("loss", 1, 0.75, now_seconds());
    context.metrics().set_step(1);
  }
  Database db = open_index_for_reading(runner::testing::index_at(home));
  const RunRecord run = resolve_run(db, "early");
  CHECK(run.status == "interrupted");
  REQUIRE(run.error.has_value());
  CHECK(*run.error == "the run was not finished (the process ended early)");
  CHECK(run.ended_at.has_value());
  CHECK(latest_metric(db, run.run, "loss") == std::optional<double>(0.75));
}

TEST_CASE("a run context refuses a name that is taken and leaves the existing run alone", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  RunContext first(run_start(home, "exp"));
  CHECK_THAT(index_error([&] { RunContext second(run_start(home, "exp")); }), Contains("already exists"));
  first.finish("finished");
  Database db = open_index_for_reading(runner::testing::index_at(home));
  CHECK(scalar(db, "SELECT count(*) FROM runs") == 1);
  CHECK(resolve_run(db, "exp").status == "finished");
}

TEST_CASE("an intervention's long chunk is recorded cut, with its size, and the log line too", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  RunContext context(run_start(home, "live"));
  // 20 MB of chunk, with a two-byte character across the cut.
  std::string chunk = "cfg.lr = 0.5 -- " + std::string(4079, 'x') + "\xc3\xa9" + std::string(20'000'000, 'y');
  context.record_intervention(chunk, {"config.lr = 0.5"});
  Database db = open_index_for_reading(runner::testing::index_at(home));
  const auto recorded = interventions(db, context.record().run);
  REQUIRE(recorded.size() == 1);
  CHECK(recorded[0].chunk == "cfg.lr = 0.5 -- " + std::string(4079, 'x') + "\n... (cut: 20.0 MB in all)");
  CHECK(recorded[0].changes == std::vector<std::string>{"config.lr = 0.5"});
  const std::string log = read_file(home + "/live/log.txt");
  CHECK(log.find("... (cut: 20.0 MB in all)") != std::string::npos);
  CHECK(log.size() < 10000);
  // A short one is kept whole.
  context.record_intervention("train:set_lr(1e-3)\n", {"train:set_lr(0.001)"});
  CHECK(interventions(db, context.record().run).back().chunk == "train:set_lr(1e-3)");
}

TEST_CASE("save_images writes the grid under images/ and records the artifact", "[index]") {
  TempHome tmp;
  const std::string home = tmp.path;
  RunContext context(run_start(home, "pics"));
  const at::Tensor images = at::rand({4, 3, 8, 8}) * 2 - 1;
  const std::string path = context.save_images("samples", 5, images, {});
  CHECK(path == home + "/pics/images/samples-0000005.png");
  REQUIRE(exists(path));
  const std::string png = read_file(path);
  CHECK(png.substr(1, 3) == "PNG");
  context.save_images("samples", 1234567, images, {});
  CHECK(exists(home + "/pics/images/samples-1234567.png"));

  CHECK_THROWS_AS(context.save_images("../x", 6, images, {}), std::invalid_argument);
  CHECK_THROWS_WITH(context.save_images("../x", 6, images, {}), Contains("image name '../x' is not allowed"));
  CHECK_THROWS_AS(context.save_images("a/b", 6, images, {}), std::invalid_argument);
  CHECK_THROWS_AS(context.save_images("", 6, images, {}), std::invalid_argument);
  CHECK_FALSE(exists(home + "/x-0000006.png"));
  CHECK_FALSE(exists(home + "/pics/x-0000006.png"));

  Database db = open_index_for_reading(runner::testing::index_at(home));
  const auto recorded = artifacts(db, context.record().run);
  REQUIRE(recorded.size() == 2);
  CHECK(recorded[0].kind == "image");
  CHECK(recorded[0].name == "samples");
  CHECK(recorded[0].step == 5);
  CHECK(recorded[0].path == "images/samples-0000005.png");
  CHECK(recorded[0].bytes == static_cast<int64_t>(png.size()));
  CHECK(recorded[1].step == 1234567);
  context.finish("finished");
}

// ---------------------------------------------------------------------------------------------------------
// The schema held together: SQLite's and PostgreSQL's texts (index_database.cpp) describe the same index.

namespace {

std::string joined_lines(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

// A backend's schema in common words, one line each, sorted: "column T.C family [not null]", "primary key T (C, ...)",
// "index T (C, ...) [unique]" (created indexes and unique constraints), "foreign key T (C) -> T2 (C2) on delete
// RULE" and "trigger NAME on T". Type families: integer, real, text, blob; a key column counts as not null on SQLite
// (which does not say so of INTEGER PRIMARY KEY) as it is on PostgreSQL.
std::vector<std::string> describe_schema(Database& db) {
  std::vector<std::string> lines;
  auto family = [](std::string type) {
    std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return std::tolower(c); });
    if (type == "integer" || type == "bigint") return std::string("integer");
    if (type == "real" || type == "double precision") return std::string("real");
    if (type == "text") return std::string("text");
    if (type == "blob" || type == "bytea") return std::string("blob");
    return "unknown type " + type;
  };
  auto rows = [&db](const std::string& sql) {
    std::vector<std::vector<std::string>> out;
    Statement statement = db.prepare(sql);
    while (statement.step()) {
      std::vector<std::string> row;
      for (int i = 0; i < statement.column_count(); ++i) row.push_back(statement.text(i));
      out.push_back(row);
    }
    return out;
  };
  auto joined = [](const std::vector<std::string>& parts) {
    std::string text;
    for (const std::string& part : parts) text += (text.empty() ? "" : ", ") + part;
    return text;
  };
  if (db.backend() == Backend::postgresql) {
    for (const auto& r : rows("SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns "
                              "WHERE table_schema = current_schema() AND table_name != 'runner_schema'"))
      lines.push_back("column " + r[0] + "." + r[1] + " " + family(r[2]) + (r[3] == "NO" ? " not null" : ""));
    std::map<std::string, std::vector<std::string>> keys;  // constraint -> its columns in order
    std::map<std::string, std::string> key_tables;
    for (const auto& r :
         rows("SELECT c.constraint_name, c.table_name, k.column_name FROM information_schema.table_constraints c "
              "JOIN information_schema.key_column_usage k USING (constraint_schema, constraint_name) WHERE "
              "c.table_schema = current_schema() AND c.constraint_type = 'PRIMARY KEY' ORDER BY c.constraint_name, "
              "k.ordinal_position")) {
      keys[r[0]].push_back(r[2]);
      key_tables[r[0]] = r[1];
    }
    for (const auto& [name, columns] : keys)
      lines.push_back("primary key " + key_tables[name] + " (" + joined(columns) + ")");
    // Indexes other than the primary keys': their columns from the catalogue, in order.
    for (const auto& r :
         rows("SELECT t.relname, i.indisunique, string_agg(a.attname, ', ' ORDER BY k.n) FROM pg_index i JOIN pg_class "
              "t ON t.oid = i.indrelid JOIN pg_namespace s ON s.oid = t.relnamespace CROSS JOIN LATERAL "
              "unnest(i.indkey) "
              "WITH ORDINALITY AS k(attnum, n) JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum WHERE "
              "s.nspname = current_schema() AND NOT i.indisprimary AND t.relname != 'runner_schema' GROUP BY "
              "i.indexrelid, "
              "t.relname, i.indisunique"))
      lines.push_back("index " + r[0] + " (" + r[2] + ")" +
                      (r[1] == "1" || r[1] == "t" || r[1] == "true" ? " unique" : ""));
    for (const auto& r :
         rows("SELECT k.table_name, k.column_name, u.table_name, u.column_name, f.delete_rule FROM "
              "information_schema.referential_constraints f JOIN information_schema.key_column_usage k ON "
              "k.constraint_schema = f.constraint_schema AND k.constraint_name = f.constraint_name JOIN "
              "information_schema.key_column_usage u ON u.constraint_schema = f.unique_constraint_schema AND "
              "u.constraint_name = f.unique_constraint_name AND u.ordinal_position = k.position_in_unique_constraint "
              "WHERE f.constraint_schema = current_schema()")) {
      std::string rule = r[4];
      std::transform(rule.begin(), rule.end(), rule.begin(), [](unsigned char c) { return std::tolower(c); });
      lines.push_back("foreign key " + r[0] + " (" + r[1] + ") -> " + r[2] + " (" + r[3] + ") on delete " + rule);
    }
    for (const auto& r : rows("SELECT DISTINCT trigger_name, event_object_table FROM information_schema.triggers WHERE "
                              "trigger_schema = current_schema()"))
      lines.push_back("trigger " + r[0] + " on " + r[1]);
  } else {
    for (const auto& table : rows("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")) {
      const std::string& t = table[0];
      std::vector<std::pair<int, std::string>> key;
      for (const auto& r : rows("SELECT name, type, \"notnull\", pk FROM pragma_table_info('" + t + "')")) {
        lines.push_back("column " + t + "." + r[0] + " " + family(r[1]) +
                        (r[2] == "1" || r[3] != "0" ? " not null" : ""));
        if (r[3] != "0") key.emplace_back(std::stoi(r[3]), r[0]);
      }
      std::sort(key.begin(), key.end());
      std::vector<std::string> key_columns;
      for (const auto& [position, column] : key) key_columns.push_back(column);
      if (!key_columns.empty()) lines.push_back("primary key " + t + " (" + joined(key_columns) + ")");
      for (const auto& index : rows("SELECT name, \"unique\", origin FROM pragma_index_list('" + t + "')")) {
        if (index[2] == "pk") continue;
        std::vector<std::string> columns;
        for (const auto& c : rows("SELECT name FROM pragma_index_info('" + index[0] + "') ORDER BY seqno"))
          columns.push_back(c[0]);
        lines.push_back("index " + t + " (" + joined(columns) + ")" + (index[1] == "1" ? " unique" : ""));
      }
      for (const auto& r :
           rows("SELECT \"from\", \"table\", \"to\", on_delete FROM pragma_foreign_key_list('" + t + "')")) {
        std::string rule = r[3];
        std::transform(rule.begin(), rule.end(), rule.begin(), [](unsigned char c) { return std::tolower(c); });
        lines.push_back("foreign key " + t + " (" + r[0] + ") -> " + r[1] + " (" + r[2] + ") on delete " + rule);
      }
    }
    for (const auto& r : rows("SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger'"))
      lines.push_back("trigger " + r[0] + " on " + r[1]);
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

}  // namespace

TEST_CASE("a fresh index has the same tables, columns, keys, indexes and triggers on SQLite and on PostgreSQL",
          "[index][postgresql]") {
  TempHome tmp;
  std::vector<std::string> sqlite;
  {
    Database db(index_path(tmp.path), OpenMode::read_write_create);
    migrate(db, schema_migrations());
    sqlite = describe_schema(db);
  }
  REQUIRE_FALSE(sqlite.empty());
  const runner::testing::PostgresIndex server;
  if (!server.available()) {
    WARN("SKIP: " << server.reason());
    return;
  }
  Database db = open_index_for_writing(runner::testing::index_at(tmp.path + "/postgresql"));
  const std::vector<std::string> postgresql = describe_schema(db);
  std::vector<std::string> only_sqlite, only_postgresql;
  std::set_difference(sqlite.begin(), sqlite.end(), postgresql.begin(), postgresql.end(),
                      std::back_inserter(only_sqlite));
  std::set_difference(postgresql.begin(), postgresql.end(), sqlite.begin(), sqlite.end(),
                      std::back_inserter(only_postgresql));
  INFO("only on SQLite:\n" << joined_lines(only_sqlite) << "only on PostgreSQL:\n" << joined_lines(only_postgresql));
  CHECK(only_sqlite.empty());
  CHECK(only_postgresql.empty());
}

INDEX_TEST_CASE("an index migrated from the first schema equals a fresh one, table for table", "[index]") {
  TempHome tmp;
  const std::string url = runner::core::launch_context().index_url;
  std::vector<std::string> fresh;
  {
    Database db = open_index_for_writing(runner::testing::index_at(tmp.path + "/fresh"));
    fresh = describe_schema(db);
  }
  std::vector<std::string> migrated;
  {
    // SQLite's first schema is version 1; PostgreSQL's, version 8.
    const int first = url.empty() ? 1 : 8;
    std::filesystem::create_directories(tmp.path + "/old");
    Database old = url.empty() ? Database(index_path(tmp.path + "/old"), OpenMode::read_write_create)
                               : Database::postgresql(url, false);
    if (!url.empty()) {
      // The fresh index took the database; the old one gets a schema of its own.
      old.execute("CREATE SCHEMA old_index; SET search_path TO old_index");
    }
    CHECK(migrate(old, migrations_to(first)) == first);
    CHECK(migrate(old, schema_migrations()) == schema_version());
    migrated = describe_schema(old);
  }
  CHECK(joined_lines(migrated) == joined_lines(fresh));
}
