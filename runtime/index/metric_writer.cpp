// The metric writer thread: queued values inserted many rows per statement (a later value for the same key and
// step replaces the earlier one), the per-key latest values and the run's heartbeat, one transaction per batch.
#include "runtime/index/metric_writer.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "runtime/core/logging.h"
#include "runtime/core/utf8_text.h"
#include "runtime/index/index_database.h"
#include "runtime/index/run_store.h"

namespace runner::index {
namespace {

using Clock = std::chrono::steady_clock;

// Rows per INSERT statement: 5 parameters each, within SQLite's 32766 and PostgreSQL's 65535 parameters.
constexpr size_t kRowsPerInsert = 1000;

std::string metrics_insert(size_t rows) {
  std::string sql = "INSERT INTO metrics (run, key, step, value, time) VALUES ";
  for (size_t i = 0; i < rows; ++i) sql += i ? ", (?, ?, ?, ?, ?)" : "(?, ?, ?, ?, ?)";
  return sql + " ON CONFLICT (run, key, step) DO UPDATE SET value = excluded.value, time = excluded.time";
}

Clock::duration seconds(double value) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(value));
}

}  // namespace

MetricWriter::MetricWriter(IndexLocation index, int64_t run, MetricWriterOptions options)
    : index_(std::move(index)), run_(run), options_(options) {
  // Opening here reports a bad index to the caller instead of failing later on the thread.
  open_index_for_writing(index_);
  // Both buffers start at a batch's size, so the training loop's push never pays for growing the queue
  // while the writer keeps up.
  queued_.reserve(options_.flush_rows);
  thread_ = std::thread([this] { run_thread(); });
}

MetricWriter::~MetricWriter() {
  try {
    close();
  } catch (const std::exception& error) {
    core::log(core::LogLevel::error, std::string("metrics not written: ") + error.what());
  }
}

uint32_t MetricWriter::intern(std::string_view key) {
  auto found = key_ids_.find(std::string(key));
  if (found != key_ids_.end()) return found->second;
  core::require_utf8(key, "metric key");
  const auto id = static_cast<uint32_t>(keys_.size());
  keys_.emplace_back(key);
  key_ids_.emplace(keys_.back(), id);
  return id;
}

void MetricWriter::push(Entry entry) {
  std::unique_lock lock(mutex_);
  if (closed_) throw IndexError("metrics cannot be logged after the run has finished");
  if (queued_.size() >= options_.max_queued_rows) {
    wake_writer_.notify_one();
    batch_done_.wait(lock, [&] { return queued_.size() < options_.max_queued_rows || failure_; });
    if (failure_ && queued_.size() >= options_.max_queued_rows) std::rethrow_exception(failure_);
  }
  queued_.push_back(std::move(entry));
  ++queued_total_;
  if (queued_.size() == options_.flush_rows) wake_writer_.notify_one();
}

void MetricWriter::log(std::string_view key, int64_t step, double value, double time) {
  std::unique_lock lock(mutex_);
  const uint32_t id = intern(key);
  lock.unlock();
  push({id, step, time, value, {}});
}

void MetricWriter::log(std::string_view key, int64_t step, const at::Tensor& value, double time) {
  if (value.numel() != 1)
    throw std::invalid_argument("metric '" + std::string(key) + "' must be a number or a one-element tensor, got " +
                                std::to_string(value.numel()) + " elements");
  // The value is the one the tensor holds now, even if the script changes it in place afterwards: a CPU value
  // is read at once, a device value is copied (asynchronously) and read on the writer thread.
  if (!value.is_cuda() && !value.is_privateuseone() && !value.is_xpu() && !value.is_mps()) {
    log(key, step, value.item<double>(), time);
    return;
  }
  std::unique_lock lock(mutex_);
  const uint32_t id = intern(key);
  lock.unlock();
  push({id, step, time, 0.0, value.detach().clone()});
}

void MetricWriter::set_step(int64_t step) {
  std::lock_guard lock(mutex_);
  step_ = step;
}

void MetricWriter::flush() {
  std::unique_lock lock(mutex_);
  if (closed_ && !thread_.joinable()) return;
  const uint64_t target = queued_total_;
  if (committed_total_ >= target) return;
  flush_target_ = std::max(flush_target_, target);
  wake_writer_.notify_one();
  batch_done_.wait(lock, [&] { return committed_total_ >= target || failure_ || !thread_.joinable(); });
  if (committed_total_ < target && failure_) std::rethrow_exception(failure_);
}

void MetricWriter::close() {
  {
    std::lock_guard lock(mutex_);
    if (closed_) return;
    closed_ = true;
    stopping_ = true;
  }
  wake_writer_.notify_one();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mutex_);
  if (committed_total_ >= queued_total_ || !failure_) return;
  std::string cause;
  try {
    std::rethrow_exception(failure_);
  } catch (const std::exception& error) {
    cause = error.what();
  }
  throw IndexError(fmt::format("{} of {} metric values could not be written to the index: {}",
                               queued_total_ - committed_total_, queued_total_, cause));
}

uint64_t MetricWriter::values_logged() const {
  std::lock_guard lock(mutex_);
  return queued_total_;
}

uint64_t MetricWriter::rows_written() const {
  std::lock_guard lock(mutex_);
  return committed_total_;
}

