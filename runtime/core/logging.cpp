// spdlog configuration and the log entry point for the runner process.
#include "runtime/core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <stdexcept>
#include <utility>

namespace runner::core {
namespace {

spdlog::level::level_enum to_spdlog(LogLevel level) {
  switch (level) {
    case LogLevel::trace: return spdlog::level::trace;
    case LogLevel::debug: return spdlog::level::debug;
    case LogLevel::info: return spdlog::level::info;
    case LogLevel::warn: return spdlog::level::warn;
    case LogLevel::error: return spdlog::level::err;
    case LogLevel::off: return spdlog::level::off;
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

}  // namespace

LogLevel parse_log_level(const std::string& level) {
  static const std::pair<const char*, LogLevel> levels[] = {
      {"trace", LogLevel::trace}, {"debug", LogLevel::debug}, {"info", LogLevel::info},
      {"warn", LogLevel::warn},   {"error", LogLevel::error}, {"off", LogLevel::off}};
  for (const auto& [name, value] : levels)
    if (level == name) return value;
  throw std::invalid_argument("unknown log level '" + level + "' (expected trace, debug, info, warn, error or off)");
}

void set_log_level(const std::string& level) { runner_logger()->set_level(to_spdlog(parse_log_level(level))); }

void init_logging(const std::string& level) { set_log_level(level); }

void log(LogLevel level, std::string_view message) {
  runner_logger()->log(to_spdlog(level), "{}", spdlog::string_view_t(message.data(), message.size()));
}

bool log_enabled(LogLevel level) { return runner_logger()->should_log(to_spdlog(level)); }

void flush_logs() { runner_logger()->flush(); }

}  // namespace runner::core
