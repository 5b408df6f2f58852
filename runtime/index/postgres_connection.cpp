// The PostgreSQL connection of the index (libpq): `?` / `?N` parameters sent as $N with their types, write
// transactions serialised by an advisory lock like SQLite's BEGIN IMMEDIATE, sessions bounded by timeouts and TCP
// keepalives, waiting for a server that is away, sessions given up ended by the next, and read-only queries in a
// READ ONLY transaction.
#include <libpq-fe.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fmt/format.h>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "runtime/core/duration_text.h"
#include "runtime/core/environment_seconds.h"
#include "runtime/core/logging.h"
#include "runtime/index/connection.h"

namespace runner::index {
namespace {

// The advisory lock that TransactionScope::index takes: "rnnr", the application id of the SQLite index.
constexpr int64_t kIndexLock = 0x726e6e72;
// How often a writer waiting for the server says so.
constexpr double kWaitingMessageSeconds = 5;
// How long past its statement timeout a server may take to answer before it is taken for gone (hung, or its
// host's network lost in a way TCP does not report).
constexpr double kAnswerGraceSeconds = 10;
// How often a session given up that could not be ended is asked after while it is waited for.
constexpr auto kSessionPollInterval = std::chrono::milliseconds(250);
// How many times a statement runs again after waiting for a lock of a session this process lost.
constexpr int kLostSessionRetries = 3;

using Clock = std::chrono::steady_clock;

// A session of runner's on the server: its backend's pid and start (the pid alone may be a later backend's).
struct Session {
  int64_t pid = 0;
  double started = 0;  // backend_start, Unix seconds
};

// What the connections of this process know of each other, per server and database (their URL as shown). The
// sessions they gave up with a lost connection: the server may keep one, and the locks of its open transaction, until
// its idle timeout ends it (an answer lost in the network: the server does not learn that the client went away); the
// next session set up on that server ends them. And the connections that await an answer now: a writer whose
// statement timed out waiting for a lock while another connection of the process waited for an answer that never came
// waits for that one to give its session up, then ends it and runs its transaction again.
class ProcessSessions {
 public:
  static ProcessSessions& shared() {
    static ProcessSessions* sessions = new ProcessSessions;  // never destroyed: connections may outlive statics
    return *sessions;
  }

  void give_up(const std::string& server, const Session& session) {
    std::lock_guard lock(mutex_);
    given_up_[server].push_back(session);
    ++ever_given_up_[server];
  }

  // Puts back sessions taken that could not be ended.
  void give_back(const std::string& server, const std::vector<Session>& sessions) {
    std::lock_guard lock(mutex_);
    std::vector<Session>& kept = given_up_[server];
    kept.insert(kept.end(), sessions.begin(), sessions.end());
  }

  // How many sessions were given up on `server` so far, and whether some of them are not ended yet.
  uint64_t ever_given_up(const std::string& server) {
    std::lock_guard lock(mutex_);
    return ever_given_up_[server];
  }
  bool some_given_up(const std::string& server) {
    std::lock_guard lock(mutex_);
    return given_up_.count(server) > 0;
  }

  // The sessions given up on `server`, from now on the caller's to end.
  std::vector<Session> take_given_up(const std::string& server) {
    std::lock_guard lock(mutex_);
    const auto found = given_up_.find(server);
    if (found == given_up_.end()) return {};
    std::vector<Session> sessions = std::move(found->second);
    given_up_.erase(found);
    return sessions;
  }

  void awaiting_answer(const void* connection, const std::string& server) {
    std::lock_guard lock(mutex_);
    awaiting_[connection] = server;
  }

  void answered(const void* connection) {
    {
      std::lock_guard lock(mutex_);
      awaiting_.erase(connection);
    }
    answered_.notify_all();
  }

  bool others_awaiting_answers(const void* connection, const std::string& server) {
    std::lock_guard lock(mutex_);
    return others_awaiting(connection, server);
  }

  // Waits until no other connection to `server` awaits an answer (each has it, or gives its session up, by its own
  // deadline), or until `limit`.
  void wait_for_answers(const void* connection, const std::string& server, Clock::time_point limit) {
    std::unique_lock lock(mutex_);
    answered_.wait_until(lock, limit, [&] { return !others_awaiting(connection, server); });
  }

 private:
  bool others_awaiting(const void* connection, const std::string& server) const {
    for (const auto& [other, other_server] : awaiting_)
      if (other != connection && other_server == server) return true;
    return false;
  }

