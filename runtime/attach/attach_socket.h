// The Unix socket of a running run, for `runner attach`: the training process's end (AttachServer: listens in the
// run's folder, owner only, serviced without blocking between steps) and the client's end (AttachClient).
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

#include "runtime/attach/attach_protocol.h"

namespace runner::attach {

// <run directory>/attach/socket: the folder is 0700 and the socket 0600, both the training process's user's.
std::string attach_socket_path(const std::string& run_directory);

// A socket that cannot be made or reached; what() names the path and the reason.
struct AttachError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class AttachServer {
 public:
  // Listens on attach_socket_path(run_directory); a socket left by an earlier process of the run is replaced.
  // `greeting` is the hello message's text, made when a client is accepted. Throws AttachError.
  AttachServer(const std::string& run_directory, std::function<std::string()> greeting);
  ~AttachServer();  // close("")
  AttachServer(const AttachServer&) = delete;
  AttachServer& operator=(const AttachServer&) = delete;

  // Never waits (a few system calls when nothing happens): accepts a waiting client (one at a time: another is
  // told `busy` and closed; a process of another user is closed), writes what is queued, reads what arrived.
  // Returns the next whole request of the client (eval, complete), if any. A client that detached, hung up or broke
  // the protocol is dropped.
  std::optional<Message> poll();
  // Queues a message for the client and writes what the socket takes now; nothing without a client. A client
  // that leaves kMaxMessageBytes unread is dropped.
  void send(const Message& message);
  bool has_client() const { return client_ >= 0; }
  // Tells the client `ended` with `reason` (when not empty), waits up to a second for it to be written, closes
  // the connection and removes the socket and its folder. Later calls do nothing.
  void close(const std::string& reason);
  const std::string& socket_path() const { return socket_path_; }

 private:
  void accept_waiting();
  void flush();
  void drop_client();

  std::string folder_;
  std::string socket_path_;
  std::function<std::string()> greeting_;
  int folder_fd_ = -1;
  int listener_ = -1;
  int client_ = -1;
  std::string outgoing_;
  MessageReader incoming_;
};

class AttachClient {
 public:
  // Connects to a training process's socket. Throws AttachError: no socket at the path (the process ended or
  // never listened), nothing listening (the process is gone), no permission.
  explicit AttachClient(const std::string& socket_path);
  ~AttachClient();
  AttachClient(const AttachClient&) = delete;
  AttachClient& operator=(const AttachClient&) = delete;

  void send(const Message& message);  // waits until written; AttachError when the process closed the connection
  // Whether a message (or the end of the connection) has arrived within `seconds`.
  bool wait_readable(double seconds);
  // The next message, waiting for it; nothing once the process closed the connection. Throws ProtocolError.
  std::optional<Message> receive();
  int descriptor() const { return fd_; }  // for waiting on it beside the terminal

 private:
  int fd_ = -1;
  MessageReader incoming_;
  bool closed_ = false;
};

}  // namespace runner::attach
