// ASHA's rungs and its promotion rule.
#include "runtime/sweep/asha.h"

#include <algorithm>
#include <cmath>

namespace runner::sweep {

std::vector<std::int64_t> rung_steps(const AshaOptions& asha) {
  std::vector<std::int64_t> steps;
  for (std::int64_t step = asha.min_steps; step > 0 && step < asha.max_steps; step *= asha.reduction) steps.push_back(step);
  return steps;
}

bool promotable(const std::vector<RungResult>& results, std::int64_t trial, int reduction, bool minimize) {
  std::vector<RungResult> ranked = results;
  for (RungResult& result : ranked)  // a diverged trial (NaN) ranks last
    if (std::isnan(result.value)) result.value = minimize ? HUGE_VAL : -HUGE_VAL;
  std::sort(ranked.begin(), ranked.end(), [&](const RungResult& a, const RungResult& b) {
    if (a.value != b.value) return minimize ? a.value < b.value : a.value > b.value;
    return a.trial < b.trial;
  });
  const size_t top = ranked.size() / static_cast<size_t>(reduction);
  for (size_t i = 0; i < top; ++i)
    if (ranked[i].trial == trial) return true;
  return false;
}

}  // namespace runner::sweep
