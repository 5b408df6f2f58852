// The data loader: per-epoch seeded order, rank sharding, worker threads, pinned batches, device prefetch.
#include "runtime/data/loader.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>

#include "runtime/core/device.h"
#include "runtime/core/interrupt.h"
#include "runtime/core/shape_text.h"
#include "runtime/data/batch_order.h"
#include "runtime/data/data_error.h"
#include "runtime/core/sample_rng.h"

namespace runner::data {
namespace {

constexpr std::uint64_t kAugmentStream = 0x6175676d656e7431ull;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// A batch assembled on the host.
struct HostBatch {
  at::Tensor data;
  at::Tensor label;
  at::Tensor index;
  std::int64_t position = 0;
  std::int64_t epoch = 0;
  bool normalize_on_device = false;
  std::exception_ptr error;
  std::vector<SkippedSample> skipped;
};

// A batch whose copy to the device was started on the side stream.
struct StagedBatch {
  Batch batch;
  c10::Event ready;
  std::vector<SkippedSample> skipped;
};

// Host memory for batches, reused once Lua drops a batch: fresh multi-megabyte allocations would cost a
// page fault per 4 KiB on every batch. Buffers return through the tensor's deleter, from any thread.
class BatchBufferPool : public std::enable_shared_from_this<BatchBufferPool> {
 public:
  explicit BatchBufferPool(std::size_t max_free) : max_free_(max_free) {}
  ~BatchBufferPool() {
    for (const Buffer& buffer : free_) std::free(buffer.data);
  }

  at::Tensor make(const std::vector<std::int64_t>& shape, at::ScalarType dtype) {
    std::size_t bytes = at::elementSize(dtype);
    for (std::int64_t dim : shape) bytes *= static_cast<std::size_t>(dim);
    Buffer buffer = take(bytes);
    auto pool = shared_from_this();
    return at::from_blob(
        buffer.data, shape, [pool, buffer](void*) { pool->give_back(buffer); }, at::TensorOptions().dtype(dtype));
  }

 private:
  struct Buffer {
    void* data = nullptr;
    std::size_t bytes = 0;
  };

  Buffer take(std::size_t bytes) {
    {
      std::lock_guard lock(mutex_);
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->bytes == bytes) {
          const Buffer buffer = *it;
          free_.erase(it);
          return buffer;
        }
      }
    }
    void* data = std::aligned_alloc(64, (std::max<std::size_t>(bytes, 1) + 63) / 64 * 64);
    if (data == nullptr) throw std::bad_alloc();
    return Buffer{data, bytes};
  }

  void give_back(const Buffer& buffer) {
    std::lock_guard lock(mutex_);
    if (free_.size() < max_free_) {
      free_.push_back(buffer);
    } else {
      std::free(buffer.data);
    }
  }

  std::size_t max_free_;
  std::mutex mutex_;
  std::vector<Buffer> free_;
};

}  // namespace

int default_worker_count() {
  // Ranks of a data-parallel job on this node share its cores; each drives one GPU.
  const int ranks = std::max(1, core::launch_context().local_world_size);
  const int host_cores = core::launch_context().cores > 0
                             ? core::launch_context().cores
                             : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int cores = host_cores / ranks;
  const int gpus = ranks > 1 ? 1 : std::max(1, core::cuda_device_count());
  return std::max(cores >= 2 ? 1 : 0, std::min(4 * gpus, cores - 1));
}

struct Loader::Impl {
  std::shared_ptr<const Dataset> dataset;
  LoaderOptions options;
  std::function<void()> before_next;  // set_before_next
  std::int64_t size = 0;
  std::optional<BatchOrder> order;  // which samples each batch position reads
  bool cuda = false;
  bool synchronous = false;

  // Work queue and results, guarded by `mutex`.
  std::mutex mutex;
  std::condition_variable work_ready;
  std::condition_variable batch_done;
  std::deque<std::int64_t> pending;
  std::map<std::int64_t, HostBatch> ready;
  std::int64_t next_issue = 0;
  std::int64_t position = 0;
  std::int64_t end = -1;
  std::uint64_t generation = 0;
  bool stopping = false;
  std::vector<std::thread> threads;

  // The seed in use; read by workers when they take a batch (restore() may change it).
  std::uint64_t seed = 0;

  // Device prefetch (CUDA only; used by the calling thread only).
  std::optional<StagedBatch> staged;
  std::optional<c10::Stream> copy_stream;

