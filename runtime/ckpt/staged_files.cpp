// Staging checkpoint files written by other ranks, and waiting for them.
#include "runtime/ckpt/staged_files.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "runtime/core/atomic_file.h"

namespace runner::ckpt {
namespace {

std::string staging_directory(const std::string& run_dir, std::int64_t step) {
  return fmt::format("{}/checkpoints/.staged-{:07d}-{}", run_dir, step, ::getpid());
}

bool is_file(const std::string& path) {
  struct stat status {};
  return ::stat(path.c_str(), &status) == 0 && S_ISREG(status.st_mode);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The staging folders of checkpoint `step`, of every process.
std::vector<std::string> staging_directories(const std::string& run_dir, std::int64_t step) {
  const std::string folder = run_dir + "/checkpoints";
  const std::string prefix = fmt::format(".staged-{:07d}-", step);
  std::vector<std::string> found;
  if (DIR* dir = ::opendir(folder.c_str())) {
    while (dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (name.rfind(prefix, 0) == 0) found.push_back(folder + "/" + name);
    }
    ::closedir(dir);
  }
  return found;
}

void write_staged(const std::string& run_dir, std::int64_t step, const std::vector<CheckpointFileContent>& files) {
  const std::string directory = staging_directory(run_dir, step);
  ::mkdir((run_dir + "/checkpoints").c_str(), 0755);  // rank 0 may not have made it yet
  if (::mkdir(directory.c_str(), 0755) != 0 && errno != EEXIST)
    throw CheckpointWriteError(fmt::format("{}: cannot create: {}", directory, std::strerror(errno)));
  for (const CheckpointFileContent& file : files) {
    const std::string path = directory + "/" + file.name;
    try {
      save_safetensors(path, file.tensors, file.metadata);
    } catch (const std::exception& error) {
      // Rank 0 waits for this file: the marker tells it why it will not come.
      try {
        core::AtomicFileWriter marker(path + ".failed");
        const std::string text = error.what();
        marker.write(text.data(), text.size(), "the failure marker");
        marker.commit();
      } catch (const std::exception&) {  // the disk may be full: rank 0 then waits until its timeout
      }
      throw CheckpointWriteError(error.what());
    }
  }
}

}  // namespace

StagedFileWriter::StagedFileWriter(std::string run_dir) : run_dir_(std::move(run_dir)) {}

StagedFileWriter::~StagedFileWriter() { wait(); }

void StagedFileWriter::wait() {
  if (worker_.joinable()) worker_.join();
}

std::vector<std::string> StagedFileWriter::take_errors() {
  std::lock_guard lock(mutex_);
  std::vector<std::string> errors;
  errors.swap(errors_);
  return errors;
}

void StagedFileWriter::submit(std::int64_t step, std::vector<CheckpointFileContent> files,
                              std::function<void()> wait_ready) {
  wait();
  worker_ = std::thread([this, step, files = std::move(files), wait_ready = std::move(wait_ready)]() mutable {
    try {
      if (wait_ready) wait_ready();
      write_staged(run_dir_, step, files);
    } catch (const std::exception& error) {
      std::lock_guard lock(mutex_);
      errors_.push_back(error.what());
    }
    files.clear();  // frees the host copies on this thread
  });
}

std::vector<std::string> wait_for_staged_files(const std::string& run_dir, std::int64_t step,
                                               const std::vector<std::string>& names,
                                               std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> paths(names.size());
  std::size_t missing = names.size();
  for (auto pause = std::chrono::milliseconds(2);; pause = std::min(pause * 2, std::chrono::milliseconds(100))) {
    for (const std::string& directory : staging_directories(run_dir, step)) {
      for (std::size_t i = 0; i < names.size(); ++i) {
        if (!paths[i].empty()) continue;
        const std::string path = directory + "/" + names[i];
        if (is_file(path + ".failed"))
          throw CheckpointWriteError(fmt::format("{}: its writer failed: {}", names[i], read_text(path + ".failed")));
        if (is_file(path)) {
          paths[i] = path;
          --missing;
        }
      }
    }
    if (missing == 0) return paths;
    if (std::chrono::steady_clock::now() > deadline) {
      std::string absent;
      for (std::size_t i = 0; i < names.size(); ++i)
        if (paths[i].empty()) absent += (absent.empty() ? "" : ", ") + names[i];
      throw CheckpointWriteError(
          fmt::format("{}/checkpoints: {} of step {} did not arrive within {} s (did its rank stop?)", run_dir, absent,
                      step, std::chrono::duration_cast<std::chrono::seconds>(timeout).count()));
    }
    std::this_thread::sleep_for(pause);
  }
}

}  // namespace runner::ckpt