void MetricWriter::run_thread() {
  std::optional<Database> db;
  std::optional<Statement> insert, latest, heartbeat, attempt_step;
  std::vector<std::string> keys;
  std::vector<Entry> batch;
  batch.reserve(options_.flush_rows);
  auto last_flush = Clock::now();
  auto next_heartbeat = Clock::now();
  int failures = 0;
  constexpr int kFinalAttempts = 4;
  int final_attempts = 0;

  std::unique_lock lock(mutex_);
  while (true) {
    const auto retry_pause = seconds(std::min(30.0, options_.flush_interval_seconds * (1 << std::min(failures, 5))));
    const auto deadline =
        std::min(last_flush + (failures ? retry_pause : seconds(options_.flush_interval_seconds)), next_heartbeat);
    wake_writer_.wait_until(lock, deadline, [&] {
      return stopping_ || (!failures && (queued_.size() >= options_.flush_rows || flush_target_ > committed_total_));
    });
    const auto now = Clock::now();
    const bool heartbeat_due = now >= next_heartbeat;
    if (queued_.empty() && !heartbeat_due && !stopping_) continue;
    batch.swap(queued_);
    for (size_t i = keys.size(); i < keys_.size(); ++i) keys.push_back(keys_[i]);
    const int64_t step = step_;
    const bool stopping = stopping_;
    lock.unlock();

    std::exception_ptr failure;
    try {
      if (!db) {
        db.emplace(open_index_for_writing(index_));
        insert.emplace(db->prepare(metrics_insert(kRowsPerInsert)));
        latest.emplace(*db,
                       "INSERT INTO metric_latest (run, key, step, value, time) VALUES (?, ?, ?, ?, ?) "
                       "ON CONFLICT (run, key) DO UPDATE SET step = excluded.step, value = excluded.value, "
                       "time = excluded.time WHERE excluded.step >= metric_latest.step");
        heartbeat.emplace(
            db->prepare("UPDATE runs SET heartbeat_at = ?1, step = " + db->greatest("step", "?2") + " WHERE run = ?3"));
        attempt_step.emplace(*db,
                             "UPDATE attempts SET end_step = ?1 WHERE run = ?2 AND attempt = "
                             "(SELECT attempts FROM runs WHERE run = ?2)");
      }
      std::map<uint32_t, size_t> newest;                       // key -> index of the entry with the highest step
      std::map<std::pair<uint32_t, int64_t>, size_t> last_at;  // (key, step) -> index of its latest entry
      for (size_t i = 0; i < batch.size(); ++i) {
        Entry& entry = batch[i];
        if (entry.tensor.defined()) {
          entry.value = entry.tensor.item<double>();
          entry.tensor = at::Tensor();
        }
        last_at[{entry.key, entry.step}] = i;
        auto [slot, fresh] = newest.emplace(entry.key, i);
        if (!fresh && batch[slot->second].step <= entry.step) slot->second = i;
      }
      std::vector<size_t> rows;
      rows.reserve(last_at.size());
      for (const auto& [key_step, i] : last_at) rows.push_back(i);
      // A connection lost meanwhile (an answer lost in the network too) connects again, and the batch's statements
      // run again.
      with_transaction(
          *db,
          [&] {
            for (size_t first = 0; first < rows.size(); first += kRowsPerInsert) {
              const size_t count = std::min(kRowsPerInsert, rows.size() - first);
              std::optional<Statement> partial;  // the batch's last, shorter statement
              if (count < kRowsPerInsert) partial.emplace(db->prepare(metrics_insert(count)));
              Statement& statement = partial ? *partial : *insert;
              for (size_t r = 0; r < count; ++r) {
                const Entry& entry = batch[rows[first + r]];
                const int p = static_cast<int>(5 * r);
                statement.bind(p + 1, run_).bind(p + 2, keys[entry.key]).bind(p + 3, entry.step);
                if (std::isnan(entry.value))
                  statement.bind_null(p + 4);
                else
                  statement.bind(p + 4, entry.value);
                statement.bind(p + 5, entry.time);
              }
              statement.run();
            }
            for (const auto& [key, i] : newest) {
              const Entry& entry = batch[i];
              latest->bind(1, run_).bind(2, keys[key]).bind(3, entry.step);
              if (std::isnan(entry.value))
                latest->bind_null(4);
              else
                latest->bind(4, entry.value);
              latest->bind(5, entry.time);
              latest->run();
            }
            heartbeat->bind(1, now_seconds()).bind(2, step).bind(3, run_);
            heartbeat->run();
            attempt_step->bind(1, step).bind(2, run_);
            attempt_step->run();
          },
          TransactionScope::own_rows);
    } catch (...) {
      failure = std::current_exception();
      // Nothing of the transaction was committed; the next try opens the index again (a connection to a server
      // lost again and again, a file replaced meanwhile).
      insert.reset(), latest.reset(), heartbeat.reset(), attempt_step.reset();
      db.reset();
    }

    lock.lock();
    last_flush = Clock::now();
    if (failure) {
      // Nothing of the batch was committed: it goes back in front of what was queued meanwhile.
      batch.insert(batch.end(), std::make_move_iterator(queued_.begin()), std::make_move_iterator(queued_.end()));
      queued_.swap(batch);
      if (!failures) {
        try {
          std::rethrow_exception(failure);
        } catch (const std::exception& error) {
          core::log(core::LogLevel::warn, std::string("metrics are waiting to be written: ") + error.what());
        }
      }
      ++failures;
      failure_ = failure;
    } else {
      committed_total_ += batch.size();
      failures = 0;
      failure_ = nullptr;
      next_heartbeat = last_flush + seconds(options_.heartbeat_seconds);
    }
    batch.clear();
    batch_done_.notify_all();
    if (stopping && failure && ++final_attempts < kFinalAttempts) {
      // At close, a few more tries over a few seconds (space freed meanwhile), then the values are lost.
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(500 * final_attempts));
      lock.lock();
      continue;
    }
    if (stopping && (queued_.empty() || failure)) break;
  }
}

}  // namespace runner::index