  std::mutex mutex_;
  std::condition_variable answered_;
  std::map<std::string, std::vector<Session>> given_up_;
  std::map<std::string, uint64_t> ever_given_up_;
  std::map<const void*, std::string> awaiting_;
};

// The limits of runner's sessions (README, "The index on PostgreSQL"): RUNNER_INDEX_* variables in seconds over
// these defaults. The URL's own parameters (connect_timeout, options=-c ...) win over them.
struct SessionLimits {
  double connect = 10;     // RUNNER_INDEX_CONNECT_TIMEOUT: libpq's connect_timeout
  double idle = 60;        // RUNNER_INDEX_IDLE_TIMEOUT: idle_in_transaction_session_timeout
  double statement = 600;  // RUNNER_INDEX_STATEMENT_TIMEOUT: statement_timeout (waits for the index lock included)
  double wait = 600;       // RUNNER_INDEX_WAIT: how long a writer waits for a server that is away
};

// core::seconds_from_environment, its error an IndexError.
double seconds_from_environment(const char* name, double fallback) {
  try {
    return core::seconds_from_environment(name, fallback);
  } catch (const std::invalid_argument& error) {
    throw IndexError(error.what());
  }
}

SessionLimits session_limits() {
  SessionLimits limits;
  limits.connect = seconds_from_environment("RUNNER_INDEX_CONNECT_TIMEOUT", limits.connect);
  limits.idle = seconds_from_environment("RUNNER_INDEX_IDLE_TIMEOUT", limits.idle);
  limits.statement = seconds_from_environment("RUNNER_INDEX_STATEMENT_TIMEOUT", limits.statement);
  limits.wait = seconds_from_environment("RUNNER_INDEX_WAIT", limits.wait);
  return limits;
}

int64_t milliseconds(double seconds) { return static_cast<int64_t>(std::ceil(seconds * 1000)); }

Clock::duration duration(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// The value of one of the URL's own parameters ("" when it sets none, or is not a URL libpq reads: connecting
// then says why).
std::string url_parameter(const std::string& url, const char* keyword) {
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(url.c_str(), &error);
  if (!options) {
    PQfreemem(error);
    return "";
  }
  std::string value;
  for (const PQconninfoOption* option = options; option->keyword; ++option)
    if (std::strcmp(option->keyword, keyword) == 0 && option->val) value = option->val;
  PQconninfoFree(options);
  return value;
}

// Starts a connection with runner's limits under the URL's parameters. TCP keepalives find a server that went
// away while a reply is awaited (in under a minute); the server ends a session idle inside a transaction (and so frees
// the index lock that transaction holds) and a statement, lock waits included, that runs too long. The session options
// are runner's, then PGOPTIONS, then the URL's `options` (PostgreSQL takes the last of a setting).
PGconn* start_connection(const std::string& url, const SessionLimits& limits) {
  std::string options = fmt::format("-c statement_timeout={} -c idle_in_transaction_session_timeout={}",
                                    milliseconds(limits.statement), milliseconds(limits.idle));
  if (const char* more = std::getenv("PGOPTIONS"); more && *more) options += std::string(" ") + more;
  const std::string url_options = url_parameter(url, "options");
  const std::string all_options = url_options.empty() ? "" : options + " " + url_options;
  // Whole seconds; libpq takes 1 for 2.
  const std::string connect_timeout = std::to_string(std::max<int64_t>(2, std::llround(std::ceil(limits.connect))));
  // Entries before the URL (dbname, expanded) are overridden by its parameters; the empty last one is ignored.
  const char* keywords[] = {"connect_timeout",  "keepalives",
                            "keepalives_idle",  "keepalives_interval",
                            "keepalives_count", "tcp_user_timeout",
                            "options",          "dbname",
                            "options",          nullptr};
  const char* values[] = {connect_timeout.c_str(), "1",    "10", "5", "3", "30000", options.c_str(), url.c_str(),
                          all_options.c_str(),     nullptr};
  return PQconnectdbParams(keywords, values, 1);
}

std::string time_of_day(std::chrono::system_clock::time_point when) {
  const std::time_t time = std::chrono::system_clock::to_time_t(when);
  std::tm local{};
  localtime_r(&time, &local);
  char text[16];
  std::strftime(text, sizeof text, "%H:%M:%S", &local);
  return text;
}

// Type OIDs (pg_type.dat).
constexpr Oid kBool = 16, kInt8 = 20, kInt2 = 21, kInt4 = 23, kText = 25, kOid = 26, kFloat4 = 700, kFloat8 = 701,
              kNumeric = 1700;

// `?` and `?N` (SQLite's parameters) as `$N`, outside quotes and comments; `$N` stays. Returns the number of
// parameters (the highest N).
int translate_parameters(std::string_view sql, std::string& out) {
  out.clear();
  out.reserve(sql.size() + 16);
  int highest = 0;
  for (size_t i = 0; i < sql.size(); ++i) {
    const char c = sql[i];
    if (c == '\'' || c == '"') {
      const size_t end = sql.find(c, i + 1);
      const size_t stop = end == std::string_view::npos ? sql.size() : end + 1;
      out.append(sql.substr(i, stop - i));
      i = stop - 1;
    } else if (c == '-' && i + 1 < sql.size() && sql[i + 1] == '-') {
      const size_t end = sql.find('\n', i);
      const size_t stop = end == std::string_view::npos ? sql.size() : end;
      out.append(sql.substr(i, stop - i));
      i = stop - 1;
    } else if (c == '/' && i + 1 < sql.size() && sql[i + 1] == '*') {
      const size_t end = sql.find("*/", i + 2);
      const size_t stop = end == std::string_view::npos ? sql.size() : end + 2;
      out.append(sql.substr(i, stop - i));
      i = stop - 1;
    } else if (c == '?' || (c == '$' && i + 1 < sql.size() && std::isdigit(static_cast<unsigned char>(sql[i + 1])))) {
      size_t j = i + 1;
      while (j < sql.size() && std::isdigit(static_cast<unsigned char>(sql[j]))) ++j;
      const int number = j > i + 1 ? std::atoi(std::string(sql.substr(i + 1, j - i - 1)).c_str()) : highest + 1;
      highest = std::max(highest, number);
      out += fmt::format("${}", number);
      i = j - 1;
    } else {
      out += c;
    }
  }
  return highest;
}

// libpq's message on one line: line breaks and the tabs that indent its hints as single spaces.
std::string one_line(const std::string& message) {
  std::string line;
  for (const char c : message) {
    const bool space = c == '\n' || c == '\t' || c == ' ';
    if (!space)
      line += c;
    else if (!line.empty() && line.back() != ' ')
      line += ' ';
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line;
}

std::string sql_state(const PGresult* result) {
  const char* state = result ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : nullptr;
  return state ? state : "";
}

// Connection exceptions (class 08) and the server shutting down or restarting (57P01-57P03).
bool connection_failure(PGconn* conn, const PGresult* result) {
  if (PQstatus(conn) == CONNECTION_BAD) return true;
  const std::string state = sql_state(result);
  return state.rfind("08", 0) == 0 || state == "57P01" || state == "57P02" || state == "57P03";
}

struct ResultDeleter {
  void operator()(PGresult* result) const { PQclear(result); }
};
using Result = std::unique_ptr<PGresult, ResultDeleter>;

class PostgresConnection;

class PostgresStatement final : public StatementImpl {
 public:
  PostgresStatement(PostgresConnection& db, std::string_view sql);

  void bind(int position, BoundValue value) override {
    if (position < 1 || position > static_cast<int>(values_.size()))
      throw IndexError(
          fmt::format("SQL error: parameter {} of a statement with {} parameters", position, values_.size()));
    values_[static_cast<size_t>(position - 1)] = std::move(value);
  }
  bool step() override;
  void reset() override {
    result_.reset();
    row_ = -1;
    for (BoundValue& value : values_) value = BoundValue{};
  }
  int column_count() const override { return result_ ? PQnfields(result_.get()) : 0; }
  std::string column_name(int column) const override { return PQfname(result_.get(), column); }
  ColumnType column_type(int column) const override {
    if (PQgetisnull(result_.get(), row_, column)) return ColumnType::null;
    switch (PQftype(result_.get(), column)) {
      case kInt2:
      case kInt4:
      case kInt8:
      case kOid:
      case kBool:
        return ColumnType::integer;
      case kFloat4:
      case kFloat8:
      case kNumeric:
        return ColumnType::real;
      default:
        return ColumnType::text;
    }
  }
  int64_t integer(int column) const override {
    const char* text = PQgetvalue(result_.get(), row_, column);
    if (PQftype(result_.get(), column) == kBool) return text[0] == 't' ? 1 : 0;
    if (std::strpbrk(text, ".eEIN")) return static_cast<int64_t>(std::strtod(text, nullptr));
    return std::strtoll(text, nullptr, 10);
  }
  double real(int column) const override { return std::strtod(PQgetvalue(result_.get(), row_, column), nullptr); }
  std::string text(int column) const override {
    return std::string(PQgetvalue(result_.get(), row_, column),
                       static_cast<size_t>(PQgetlength(result_.get(), row_, column)));
  }

 private:
  PostgresConnection& db_;
  std::string sql_;
  std::vector<BoundValue> values_;
  Result result_;
  int row_ = -1;
};

class PostgresConnection final : public Connection {
 public:
  PostgresConnection(const std::string& url, const std::string& shown, bool read_only)
      : shown_(shown), read_only_(read_only), limits_(session_limits()) {
    conn_ = start_connection(url, limits_);
    if (PQstatus(conn_) != CONNECTION_OK) {
      // A writer waits for a server that is restarting; a reader (a command) says at once that it is not there.
      std::string message = fmt::format("{}: cannot connect to the index server at {}: {}", shown_, server(), reason());
      if (timed_out())
        message += fmt::format(" (no answer within {} s: RUNNER_INDEX_CONNECT_TIMEOUT, or connect_timeout in the URL)",
                               connect_timeout());
      if (read_only_) throw IndexUnreachable(message);
      if (!server_away()) throw IndexError(message);
      wait_for_server();
      return;
    }
    set_up_session();
  }
  ~PostgresConnection() override {
    if (PQstatus(conn_) != CONNECTION_OK) give_up_session();
    PQfinish(conn_);
  }

  Backend backend() const override { return Backend::postgresql; }
  PGconn* handle() const { return conn_; }
  const std::string& shown() const { return shown_; }
  bool in_transaction() const { return in_transaction_; }
  std::string error() const { return one_line(PQerrorMessage(conn_)); }

  // Sends one statement with its parameters; the result (or none) as answer() gives it.
  Result send(const std::string& sql, const std::vector<BoundValue>& values, double answer_seconds) {
    std::vector<Oid> types(values.size());
    std::vector<std::string> texts(values.size());
    std::vector<const char*> pointers(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      const BoundValue& value = values[i];
      switch (value.kind) {
        case BoundValue::Kind::null:
          types[i] = 0;
          pointers[i] = nullptr;
          continue;
        case BoundValue::Kind::integer:
          types[i] = kInt8;
          texts[i] = std::to_string(value.integer);
          break;
        case BoundValue::Kind::real:
          types[i] = kFloat8;
          texts[i] = std::isnan(value.real)   ? "NaN"
                     : std::isinf(value.real) ? (value.real > 0 ? "Infinity" : "-Infinity")
                                              : fmt::format("{:.17g}", value.real);
          break;
        case BoundValue::Kind::text:
          types[i] = kText;
          texts[i] = value.text;
          break;
      }
      pointers[i] = texts[i].c_str();
    }
    if (!PQsendQueryParams(conn_, sql.c_str(), static_cast<int>(values.size()), types.data(), pointers.data(), nullptr,
                           nullptr, 0))
      return nullptr;
    return answer(answer_seconds);
  }

  // Sends statements without parameters (several, separated by ';'); the result as answer() gives it.
  Result send(const std::string& sql) { return PQsendQuery(conn_, sql.c_str()) ? answer(statement_seconds_) : nullptr; }

  // The server's answer to what was just sent: the first failed statement's result, or else the last one. A server
  // that says nothing for `timeout_seconds` (0: no limit; its own statement timeout ends a statement before) and
  // kAnswerGraceSeconds more is taken for gone: the socket is shut (the next use connects again) and the
  // statement is an IndexConnectionLost saying so.
  Result answer(double timeout_seconds) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds + kAnswerGraceSeconds);
    // A writer's wait is known to the process's other connections (ProcessSessions) until it ends either way.
    struct Awaiting {
      const PostgresConnection* connection;
      ~Awaiting() {
        if (connection) ProcessSessions::shared().answered(connection);
      }
    } awaiting{read_only_ ? nullptr : this};
    if (!read_only_) ProcessSessions::shared().awaiting_answer(this, shown_);
    while (PQisBusy(conn_)) {
      int wait_ms = -1;
      if (timeout_seconds > 0)
        wait_ms = static_cast<int>(std::max<int64_t>(
            0, std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count()));
      pollfd socket{PQsocket(conn_), POLLIN, 0};
      const int ready = ::poll(&socket, 1, wait_ms);
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) {
        ::shutdown(PQsocket(conn_), SHUT_RDWR);
        PQconsumeInput(conn_);  // reads the end of the connection: CONNECTION_BAD from here on
        throw lost(
            fmt::format("the index server at {} did not answer in {} (RUNNER_INDEX_STATEMENT_TIMEOUT, or "
                        "statement_timeout in the URL's options, and {:g} s more)",
                        server(), core::duration_text(timeout_seconds + kAnswerGraceSeconds), kAnswerGraceSeconds));
      }
      if (!PQconsumeInput(conn_)) break;  // PQgetResult reports the connection's failure
    }
    Result kept;
    while (PGresult* next = PQgetResult(conn_)) {
      Result result(next);
      if (!kept || succeeded(kept)) kept = std::move(result);
    }
    return kept;
  }

