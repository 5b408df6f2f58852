// Writing checkpoint directories through a partial directory and a rename, and verifying them by sha256.
#include "runtime/ckpt/checkpoint_directory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <dirent.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>

#include "runtime/core/atomic_file.h"
#include "runtime/core/disk_usage.h"
#include "runtime/core/sha256.h"
#include "runtime/core/storage_full.h"

namespace runner::ckpt {
namespace {

void make_directory(const std::string& path) {
  if (::mkdir(path.c_str(), 0777) == 0 || errno == EEXIST) return;
  const int error = errno;
  core::note_write_error(error);
  throw CheckpointWriteError(fmt::format("{}: cannot create the directory: {}", path, std::strerror(error)));
}

void sync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw CheckpointWriteError(fmt::format("{}: cannot open to fsync: {}", path, std::strerror(errno)));
  const int result = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (result != 0) core::note_write_error(error);
  if (result != 0) throw CheckpointWriteError(fmt::format("{}: fsync failed: {}", path, std::strerror(error)));
}

bool exists(const std::string& path) {
  struct stat info {};
  return ::lstat(path.c_str(), &info) == 0;
}

int64_t file_size(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return -1;
  return static_cast<int64_t>(info.st_size);
}

// Removes a directory of plain files (a checkpoint directory has no subdirectories).
void remove_flat_directory(const std::string& path) {
  if (!exists(path)) return;
  if (DIR* dir = ::opendir(path.c_str())) {
    while (dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") ::unlink((path + "/" + name).c_str());
    }
    ::closedir(dir);
  }
  ::rmdir(path.c_str());
}

void check_file_name(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 100 && name[0] != '.' && name != "manifest.json";
  for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.');
  if (!ok)
    throw std::invalid_argument(
        fmt::format("checkpoint file name '{}' is not allowed: use letters, digits, '_', '-' "
                    "and '.' (not manifest.json)",
                    name));
}

// ".partial-0000012-345" -> step 12 and pid 345 for the prefix ".partial-"; false for other names.
bool parse_writer_entry(const std::string& name, const std::string& prefix, int64_t& step, long& pid) {
  if (name.rfind(prefix, 0) != 0) return false;
  const std::string rest = name.substr(prefix.size());
  const auto dash = rest.find('-');
  if (dash == std::string::npos || dash == 0 || dash + 1 == rest.size()) return false;
  for (std::size_t i = 0; i < rest.size(); ++i)
    if (i != dash && !std::isdigit(static_cast<unsigned char>(rest[i]))) return false;
  step = std::stoll(rest.substr(0, dash));
  pid = std::stol(rest.substr(dash + 1));
  return true;
}

}  // namespace

StaleWrites clean_stale_writes(const std::string& run_dir, bool dry_run) {
  StaleWrites stale;
  const std::string folder = run_dir + "/checkpoints";
  std::vector<std::string> names;
  if (DIR* dir = ::opendir(folder.c_str())) {
    while (dirent* entry = ::readdir(dir)) names.emplace_back(entry->d_name);
    ::closedir(dir);
  }
  const long self = static_cast<long>(::getpid());
  for (const std::string& name : names) {
    int64_t step = 0;
    long pid = 0;
    const std::string path = folder + "/" + name;
    const std::string relative = "checkpoints/" + name;
    if ((parse_writer_entry(name, ".partial-", step, pid) || parse_writer_entry(name, ".staged-", step, pid)) &&
        pid != self) {
      stale.bytes += core::disk_usage(path);
      stale.removed.push_back(relative);
      if (!dry_run) remove_flat_directory(path);
    } else if (parse_writer_entry(name, ".replaced-", step, pid) && pid != self) {
      const std::string final_dir = run_dir + "/" + checkpoint_path(step);
      if (exists(final_dir)) {
        stale.bytes += core::disk_usage(path);
        stale.removed.push_back(relative);
        if (!dry_run) remove_flat_directory(path);
      } else {
        stale.recovered.push_back(relative);
        if (!dry_run && ::rename(path.c_str(), final_dir.c_str()) != 0)
          throw CheckpointWriteError(
              fmt::format("{}: cannot move back to {}: {}", path, final_dir, std::strerror(errno)));
      }
    }
  }
  return stale;
}

std::string checkpoint_path(int64_t step) { return fmt::format("checkpoints/step-{:07d}", step); }

