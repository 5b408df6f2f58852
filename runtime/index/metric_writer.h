// The background metric writer of a run: log() queues values without touching the database; a writer thread
// commits them in one transaction per flush (on a timer, when many are queued, or when asked) and keeps the
// run's heartbeat fresh.
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/index/index_database.h"

namespace runner::index {

struct MetricWriterOptions {
  double flush_interval_seconds = 1.0;  // a queued value reaches the index at most this late
  size_t flush_rows = 50000;            // or sooner, once this many are queued
  size_t max_queued_rows = 4000000;     // log() waits (back-pressure) beyond this
  double heartbeat_seconds = 5.0;
};

class MetricWriter {
 public:
  // Opens its own connection to the index at `index` for run `run`.
  MetricWriter(IndexLocation index, int64_t run, MetricWriterOptions options = {});
  ~MetricWriter();  // close() without throwing; an error then is logged
  MetricWriter(const MetricWriter&) = delete;
  MetricWriter& operator=(const MetricWriter&) = delete;

  // Queues one value at `step`; (key, step) pairs are unique per run: a later value replaces an earlier one.
  void log(std::string_view key, int64_t step, double value, double time);
  // A one-element tensor's current value: a device tensor is copied and read on the writer thread, so a
  // CUDA value costs the training loop no device synchronisation.
  void log(std::string_view key, int64_t step, const at::Tensor& value, double time);
  // The step the heartbeat records as the run's progress and as the end step of its running attempt.
  void set_step(int64_t step);

  // Blocks until everything queued before the call is committed. Throws IndexError if the writer failed.
  void flush();
  // Commits what is queued (retrying a failed write a few times over a few seconds), then stops the thread.
  // Throws IndexError "N of M metric values could not be written to the index: <cause>" when values are
  // lost. Idempotent.
  void close();

  uint64_t rows_written() const;
  uint64_t values_logged() const;  // every value given to log(), written or not

 private:
  struct Entry {
    uint32_t key;
    int64_t step;
    double time;
    double value;
    at::Tensor tensor;  // undefined for plain values
  };
  uint32_t intern(std::string_view key);
  void push(Entry entry);
  void run_thread();
  void write_batch(std::vector<Entry>& batch);

  IndexLocation index_;
  int64_t run_;
  MetricWriterOptions options_;

  mutable std::mutex mutex_;
  std::condition_variable wake_writer_;
  std::condition_variable batch_done_;
  std::vector<Entry> queued_;
  std::vector<std::string> keys_;
  std::unordered_map<std::string, uint32_t> key_ids_;
  uint64_t queued_total_ = 0;     // entries ever queued
  uint64_t committed_total_ = 0;  // entries ever committed
  uint64_t flush_target_ = 0;
  int64_t step_ = 0;
  bool stopping_ = false;
  bool closed_ = false;
  std::exception_ptr failure_;
  std::thread thread_;
};

}  // namespace runner::index
