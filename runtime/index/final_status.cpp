// The reserved final-status file: blank at the start, overwritten in place when the index refuses the status.
#include "runtime/index/final_status.h"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "runtime/core/json_text.h"
#include "runtime/index/run_store.h"
#include "runtime/index/database.h"

namespace runner::index {
namespace {

// Writes `text` at offset 0 of the file at `path`, with `flags`, and fsyncs it.
void write_whole(const std::string& path, int flags, const std::string& text) {
  const int fd = ::open(path.c_str(), flags | O_WRONLY | O_CLOEXEC, 0666);
  if (fd < 0) throw IndexError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::pwrite(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      throw IndexError(fmt::format("{}: cannot write: {}", path, std::strerror(error)));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    throw IndexError(fmt::format("{}: cannot sync: {}", path, std::strerror(error)));
  }
  ::close(fd);
}

}  // namespace

void reserve_final_status(const std::string& run_dir) {
  write_whole(run_dir + "/" + kFinalStatusFile, O_CREAT | O_TRUNC, std::string(kFinalStatusBytes, ' '));
}

void write_final_status(const std::string& run_dir, const FinalStatus& status) {
  nlohmann::json record{{"status", status.status}, {"ended_at", status.ended_at}};
  if (status.error) record["error"] = *status.error;
  std::string text = core::json_text(record);
  // Keep the start of a long error: that is where the cause is.
  std::string error = status.error.value_or("");
  while (text.size() > kFinalStatusBytes - 1 && !error.empty()) {
    error.resize(error.size() / 2);
    record["error"] = error + "...";
    text = core::json_text(record);
  }
  text.resize(kFinalStatusBytes, ' ');
  text[kFinalStatusBytes - 1] = '\n';
  write_whole(run_dir + "/" + kFinalStatusFile, 0, text);  // no O_CREAT: only the reserved file, in place
}

std::optional<FinalStatus> read_final_status(const std::string& run_dir) {
  std::ifstream in(run_dir + "/" + kFinalStatusFile, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json record = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!record.is_object() || !record.contains("status") || !record["status"].is_string() ||
      !record.contains("ended_at") || !record["ended_at"].is_number())
    return std::nullopt;
  FinalStatus status;
  status.status = record["status"].get<std::string>();
  if (!is_run_status(status.status) || status.status == "running") return std::nullopt;
  status.ended_at = record["ended_at"].get<double>();
  if (record.contains("error") && record["error"].is_string()) status.error = record["error"].get<std::string>();
  return status;
}

}  // namespace runner::index
