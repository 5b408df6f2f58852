// The loader's batch order, a pure function of (seed, epoch, rank): the samples each rank reads at each batch
// position. No threads, no I/O: the data-parallel and resume guarantees rest on it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace runner::data {

struct BatchOrderOptions {
  std::int64_t size = 0;          // samples in the dataset
  std::int64_t global_batch = 1;  // of all ranks together
  std::int64_t rank = 0;
  std::int64_t world_size = 1;
  bool shuffle = false;
  bool drop_last = false;
};

// Epoch e's order is the identity, or with shuffle a Fisher-Yates shuffle drawn from core::SampleRng(seed, the
// permutation stream, e). Batch position p is batch p % per_epoch of epoch p / per_epoch: global_batch
// consecutive samples of that order, rank r taking the r-th of world_size equal parts. The last, partial batch
// of an epoch (without drop_last) is split as evenly as it goes; a rank left without a sample repeats one from
// the start of the epoch, so every rank takes the same number of steps. The ranks' parts of a batch, in rank
// order, are the one-process batch.
class BatchOrder {
 public:
  // Throws std::invalid_argument when the batch does not split over the ranks, the dataset is empty, or
  // drop_last leaves no full batch (the texts name the numbers).
  explicit BatchOrder(const BatchOrderOptions& options);

  std::int64_t batches_per_epoch() const { return per_epoch_; }
  // This rank's sample indices at `position` (0, 1, ... across epochs).
  std::vector<std::int64_t> indices(std::uint64_t seed, std::int64_t position) const;
  // The shuffled order of an epoch (a permutation of 0 .. size - 1).
  static std::vector<std::int64_t> permutation(std::uint64_t seed, std::int64_t epoch, std::int64_t size);

 private:
  std::shared_ptr<const std::vector<std::int64_t>> cached_permutation(std::uint64_t seed, std::int64_t epoch) const;

  BatchOrderOptions options_;
  std::int64_t per_epoch_ = 0;
  // The orders of recent epochs: the loader's workers ask for the same epoch many times.
  mutable std::mutex mutex_;
  mutable std::map<std::pair<std::uint64_t, std::int64_t>, std::shared_ptr<const std::vector<std::int64_t>>> recent_;
};

}  // namespace runner::data
