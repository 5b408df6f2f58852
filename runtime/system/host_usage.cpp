// Parsers of /proc/self/stat, /proc/stat, /proc/self/status and /proc/meminfo.
#include "runtime/system/host_usage.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <algorithm>
#include <fmt/format.h>

namespace runner::system {
namespace {

double clock_ticks_per_second() {
  static const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  return ticks;
}

// The value of "<name>: <number> kB" in a /proc file of such lines, in bytes.
double kilobyte_field(const std::string& text, const std::string& name, const std::string& where) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.starts_with(name + ":")) continue;
    std::istringstream fields(line.substr(name.size() + 1));
    double kilobytes = -1;
    std::string unit;
    if (!(fields >> kilobytes >> unit) || kilobytes < 0 || unit != "kB")
      throw std::runtime_error(fmt::format("{}: the {} line is not '<number> kB': '{}'", where, name, line));
    return kilobytes * 1024;
  }
  throw std::runtime_error(fmt::format("{}: there is no {} line", where, name));
}

}  // namespace

std::string read_proc_file(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error(fmt::format("{}: cannot read it: {}", path, std::strerror(errno)));
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

double parse_process_cpu_seconds(const std::string& stat_text, const std::string& where) {
  // The command name (field 2) is in parentheses and may hold spaces: the fields are counted after its ')'.
  const std::size_t name_end = stat_text.rfind(')');
  if (name_end == std::string::npos)
    throw std::runtime_error(fmt::format("{}: no ')' ends the command name: '{}'", where, stat_text));
  std::istringstream fields(stat_text.substr(name_end + 1));
  std::vector<std::string> after_name;  // fields 3, 4, ...
  for (std::string field; after_name.size() < 13 && fields >> field;) after_name.push_back(field);
  if (after_name.size() < 13) throw std::runtime_error(fmt::format("{}: fewer than 15 fields: '{}'", where, stat_text));
  try {
    const double ticks = std::stod(after_name[11]) + std::stod(after_name[12]);  // utime (14) and stime (15)
    return ticks / clock_ticks_per_second();
  } catch (const std::logic_error&) {
    throw std::runtime_error(fmt::format("{}: utime and stime (fields 14 and 15) are not numbers: '{}' '{}'", where,
                                         after_name[11], after_name[12]));
  }
}

double read_process_cpu_seconds(const ProcFileReader& read) {
  const std::string path = "/proc/self/stat";
  return parse_process_cpu_seconds(read(path), path);
}

HostCpuTimes parse_host_cpu_times(const std::string& stat_text, const std::string& where) {
  std::istringstream lines(stat_text);
  std::string line;
  std::getline(lines, line);
  std::istringstream fields(line);
  std::string label;
  fields >> label;
  // user nice system idle iowait irq softirq steal (guest and guest_nice are counted in user and nice already)
  std::vector<std::uint64_t> ticks;
  for (std::uint64_t value; ticks.size() < 8 && fields >> value;) ticks.push_back(value);
  if (label != "cpu" || ticks.size() < 4)
    throw std::runtime_error(
        fmt::format("{}: the first line is not 'cpu <user> <nice> <system> <idle> ...': '{}'", where, line));
  std::uint64_t total = 0;
  for (std::uint64_t value : ticks) total += value;
  const std::uint64_t idle = ticks[3] + (ticks.size() > 4 ? ticks[4] : 0);
  return {total - idle, total};
}

std::optional<double> host_busy_percent(const HostCpuTimes& before, const HostCpuTimes& after) {
  if (after.total_ticks <= before.total_ticks) return std::nullopt;
  const std::uint64_t total = after.total_ticks - before.total_ticks;
  const std::uint64_t busy = after.busy_ticks >= before.busy_ticks ? after.busy_ticks - before.busy_ticks : 0;
  return 100.0 * static_cast<double>(std::min(busy, total)) / static_cast<double>(total);
}

HostCpuTimes read_host_cpu_times(const ProcFileReader& read) {
  const std::string path = "/proc/stat";
  return parse_host_cpu_times(read(path), path);
}

ProcessMemory parse_process_memory(const std::string& status_text, const std::string& where) {
  return {kilobyte_field(status_text, "VmRSS", where), kilobyte_field(status_text, "VmHWM", where)};
}

ProcessMemory read_process_memory(const ProcFileReader& read) {
  const std::string path = "/proc/self/status";
  return parse_process_memory(read(path), path);
}

HostMemory parse_host_memory(const std::string& meminfo_text, const std::string& where) {
  return {kilobyte_field(meminfo_text, "MemTotal", where), kilobyte_field(meminfo_text, "MemAvailable", where)};
}

HostMemory read_host_memory(const ProcFileReader& read) {
  const std::string path = "/proc/meminfo";
  return parse_host_memory(read(path), path);
}

}  // namespace runner::system