  static bool succeeded(const Result& result) {
    const ExecStatusType status = result ? PQresultStatus(result.get()) : PGRES_FATAL_ERROR;
    return status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK;
  }

  // Runs a statement with parameters; a lost connection outside a transaction is reconnected and the
  // statement sent again (once), inside one it is an IndexConnectionLost for with_transaction to retry. So is a
  // statement that timed out waiting for a lock of a session this process lost (ran_into_lost_session).
  Result run(const std::string& sql, const std::vector<BoundValue>& values) {
    for (int attempt = 0;; ++attempt) {
      if (PQstatus(conn_) == CONNECTION_BAD) {
        if (in_transaction_) throw lost("the connection to the server was lost");
        reconnect();
      }
      Result result = send(sql, values, statement_seconds_);
      if (succeeded(result)) {
        const char* tuples = PQcmdTuples(result.get());
        changes_ = tuples && *tuples ? std::atoi(tuples) : 0;
        return result;
      }
      if (connection_failure(conn_, result.get())) {
        if (in_transaction_ || attempt > 0) throw lost(result ? PQresultErrorMessage(result.get()) : error());
        continue;
      }
      if (attempt < kLostSessionRetries && ran_into_lost_session(result.get())) {
        if (in_transaction_) throw held_up_by_lost_session(result.get());
        continue;
      }
      throw IndexError(fmt::format("{}: SQL error: {}", shown_, failure(result.get())));
    }
  }

