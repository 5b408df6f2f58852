// The sampler thread of a run's system metrics: host and process readings from /proc, the loader's stats, the CUDA
// caching allocator's counts and NVML's readings, logged as sys/* at the run's step.
#include "runtime/run/system_metrics.h"

#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

#include "runtime/core/clock.h"
#include "runtime/core/device.h"
#include "runtime/core/logging.h"
#include "runtime/index/run_store.h"
#include "runtime/system/host_usage.h"

namespace runner::run {
namespace {

constexpr double kMebibyte = 1024.0 * 1024.0;

}  // namespace

SystemMetrics::SystemMetrics(index::MetricWriter& writer, std::function<std::int64_t()> step,
                             SystemMetricsOptions options)
    : writer_(writer), step_(std::move(step)), options_(options) {
  if (!(options_.interval_seconds > 0))
    throw std::invalid_argument(
        fmt::format("system metrics: the interval must be more than 0 seconds, got {}", options_.interval_seconds));
  if (options_.device.is_cuda()) {
    try {
      nvml_ = system::NvmlDevice::open(options_.device.index() < 0 ? 0 : options_.device.index());
    } catch (const std::exception& error) {
      core::log(core::LogLevel::info,
                fmt::format("system metrics: GPU utilisation, memory used, power and temperature are not recorded "
                            "(NVML: {})",
                            error.what()));
    }
  }
  thread_ = std::thread([this] { run_thread(); });
}

SystemMetrics::~SystemMetrics() { stop(); }

void SystemMetrics::attach_loader(std::shared_ptr<data::Loader> loader) {
  std::lock_guard lock(mutex_);
  loader_ = std::move(loader);
  loader_changed_ = true;
}

void SystemMetrics::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SystemMetrics::run_thread() {
  try {
    previous_time_ = core::steady_seconds();
    reading("the process's CPU time",
            [&] { previous_process_cpu_ = system::read_process_cpu_seconds(options_.read_proc_file); });
    reading("the host's CPU time", [&] { previous_host_ = system::read_host_cpu_times(options_.read_proc_file); });
    previous_step_ = step_();
    const auto interval = std::chrono::duration<double>(options_.interval_seconds);
    std::unique_lock lock(mutex_);
    while (!wake_.wait_for(lock, interval, [this] { return stopping_; })) {
      lock.unlock();
      sample();
      lock.lock();
    }
  } catch (const std::exception& error) {
    core::log(core::LogLevel::warn, fmt::format("system metrics are no longer recorded: {}", error.what()));
  }
}

bool SystemMetrics::reading(const char* what, const std::function<void()>& read) {
  try {
    read();
    return true;
  } catch (const std::exception& error) {
    if (failed_readings_.insert(what).second)
      core::log(core::LogLevel::warn,
                fmt::format("system metrics: {} is left out where it cannot be read ({}); the other readings go on",
                            what, error.what()));
    return false;
  }
}

void SystemMetrics::sample() {
  std::vector<std::pair<const char*, double>> values;
  const double now = core::steady_seconds();
  const double elapsed = now - previous_time_;
  const std::int64_t step = step_();
  const system::ProcFileReader& read = options_.read_proc_file;

  std::optional<double> process_cpu;
  reading("the process's CPU time", [&] { process_cpu = system::read_process_cpu_seconds(read); });
  if (process_cpu && previous_process_cpu_)
    values.emplace_back("sys/cpu_percent", 100 * (*process_cpu - *previous_process_cpu_) / elapsed);
  std::optional<system::HostCpuTimes> host;
  reading("the host's CPU time", [&] { host = system::read_host_cpu_times(read); });
  if (host && previous_host_)
    if (const std::optional<double> busy = system::host_busy_percent(*previous_host_, *host))
      values.emplace_back("sys/host_cpu_percent", *busy);
  reading("the process's memory", [&] {
    const system::ProcessMemory process_memory = system::read_process_memory(read);
    values.emplace_back("sys/rss_mib", process_memory.resident_bytes / kMebibyte);
    values.emplace_back("sys/peak_rss_mib", process_memory.peak_resident_bytes / kMebibyte);
  });
  reading("the host's memory", [&] {
    const system::HostMemory host_memory = system::read_host_memory(read);
    values.emplace_back("sys/host_memory_used_mib",
                        (host_memory.total_bytes - host_memory.available_bytes) / kMebibyte);
    values.emplace_back("sys/host_memory_available_mib", host_memory.available_bytes / kMebibyte);
  });
  // The rates of training are measured over intervals with steps: a time without them (an evaluation, the end of
  // the run) would read 0 and stand as the run's last rate.
  const bool trained = step != previous_step_;
  if (trained) values.emplace_back("sys/steps_per_second", static_cast<double>(step - previous_step_) / elapsed);

  std::shared_ptr<data::Loader> loader;
  bool loader_changed = false;
  {
    std::lock_guard lock(mutex_);
    loader = loader_;
    loader_changed = std::exchange(loader_changed_, false);
  }
  if (loader) {
    const data::LoaderStats stats = loader->stats();
    // A loader attached since the last sample is measured from now on.
    if (!loader_changed && trained) {
      values.emplace_back("sys/loader_queue_depth", stats.queue_depth);
      values.emplace_back("sys/data_wait_percent",
                          100 * (stats.wait_seconds - previous_loader_.wait_seconds) / elapsed);
      values.emplace_back("sys/samples_per_second", static_cast<double>(stats.samples - previous_loader_.samples) *
                                                        options_.world_size / elapsed);
    }
    previous_loader_ = stats;
  }

  if (options_.device.is_cuda()) {
    reading("the CUDA allocator's memory", [&] {
      const core::CudaMemory memory = core::cuda_memory(options_.device.index() < 0 ? 0 : options_.device.index());
      values.emplace_back("sys/cuda_allocated_mib", memory.allocated / kMebibyte);
      values.emplace_back("sys/cuda_reserved_mib", memory.reserved / kMebibyte);
      values.emplace_back("sys/cuda_peak_allocated_mib", memory.peak_allocated / kMebibyte);
    });
  }
  if (nvml_) {
    reading("the GPU's readings (NVML)", [&] {
      const system::GpuReading gpu = nvml_->read();
      if (gpu.utilization_percent) values.emplace_back("sys/gpu_percent", *gpu.utilization_percent);
      if (gpu.memory_used_bytes) values.emplace_back("sys/gpu_memory_used_mib", *gpu.memory_used_bytes / kMebibyte);
      if (gpu.power_watts) values.emplace_back("sys/gpu_power_watts", *gpu.power_watts);
      if (gpu.temperature_celsius) values.emplace_back("sys/gpu_temperature_celsius", *gpu.temperature_celsius);
    });
  }

  const double time = index::now_seconds();
  for (const auto& [key, value] : values) writer_.log(key, step, value, time);
  values_logged_ += values.size();
  previous_time_ = now;
  previous_process_cpu_ = process_cpu;
  previous_host_ = host;
  previous_step_ = step;
}

}  // namespace runner::run
