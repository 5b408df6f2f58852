// Host leases: a registration file per worker and a lock file per core and GPU, each held with flock.
#include "runtime/sweep/host_leases.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <random>
#include <stdexcept>
#include <utility>

#include "runtime/core/launch_context.h"

namespace runner::sweep {
namespace {

constexpr const char* kWorkerPrefix = "worker-";

std::string error_text() { return std::strerror(errno); }

// Makes `path` (and its parents) a folder of this user, 0700 where it makes it.
void make_own_folder(const std::string& path) {
  for (std::size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    const std::string prefix = path.substr(0, slash);
    if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST)
      throw std::runtime_error(fmt::format("{}: cannot create the folder for host leases: {}", prefix, error_text()));
    if (slash == std::string::npos) break;
  }
  struct stat status {};
  if (::lstat(path.c_str(), &status) != 0 || !S_ISDIR(status.st_mode))
    throw std::runtime_error(fmt::format("{}: the folder for host leases is not a folder", path));
  if (status.st_uid != ::getuid())
    throw std::runtime_error(fmt::format("{}: the folder for host leases belongs to another user", path));
}

// Opens `path` (made if needed) and takes its lock without waiting: the descriptor, or -1 when another holds it.
int lock_now(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) throw std::runtime_error(fmt::format("{}: cannot open the lease: {}", path, error_text()));
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
  const int error = errno;
  ::close(fd);
  if (error != EWOULDBLOCK)
    throw std::runtime_error(fmt::format("{}: cannot lock the lease: {}", path, std::strerror(error)));
  return -1;
}

// A GPU id as a file name: CUDA_VISIBLE_DEVICES holds indices or UUIDs ("GPU-8f1c..."); anything else is hex-coded.
std::string file_name_of(const std::string& gpu) {
  std::string name;
  for (const unsigned char c : gpu)
    name += std::isalnum(c) || c == '-' ? std::string(1, static_cast<char>(c)) : fmt::format("_{:02x}", c);
  return name;
}

std::vector<int> affinity_cpus() {
  std::vector<int> cpus;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (::sched_getaffinity(0, sizeof mask, &mask) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &mask)) cpus.push_back(cpu);
  return cpus;
}

}  // namespace

TrialLease::~TrialLease() { release(); }

TrialLease::TrialLease(TrialLease&& other) noexcept
    : threads_(other.threads_),
      cpus_(std::move(other.cpus_)),
      gpus_(std::move(other.gpus_)),
      lock_fds_(std::exchange(other.lock_fds_, {})) {}

TrialLease& TrialLease::operator=(TrialLease&& other) noexcept {
  if (this != &other) {
    release();
    threads_ = other.threads_;
    cpus_ = std::move(other.cpus_);
    gpus_ = std::move(other.gpus_);
    lock_fds_ = std::exchange(other.lock_fds_, {});
  }
  return *this;
}

void TrialLease::release() {
  for (const int fd : lock_fds_) ::close(fd);  // closing the last descriptor drops the flock
  lock_fds_.clear();
}

std::string host_leases_folder() {
  if (const std::string& given = core::launch_context().host_leases; !given.empty()) return given;
  return fmt::format("/tmp/runner-{}/host-leases", ::getuid());
}

HostLeases::HostLeases(int slots, std::string folder) : folder_(folder.empty() ? host_leases_folder() : folder) {
  make_own_folder(folder_);
  // Written under a temporary name and locked before it is renamed: a worker that counts never sees a registration
  // whose lock is not taken yet.
  std::random_device random;
  const std::string name = fmt::format("{}{}-{:08x}", kWorkerPrefix, ::getpid(), random());
  const std::string temporary = fmt::format("{}/.{}", folder_, name);
  registration_fd_ = lock_now(temporary);
  const std::string text = std::to_string(slots);
  if (registration_fd_ < 0 || ::write(registration_fd_, text.data(), text.size()) != std::ssize(text) ||
      ::rename(temporary.c_str(), (folder_ + "/" + name).c_str()) != 0) {
    const std::string error = error_text();
    if (registration_fd_ >= 0) ::close(registration_fd_);
    ::unlink(temporary.c_str());
    throw std::runtime_error(fmt::format("{}: cannot register the worker's slots: {}", temporary, error));
  }
  registration_path_ = folder_ + "/" + name;
}

HostLeases::~HostLeases() {
  ::unlink(registration_path_.c_str());
  ::close(registration_fd_);
}

int HostLeases::slots_on_host() const {
  int slots = 0;
  DIR* folder = ::opendir(folder_.c_str());
  if (!folder) throw std::runtime_error(fmt::format("{}: cannot read the host leases: {}", folder_, error_text()));
  while (const dirent* entry = ::readdir(folder)) {
    if (std::strncmp(entry->d_name, kWorkerPrefix, std::strlen(kWorkerPrefix)) != 0) continue;
    const std::string path = folder_ + "/" + entry->d_name;
    if (path == registration_path_) {
      char text[16] = {};
      if (::pread(registration_fd_, text, sizeof text - 1, 0) > 0) slots += std::atoi(text);
      continue;
    }
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;  // removed meanwhile
    if (::flock(fd, LOCK_SH | LOCK_NB) == 0) {
      ::unlink(path.c_str());  // its worker is gone
    } else {
      char text[16] = {};
      if (::read(fd, text, sizeof text - 1) > 0) slots += std::max(0, std::atoi(text));
    }
    ::close(fd);
  }
  ::closedir(folder);
  return slots;
}

std::optional<TrialLease> HostLeases::try_lease(int usable_cores, int cores, const std::vector<std::string>& gpus,
                                                int gpu_count) const {
  std::vector<int> named = affinity_cpus();
  const bool pinned = std::ssize(named) >= usable_cores;
  if (pinned) {
    named.resize(static_cast<std::size_t>(usable_cores));
  } else {
    named.clear();
    for (int core = 0; core < usable_cores; ++core) named.push_back(core);
  }
  TrialLease lease;
  lease.threads_ = cores;
  for (const int cpu : named) {
    if (std::ssize(lease.cpus_) == std::min(cores, usable_cores)) break;
    const int fd = lock_now(fmt::format("{}/{}-{}.lock", folder_, pinned ? "cpu" : "core", cpu));
    if (fd < 0) continue;
    lease.lock_fds_.push_back(fd);
    lease.cpus_.push_back(cpu);
  }
  if (std::ssize(lease.cpus_) < std::min(cores, usable_cores)) return std::nullopt;
  for (const std::string& gpu : gpus) {
    if (std::ssize(lease.gpus_) == gpu_count) break;
    const int fd = lock_now(fmt::format("{}/gpu-{}.lock", folder_, file_name_of(gpu)));
    if (fd < 0) continue;
    lease.lock_fds_.push_back(fd);
    lease.gpus_.push_back(gpu);
  }
  if (std::ssize(lease.gpus_) < gpu_count) return std::nullopt;
  if (!pinned) lease.cpus_.clear();
  return lease;
}

}  // namespace runner::sweep
