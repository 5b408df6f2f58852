// The attach socket: a non-blocking listener and client connection in the training process, a blocking
// connection in `runner attach`.
#include "runtime/attach/attach_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <utility>

#include "runtime/core/clock.h"
#include "runtime/core/duration_text.h"
#include "runtime/core/environment_seconds.h"

namespace runner::attach {
namespace {

constexpr const char* kSocketName = "socket";

std::string error_text(int error_number) { return std::strerror(error_number); }

// The socket's address: its path, or (a path longer than sockaddr_un holds) the same file through the folder's
// descriptor, /proc/self/fd/N/socket.
sockaddr_un socket_address(const std::string& path, int folder_fd) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::string shown = path;
  if (path.size() >= sizeof(address.sun_path)) {
    if (folder_fd < 0) throw AttachError(fmt::format("{}: the path is too long for a Unix socket", path));
    shown = fmt::format("/proc/self/fd/{}/{}", folder_fd, kSocketName);
  }
  std::memcpy(address.sun_path, shown.c_str(), shown.size() + 1);
  return address;
}

std::string folder_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

std::string attach_socket_path(const std::string& run_directory) { return run_directory + "/attach/" + kSocketName; }

double idle_timeout_from_environment() {
  return core::seconds_from_environment("RUNNER_ATTACH_IDLE_TIMEOUT", kDefaultIdleTimeoutSeconds);
}

// ---- the training process's end ------------------------------------------------------------------

AttachServer::AttachServer(const std::string& run_directory, std::function<std::string()> greeting,
                           double idle_timeout_seconds)
    : socket_path_(attach_socket_path(run_directory)),
      greeting_(std::move(greeting)),
      idle_timeout_seconds_(idle_timeout_seconds) {
  folder_ = folder_of(socket_path_);
  if (::mkdir(folder_.c_str(), 0700) != 0 && errno != EEXIST)
    throw AttachError(fmt::format("{}: cannot create the folder: {}", folder_, error_text(errno)));
  folder_fd_ = ::open(folder_.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat folder_status {};
  if (folder_fd_ < 0 || ::fstat(folder_fd_, &folder_status) != 0) {
    const int error = errno;
    close("");
    throw AttachError(fmt::format("{}: cannot open the folder: {}", folder_, error_text(error)));
  }
  if (folder_status.st_uid != ::getuid()) {
    close("");
    throw AttachError(fmt::format("{}: the folder belongs to another user", folder_));
  }
  // A folder left by an earlier process of the run may have other permissions: owner only, whatever it had.
  if (::chmod(fmt::format("/proc/self/fd/{}", folder_fd_).c_str(), 0700) != 0 ||
      (::unlinkat(folder_fd_, kSocketName, 0) != 0 && errno != ENOENT)) {
    const int error = errno;
    close("");
    throw AttachError(fmt::format("{}: cannot prepare the folder: {}", folder_, error_text(error)));
  }
  listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const sockaddr_un address = socket_address(socket_path_, folder_fd_);
  if (listener_ < 0 || ::bind(listener_, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0 ||
      ::fchmodat(folder_fd_, kSocketName, 0600, 0) != 0 || ::listen(listener_, 4) != 0) {
    const int error = errno;
    close("");
    throw AttachError(fmt::format("{}: cannot listen: {}", socket_path_, error_text(error)));
  }
}

AttachServer::~AttachServer() { close(""); }

void AttachServer::accept_waiting() {
  while (listener_ >= 0) {
    const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN: nobody waits (other errors: the next poll tries again)
    ucred peer{};
    socklen_t size = sizeof peer;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &size) != 0 || peer.uid != ::getuid()) {
      ::close(fd);
      continue;
    }
    if (client_ >= 0) {
      const std::string busy =
          encode_message({"busy", "another `runner attach` is attached to this run (one at a time)"});
      (void)!::send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      ::close(fd);
      continue;
    }
    client_ = fd;
    last_activity_ = core::steady_seconds();
    incoming_ = MessageReader();
    outgoing_.clear();
    send({"hello", greeting_ ? greeting_() : std::string()});
  }
}

void AttachServer::flush() {
  while (client_ >= 0 && !outgoing_.empty()) {
    const ssize_t written = ::send(client_, outgoing_.data(), outgoing_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (written < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      drop_client();
      return;
    }
    outgoing_.erase(0, static_cast<std::size_t>(written));
  }
}

void AttachServer::say_and_drop(const Message& message) {
  send(message);
  for (int tries = 0; tries < 10 && client_ >= 0 && !outgoing_.empty(); ++tries) {
    pollfd writable{client_, POLLOUT, 0};
    ::poll(&writable, 1, 100);
    flush();
  }
  drop_client();
}

void AttachServer::drop_client() {
  if (client_ >= 0) ::close(client_);
  client_ = -1;
  outgoing_.clear();
  incoming_ = MessageReader();
}

std::optional<Message> AttachServer::poll() {
  accept_waiting();
  if (client_ < 0) return std::nullopt;
  flush();
  char buffer[65536];
  while (client_ >= 0) {
    const ssize_t count = ::recv(client_, buffer, sizeof buffer, MSG_DONTWAIT);
    if (count > 0) {
      incoming_.feed(buffer, static_cast<std::size_t>(count));
      last_activity_ = core::steady_seconds();
      continue;
    }
    if (count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (count < 0 && errno == EINTR) continue;
    // The client hung up (or the connection broke): what it sent before still counts, up to its detach.
    try {
      std::optional<Message> last = incoming_.next();
      drop_client();
      if (last && last->kind == "detach") return std::nullopt;
      return last;
    } catch (const ProtocolError&) {
      drop_client();
      return std::nullopt;
    }
  }
  if (client_ < 0) return std::nullopt;
  try {
    std::optional<Message> request = incoming_.next();
    if (request && request->kind == "detach") {
      drop_client();
      return std::nullopt;
    }
    if (!request && core::steady_seconds() - last_activity_ > idle_timeout_seconds_)
      say_and_drop({"disconnected", fmt::format("runner attach: disconnected after {} without a request "
                                                "(RUNNER_ATTACH_IDLE_TIMEOUT), so that another session can attach; "
                                                "the run goes on",
                                                core::duration_text(idle_timeout_seconds_))});
    return request;
  } catch (const ProtocolError& error) {
    send({"error", std::string("runner attach: ") + error.what() + "; disconnected"});
    flush();
    drop_client();
    return std::nullopt;
  }
}

bool AttachServer::interrupt_waiting() const {
  MessageReader unread = incoming_;
  try {
    while (std::optional<Message> message = unread.next())
      if (message->kind == "interrupt") return true;
  } catch (const ProtocolError&) {
    // poll answers it
  }
  return false;
}

void AttachServer::send(const Message& message) {
  if (client_ < 0) return;
  last_activity_ = core::steady_seconds();
  outgoing_ += encode_message(message);
  flush();
  if (outgoing_.size() > kMaxMessageBytes) drop_client();
}

void AttachServer::close(const std::string& reason) {
  if (client_ >= 0 && !reason.empty()) say_and_drop({"ended", reason});
  drop_client();
  if (listener_ >= 0) {
    ::close(listener_);
    listener_ = -1;
  }
  if (folder_fd_ >= 0) {
    ::unlinkat(folder_fd_, kSocketName, 0);
    ::close(folder_fd_);
    folder_fd_ = -1;
    ::rmdir(folder_.c_str());  // only when empty
  }
}

// ---- the client's end ----------------------------------------------------------------------------

AttachClient::AttachClient(const std::string& socket_path) {
  struct stat status {};
  if (::stat(socket_path.c_str(), &status) != 0)
    throw AttachError(fmt::format("{}: {}", socket_path, error_text(errno)));
  if (!S_ISSOCK(status.st_mode)) throw AttachError(fmt::format("{}: not a socket", socket_path));
  const int folder_fd = ::open(folder_of(socket_path).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int error = fd_ < 0 ? errno : 0;
  if (fd_ >= 0) {
    try {
      const sockaddr_un address = socket_address(socket_path, folder_fd);
      if (::connect(fd_, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) error = errno;
    } catch (...) {
      if (folder_fd >= 0) ::close(folder_fd);
      throw;
    }
  }
  if (folder_fd >= 0) ::close(folder_fd);
  if (error != 0) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    throw AttachError(
        fmt::format("{}: {}", socket_path,
                    error == ECONNREFUSED ? "nothing listens on it (its process is gone)" : error_text(error)));
  }
}

AttachClient::~AttachClient() {
  if (fd_ >= 0) ::close(fd_);
}

void AttachClient::send(const Message& message) {
  const std::string bytes = encode_message(message);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t written = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (written < 0 && errno == EINTR) continue;
    if (written < 0)
      throw AttachError(fmt::format("the training process closed the connection ({})", error_text(errno)));
    done += static_cast<std::size_t>(written);
  }
}

bool AttachClient::wait_readable(double seconds, int wake_descriptor) {
  if (!arrived_) arrived_ = incoming_.next();
  if (arrived_ || closed_) return true;
  pollfd watched[2] = {{fd_, POLLIN, 0}, {wake_descriptor, POLLIN, 0}};
  const int ready = ::poll(watched, wake_descriptor >= 0 ? 2 : 1, seconds < 0 ? -1 : static_cast<int>(seconds * 1000));
  return ready > 0 && watched[0].revents != 0;
}

std::optional<Message> AttachClient::receive() {
  if (arrived_) return std::exchange(arrived_, std::nullopt);
  while (true) {
    if (std::optional<Message> message = incoming_.next()) return message;
    if (closed_) return std::nullopt;
    char buffer[65536];
    const ssize_t count = ::recv(fd_, buffer, sizeof buffer, 0);
    if (count < 0 && errno == EINTR) continue;
    if (count <= 0) {
      closed_ = true;
      continue;
    }
    incoming_.feed(buffer, static_cast<std::size_t>(count));
  }
}

}  // namespace runner::attach