  void execute(std::string_view sql) override {
    for (int attempt = 0;; ++attempt) {
      if (PQstatus(conn_) == CONNECTION_BAD && !in_transaction_) reconnect();
      Result result = send(std::string(sql));
      const ExecStatusType status = result ? PQresultStatus(result.get()) : PGRES_FATAL_ERROR;
      if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) return;
      if (connection_failure(conn_, result.get())) {
        if (in_transaction_ || attempt > 0) throw lost(result ? PQresultErrorMessage(result.get()) : error());
        continue;
      }
      if (attempt < kLostSessionRetries && ran_into_lost_session(result.get())) {
        if (in_transaction_) throw held_up_by_lost_session(result.get());
        continue;  // BEGIN and the index lock (begin()) again
      }
      throw IndexError(fmt::format("{}: {}", shown_, failure(result.get())));
    }
  }

  std::unique_ptr<StatementImpl> prepare(std::string_view sql) override {
    return std::make_unique<PostgresStatement>(*this, sql);
  }

  int changes() const override { return changes_; }

  void begin(TransactionScope scope) override {
    if (PQstatus(conn_) == CONNECTION_BAD) reconnect();
    // BEGIN and the index lock in one round trip. The lock belongs to the transaction: commit, rollback or the
    // server ending the session (idle_in_transaction_session_timeout) releases it.
    try {
      execute(scope == TransactionScope::index ? fmt::format("BEGIN; SELECT pg_advisory_xact_lock({})", kIndexLock)
                                               : std::string("BEGIN"));
    } catch (...) {
      rollback();
      throw;
    }
    in_transaction_ = true;
  }

