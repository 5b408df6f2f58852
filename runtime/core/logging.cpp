// spdlog configuration and the log entry point for the runner process.
#include "runtime/core/logging.h"

#include "runtime/core/enum_table.h"
#include "runtime/core/open_line.h"
#include "runtime/core/terminal_text.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <stdexcept>
#include <algorithm>
#include <mutex>
#include <utility>

namespace runner::core {
namespace {

spdlog::level::level_enum to_spdlog(LogLevel level) {
  switch (level) {
    case LogLevel::trace:
      return spdlog::level::trace;
    case LogLevel::debug:
      return spdlog::level::debug;
    case LogLevel::info:
      return spdlog::level::info;
    case LogLevel::warn:
      return spdlog::level::warn;
    case LogLevel::error:
      return spdlog::level::err;
    case LogLevel::off:
      return spdlog::level::off;
  }
  return spdlog::level::info;
}

std::shared_ptr<spdlog::logger> runner_logger() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto created = spdlog::stderr_color_mt("runner");
    created->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    created->flush_on(spdlog::level::trace);  // log lines interleave correctly with script output
    return created;
  }();
  return logger;
}

// The run's log file: log messages through `sink` (with timestamps), printed text through `raw` (as is).
// Both append to the same file and flush every line, so the file keeps the order of events.
struct LogFile {
  std::mutex mutex;
  std::shared_ptr<spdlog::sinks::basic_file_sink_mt> sink;
  std::shared_ptr<spdlog::sinks::basic_file_sink_mt> raw;
};

LogFile& log_file() {
  static LogFile file;
  return file;
}

}  // namespace

LogLevel parse_log_level(const std::string& level) {
  static const EnumTable<LogLevel, 6> kLevels{{{{LogLevel::trace, "trace"},
                                                {LogLevel::debug, "debug"},
                                                {LogLevel::info, "info"},
                                                {LogLevel::warn, "warn"},
                                                {LogLevel::error, "error"},
                                                {LogLevel::off, "off"}}},
                                              NameQuotes::none,
                                              "unknown log level '{got}' (expected {list})"};
  return kLevels.parse(level);
}

void set_log_level(const std::string& level) { runner_logger()->set_level(to_spdlog(parse_log_level(level))); }

void init_logging(const std::string& level) { set_log_level(level); }

void log(LogLevel level, std::string_view message) {
  const std::string shown = terminal_text(message);
  if (runner_logger()->should_log(to_spdlog(level))) end_open_line();
  runner_logger()->log(to_spdlog(level), "{}", spdlog::string_view_t(shown.data(), shown.size()));
}

bool log_enabled(LogLevel level) { return runner_logger()->should_log(to_spdlog(level)); }

void flush_logs() { runner_logger()->flush(); }

}  // namespace runner::core

namespace runner::core {

void attach_log_file(const std::string& path) {
  detach_log_file();
  LogFile& file = log_file();
  std::lock_guard lock(file.mutex);
  try {
    file.sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path);
    file.raw = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path);
  } catch (const spdlog::spdlog_ex& error) {
    file.sink.reset();
    throw std::runtime_error(path + ": cannot open the log file: " + error.what());
  }
  file.sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
  file.sink->set_level(spdlog::level::trace);
  file.raw->set_pattern("%v");
  runner_logger()->sinks().push_back(file.sink);
}

void detach_log_file() {
  LogFile& file = log_file();
  std::lock_guard lock(file.mutex);
  if (!file.sink) return;
  auto& sinks = runner_logger()->sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), file.sink), sinks.end());
  file.sink->flush();
  file.sink.reset();
  file.raw.reset();
}

void append_to_log_file(std::string_view text) {
  LogFile& file = log_file();
  std::lock_guard lock(file.mutex);
  if (!file.raw) return;
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  file.raw->log(spdlog::details::log_msg("", spdlog::level::info, spdlog::string_view_t(text.data(), text.size())));
  file.raw->flush();
}

void log_to_file(LogLevel level, std::string_view message) {
  LogFile& file = log_file();
  std::lock_guard lock(file.mutex);
  if (!file.sink) return;
  const std::string shown = terminal_text(message);
  file.sink->log(spdlog::details::log_msg("", to_spdlog(level), spdlog::string_view_t(shown.data(), shown.size())));
  file.sink->flush();
}

}  // namespace runner::core