  // Statistics, written by the calling thread and read by any (a run's system metrics) under `stats_mutex`.
  mutable std::mutex stats_mutex;
  LoaderStats stats;
  std::optional<Clock::time_point> first_request;
  void add_wait(double seconds) {
    std::lock_guard stats_lock(stats_mutex);
    stats.wait_seconds += seconds;
  }

  // Skip reports (calling thread only).
  std::set<std::string> reported_files;
  std::vector<SkippedSample> skip_reports;
  std::size_t skip_reports_taken = 0;

  std::vector<std::int64_t> batch_indices(std::uint64_t batch_seed, std::int64_t batch_position) const {
    return order->indices(batch_seed, batch_position);
  }

  bool normalize_on_device() const { return cuda; }

  std::shared_ptr<BatchBufferPool> buffers;

  at::Tensor allocate_batch(const std::vector<std::int64_t>& shape, at::ScalarType dtype, bool pinned) {
    // Pinned memory comes from LibTorch's caching host allocator, which already reuses blocks.
    if (pinned) return at::empty(shape, at::TensorOptions().dtype(dtype).pinned_memory(true));
    return buffers->make(shape, dtype);
  }

  // Assembles a batch. Runs on worker threads, or on the calling thread for synchronous loaders.
  HostBatch make_batch(std::uint64_t batch_seed, std::int64_t batch_position) {
    HostBatch batch;
    batch.position = batch_position;
    batch.epoch = batch_position / order->batches_per_epoch();
    const std::vector<std::int64_t> indices = batch_indices(batch_seed, batch_position);
    const auto n = static_cast<std::int64_t>(indices.size());
    const TransformSpec& spec = options.transform;
    const bool pinned = cuda && options.pin_memory;
    auto host = [&](at::ScalarType dtype) { return at::TensorOptions().dtype(dtype).pinned_memory(pinned); };

    thread_local Sample sample;
    thread_local std::vector<std::uint8_t> rendered;
    std::vector<std::int64_t> sample_shape;  // of the first sample, after the transform
    at::ScalarType sample_dtype = at::kByte;
    bool normalize = false;
    std::int64_t sample_elements = 0;
    std::vector<std::int64_t> labels;
    std::vector<std::int64_t> kept_indices;
    std::int64_t kept = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t index = indices[static_cast<std::size_t>(j)];
      try {
        sample.label = -1;
        core::SampleRng rng(batch_seed, kAugmentStream ^ static_cast<std::uint64_t>(batch.epoch),
                            static_cast<std::uint64_t>(index));
        if (dataset->kind() == SampleKind::image) {
          const Placement placement = read_and_place(*dataset, index, spec, rng, sample);
          const std::vector<std::int64_t> shape{sample.image.channels, placement.height, placement.width};
          if (!batch.data.defined()) {
            sample_shape = shape;
            normalize = spec.normalize;
            sample_dtype = normalize && !normalize_on_device() ? at::kFloat : at::kByte;
            sample_elements = shape[0] * shape[1] * shape[2];
            std::vector<std::int64_t> batch_shape{n};
            batch_shape.insert(batch_shape.end(), shape.begin(), shape.end());
            batch.data = allocate_batch(batch_shape, sample_dtype, pinned);
          } else if (shape != sample_shape) {
            throw DataError(dataset->source(index),
                            "is " + core::shape_text(shape) + " after the transform but the batch's first sample is " +
                                core::shape_text(sample_shape) + " (resize and crop to one size)");
          }
          if (sample_dtype == at::kFloat) {
            rendered.resize(static_cast<std::size_t>(sample_elements));
            render_image(sample.image, placement, rendered.data());
            normalize_bytes(rendered.data(), batch.data.data_ptr<float>() + kept * sample_elements, rendered.size());
          } else {
            render_image(sample.image, placement, batch.data.data_ptr<std::uint8_t>() + kept * sample_elements);
          }
        } else {
          ReadHint hint;
          hint.rng = &rng;
          dataset->read(index, hint, sample);
          at::Tensor& tensor = sample.tensor;
          if (dataset->reads_on_caller_thread() && (!tensor.is_contiguous() || !tensor.device().is_cpu()))
            tensor = tensor.to(at::kCPU).contiguous();
          const std::vector<std::int64_t> in_shape = tensor.sizes().vec();
          const SampleOrigin origin = [&] { return dataset->source(index); };
          const std::vector<std::int64_t> shape = tensor_output_shape(spec, in_shape, origin);
          const int h = in_shape.size() >= 2 ? static_cast<int>(in_shape[in_shape.size() - 2]) : 1;
          const int w = in_shape.empty() ? 1 : static_cast<int>(in_shape.back());
          Placement placement = place_sample(spec, h, w, rng, origin);
          if (!batch.data.defined()) {
            sample_shape = shape;
            sample_dtype = tensor.scalar_type();
            normalize = spec.normalize && sample_dtype == at::kByte;
            sample_elements = 1;
            for (std::int64_t d : shape) sample_elements *= d;
            std::vector<std::int64_t> batch_shape{n};
            batch_shape.insert(batch_shape.end(), shape.begin(), shape.end());
            batch.data =
                allocate_batch(batch_shape, normalize && !normalize_on_device() ? at::kFloat : sample_dtype, pinned);
          } else if (shape != sample_shape || tensor.scalar_type() != sample_dtype) {
            throw DataError(dataset->source(index),
                            "is " + core::shape_text(shape) + " " + c10::toString(tensor.scalar_type()) +
                                " but the batch's first sample is " + core::shape_text(sample_shape) + " " +
                                c10::toString(sample_dtype));
          }
          if (in_shape.size() < 2) placement.height = 1, placement.width = w;
          if (normalize && !normalize_on_device()) {
            rendered.resize(static_cast<std::size_t>(sample_elements));
            at::Tensor view = at::from_blob(rendered.data(), shape, at::kByte);
            render_tensor(tensor, placement, view);
            normalize_bytes(rendered.data(), batch.data.data_ptr<float>() + kept * sample_elements, rendered.size());
          } else {
            at::Tensor slot = batch.data[kept];
            render_tensor(tensor, placement, slot);
          }
        }
      } catch (const DataError& error) {
        // A sample's own file (an image of a folder) can be left out; a shared file's damage (a truncated
        // .npy) cannot usefully be, and gets no hint.
        if (options.on_error != BadSamplePolicy::skip && error.path != dataset->source(index)) throw;
        if (options.on_error != BadSamplePolicy::skip) {
          DataError hinted("", std::string(error.what()) + " (on_error = \"skip\" leaves bad samples out)");
          hinted.path = error.path;
          throw hinted;
        }
        batch.skipped.push_back(SkippedSample{error.path.empty() ? dataset->source(index) : error.path, error.what()});
        continue;
      }
      labels.push_back(sample.label);
      kept_indices.push_back(index);
      ++kept;
    }
    if (kept == 0) {
      throw DataError(dataset->source(indices.front()),
                      "every sample of batch " + std::to_string(batch_position) + " was bad and skipped");
    }
    if (kept < n) batch.data = batch.data.narrow(0, 0, kept);
    batch.index = at::empty({kept}, host(at::kLong));
    std::copy(kept_indices.begin(), kept_indices.end(), batch.index.data_ptr<std::int64_t>());
    if (dataset->has_labels()) {
      batch.label = at::empty({kept}, host(at::kLong));
      std::copy(labels.begin(), labels.end(), batch.label.data_ptr<std::int64_t>());
    }
    batch.normalize_on_device = normalize && normalize_on_device();
    return batch;
  }

  void worker_loop() {
    while (true) {
      std::int64_t batch_position = 0;
      std::uint64_t batch_generation = 0;
      std::uint64_t batch_seed = 0;
      {
        std::unique_lock lock(mutex);
        work_ready.wait(lock, [&] { return stopping || !pending.empty(); });
        if (stopping) return;
        batch_position = pending.front();
        pending.pop_front();
        batch_generation = generation;
        batch_seed = seed;
      }
      HostBatch batch;
      try {
        batch = make_batch(batch_seed, batch_position);
      } catch (...) {
        batch = HostBatch{};
        batch.position = batch_position;
        batch.error = std::current_exception();
      }
      std::lock_guard lock(mutex);
      if (batch_generation != generation) continue;
      ready.emplace(batch_position, std::move(batch));
      batch_done.notify_all();
    }
  }

  // Queues batches up to `prefetch` ahead of the position. Caller holds `mutex`.
  void issue_locked() {
    const std::int64_t limit = position + options.prefetch;
    bool issued = false;
    while (next_issue < limit && (end < 0 || next_issue < end)) {
      pending.push_back(next_issue++);
      issued = true;
    }
    if (issued) work_ready.notify_all();
  }

  HostBatch take_host_batch() {
    if (synchronous) {
      const auto start = Clock::now();
      HostBatch batch = make_batch(seed, position);
      add_wait(seconds_since(start));
      return batch;
    }
    std::unique_lock lock(mutex);
    if (next_issue <= position) next_issue = position;
    // A batch asked for at or past the end (after the loop that set it) lifts the end: nothing would make it.
    if (end >= 0 && position >= end) end = -1;
    issue_locked();
    const auto wait_start = Clock::now();
    while (ready.find(position) == ready.end()) {
      batch_done.wait_for(lock, std::chrono::milliseconds(50));
      if (core::interrupt_requested()) throw core::Interrupted();
    }
    {
      std::lock_guard stats_lock(stats_mutex);
      stats.wait_seconds += seconds_since(wait_start);
      stats.queue_depth = static_cast<int>(ready.size());  // the batch taken now included
    }
    auto node = ready.extract(position);
    return std::move(node.mapped());
  }

  // Starts the copy of a host batch to the device on the side stream.
  StagedBatch stage(HostBatch&& host) {
    c10::impl::VirtualGuardImpl guard_impl(options.device.type());
    if (!copy_stream) copy_stream = guard_impl.getStreamFromGlobalPool(options.device);
    StagedBatch staged_batch{Batch{}, c10::Event(options.device.type()), std::move(host.skipped)};
    {
      c10::StreamGuard stream_guard(*copy_stream);
      Batch& batch = staged_batch.batch;
      batch.data = host.data.to(options.device, /*non_blocking=*/true);
      if (host.normalize_on_device) batch.data = batch.data.to(at::kFloat).div_(127.5).sub_(1.0);
      if (host.label.defined()) batch.label = host.label.to(options.device, /*non_blocking=*/true);
      batch.index = host.index;
      batch.position = host.position;
      batch.epoch = host.epoch;
      staged_batch.ready.record(*copy_stream);
    }
    return staged_batch;
  }

  // Makes a staged batch safe to use on the current stream.
  Batch hand_over(StagedBatch&& staged_batch) {
    c10::impl::VirtualGuardImpl guard_impl(options.device.type());
    const c10::Stream current = guard_impl.getStream(options.device);
    staged_batch.ready.block(current);
    Batch batch = std::move(staged_batch.batch);
    batch.data.record_stream(current);
    if (batch.label.defined()) batch.label.record_stream(current);
    note_skipped(staged_batch.skipped);
    return batch;
  }

  void note_skipped(std::vector<SkippedSample>& skipped) {
    {
      std::lock_guard stats_lock(stats_mutex);
      stats.skipped += static_cast<std::int64_t>(skipped.size());
    }
    for (SkippedSample& sample : skipped) {
      if (reported_files.insert(sample.path).second) skip_reports.push_back(std::move(sample));
    }
  }

  Batch next() {
    {
      std::lock_guard stats_lock(stats_mutex);
      if (!first_request) first_request = Clock::now();
    }
    Batch batch;
    if (staged && staged->batch.position == position) {
      {
        std::scoped_lock lock(mutex, stats_mutex);  // the staged batch and those ready behind it
        stats.queue_depth = 1 + static_cast<int>(ready.size());
      }
      batch = hand_over(std::move(*staged));
      staged.reset();
    } else {
      staged.reset();
      HostBatch host = take_host_batch();
      if (host.error) {
        const std::exception_ptr error = host.error;
        drop_in_flight();
        std::rethrow_exception(error);
      }
      if (cuda) {
        batch = hand_over(stage(std::move(host)));
      } else {
        note_skipped(host.skipped);
        batch = Batch{host.data, host.label, host.index, host.position, host.epoch};
      }
    }
    ++position;
    {
      std::lock_guard stats_lock(stats_mutex);
      ++stats.batches;
      stats.samples += batch.data.size(0);
    }
    if (cuda && !synchronous) stage_next_if_ready();
    if (!cuda && !synchronous) {  // the workers keep `prefetch` batches ahead while the consumer uses this one
      std::lock_guard lock(mutex);
      issue_locked();
    }
    return batch;
  }

  // Starts the device copy of the following batch now if a worker has finished it.
  void stage_next_if_ready() {
    std::optional<HostBatch> host;
    {
      std::lock_guard lock(mutex);
      issue_locked();
      auto it = ready.find(position);
      if (it == ready.end() || it->second.error) return;
      host = std::move(it->second);
      ready.erase(it);
    }
    staged = stage(std::move(*host));
  }

  void drop_in_flight() {
    staged.reset();
    std::lock_guard lock(mutex);
    ++generation;
    pending.clear();
    ready.clear();
    next_issue = position;
  }
};

