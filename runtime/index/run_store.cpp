// Run rows of the index, their attempts, and the lookup of runs by what users type.
#include "runtime/index/run_store.h"

#include <sys/stat.h>
#include <fnmatch.h>
#include <unistd.h>

#include <cctype>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <csignal>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <limits>
#include <map>
#include <random>

#include "runtime/core/json_text.h"
#include "runtime/core/utf8_text.h"
#include "runtime/index/final_status.h"

namespace runner::index {
namespace {

constexpr const char* kRunColumns =
    "r.run, r.id, r.name, r.status, r.script, r.script_hash, r.config, r.summary, r.git_revision, r.git_dirty, "
    "r.host, r.pid, r.device, r.seed, r.world_size, r.versions, r.dir, r.started_at, r.ended_at, r.heartbeat_at, "
    "r.step, r.error, (SELECT p.id FROM runs p WHERE p.run = r.parent), r.attempts, r.attempt_started_at, "
    "r.active_seconds, r.hosts, r.sweep, r.trial, r.note";

// SQL that adds the running attempt's span, ended at `end` (an SQL expression), to active_seconds.
std::string fold_attempt(const Database& db, const std::string& end) {
  return fmt::format(
      "active_seconds = active_seconds + CASE WHEN attempt_started_at IS NULL THEN 0 ELSE "
      "{} END, attempt_started_at = NULL",
      db.greatest("0", end + " - attempt_started_at"));
}

// A column that should hold JSON; text that is not JSON (a row edited by hand) comes back as a string.
nlohmann::json parse_json_column(const Statement& statement, int column) {
  const std::string text = statement.text(column);
  nlohmann::json value = nlohmann::json::parse(text.empty() ? "{}" : text, nullptr, false);
  return value.is_discarded() ? nlohmann::json(text) : value;
}

std::string hosts_json(const NewRun& spec) {
  return core::json_text(nlohmann::json(spec.hosts.empty() ? std::vector<std::string>{host_name()} : spec.hosts));
}

// The row of a run's attempt that this process starts now, from step 0 until a restore says otherwise.
void insert_attempt(Database& db, int64_t run, int64_t attempt, const NewRun& spec, double now) {
  Statement insert = db.prepare(
      "INSERT INTO attempts (run, attempt, status, config, world_size, hosts, host, pid, device, seed, script_hash, "
      "git_revision, git_dirty, versions, start_step, end_step, started_at) "
      "VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, ?)");
  insert.bind(1, run)
      .bind(2, attempt)
      .bind(3, core::json_text(spec.config))
      .bind(4, spec.world_size)
      .bind(5, hosts_json(spec));
  insert.bind(6, host_name()).bind(7, static_cast<int64_t>(::getpid())).bind(8, spec.device).bind(9, spec.seed);
  insert.bind(10, spec.script_hash).bind(11, spec.git_revision);
  if (spec.git_dirty)
    insert.bind(12, static_cast<int64_t>(*spec.git_dirty));
  else
    insert.bind_null(12);
  insert.bind(13, core::json_text(spec.versions)).bind(14, now);
  insert.run();
}

std::vector<std::string> parse_hosts(const nlohmann::json& hosts) {
  std::vector<std::string> names;
  if (hosts.is_array())
    for (const auto& host : hosts)
      if (host.is_string()) names.push_back(host.get<std::string>());
  return names;
}

RunRecord read_run(const Statement& s) {
  RunRecord run;
  run.run = s.integer(0);
  run.id = s.text(1);
  run.name = s.text(2);
  run.status = s.text(3);
  run.script = s.text(4);
  run.script_hash = s.text(5);
  run.config = parse_json_column(s, 6);
  run.summary = parse_json_column(s, 7);
  run.git_revision = s.optional_text(8);
  if (auto dirty = s.optional_integer(9)) run.git_dirty = *dirty != 0;
  run.host = s.text(10);
  run.pid = s.integer(11);
  run.device = s.text(12);
  run.seed = s.optional_integer(13);
  run.world_size = static_cast<int>(s.integer(14));
  run.versions = parse_json_column(s, 15);
  run.dir = s.text(16);
  run.started_at = s.real(17);
  run.ended_at = s.optional_real(18);
  run.heartbeat_at = s.real(19);
  run.step = s.integer(20);
  run.error = s.optional_text(21);
  run.parent_id = s.optional_text(22);
  run.attempts = s.integer(23);
  run.attempt_started_at = s.optional_real(24);
  run.active_seconds = s.real(25);
  run.hosts = parse_hosts(parse_json_column(s, 26));
  run.sweep = s.optional_integer(27);
  run.trial = s.optional_integer(28);
  run.note = s.optional_text(29);
  return run;
}

std::vector<std::string> run_tags(Database& db, int64_t run) {
  Statement statement = db.prepare("SELECT tag FROM run_tags WHERE run = ? ORDER BY tag");
  statement.bind(1, run);
  std::vector<std::string> tags;
  while (statement.step()) tags.push_back(statement.text(0));
  return tags;
}

// The runs' tags: one query for the run of a lookup, one for the whole table when many runs are listed.
void read_tags(Database& db, std::vector<RunRecord>& runs) {
  if (runs.size() == 1) {
    runs[0].tags = run_tags(db, runs[0].run);
    return;
  }
  if (runs.empty()) return;
  std::map<int64_t, RunRecord*> by_key;
  for (RunRecord& run : runs) by_key[run.run] = &run;
  Statement statement = db.prepare("SELECT run, tag FROM run_tags ORDER BY run, tag");
  while (statement.step())
    if (auto found = by_key.find(statement.integer(0)); found != by_key.end())
      found->second->tags.push_back(statement.text(1));
}

std::vector<RunRecord> query_runs(Database& db, const std::string& where, const std::vector<std::string>& texts) {
  Statement statement =
      db.prepare(fmt::format("SELECT {} FROM runs r {} ORDER BY r.started_at DESC, r.run DESC", kRunColumns, where));
  for (size_t i = 0; i < texts.size(); ++i) statement.bind(static_cast<int>(i + 1), texts[i]);
  std::vector<RunRecord> runs;
  while (statement.step()) runs.push_back(read_run(statement));
  read_tags(db, runs);
  return runs;
}

bool process_alive(int64_t pid) {
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

std::string random_id() {
  static constexpr char kAlphabet[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::random_device device;
  std::mt19937_64 generator((static_cast<uint64_t>(device()) << 32) ^ device() ^
                            static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::string id;
  for (int i = 0; i < 8; ++i) id += kAlphabet[generator() % 36];
  return id;
}

}  // namespace

std::string client_key() {
  std::string key;
  for (int i = 0; i < 3; ++i) key += random_id();
  return key;
}

namespace {

bool exists_on_disk(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

bool name_taken(Database& db, const std::string& name) {
  Statement statement = db.prepare("SELECT 1 FROM runs WHERE name = ?");
  statement.bind(1, name);
  return statement.step();
}

std::string script_stem(const std::string& script) {
  std::string stem = script.substr(script.rfind('/') == std::string::npos ? 0 : script.rfind('/') + 1);
  if (stem.size() > 4 && stem.ends_with(".lua")) stem.resize(stem.size() - 4);
  std::string clean;
  for (char c : stem)
    clean += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.') ? c : '_';
  if (clean.empty() || clean[0] == '.') clean = "run" + clean;
  return clean;
}

}  // namespace

void check_name(const std::string& name, std::string_view what) {
  if (name.empty() || name.size() > 100 || name[0] == '.' || name == "last")
    throw IndexError(fmt::format("{} name '{}' is not allowed (1 to 100 characters, not starting with '.', not 'last')",
                                 what, name));
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'))
      throw IndexError(fmt::format("{} name '{}' is not allowed: use letters, digits, '_', '-' and '.'", what, name));
}

namespace {

std::string describe_matches(const std::vector<RunRecord>& runs) {
  std::string text;
  for (size_t i = 0; i < runs.size() && i < 5; ++i)
    text += fmt::format("{}{} ({})", i ? ", " : "", runs[i].id, runs[i].name);
  if (runs.size() > 5) text += fmt::format(" and {} more", runs.size() - 5);
  return text;
}

}  // namespace

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buffer[256] = {};
  if (::gethostname(buffer, sizeof buffer - 1) != 0) return "unknown";
  return buffer;
}

bool is_run_status(std::string_view status) {
  return std::find(std::begin(kRunStatuses), std::end(kRunStatuses), status) != std::end(kRunStatuses);
}

std::string effective_status(const RunRecord& run, double now) {
  if (run.status != "running") return run.status;
  if (now - run.heartbeat_at > kStaleAfterSeconds) return "interrupted";
  if (run.host == host_name() && !process_alive(run.pid)) return "interrupted";
  return "running";
}

std::string effective_attempt_status(const RunRecord& run, const AttemptRecord& attempt, double now) {
  return attempt.attempt == run.attempts && attempt.status == "running" ? effective_status(run, now) : attempt.status;
}

double duration_seconds(const RunRecord& run, double now) {
  if (!run.attempt_started_at) return run.active_seconds;
  const double end = effective_status(run, now) == "running" ? now : run.heartbeat_at;
  return run.active_seconds + std::max(0.0, end - *run.attempt_started_at);
}

double wall_seconds(const RunRecord& run, double now) {
  const double end = run.ended_at ? *run.ended_at : (effective_status(run, now) == "running" ? now : run.heartbeat_at);
  return std::max(0.0, end - run.started_at);
}

RunRecord create_run(Database& db, const NewRun& spec, const std::string& home) {
  if (!spec.name.empty()) check_name(spec.name);
  const double now = now_seconds();
  const std::string key = client_key();
  for (int attempt = 0;; ++attempt) {
    std::optional<int64_t> inserted;
    // Under the index lock: the generated name reads the numbers given to the script's runs and the names in use
    // across the index, which another run's start must not take meanwhile.
    with_transaction(db, [&] {
      // A retry whose first try committed (its answer lost) finds the run it created.
      Statement created = db.prepare("SELECT run FROM runs WHERE start_key = ?");
      created.bind(1, key);
      if (created.step()) {
        inserted = created.integer(0);
        return;
      }
      created.reset();
      std::string name = spec.name;
      if (name.empty()) {
        // The next number after the highest ever given (run_name_numbers) or in use: a removed run's name is
        // not given again.
        const std::string stem = script_stem(spec.script.empty() ? "run" : spec.script);
        Statement given_last = db.prepare("SELECT last FROM run_name_numbers WHERE stem = ?");
        given_last.bind(1, stem);
        int64_t n = given_last.step() ? given_last.integer(0) : 0;
        Statement in_use = db.prepare(
            "SELECT substr(name, length(?1) + 2) FROM runs WHERE substr(name, 1, length(?1) + 1) = ?1 || '-'");
        in_use.bind(1, stem);
        while (in_use.step()) {  // names "<stem>-<digits>..." count with their leading number
          const std::string suffix = in_use.text(0);
          if (!suffix.empty() && std::isdigit(static_cast<unsigned char>(suffix[0])))
            n = std::max<int64_t>(n, std::strtoll(suffix.c_str(), nullptr, 10));
        }
        ++n;
        for (;; ++n) {
          name = fmt::format("{}-{}", stem, n);
          if (!name_taken(db, name) && !exists_on_disk(home + "/" + name)) break;
        }
        Statement given = db.prepare(
            "INSERT INTO run_name_numbers (stem, last) VALUES (?, ?) ON CONFLICT (stem) DO UPDATE SET last = "
            "excluded.last");
        given.bind(1, stem).bind(2, n);
        given.run();
      } else if (name_taken(db, name)) {
        throw IndexError(
            fmt::format("{}: a run named '{}' already exists; choose another name, continue it with "
                        "`runner --resume {} ...` or remove it with `runner rm {}`",
                        db.path(), name, name, name));
      } else if (exists_on_disk(home + "/" + name)) {
        throw IndexError(
            fmt::format("{}/{}: the run directory already exists but is not in the index; choose "
                        "another name or move the directory away",
                        home, name));
      }
      const std::string id = random_id();
      Statement clash = db.prepare("SELECT 1 FROM runs WHERE id = ?");
      clash.bind(1, id);
      if (clash.step()) return;  // retried with another id
      Statement insert = db.prepare(
          "INSERT INTO runs (id, name, status, script, script_hash, config, git_revision, git_dirty, host, pid, "
          "device, seed, world_size, versions, dir, started_at, heartbeat_at, parent, attempt_started_at, hosts, "
          "sweep, trial, start_key) "
          "VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING run");
      insert.bind(1, id)
          .bind(2, name)
          .bind(3, spec.script)
          .bind(4, spec.script_hash)
          .bind(5, core::json_text(spec.config));
      insert.bind(6, spec.git_revision);
      if (spec.git_dirty)
        insert.bind(7, static_cast<int64_t>(*spec.git_dirty));
      else
        insert.bind_null(7);
      insert.bind(8, host_name()).bind(9, static_cast<int64_t>(::getpid())).bind(10, spec.device).bind(11, spec.seed);
      insert.bind(12, spec.world_size)
          .bind(13, core::json_text(spec.versions))
          .bind(14, name)
          .bind(15, now)
          .bind(16, now);
      insert.bind(17, spec.parent).bind(18, now).bind(19, hosts_json(spec)).bind(20, spec.sweep).bind(21, spec.trial);
      insert.bind(22, key);
      insert.step();
      inserted = insert.integer(0);
      insert.reset();
      insert_attempt(db, *inserted, 1, spec, now);
    });
    if (inserted) return load_run(db, *inserted);
    if (attempt > 100) throw IndexError(fmt::format("{}: cannot find a free run id", db.path()));
  }
}

void release_run_name(Database& db, const std::string& name) {
  with_transaction(
      db,
      [&] {
        Statement release = db.prepare("UPDATE run_name_numbers SET last = last - 1 WHERE stem || '-' || last = ?");
        release.bind(1, name);
        release.run();
      },
      TransactionScope::own_rows);
}

RunRecord reopen_run(Database& db, int64_t run, const NewRun& spec) {
  const std::string key = client_key();
  with_transaction(
      db,
      [&] {
        Statement read = db.prepare(
            std::string("SELECT status, pid, host, heartbeat_at, start_key FROM runs WHERE run = ?") + db.lock_rows());
        read.bind(1, run);
        if (!read.step()) throw IndexError(fmt::format("{}: run {} is not in the index", db.path(), run));
        if (read.optional_text(4) == key) return;  // a retry whose first try committed (its answer lost)
        RunRecord current;
        current.status = read.text(0);
        current.pid = read.integer(1);
        current.host = read.text(2);
        current.heartbeat_at = read.real(3);
        if (effective_status(current, now_seconds()) == "running")
          throw IndexError(fmt::format("{}: the run is still running (pid {} on {}); it cannot be resumed twice",
                                       db.path(), current.pid, current.host));
        // An attempt whose process died without ending it counts up to its last heartbeat.
        Statement fold = db.prepare("UPDATE runs SET " + fold_attempt(db, "heartbeat_at") + " WHERE run = ?");
        fold.bind(1, run);
        fold.run();
        const double now = now_seconds();
        Statement update = db.prepare(
            "UPDATE runs SET status = 'running', error = NULL, ended_at = NULL, host = ?, pid = ?, heartbeat_at = ?, "
            "script_hash = ?, config = ?, git_revision = ?, git_dirty = ?, device = ?, versions = ?, "
            "attempts = attempts + 1, attempt_started_at = ?, world_size = ?, hosts = ?, start_key = ? WHERE run = ?");
        update.bind(1, host_name()).bind(2, static_cast<int64_t>(::getpid())).bind(3, now);
        update.bind(4, spec.script_hash).bind(5, core::json_text(spec.config)).bind(6, spec.git_revision);
        if (spec.git_dirty)
          update.bind(7, static_cast<int64_t>(*spec.git_dirty));
        else
          update.bind_null(7);
        update.bind(8, spec.device).bind(9, core::json_text(spec.versions)).bind(10, now).bind(11, spec.world_size);
        update.bind(12, hosts_json(spec)).bind(13, key).bind(14, run);
        update.run();
        Statement count = db.prepare("SELECT attempts FROM runs WHERE run = ?");
        count.bind(1, run);
        count.step();
        insert_attempt(db, run, count.integer(0), spec, now);
      },
      TransactionScope::own_rows);
  return load_run(db, run);
}

std::optional<RunRecord> latest_run_with_checkpoint(Database& db, const std::string& script,
                                                    const nlohmann::json& config) {
  Statement statement = db.prepare(
      "SELECT run FROM runs WHERE script = ? AND config = ? AND EXISTS "
      "(SELECT 1 FROM checkpoints WHERE checkpoints.run = runs.run AND kept = 1) ORDER BY started_at DESC, run DESC");
  statement.bind(1, script).bind(2, core::json_text(config));
  const double now = now_seconds();
  while (statement.step()) {
    RunRecord record = load_run(db, statement.integer(0));
    if (effective_status(record, now) != "running") return record;
  }
  return std::nullopt;
}

std::vector<AttemptRecord> run_attempts(Database& db, int64_t run) {
  Statement statement = db.prepare(
      "SELECT attempt, status, config, world_size, hosts, host, pid, device, seed, script_hash, git_revision, "
      "git_dirty, "
      "versions, start_step, end_step, started_at, ended_at, error FROM attempts WHERE run = ? ORDER BY attempt");
  statement.bind(1, run);
  std::vector<AttemptRecord> attempts;
  while (statement.step()) {
    AttemptRecord a;
    a.attempt = statement.integer(0);
    a.status = statement.text(1);
    a.config = parse_json_column(statement, 2);
    a.world_size = static_cast<int>(statement.integer(3));
    a.hosts = parse_hosts(parse_json_column(statement, 4));
    a.host = statement.text(5);
    a.pid = statement.integer(6);
    a.device = statement.text(7);
    a.seed = statement.optional_integer(8);
    a.script_hash = statement.text(9);
    a.git_revision = statement.optional_text(10);
    if (auto dirty = statement.optional_integer(11)) a.git_dirty = *dirty != 0;
    a.versions = parse_json_column(statement, 12);
    a.start_step = statement.optional_integer(13);
    a.end_step = statement.optional_integer(14);
    a.started_at = statement.optional_real(15);
    a.ended_at = statement.optional_real(16);
    a.error = statement.optional_text(17);
    attempts.push_back(std::move(a));
  }
  return attempts;
}

void set_attempt_start(Database& db, int64_t run, int64_t step) {
  with_transaction(
      db,
      [&] {
        Statement statement = db.prepare(
            "UPDATE attempts SET start_step = ?1, end_step = ?1 WHERE run = ?2 AND attempt = "
            "(SELECT attempts FROM runs WHERE run = ?2)");
        statement.bind(1, step).bind(2, run);
        statement.run();
      },
      TransactionScope::own_rows);
}

RunRecord drop_latest_attempt(Database& db, int64_t run, int64_t attempt) {
  with_transaction(
      db,
      [&] {
        Statement count = db.prepare(std::string("SELECT attempts FROM runs WHERE run = ?") + db.lock_rows());
        count.bind(1, run);
        if (!count.step()) throw IndexError(fmt::format("{}: run {} is not in the index", db.path(), run));
        const int64_t latest = count.integer(0);
        count.reset();
        if (latest < attempt) return;  // a retry whose first try committed (its answer lost)
        if (latest != attempt)
          throw IndexError(fmt::format("{}: run {} has attempt {} after attempt {}, which is not taken back", db.path(),
                                       run, latest, attempt));
        Statement earlier = db.prepare("SELECT 1 FROM attempts WHERE run = ? AND attempt = ?");
        earlier.bind(1, run).bind(2, latest - 1);
        if (!earlier.step())
          throw IndexError(
              fmt::format("{}: run {} has no attempt before attempt {} on record", db.path(), run, latest));
        Statement restore = db.prepare(
            "UPDATE runs SET (status, error, ended_at, heartbeat_at, config, world_size, hosts, host, pid, device, "
            "script_hash, git_revision, git_dirty, versions) = (SELECT a.status, a.error, a.ended_at, "
            "coalesce(a.ended_at, runs.heartbeat_at), a.config, a.world_size, a.hosts, a.host, a.pid, a.device, "
            "a.script_hash, a.git_revision, a.git_dirty, a.versions FROM attempts a WHERE a.run = ?1 AND a.attempt = "
            "?2), "
            "attempts = ?2, attempt_started_at = NULL WHERE run = ?1");
        restore.bind(1, run).bind(2, latest - 1);
        restore.run();
        Statement drop = db.prepare("DELETE FROM attempts WHERE run = ? AND attempt = ?");
        drop.bind(1, run).bind(2, latest);
        drop.run();
      },
      TransactionScope::own_rows);
  return load_run(db, run);
}

void finish_run(Database& db, int64_t run, const std::string& status, const std::optional<std::string>& error) {
  with_transaction(
      db,
      [&] {
        Statement statement = db.prepare("UPDATE runs SET status = ?1, error = ?2, ended_at = ?3, heartbeat_at = ?3, " +
                                         fold_attempt(db, "?3") + " WHERE run = ?4");
        const double now = now_seconds();
        statement.bind(1, status).bind(2, error).bind(3, now).bind(4, run);
        statement.run();
      },
      TransactionScope::own_rows);
}

void merge_summary(Database& db, int64_t run, const nlohmann::json& values) {
  with_transaction(
      db,
      [&] {
        Statement read = db.prepare(std::string("SELECT summary FROM runs WHERE run = ?") + db.lock_rows());
        read.bind(1, run);
        if (!read.step()) throw IndexError(fmt::format("{}: run {} is not in the index", db.path(), run));
        nlohmann::json summary = parse_json_column(read, 0);
        if (!summary.is_object()) summary = nlohmann::json::object();
        summary.update(values);
        Statement write = db.prepare("UPDATE runs SET summary = ? WHERE run = ?");
        write.bind(1, core::json_text(summary)).bind(2, run);
        write.run();
      },
      TransactionScope::own_rows);
}

void record_heartbeat(Database& db, int64_t run, int64_t step, double now) {
  Statement statement =
      db.prepare("UPDATE runs SET heartbeat_at = ?1, step = " + db.greatest("step", "?2") + " WHERE run = ?3");
  statement.bind(1, now).bind(2, step).bind(3, run);
  statement.run();
}

void add_run_tags(Database& db, int64_t run, const std::vector<std::string>& tags) {
  for (const std::string& tag : tags) check_name(tag, "tag");
  with_transaction(
      db,
      [&] {
        load_run(db, run);  // the run is in the index
        for (const std::string& tag : tags) {
          Statement insert = db.prepare("INSERT INTO run_tags (run, tag) VALUES (?, ?) ON CONFLICT DO NOTHING");
          insert.bind(1, run).bind(2, tag);
          insert.run();
        }
      },
      TransactionScope::own_rows);
}

void remove_run_tags(Database& db, int64_t run, const std::vector<std::string>& tags) {
  // Checked before the transaction, so that its retry after a lost answer does not find the tags gone.
  const RunRecord record = load_run(db, run);
  for (const std::string& tag : tags)
    if (std::find(record.tags.begin(), record.tags.end(), tag) == record.tags.end())
      throw IndexError(fmt::format("run {} has no tag '{}' (its tags: {})", record.name, tag,
                                   record.tags.empty() ? "none" : fmt::format("{}", fmt::join(record.tags, ", "))));
  with_transaction(
      db,
      [&] {
        for (const std::string& tag : tags) {
          Statement remove = db.prepare("DELETE FROM run_tags WHERE run = ? AND tag = ?");
          remove.bind(1, run).bind(2, tag);
          remove.run();
        }
      },
      TransactionScope::own_rows);
}

void set_run_note(Database& db, int64_t run, const std::optional<std::string>& note) {
  if (note) core::require_utf8(*note, "the note");
  with_transaction(
      db,
      [&] {
        Statement statement = db.prepare("UPDATE runs SET note = ? WHERE run = ?");
        statement.bind(1, note && !note->empty() ? note : std::nullopt).bind(2, run);
        statement.run();
      },
      TransactionScope::own_rows);
}

RunRecord load_run(Database& db, int64_t run) {
  Statement statement = db.prepare(fmt::format("SELECT {} FROM runs r WHERE r.run = ?", kRunColumns));
  statement.bind(1, run);
  if (!statement.step()) throw IndexError(fmt::format("{}: run {} is not in the index", db.path(), run));
  RunRecord record = read_run(statement);
  record.tags = run_tags(db, run);
  return record;
}

RunRecord resolve_run(Database& db, const std::string& reference, LastAmong last) {
  if (reference.empty()) throw IndexError("an empty run reference (expected an id, an id prefix, a name or 'last')");
  if (reference == "last") {
    auto runs = query_runs(db, last == LastAmong::all_runs ? "" : "WHERE r.sweep IS NULL", {});
    if (!runs.empty()) return runs.front();
    if (last == LastAmong::runs_outside_sweeps && !query_runs(db, "WHERE r.sweep IS NOT NULL", {}).empty())
      throw IndexError(
          fmt::format("{}: every run was started by a sweep, so 'last' matches nothing ('last --sweep' "
                      "is the newest sweep trial)",
                      db.path()));
    throw IndexError(fmt::format("{}: there are no runs yet, so 'last' matches nothing", db.path()));
  }
  auto exact = query_runs(db, "WHERE r.id = ?1 OR r.name = ?1", {reference});
  if (exact.size() == 1) return exact.front();
  if (exact.size() > 1)
    throw IndexError(fmt::format("run '{}' is ambiguous: it is the id of one run and the name of another ({})",
                                 reference, describe_matches(exact)));
  auto prefixed = query_runs(db, "WHERE substr(r.id, 1, length(?1)) = ?1", {reference});
  if (prefixed.size() == 1) return prefixed.front();
  if (prefixed.size() > 1)
    throw IndexError(fmt::format("run prefix '{}' is ambiguous: it matches {} runs: {}", reference, prefixed.size(),
                                 describe_matches(prefixed)));
  throw IndexError(
      fmt::format("no run matches '{}' (give an id, a unique id prefix, a name or 'last'; `runner runs` "
                  "lists them)",
                  reference));
}

RunRecord resolve_fork_source(Database& db, const std::string& reference) {
  if (reference != "last") return resolve_run(db, reference);
  auto runs = query_runs(
      db, "WHERE r.sweep IS NULL AND EXISTS (SELECT 1 FROM checkpoints c WHERE c.run = r.run AND c.kept = 1)", {});
  if (runs.empty())
    throw IndexError(fmt::format("{}: no run has a checkpoint yet, so fork 'last' matches nothing", db.path()));
  return runs.front();
}

std::vector<RunRecord> list_runs(Database& db, const RunFilter& filter) {
  std::string where;
  std::vector<std::string> texts;
  auto add = [&](const std::string& condition) { where += (where.empty() ? "WHERE " : " AND ") + condition; };
  if (filter.started_after) add(fmt::format("r.started_at >= {:.6f}", *filter.started_after));
  if (filter.sweep) add(fmt::format("r.sweep = {}", *filter.sweep));
  auto runs = query_runs(db, where, texts);
  const double now = now_seconds();
  std::vector<RunRecord> kept;
  for (auto& run : runs) {
    if (filter.status && effective_status(run, now) != *filter.status) continue;
    // SQLite's GLOB in both dialects: '*', '?' and '[...]', case-sensitive, '/' not special.
    if (filter.name_glob && ::fnmatch(filter.name_glob->c_str(), run.name.c_str(), 0) != 0) continue;
    if (filter.limit && static_cast<int64_t>(kept.size()) >= *filter.limit) break;
    kept.push_back(std::move(run));
  }
  return kept;
}

int reap_stale_runs(Database& db, double now, const std::string& home) {
  auto running = query_runs(db, "WHERE r.status = 'running'", {});
  int reaped = 0;
  for (const auto& run : running) {
    if (effective_status(run, now) != "interrupted") continue;
    if (const std::optional<FinalStatus> recorded = read_final_status(home + "/" + run.dir)) {
      // The process wrote its final status beside the index, which could not take it then.
      with_transaction(
          db,
          [&] {
            Statement statement =
                db.prepare("UPDATE runs SET status = ?1, error = ?2, ended_at = ?3, " + fold_attempt(db, "?3") +
                           " WHERE run = ?4 AND status = 'running' AND heartbeat_at = ?5");
            statement.bind(1, recorded->status)
                .bind(2, recorded->error)
                .bind(3, recorded->ended_at)
                .bind(4, run.run)
                .bind(5, run.heartbeat_at);
            statement.run();
            reaped += db.changes();
          },
          TransactionScope::own_rows);
      continue;
    }
    with_transaction(
        db,
        [&] {
          reaped += interrupt_silent_run(db, run.run, run.heartbeat_at,
                                         "the process stopped without finishing the run (killed or crashed)");
        },
        TransactionScope::own_rows);
  }
  return reaped;
}

bool interrupt_silent_run(Database& db, int64_t run, double heartbeat_at, const std::string& error) {
  Statement statement = db.prepare(
      "UPDATE runs SET status = 'interrupted', ended_at = heartbeat_at, " + fold_attempt(db, "heartbeat_at") +
      ", error = coalesce(error, ?) WHERE run = ? AND status = 'running' AND heartbeat_at = ?");
  statement.bind(1, error).bind(2, run).bind(3, heartbeat_at);
  statement.run();
  return db.changes() > 0;
}

}  // namespace runner::index
