// A run's system metrics, recorded without a line of the script's code (as W&B's are): a thread that every few
// seconds logs sys/* values at the run's current step through its metric writer. What it records:
//   sys/cpu_percent            this process's CPU use over the interval (100 = one core busy)
//   sys/host_cpu_percent       the host's, over all its cores (100 = every core busy)
//   sys/rss_mib, sys/peak_rss_mib                  the process's resident memory now and at its peak
//   sys/host_memory_used_mib, sys/host_memory_available_mib
//   sys/steps_per_second       the run's steps over the interval
//   with a loader attached (run:restore): sys/loader_queue_depth (batches ready at its last batch),
//     sys/data_wait_percent (the share of the interval the training loop waited for batches) and
//     sys/samples_per_second (this rank's samples over the interval, times the world size)
//   The rates of training (steps, samples, data wait, queue depth) are left out of an interval without steps (an
//   evaluation, the end of a run), whose 0 would stand as the run's last rate.
//   on a CUDA device: sys/cuda_allocated_mib, sys/cuda_reserved_mib, sys/cuda_peak_allocated_mib (the caching
//     allocator's counts), and from the driver (NVML, runtime/system/gpu_usage.h) sys/gpu_percent,
//     sys/gpu_memory_used_mib, sys/gpu_power_watts, sys/gpu_temperature_celsius.
// Rank 0 records them (a follower rank records nothing). Its values are keyed by step as every metric is, so
// several samples within one step keep the last. A reading that fails (a damaged /proc file, the driver) is left out
// of that sample, with a warning the first time, and the other readings go on; so does that one at the next sample.
#pragma once

#include <c10/core/Device.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "runtime/data/loader.h"
#include "runtime/index/metric_writer.h"
#include "runtime/system/gpu_usage.h"
#include "runtime/system/host_usage.h"

namespace runner::run {

struct SystemMetricsOptions {
  double interval_seconds = 10;  // between samples; the first is taken one interval after the start
  c10::Device device = c10::Device(c10::kCPU);
  int world_size = 1;
  system::ProcFileReader read_proc_file = system::read_proc_file;  // a test gives damaged /proc files
};

class SystemMetrics {
 public:
  // Starts the thread. `step` gives the run's current step (called on the thread). The writer must outlive
  // this object.
  SystemMetrics(index::MetricWriter& writer, std::function<std::int64_t()> step, SystemMetricsOptions options);
  ~SystemMetrics();  // stop()
  SystemMetrics(const SystemMetrics&) = delete;
  SystemMetrics& operator=(const SystemMetrics&) = delete;

  // The loader whose queue and waits are sampled from now on; nullptr for none.
  void attach_loader(std::shared_ptr<data::Loader> loader);
  // Ends the thread (a sample in progress completes first). Idempotent.
  void stop();
  // Values given to the writer so far.
  std::uint64_t values_logged() const { return values_logged_.load(); }

 private:
  void run_thread();
  void sample();
  // Runs one reading; when it throws, warns the first time (naming `what`) and returns false.
  bool reading(const char* what, const std::function<void()>& read);

  index::MetricWriter& writer_;
  std::function<std::int64_t()> step_;
  SystemMetricsOptions options_;
  std::unique_ptr<system::NvmlDevice> nvml_;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::shared_ptr<data::Loader> loader_;  // guarded by mutex_
  bool loader_changed_ = false;           // guarded by mutex_

  // The previous sample's readings (thread only), which the rates are taken over; none where it failed.
  double previous_time_ = 0;
  std::optional<double> previous_process_cpu_;
  std::optional<system::HostCpuTimes> previous_host_;
  std::int64_t previous_step_ = 0;
  data::LoaderStats previous_loader_;

  std::set<std::string> failed_readings_;  // those warned about (thread only)

  std::atomic<std::uint64_t> values_logged_{0};
  std::thread thread_;
};

}  // namespace runner::run
