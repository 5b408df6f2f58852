// An httplib::Server that slow or silent clients cannot stall: a request must arrive, and its answer be taken,
// within deadlines; one client address holds at most a few connections; the workers outnumber that cap.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>

namespace runner::serve {

struct ConnectionLimits {
  // Connections one client address may hold open at once; past that a connection is answered 429 and closed.
  int connections_per_address = 8;
  // Threads that serve connections, each one connection at a time: two addresses holding their cap's worth leave
  // half of them to other clients.
  int workers = 32;
  std::chrono::seconds idle{5};       // a kept-alive connection waits this long for its next request
  std::chrono::seconds request{10};   // request line, headers and body must all arrive within this of its first byte
  std::chrono::seconds answer{20};    // the whole answer must be taken within this of its first byte
  int requests_per_connection = 100;  // then the connection is closed
};

// Serves each connection itself (in place of httplib's per-read timeouts, which a client that sends a byte a
// second never reaches) and hands each request to httplib's parsing and routing.
class GuardedHttpServer : public httplib::Server {
 public:
  explicit GuardedHttpServer(ConnectionLimits limits = {});

 private:
  bool process_and_close_socket(socket_t socket) override;

  // Counts the connection against its address; false when the address holds the cap's worth already.
  bool admit(const std::string& address);
  void release(const std::string& address);

  ConnectionLimits limits_;
  std::mutex open_mutex_;
  std::map<std::string, int> open_by_address_;
};

}  // namespace runner::serve