  void commit() override {
    in_transaction_ = false;
    Result result = send("COMMIT");
    if (result && PQresultStatus(result.get()) == PGRES_COMMAND_OK) return;
    if (connection_failure(conn_, result.get())) throw lost(result ? PQresultErrorMessage(result.get()) : error());
    throw IndexError(fmt::format("{}: cannot commit: {}", shown_, failure(result.get())));
  }

  void rollback() noexcept override {
    in_transaction_ = false;
    if (PQstatus(conn_) != CONNECTION_OK) return;
    try {
      send("ROLLBACK");
    } catch (const IndexError&) {  // a server that does not answer: the connection is dropped, and the transaction
    }
  }

  // A connection that is fine (a transaction that waited for a lost session's lock) stays as it is.
  void reconnect() override {
    in_transaction_ = false;
    if (PQstatus(conn_) == CONNECTION_OK) return;
    give_up_session();
    PQreset(conn_);
    if (PQstatus(conn_) == CONNECTION_OK) {
      set_up_session();
      return;
    }
    if (!server_away())
      throw IndexError(
          fmt::format("{}: the connection to the index was lost and cannot be made again: {}", shown_, error()));
    wait_for_server();
  }

  void tidy_after_deleting() override {}

  QueryResult read_query(const std::string& sql, const std::vector<SqlValue>& parameters,
                         const QueryLimits& limits) override;

 private:
  // Whether the server is (for now) away, rather than refusing us: worth waiting for.
  bool server_away() const {
    const std::string text = PQerrorMessage(conn_);
    return text.find("Connection refused") != std::string::npos ||
           text.find("No such file or directory") != std::string::npos ||
           text.find("starting up") != std::string::npos || text.find("shutting down") != std::string::npos ||
           text.find("recovery mode") != std::string::npos || timed_out() ||
           text.find("server closed the connection") != std::string::npos ||
           text.find("Connection reset") != std::string::npos || text.find("No route to host") != std::string::npos ||
           text.find("Network is unreachable") != std::string::npos;
  }

  bool timed_out() const { return std::strstr(PQerrorMessage(conn_), "timeout expired") != nullptr; }

  // The server this connection is for, as host:port (a Unix socket's folder for the host).
  std::string server() const {
    const char* host = PQhost(conn_);
    const char* port = PQport(conn_);
    return fmt::format("{}:{}", host && *host ? host : "localhost", port && *port ? port : "5432");
  }

  // Why the latest attempt to connect failed, without libpq's "connection to server at ... failed: " and hints.
  std::string reason() const {
    std::string text = PQerrorMessage(conn_);
    text = text.substr(0, text.find('\n'));
    if (const size_t failed = text.find("failed: "); failed != std::string::npos) text.erase(0, failed + 8);
    return one_line(text);
  }

