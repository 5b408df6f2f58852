// The rotation rule of checkpoints: last K, best N, never the only good one.
#include "runtime/ckpt/checkpoint_rotation.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>

namespace runner::ckpt {

std::vector<int64_t> checkpoints_to_drop(const std::vector<RotationCandidate>& candidates,
                                         const RotationPolicy& policy) {
  if (policy.keep_last < 0 || policy.keep_best < 0)
    throw std::invalid_argument("checkpoint rotation: keep_last and keep_best must be >= 0");
  std::vector<const RotationCandidate*> good;
  for (const auto& candidate : candidates)
    if (candidate.good) good.push_back(&candidate);
  if (good.empty()) return {};

  std::set<int64_t> kept;
  std::sort(good.begin(), good.end(), [](auto* a, auto* b) { return a->step > b->step; });
  kept.insert(good.front()->id);  // the newest good checkpoint is what a resume continues from
  for (size_t i = 0; i < good.size() && static_cast<int64_t>(i) < policy.keep_last; ++i) kept.insert(good[i]->id);

  std::vector<const RotationCandidate*> ranked;
  for (auto* candidate : good)
    if (candidate->metric_value && !std::isnan(*candidate->metric_value)) ranked.push_back(candidate);
  std::stable_sort(ranked.begin(), ranked.end(), [&](auto* a, auto* b) {
    return policy.lower_is_better ? *a->metric_value < *b->metric_value : *a->metric_value > *b->metric_value;
  });
  for (size_t i = 0; i < ranked.size() && static_cast<int64_t>(i) < policy.keep_best; ++i) kept.insert(ranked[i]->id);

  std::vector<const RotationCandidate*> dropped;
  for (const auto& candidate : candidates)
    if (!kept.count(candidate.id)) dropped.push_back(&candidate);
  std::sort(dropped.begin(), dropped.end(), [](auto* a, auto* b) { return a->step < b->step; });
  std::vector<int64_t> ids;
  for (auto* candidate : dropped) ids.push_back(candidate->id);
  return ids;
}

}  // namespace runner::ckpt
