// GuardedHttpServer: each connection served under deadlines (DeadlineStream) and a cap per client address.
#include "runtime/serve/guarded_http_server.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

namespace runner::serve {
namespace {

using Clock = std::chrono::steady_clock;

struct Endpoint {
  std::string ip;
  int port = 0;
};

Endpoint endpoint_of(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    inet_ntop(AF_INET, &v4.sin_addr, text, sizeof text);
    return {text, ntohs(v4.sin_port)};
  }
  const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
  inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof text);
  return {text, ntohs(v6.sin6_port)};
}

Endpoint peer_of(socket_t socket) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (::getpeername(socket, reinterpret_cast<sockaddr*>(&address), &length) != 0) return {};
  return endpoint_of(address);
}

Endpoint local_of(socket_t socket) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (::getsockname(socket, reinterpret_cast<sockaddr*>(&address), &length) != 0) return {};
  return endpoint_of(address);
}

// One connection's socket as httplib's Stream, non-blocking underneath: a read fails once the request's deadline
// has passed, a write once the answer's has, and either as soon as the server stops.
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(socket_t socket, const std::atomic<socket_t>& listening, const ConnectionLimits& limits)
      : socket_(socket), listening_(listening), limits_(limits), peer_(peer_of(socket)), local_(local_of(socket)) {}

  // Waits up to limits.idle for the next request's first byte and starts its deadlines; false when none came.
  bool next_request() {
    answer_deadline_.reset();
    read_deadline_ = Clock::now() + limits_.idle;
    if (buffered() == 0 && !fill()) return false;  // pipelined requests are in the buffer already
    read_deadline_ = Clock::now() + limits_.request;
    return true;
  }

  bool is_readable() const override { return buffered() > 0 || wait_for(POLLIN, read_deadline_); }

  bool is_writable() const override {
    return wait_for(POLLOUT, answer_deadline_.value_or(Clock::now() + limits_.answer));
  }

  ssize_t read(char* destination, size_t size) override {
    if (buffered() == 0 && !fill()) return -1;
    const size_t taken = std::min(size, buffered());
    std::memcpy(destination, buffer_ + begin_, taken);
    begin_ += taken;
    return static_cast<ssize_t>(taken);
  }

  ssize_t write(const char* source, size_t size) override {
    if (!answer_deadline_) answer_deadline_ = Clock::now() + limits_.answer;
    for (;;) {
      if (!wait_for(POLLOUT, *answer_deadline_)) return -1;
      const ssize_t sent = ::send(socket_, source, size, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (sent >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return sent;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = peer_.ip;
    port = peer_.port;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = local_.ip;
    port = local_.port;
  }
  socket_t socket() const override { return socket_; }

 private:
  size_t buffered() const { return end_ - begin_; }

  // Waits until the read deadline for bytes and reads what has arrived into the empty buffer; false at the end
  // of the stream, on an error or past the deadline.
  bool fill() {
    for (;;) {
      const ssize_t got = ::recv(socket_, buffer_, sizeof buffer_, MSG_DONTWAIT);
      if (got > 0) {
        begin_ = 0;
        end_ = static_cast<size_t>(got);
        return true;
      }
      if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
      if (!wait_for(POLLIN, read_deadline_)) return false;
    }
  }

  // Polls in short slices, so that a stopped server's workers end without waiting out a client's deadline.
  bool wait_for(short events, Clock::time_point deadline) const {
    for (;;) {
      if (listening_ == INVALID_SOCKET) return false;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd entry{socket_, events, 0};
      const int ready = ::poll(&entry, 1, static_cast<int>(std::min<long long>(left, 250)));
      if (ready > 0) return true;  // POLLERR and POLLHUP too: the read or write that follows says which
      if (ready < 0 && errno != EINTR) return false;
    }
  }

  socket_t socket_;
  const std::atomic<socket_t>& listening_;
  const ConnectionLimits& limits_;
  Endpoint peer_;
  Endpoint local_;
  Clock::time_point read_deadline_;
  std::optional<Clock::time_point> answer_deadline_;
  char buffer_[4096];
  size_t begin_ = 0;
  size_t end_ = 0;
};

// Answers 429 to a connection past its address's cap. What the client sent so far is read first: closing with
// unread data would reset the connection and could lose the answer.
void refuse(socket_t socket, const std::string& address, int cap) {
  char discard[4096];
  while (::recv(socket, discard, sizeof discard, MSG_DONTWAIT) > 0) {
  }
  const std::string message = fmt::format(
      "runner serve: {} connections from {} are open already, the most one address may hold; close one and try "
      "again\n",
      cap, address);
  const std::string answer = fmt::format(
      "HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n"
      "Connection: close\r\n\r\n{}",
      message.size(), message);
  // The answer fits the socket's empty send buffer; a client that takes none of it loses it.
  [[maybe_unused]] const ssize_t sent = ::send(socket, answer.data(), answer.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

}  // namespace

GuardedHttpServer::GuardedHttpServer(ConnectionLimits limits) : limits_(limits) {
  const int workers = limits_.workers;
  new_task_queue = [workers] { return new httplib::ThreadPool(static_cast<size_t>(workers)); };
}

bool GuardedHttpServer::admit(const std::string& address) {
  std::lock_guard<std::mutex> lock(open_mutex_);
  int& open = open_by_address_[address];
  if (open >= limits_.connections_per_address) return false;
  ++open;
  return true;
}

void GuardedHttpServer::release(const std::string& address) {
  std::lock_guard<std::mutex> lock(open_mutex_);
  if (--open_by_address_[address] == 0) open_by_address_.erase(address);
}

bool GuardedHttpServer::process_and_close_socket(socket_t socket) {
  const std::string address = peer_of(socket).ip;
  if (!admit(address)) {
    refuse(socket, address, limits_.connections_per_address);
  } else {
    DeadlineStream stream(socket, svr_sock_, limits_);
    for (int left = limits_.requests_per_connection; left > 0 && stream.next_request(); --left) {
      bool client_closes = false;
      if (!process_request(stream, left == 1, client_closes, nullptr) || client_closes) break;
    }
    release(address);
  }
  ::shutdown(socket, SHUT_RDWR);
  ::close(socket);
  return true;
}

}  // namespace runner::serve