  // The connect_timeout in force (runner's, or the URL's own).
  std::string connect_timeout() const {
    std::string value;
    if (PQconninfoOption* options = PQconninfo(conn_)) {
      for (const PQconninfoOption* option = options; option->keyword; ++option)
        if (std::strcmp(option->keyword, "connect_timeout") == 0 && option->val) value = option->val;
      PQconninfoFree(options);
    }
    return value;
  }

  // Waits for a server that is away (down, restarting, unreachable) up to RUNNER_INDEX_WAIT, saying every few
  // seconds what it waits for and until when; an IndexError when it does not come back in that time.
  void wait_for_server() {
    const auto start = std::chrono::steady_clock::now();
    const auto until = std::chrono::system_clock::now() + std::chrono::milliseconds(milliseconds(limits_.wait));
    auto pause = std::chrono::milliseconds(200);
    double said_at = 0;
    core::log(core::LogLevel::warn,
              fmt::format("{}: the index server does not answer at {} ({}); waiting for it until {} ({}, "
                          "RUNNER_INDEX_WAIT)",
                          shown_, server(), reason(), time_of_day(until), core::duration_text(limits_.wait)));
    give_up_session();
    while (true) {
      const auto left = std::chrono::duration<double>(limits_.wait) - (std::chrono::steady_clock::now() - start);
      std::this_thread::sleep_for(
          std::max(std::chrono::duration<double>(0), std::min<std::chrono::duration<double>>(pause, left)));
      pause = std::min(pause * 2, std::chrono::milliseconds(2000));
      PQreset(conn_);
      if (PQstatus(conn_) == CONNECTION_OK) {
        set_up_session();
        core::log(core::LogLevel::info, fmt::format("{}: connected to the index server at {}", shown_, server()));
        return;
      }
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!server_away() || waited >= limits_.wait)
        throw IndexError(fmt::format("{}: the index server at {} did not answer in {} (RUNNER_INDEX_WAIT): {}", shown_,
                                     server(), core::duration_text(waited), reason()));
      if (waited - said_at >= kWaitingMessageSeconds) {
        said_at = waited;
        core::log(core::LogLevel::warn,
                  fmt::format("{}: still waiting for the index server at {} ({}), {} so far, until {}", shown_,
                              server(), reason(), core::duration_text(waited), time_of_day(until)));
      }
    }
  }

  // Sets the session up, learns who it is on the server, and ends the sessions this process gave up there.
  void set_up_session() {
    PQsetNoticeProcessor(
        conn_, [](void*, const char*) {}, nullptr);
    std::string setup = "SET client_min_messages = warning";
    if (read_only_) setup += "; SET default_transaction_read_only = on";
    // The timeouts in force (runner's or the URL's): the statement timeout bounds the wait for each answer.
    setup +=
        "; SELECT extract(epoch FROM current_setting('statement_timeout')::interval), "
        "extract(epoch FROM current_setting('idle_in_transaction_session_timeout')::interval), pg_backend_pid(), "
        "(SELECT extract(epoch FROM backend_start)::float8 FROM pg_stat_activity WHERE pid = pg_backend_pid())";
    statement_seconds_ = limits_.statement;
    Result result = send(setup);
    if (!result || PQresultStatus(result.get()) != PGRES_TUPLES_OK)
      throw IndexError(fmt::format("{}: cannot set up the session: {}", shown_, message(result.get())));
    statement_seconds_ = std::strtod(PQgetvalue(result.get(), 0, 0), nullptr);
    idle_seconds_ = std::strtod(PQgetvalue(result.get(), 0, 1), nullptr);
    session_.reset();
    if (!PQgetisnull(result.get(), 0, 3))
      session_ = Session{std::strtoll(PQgetvalue(result.get(), 0, 2), nullptr, 10),
                         std::strtod(PQgetvalue(result.get(), 0, 3), nullptr)};
    end_sessions_given_up();
  }

  // This connection's session, once its connection is lost or reset, for the next session on the server to end: the
  // server may keep it (and its transaction's locks) until its idle timeout when it did not see the connection go.
  void give_up_session() {
    if (!session_) return;
    ProcessSessions::shared().give_up(shown_, *session_);
    session_.reset();
  }

  // Ends the sessions this process gave up on this server, and with them their transactions and the locks those hold
  // (pg_terminate_backend, which a role may call on its own sessions).
  void end_sessions_given_up() {
    std::vector<Session> sessions = ProcessSessions::shared().take_given_up(shown_);
    for (size_t i = 0; i < sessions.size(); ++i) {
      try {
        end_session(sessions[i]);
      } catch (...) {
        ProcessSessions::shared().give_back(shown_,
                                            {sessions.begin() + static_cast<std::ptrdiff_t>(i), sessions.end()});
        throw;
      }
    }
  }

  // Ends one session given up (already gone: nothing to do). One that cannot be ended (a role not allowed to) is
  // waited for until it is out of its transaction, which the server's timeouts end.
  void end_session(const Session& session) {
    std::vector<BoundValue> identity(2);
    identity[0].kind = BoundValue::Kind::integer;
    identity[0].integer = session.pid;
    identity[1].kind = BoundValue::Kind::real;
    identity[1].real = session.started;
    const std::string that_session =
        " FROM pg_stat_activity WHERE pid = $1 AND abs(extract(epoch FROM backend_start)::float8 - $2) < 0.001 "
        "AND pid <> pg_backend_pid()";
    Result ended = send("SELECT pg_terminate_backend(pid)" + that_session, identity, statement_seconds_);
    if (succeeded(ended)) {
      if (PQntuples(ended.get()) > 0)
        core::log(core::LogLevel::info,
                  fmt::format("{}: ended the session that this process gave up at {} (backend {}), and its transaction",
                              shown_, server(), session.pid));
      return;
    }
    if (connection_failure(conn_, ended.get())) throw lost(ended ? PQresultErrorMessage(ended.get()) : error());
    const double limit = statement_seconds_ > 0 && idle_seconds_ > 0
                             ? statement_seconds_ + idle_seconds_ + kAnswerGraceSeconds
                             : limits_.wait;
    const auto until = Clock::now() + duration(limit);
    core::log(core::LogLevel::warn,
              fmt::format("{}: waiting until {} at the latest for the session that this process lost at {} (backend "
                          "{}) to end its transaction: it cannot be ended ({})",
                          shown_, time_of_day(std::chrono::system_clock::now() + duration(limit)), server(),
                          session.pid, message(ended.get())));
    while (Clock::now() < until) {
      Result open = send("SELECT 1" + that_session + " AND xact_start IS NOT NULL", identity, statement_seconds_);
      if (!succeeded(open)) {
        if (connection_failure(conn_, open.get())) throw lost(open ? PQresultErrorMessage(open.get()) : error());
        return;  // cannot tell: the statements that need its locks wait for them as for any other writer's
      }
      if (PQntuples(open.get()) == 0) return;
      std::this_thread::sleep_for(kSessionPollInterval);
    }
  }

  // A write's statement stopped by the statement timeout may have waited for a lock of a session this process lost:
  // one given up and not ended yet, or one whose answer another connection of the process still awaits (an answer lost
  // in the network is given up only 10 s after the statement timeout). Then the statement's transaction is rolled
  // back, the other connections' answers (or their giving up) are waited for, and if a session was lost the sessions
  // given up are ended and true says to run the statement (or its transaction) again.
  bool ran_into_lost_session(const PGresult* result) {
    if (read_only_ || sql_state(result) != "57014") return false;
    ProcessSessions& sessions = ProcessSessions::shared();
    const uint64_t lost_before = sessions.ever_given_up(shown_);
    const bool unended = sessions.some_given_up(shown_);
    if (!unended && !sessions.others_awaiting_answers(this, shown_)) return false;
    send("ROLLBACK");
    sessions.wait_for_answers(
        this, shown_,
        Clock::now() + duration(statement_seconds_ > 0 ? statement_seconds_ + kAnswerGraceSeconds : limits_.wait));
    if (!unended && sessions.ever_given_up(shown_) == lost_before) return false;  // a wait for another writer
    core::log(core::LogLevel::warn,
              fmt::format("{}: a statement waited past the statement timeout while a session that this process lost "
                          "held locks; it runs again once that session is ended",
                          shown_));
    end_sessions_given_up();
    return true;
  }

  IndexConnectionLost held_up_by_lost_session(const PGresult* result) const {
    return IndexConnectionLost(fmt::format("{}: {}; a session this process lost may have held the lock it waited for",
                                           shown_, failure(result)));
  }

  std::string message(const PGresult* result) const {
    const char* primary = result ? PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY) : nullptr;
    return primary ? one_line(primary) : error();
  }

  // A failed statement's message, with the setting that stopped it when it was runner's statement timeout.
  std::string failure(const PGresult* result) const {
    if (sql_state(result) == "57014")  // query_canceled: nothing else cancels runner's own statements
      return message(result) +
             " (RUNNER_INDEX_STATEMENT_TIMEOUT, or statement_timeout in the URL's options; a wait for another "
             "writer's transaction counts)";
    return message(result);
  }

  // A connection taken for lost is closed (if the server has not closed it) and its session given up.
  IndexConnectionLost lost(const std::string& what) {
    if (PQstatus(conn_) == CONNECTION_OK) {
      ::shutdown(PQsocket(conn_), SHUT_RDWR);
      PQconsumeInput(conn_);
    }
    give_up_session();
    return IndexConnectionLost(fmt::format("{}: the connection to the index was lost: {}", shown_, one_line(what)));
  }

  PGconn* conn_ = nullptr;
  std::string shown_;
  bool read_only_ = false;
  SessionLimits limits_;
  bool in_transaction_ = false;
  double statement_seconds_ = 0;  // the session's statement_timeout (0: none)
  double idle_seconds_ = 0;       // its idle_in_transaction_session_timeout (0: none)
  std::optional<Session> session_;
  int changes_ = 0;
};

