// Which checkpoints to keep: the last K by step and the best N by a metric; the newest good checkpoint
// is never dropped, and nothing is dropped on account of a checkpoint that is not verified yet.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace runner::ckpt {

struct RotationPolicy {
  int64_t keep_last = 3;        // the newest K good checkpoints (0: none kept for being recent)
  int64_t keep_best = 0;        // the best N good checkpoints by metric_value
  bool lower_is_better = true;  // "min" or "max" metric
};

struct RotationCandidate {
  int64_t id = 0;  // the caller's key (the index's checkpoint id)
  int64_t step = 0;
  std::optional<double> metric_value;  // NaN or absent: never among the best
  bool good = true;                    // verified (hashes match)
};

// The ids to drop, in ascending step order. Damaged (not good) checkpoints are dropped too, except that
// nothing at all is dropped unless at least one good checkpoint remains.
std::vector<int64_t> checkpoints_to_drop(const std::vector<RotationCandidate>& candidates,
                                         const RotationPolicy& policy);

}  // namespace runner::ckpt
