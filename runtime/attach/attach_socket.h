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

// How long a client may say nothing (no request since the last answer or since it attached) before it is
// disconnected, so that the one session is free again; RUNNER_ATTACH_IDLE_TIMEOUT sets it.
inline constexpr double kDefaultIdleTimeoutSeconds = 1800;

// RUNNER_ATTACH_IDLE_TIMEOUT, else kDefaultIdleTimeoutSeconds. Throws std::invalid_argument when it is not a number
// of seconds > 0.
double idle_timeout_from_environment();

class AttachServer {
 public:
  // Listens on attach_socket_path(run_directory); a socket left by an earlier process of the run is replaced.
  // `greeting` is the hello message's text, made when a client is accepted. Throws AttachError.
  AttachServer(const std::string& run_directory, std::function<std::string()> greeting,
               double idle_timeout_seconds = kDefaultIdleTimeoutSeconds);
  ~AttachServer();  // close("")
  AttachServer(const AttachServer&) = delete;
  AttachServer& operator=(const AttachServer&) = delete;

  // Never waits (a few system calls when nothing happens): accepts a waiting client (one at a time: another is
  // told `busy` and closed; a process of another user is closed), writes what is queued, reads what arrived.
  // Returns the next whole request of the client (eval, complete, interrupt), if any. A client that detached, hung
  // up or broke the protocol is dropped; one silent for the idle timeout is told `disconnected` (why) and dropped.
  std::optional<Message> poll();
  // Whether an `interrupt` is among the messages that poll read but has not returned yet (one that came with the
  // chunk it is for; the next poll returns it).
  bool interrupt_waiting() const;
  // Queues a message for the client and writes what the socket takes now; nothing without a client. A client
  // that leaves kMaxMessageBytes unread is dropped.
  void send(const Message& message);
  bool has_client() const { return client_ >= 0; }
  // The client's connection, for another thread to watch for readability (-1 without a client). Only poll reads
  // from it.
  int client_descriptor() const { return client_; }
  // Tells the client `ended` with `reason` (when not empty), waits up to a second for it to be written, closes
  // the connection and removes the socket and its folder. Later calls do nothing.
  void close(const std::string& reason);
  const std::string& socket_path() const { return socket_path_; }

 private:
  void accept_waiting();
  void flush();
  void drop_client();
  // Sends `message`, waits up to a second for it to be written, and drops the client.
  void say_and_drop(const Message& message);

  std::string folder_;
  std::string socket_path_;
  std::function<std::string()> greeting_;
  double idle_timeout_seconds_;
  double last_activity_ = 0;  // core::steady_seconds() of the client's latest request or answer
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
  // Whether a message (or the end of the connection) has arrived within `seconds` (< 0: however long it takes),
  // including one that an earlier read brought with another; false as well when a signal handler ran meanwhile or
  // `wake_descriptor` (>= 0: a self-pipe that a signal handler writes to, whichever thread runs it) is readable.
  // Throws ProtocolError.
  bool wait_readable(double seconds, int wake_descriptor = -1);
  // The next message, waiting for it; nothing once the process closed the connection. Throws ProtocolError.
  std::optional<Message> receive();
  int descriptor() const { return fd_; }  // for waiting on it beside the terminal

 private:
  int fd_ = -1;
  MessageReader incoming_;
  std::optional<Message> arrived_;  // taken from incoming_ by wait_readable, for receive
  bool closed_ = false;
};

}  // namespace runner::attach