Loader::Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (!dataset) throw std::invalid_argument("loader: no dataset");
  if (options.batch < 1)
    throw std::invalid_argument("loader: batch must be at least 1, got " + std::to_string(options.batch));
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    throw std::invalid_argument("loader: rank " + std::to_string(options.rank) + " is not in 0.." +
                                std::to_string(options.world_size - 1) + " for world_size " +
                                std::to_string(options.world_size));
  }
  if (options.workers < 0) options.workers = default_worker_count();
  if (dataset->reads_on_caller_thread()) options.workers = 0;
  if (options.prefetch < 0) options.prefetch = std::max(2, 2 * options.workers);
  if (options.prefetch < 1) throw std::invalid_argument("loader: prefetch must be at least 1");
  m.dataset = std::move(dataset);
  m.options = std::move(options);
  m.size = m.dataset->size();
  if (m.size < 1) throw std::invalid_argument("loader: the dataset is empty (" + m.dataset->describe() + ")");
  m.order.emplace(BatchOrderOptions{m.size, m.options.batch, m.options.rank, m.options.world_size, m.options.shuffle,
                                    m.options.drop_last});
  m.cuda = m.options.device.is_cuda();
  m.buffers = std::make_shared<BatchBufferPool>(static_cast<std::size_t>(m.options.prefetch) + 4);
  m.synchronous = m.options.workers == 0;
  m.stats.workers = m.options.workers;
  m.seed = m.options.seed;
  for (int i = 0; i < m.options.workers; ++i) m.threads.emplace_back([&m] { m.worker_loop(); });
}

