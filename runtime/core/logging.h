// Logging for the runner process: one spdlog logger on stderr whose level the CLI's --log-level sets.
// This header stays free of spdlog and fmt: LibTorch bundles its own fmt, so spdlog (built on
// Debian's fmt) is confined to logging.cpp, which is compiled without the LibTorch include path.
#pragma once
#include <string>
#include <string_view>

namespace runner::core {

enum class LogLevel { trace, debug, info, warn, error, off };

// Levels: trace, debug, info, warn, error, off. Throws std::invalid_argument for anything else.
LogLevel parse_log_level(const std::string& level);
void set_log_level(const std::string& level);
void init_logging(const std::string& level = "info");
void log(LogLevel level, std::string_view message);
bool log_enabled(LogLevel level);
void flush_logs();

// While attached, log messages (every level the logger passes) are also appended to `path` with full
// timestamps, and append_to_log_file() adds raw lines (a script's printed output). Throws
// std::runtime_error naming the path when it cannot be opened.
void attach_log_file(const std::string& path);
void detach_log_file();
void append_to_log_file(std::string_view text);
// A log message for the attached log file only (not the terminal), with a timestamp as the others.
void log_to_file(LogLevel level, std::string_view message);

}  // namespace runner::core