PostgresStatement::PostgresStatement(PostgresConnection& db, std::string_view sql) : db_(db) {
  values_.resize(static_cast<size_t>(translate_parameters(sql, sql_)));
}

bool PostgresStatement::step() {
  if (!result_) {
    result_ = db_.run(sql_, values_);
    row_ = -1;
  }
  if (row_ + 1 < PQntuples(result_.get())) {
    ++row_;
    return true;
  }
  return false;
}

QueryResult PostgresConnection::read_query(const std::string& sql, const std::vector<SqlValue>& parameters,
                                           const QueryLimits& limits) {
  std::string translated;
  const int wanted = translate_parameters(sql, translated);
  if (translated.find_first_not_of(" \t\r\n;") == std::string::npos) throw IndexError("SQL error: the query is empty");
  if (static_cast<int>(parameters.size()) != wanted)
    throw IndexError(
        fmt::format("SQL error: the query has {} parameters but {} values were given", wanted, parameters.size()));
  std::vector<BoundValue> values;
  for (const SqlValue& parameter : parameters) {
    BoundValue value;
    if (std::holds_alternative<int64_t>(parameter)) {
      value.kind = BoundValue::Kind::integer;
      value.integer = std::get<int64_t>(parameter);
    } else if (std::holds_alternative<double>(parameter)) {
      value.kind = BoundValue::Kind::real;
      value.real = std::get<double>(parameter);
    } else if (std::holds_alternative<std::string>(parameter)) {
      value.kind = BoundValue::Kind::text;
      value.text = std::get<std::string>(parameter);
    }
    values.push_back(std::move(value));
  }
  struct ReadOnly {
    PostgresConnection& db;
    ~ReadOnly() { db.rollback(); }
  } read_only{*this};
  execute("BEGIN READ ONLY");
  in_transaction_ = true;
  execute(
      fmt::format("SET LOCAL statement_timeout = {}", static_cast<int64_t>(std::ceil(limits.timeout_seconds * 1000))));
  Result result = send(translated, values, limits.timeout_seconds);
  if (!succeeded(result)) {
    if (connection_failure(conn_, result.get())) throw lost(result ? PQresultErrorMessage(result.get()) : error());
    const std::string state = sql_state(result.get());
    const std::string text = message(result.get());
    if (state == "25006") throw IndexError(refused_write_message(sql));  // read_only_sql_transaction
    if (state == "57014")                                                // query_canceled: the statement timeout
      throw IndexError(fmt::format("the query ran longer than {:g} s and was stopped (--timeout SECONDS allows more)",
                                   limits.timeout_seconds));
    if (text.find("multiple commands") != std::string::npos)
      throw IndexError("SQL error: give one statement at a time (found more after the first ';')");
    throw IndexError("SQL error: " + text);
  }
  if (PQnfields(result.get()) == 0) throw IndexError(refused_write_message(sql));
  QueryResult query;
  for (int c = 0; c < PQnfields(result.get()); ++c) query.columns.emplace_back(PQfname(result.get(), c));
  const int count = PQntuples(result.get());
  for (int r = 0; r < count; ++r) {
    if (limits.max_rows > 0 && static_cast<int64_t>(query.rows.size()) == limits.max_rows) {
      query.truncated = true;
      break;
    }
    std::vector<SqlValue> row;
    for (int c = 0; c < static_cast<int>(query.columns.size()); ++c) {
      const char* text = PQgetvalue(result.get(), r, c);
      if (PQgetisnull(result.get(), r, c)) {
        row.emplace_back(std::monostate{});
        continue;
      }
      switch (PQftype(result.get(), c)) {
        case kInt2:
        case kInt4:
        case kInt8:
        case kOid:
          row.emplace_back(static_cast<int64_t>(std::strtoll(text, nullptr, 10)));
          break;
        case kBool:
          row.emplace_back(static_cast<int64_t>(text[0] == 't'));
          break;
        case kFloat4:
        case kFloat8:
        case kNumeric:
          row.emplace_back(std::strtod(text, nullptr));
          break;
        default:
          row.emplace_back(std::string(text, static_cast<size_t>(PQgetlength(result.get(), r, c))));
      }
    }
    query.rows.push_back(std::move(row));
  }
  return query;
}

}  // namespace

std::string url_without_password(const std::string& url) {
  // postgresql://user:password@host/...: the password is between the first ':' after the scheme and the '@'.
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return url;
  const size_t at = url.find('@', scheme + 3);
  const size_t slash = url.find('/', scheme + 3);
  if (at == std::string::npos || (slash != std::string::npos && slash < at)) return url;
  const size_t colon = url.find(':', scheme + 3);
  if (colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon + 1) + "***" + url.substr(at);
}

std::unique_ptr<Connection> open_postgresql_connection(const std::string& url, const std::string& shown,
                                                       bool read_only) {
  return std::make_unique<PostgresConnection>(url, shown, read_only);
}

}  // namespace runner::index