WrittenCheckpoint write_checkpoint(const std::string& run_dir, int64_t step,
                                   const std::vector<CheckpointFileContent>& files,
                                   const nlohmann::json& manifest_extra, const std::function<void()>& before_publish) {
  if (step < 0) throw std::invalid_argument(fmt::format("checkpoint step must be >= 0, got {}", step));
  for (size_t i = 0; i < files.size(); ++i) {
    check_file_name(files[i].name);
    for (size_t j = 0; j < i; ++j)
      if (files[j].name == files[i].name)
        throw std::invalid_argument(fmt::format("checkpoint file '{}' is given twice", files[i].name));
  }
  const std::string folder = run_dir + "/checkpoints";
  make_directory(folder);
  WrittenCheckpoint written;
  written.path = checkpoint_path(step);
  const std::string final_dir = run_dir + "/" + written.path;
  const std::string partial = fmt::format("{}/.partial-{:07d}-{}", folder, step, ::getpid());
  remove_flat_directory(partial);
  make_directory(partial);
  try {
    nlohmann::json listed = nlohmann::json::array();
    for (const auto& file : files) {
      const std::string path = partial + "/" + file.name;
      if (file.staged) {
        const std::string staged = file.staged();
        if (::rename(staged.c_str(), path.c_str()) != 0)
          throw CheckpointWriteError(
              fmt::format("{}: cannot move into the checkpoint: {}", staged, std::strerror(errno)));
        const std::string staging = staged.substr(0, staged.rfind('/'));
        ::rmdir(staging.c_str());  // its writer's folder, once every file of it has moved
      } else {
        try {
          save_safetensors(path, file.tensors, file.metadata);
        } catch (const SafetensorsError& error) {
          throw CheckpointWriteError(error.what());
        }
      }
      const CheckpointFileRecord record{file.name, file_size(path), core::sha256_file(path)};
      written.bytes += record.bytes;
      listed.push_back({{"name", record.name}, {"bytes", record.bytes}, {"sha256", record.sha256}});
      written.files.push_back(record);
    }
    nlohmann::json manifest = manifest_extra.is_object() ? manifest_extra : nlohmann::json::object();
    manifest["step"] = step;
    manifest["files"] = listed;
    const std::string manifest_text = manifest.dump(2) + "\n";
    {
      core::AtomicFileWriter writer(partial + "/manifest.json");
      writer.write(manifest_text.data(), manifest_text.size(), "the manifest");
      writer.commit();
    }
    const CheckpointFileRecord manifest_record{"manifest.json", static_cast<int64_t>(manifest_text.size()),
                                               core::sha256_hex(manifest_text)};
    written.sha256 = manifest_record.sha256;
    written.bytes += manifest_record.bytes;
    written.files.push_back(manifest_record);
    sync_directory(partial);

    if (before_publish) before_publish();
    // An older checkpoint of this step stays whole until the new one is complete.
    const std::string replaced = fmt::format("{}/.replaced-{:07d}-{}", folder, step, ::getpid());
    const bool had_previous = exists(final_dir);
    if (had_previous && ::rename(final_dir.c_str(), replaced.c_str()) != 0)
      throw CheckpointWriteError(
          fmt::format("{}: cannot move the previous checkpoint aside: {}", final_dir, std::strerror(errno)));
    if (::rename(partial.c_str(), final_dir.c_str()) != 0) {
      const int error = errno;
      if (had_previous) ::rename(replaced.c_str(), final_dir.c_str());
      throw CheckpointWriteError(
          fmt::format("{}: cannot move the checkpoint into place: {}", final_dir, std::strerror(error)));
    }
    sync_directory(folder);
    if (had_previous) remove_flat_directory(replaced);
  } catch (const core::AtomicFileError& error) {
    remove_flat_directory(partial);
    throw CheckpointWriteError(error.what());
  } catch (const std::runtime_error&) {
    remove_flat_directory(partial);
    throw;
  }
  return written;
}

std::vector<std::string> verify_checkpoint(const std::string& run_dir, const std::string& path,
                                           const std::vector<CheckpointFileRecord>& expected) {
  std::vector<std::string> problems;
  const std::string directory = run_dir + "/" + path;
  if (!exists(directory)) return {fmt::format("{}: missing", path)};
  for (const auto& file : expected) {
    const std::string file_path = directory + "/" + file.name;
    const int64_t size = file_size(file_path);
    if (size < 0) {
      problems.push_back(fmt::format("{}: missing", file.name));
    } else if (size != file.bytes) {
      problems.push_back(fmt::format("{}: {} bytes, expected {} (truncated or replaced)", file.name, size, file.bytes));
    } else {
      try {
        if (core::sha256_file(file_path) != file.sha256)
          problems.push_back(fmt::format("{}: sha256 differs (damaged)", file.name));
      } catch (const std::exception& error) {
        problems.push_back(fmt::format("{}: {}", file.name, error.what()));
      }
    }
  }
  return problems;
}

}  // namespace runner::ckpt
