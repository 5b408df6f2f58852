// `runner serve`: the dashboard's HTTP server (cpp-httplib, through GuardedHttpServer). Read-only: GET and HEAD
// only, the index opened for reading per request. It answers only requests that carry the random token it was
// started with (?token=, then a cookie), unless started without one (loopback only); on a loopback address, only
// requests whose Host is a loopback name (so that a web page elsewhere cannot read the index through DNS
// rebinding).
#pragma once

#include <memory>
#include <string>

#include "runtime/index/index_database.h"

namespace runner::serve {

struct ServeOptions {
  std::string host = "127.0.0.1";  // the address to listen on
  int port = 8765;                 // 0: a free port
  index::IndexLocation index;      // the launch context's (index::index_location)
  bool token = true;  // false: requests need no token (`--no-token`, which the CLI allows on loopback only)
};

// 127.0.0.0/8, ::1 and "localhost".
bool is_loopback_address(const std::string& host);

class DashboardServer {
 public:
  explicit DashboardServer(ServeOptions options);
  ~DashboardServer();
  DashboardServer(const DashboardServer&) = delete;
  DashboardServer& operator=(const DashboardServer&) = delete;

  // Listens; a std::runtime_error "cannot listen on HOST:PORT (...)" when the address cannot be bound.
  void bind();
  int port() const;
  // 32 hex digits that every request must carry; empty when started without a token.
  const std::string& token() const;
  // Where to point a browser: http://HOST:PORT/?token=... (without ?token= when there is none).
  std::string url() const;
  // The same at another name or address of this machine (for a server listening on all of them).
  std::string url(const std::string& host) const;
  // Answers requests until stop() (from another thread).
  void run();
  void stop();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace runner::serve