Loader::~Loader() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->work_ready.notify_all();
  for (std::thread& thread : impl_->threads) thread.join();
}

const Dataset& Loader::dataset() const { return *impl_->dataset; }
const LoaderOptions& Loader::options() const { return impl_->options; }
std::int64_t Loader::batches_per_epoch() const { return impl_->order->batches_per_epoch(); }
std::vector<std::int64_t> Loader::batch_indices(std::int64_t position) const {
  return impl_->batch_indices(impl_->seed, position);
}
Batch Loader::next() {
  if (impl_->before_next) impl_->before_next();
  return impl_->next();
}

void Loader::set_before_next(std::function<void()> before) { impl_->before_next = std::move(before); }
std::int64_t Loader::position() const { return impl_->position; }

void Loader::seek(std::int64_t position) {
  if (position < 0)
    throw std::invalid_argument("loader: position must be non-negative, got " + std::to_string(position));
  if (position == impl_->position) return;
  impl_->position = position;
  impl_->drop_in_flight();
}

void Loader::set_end(std::int64_t end) {
  std::lock_guard lock(impl_->mutex);
  impl_->end = end;
}

LoaderState Loader::state() const {
  const LoaderOptions& o = impl_->options;
  return LoaderState{impl_->seed, impl_->position, impl_->size, o.batch, o.rank, o.world_size, o.shuffle, o.drop_last};
}

