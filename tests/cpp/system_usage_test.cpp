// Tests of runtime/system: the /proc parsers against this host's real files and against broken text, and NVML's
// readings of a CUDA device (on a GPU host only).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "runtime/core/clock.h"
#include "runtime/system/gpu_usage.h"
#include "runtime/system/host_usage.h"
#include "tests/cpp/cuda_skip.h"

using namespace runner::system;

TEST_CASE("the process's and the host's CPU time read from /proc give percentages within range", "[system]") {
  const double cores = static_cast<double>(::sysconf(_SC_NPROCESSORS_ONLN));
  const double process_before = read_process_cpu_seconds();
  const HostCpuTimes host_before = read_host_cpu_times();
  const double wall_before = runner::core::steady_seconds();
  // Busy for a while, so that the process's CPU time moves on by more than a clock tick.
  volatile double sink = 0;
  while (runner::core::steady_seconds() - wall_before < 0.3) sink = sink + 1;
  const double process_seconds = read_process_cpu_seconds() - process_before;
  const HostCpuTimes host_after = read_host_cpu_times();
  const double wall = runner::core::steady_seconds() - wall_before;
  const double process_percent = 100 * process_seconds / wall;
  CHECK(process_percent > 0);
  CHECK(process_percent <= 100 * cores + 5);  // a tick of rounding
  const std::optional<double> host_percent = host_busy_percent(host_before, host_after);
  REQUIRE(host_percent.has_value());
  CHECK(*host_percent > 0);
  CHECK(*host_percent <= 100);
  CHECK(host_after.busy_ticks <= host_after.total_ticks);
  // Every tick busy is 100 exactly, whatever the counts (no rounding of large sums).
  CHECK(host_busy_percent({7'000'000'001, 9'000'000'003}, {7'300'000'004, 9'300'000'006}) == 100.0);
  CHECK_FALSE(host_busy_percent(host_after, host_after).has_value());
}

TEST_CASE("the process's resident memory and its peak read from /proc follow what it touches", "[system]") {
  const ProcessMemory before = read_process_memory();
  CHECK(before.resident_bytes > 0);
  CHECK(before.peak_resident_bytes >= before.resident_bytes);
  constexpr std::size_t kTouched = 64 << 20;
  std::vector<char> block(kTouched);
  std::memset(block.data(), 1, block.size());
  const ProcessMemory after = read_process_memory();
  CHECK(after.resident_bytes >= before.resident_bytes + kTouched / 2);
  CHECK(after.peak_resident_bytes >= after.resident_bytes);
  const HostMemory host = read_host_memory();
  CHECK(host.available_bytes > 0);
  CHECK(host.total_bytes > host.available_bytes);
  CHECK(host.total_bytes > after.resident_bytes);
}

TEST_CASE("the /proc parsers read fields after a command name with spaces and name what is missing", "[system]") {
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  // pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime ...
  CHECK(parse_process_cpu_seconds("42 (a (b) c) R 1 42 42 0 -1 4194304 10 0 0 0 250 50 0 0 20 0 1", "stat") ==
        Approx(300 / ticks));
  REQUIRE_THROWS_WITH(parse_process_cpu_seconds("42 (runner) R 1 42", "/proc/self/stat"),
                      "/proc/self/stat: fewer than 15 fields: '42 (runner) R 1 42'");
  REQUIRE_THROWS_WITH(parse_process_cpu_seconds("42 runner R", "/proc/self/stat"),
                      "/proc/self/stat: no ')' ends the command name: '42 runner R'");
  const HostCpuTimes host = parse_host_cpu_times("cpu  100 10 40 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n", "stat");
  CHECK(host.busy_ticks == 150);
  CHECK(host.total_ticks == 1000);
  REQUIRE_THROWS_WITH(parse_host_cpu_times("intr 1 2 3\n", "/proc/stat"),
                      "/proc/stat: the first line is not 'cpu <user> <nice> <system> <idle> ...': 'intr 1 2 3'");
  const ProcessMemory memory = parse_process_memory("Name:\trunner\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n", "status");
  CHECK(memory.resident_bytes == 1024 * 1024);
  CHECK(memory.peak_resident_bytes == 2048 * 1024);
  REQUIRE_THROWS_WITH(parse_process_memory("VmHWM:\t 1 kB\n", "/proc/self/status"),
                      "/proc/self/status: there is no VmRSS line");
  REQUIRE_THROWS_WITH(parse_host_memory("MemTotal: lots\n", "/proc/meminfo"),
                      "/proc/meminfo: the MemTotal line is not '<number> kB': 'MemTotal: lots'");
}

TEST_CASE("NVML reads a CUDA device's utilisation, memory, power and temperature", "[system][cuda]") {
  SKIP_WITHOUT_CUDA("NVML's readings of a GPU");
  const auto device = NvmlDevice::open(0);
  const GpuReading reading = device->read();
  REQUIRE(reading.utilization_percent);
  CHECK(*reading.utilization_percent >= 0);
  CHECK(*reading.utilization_percent <= 100);
  REQUIRE(reading.memory_used_bytes);
  CHECK(*reading.memory_used_bytes > 0);
  REQUIRE(reading.temperature_celsius);
  CHECK(*reading.temperature_celsius > 0);
  CHECK(*reading.temperature_celsius < 120);
  if (reading.power_watts) CHECK(*reading.power_watts > 0);
}
