// The loader's batch order: seeded per-epoch shuffles and each rank's share of every batch.
#include "runtime/data/batch_order.h"

#include <numeric>
#include <stdexcept>
#include <string>

#include "runtime/core/sample_rng.h"

namespace runner::data {
namespace {

constexpr std::uint64_t kPermutationStream = 0x7065726d75746531ull;

}  // namespace

BatchOrder::BatchOrder(const BatchOrderOptions& options) : options_(options) {
  const std::int64_t batch = options_.global_batch;
  if (batch < 1 || options_.world_size < 1 || batch % options_.world_size != 0)
    throw std::invalid_argument("loader: batch " + std::to_string(batch) +
                                " (the global batch of all ranks) does "
                                "not split evenly over " +
                                std::to_string(options_.world_size) + " ranks");
  if (options_.size < 1) throw std::invalid_argument("loader: the dataset is empty");
  per_epoch_ = options_.drop_last ? options_.size / batch : (options_.size + batch - 1) / batch;
  if (per_epoch_ == 0)
    throw std::invalid_argument("loader: " + std::to_string(options_.size) + " samples make no full batch of " +
                                std::to_string(batch) + " with drop_last");
}

std::vector<std::int64_t> BatchOrder::permutation(std::uint64_t seed, std::int64_t epoch, std::int64_t size) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(size));
  std::iota(order.begin(), order.end(), 0);
  core::SampleRng rng(seed, kPermutationStream, static_cast<std::uint64_t>(epoch));
  for (std::int64_t i = size - 1; i > 0; --i) std::swap(order[i], order[rng.below(static_cast<std::uint64_t>(i + 1))]);
  return order;
}

std::shared_ptr<const std::vector<std::int64_t>> BatchOrder::cached_permutation(std::uint64_t seed,
                                                                                std::int64_t epoch) const {
  std::lock_guard lock(mutex_);
  const auto key = std::make_pair(seed, epoch);
  if (auto it = recent_.find(key); it != recent_.end()) return it->second;
  auto order = std::make_shared<const std::vector<std::int64_t>>(permutation(seed, epoch, options_.size));
  recent_[key] = order;
  while (recent_.size() > 3) recent_.erase(recent_.begin());
  return order;
}

std::vector<std::int64_t> BatchOrder::indices(std::uint64_t seed, std::int64_t position) const {
  const std::int64_t size = options_.size, global_batch = options_.global_batch;
  const std::int64_t epoch = position / per_epoch_;
  const std::int64_t start = (position % per_epoch_) * global_batch;
  const std::int64_t count = std::min(global_batch, size - start);
  const std::int64_t rank = options_.rank, world = options_.world_size;
  const std::int64_t per_rank = global_batch / world;
  std::int64_t lo = start + rank * per_rank;
  std::int64_t hi = lo + per_rank;
  if (count < global_batch) {  // the last, partial batch of the epoch: split it evenly over the ranks
    lo = start + rank * count / world;
    hi = start + (rank + 1) * count / world;
  }
  std::shared_ptr<const std::vector<std::int64_t>> order;
  if (options_.shuffle) order = cached_permutation(seed, epoch);
  auto at = [&](std::int64_t i) { return order ? (*order)[static_cast<std::size_t>(i)] : i; };
  std::vector<std::int64_t> indices;
  if (lo == hi) indices.push_back(at(rank % size));
  for (std::int64_t i = lo; i < hi; ++i) indices.push_back(at(i));
  return indices;
}

}  // namespace runner::data