void Loader::restore(const LoaderState& state) {
  const LoaderState mine = this->state();
  auto mismatch = [](const std::string& what, const std::string& saved, const std::string& now) {
    throw std::invalid_argument("loader state was saved with " + what + " " + saved + " but this loader has " + now);
  };
  if (state.dataset_size != mine.dataset_size)
    mismatch("a dataset of", std::to_string(state.dataset_size) + " samples", std::to_string(mine.dataset_size));
  if (state.batch != mine.batch) mismatch("batch", std::to_string(state.batch), std::to_string(mine.batch));
  // The position counts global batches: any rank of any world size continues the same global batch stream.
  if (state.shuffle != mine.shuffle)
    mismatch("shuffle", state.shuffle ? "true" : "false", mine.shuffle ? "true" : "false");
  if (state.drop_last != mine.drop_last)
    mismatch("drop_last", state.drop_last ? "true" : "false", mine.drop_last ? "true" : "false");
  impl_->position = state.position;
  impl_->drop_in_flight();
  std::lock_guard lock(impl_->mutex);
  impl_->seed = state.seed;
}

LoaderStats Loader::stats() const {
  std::lock_guard stats_lock(impl_->stats_mutex);
  LoaderStats stats = impl_->stats;
  stats.elapsed_seconds = impl_->first_request ? seconds_since(*impl_->first_request) : 0.0;
  return stats;
}

const std::vector<SkippedSample>& Loader::skip_reports() const { return impl_->skip_reports; }

std::vector<SkippedSample> Loader::take_new_skip_reports() {
  const auto first = impl_->skip_reports.begin() + static_cast<std::ptrdiff_t>(impl_->skip_reports_taken);
  std::vector<SkippedSample> reports(first, impl_->skip_reports.end());
  impl_->skip_reports_taken = impl_->skip_reports.size();
  return reports;
}

}  // namespace runner::data
