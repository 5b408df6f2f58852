// The host's and this process's CPU time and memory as Linux reports them in /proc: the readings a run's system
// metrics (runtime/run/system_metrics.h) turn into percentages and sizes. Each parse_* function reads the text of
// its file, so that a test can give it any text; read_* reads the real file.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace runner::system {

// The text of a /proc file; throws std::runtime_error "PATH: cannot read it: ..." when it cannot be read.
std::string read_proc_file(const std::string& path);
// What read_* read their file with: read_proc_file, or a test's reader that gives other text.
using ProcFileReader = std::function<std::string(const std::string& path)>;

// Seconds of CPU time the process has used, user and system together (fields 14 and 15 of /proc/self/stat).
double parse_process_cpu_seconds(const std::string& stat_text, const std::string& where);
double read_process_cpu_seconds(const ProcFileReader& read = read_proc_file);

// The host's CPU time over all cores since boot (the first "cpu" line of /proc/stat), in clock ticks: busy (all but
// idle and iowait) and in total. Their changes over an interval give the share of the host that was busy.
struct HostCpuTimes {
  std::uint64_t busy_ticks = 0;
  std::uint64_t total_ticks = 0;
};
HostCpuTimes parse_host_cpu_times(const std::string& stat_text, const std::string& where);
HostCpuTimes read_host_cpu_times(const ProcFileReader& read = read_proc_file);
// The share of the host that was busy between two readings, in percent (0 to 100, exactly: the counts are whole
// ticks); nullopt when no tick passed.
std::optional<double> host_busy_percent(const HostCpuTimes& before, const HostCpuTimes& after);

// The process's resident memory now and at its peak (VmRSS and VmHWM of /proc/self/status), in bytes.
struct ProcessMemory {
  double resident_bytes = 0;
  double peak_resident_bytes = 0;
};
ProcessMemory parse_process_memory(const std::string& status_text, const std::string& where);
ProcessMemory read_process_memory(const ProcFileReader& read = read_proc_file);

// The host's memory (MemTotal and MemAvailable of /proc/meminfo), in bytes; used is total less available.
struct HostMemory {
  double total_bytes = 0;
  double available_bytes = 0;
};
HostMemory parse_host_memory(const std::string& meminfo_text, const std::string& where);
HostMemory read_host_memory(const ProcFileReader& read = read_proc_file);

}  // namespace runner::system
