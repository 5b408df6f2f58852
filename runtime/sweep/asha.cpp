// ASHA's rungs and its promotion rule.
#include "runtime/sweep/asha.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

namespace runner::sweep {

std::vector<std::int64_t> rung_steps(const AshaOptions& asha) {
  std::vector<std::int64_t> steps;
  for (std::int64_t step = asha.min_steps; step > 0 && step < asha.max_steps;) {
    steps.push_back(step);
    if (step > asha.max_steps / asha.reduction) break;  // the next rung is past the end (and would overflow)
    step *= asha.reduction;
  }
  return steps;
}

std::vector<RungResult> ranked(std::vector<RungResult> results, bool minimize) {
  auto key = [&](double value) { return std::isnan(value) ? (minimize ? HUGE_VAL : -HUGE_VAL) : value; };
  std::stable_sort(results.begin(), results.end(), [&](const RungResult& a, const RungResult& b) {
    if (key(a.value) != key(b.value)) return minimize ? key(a.value) < key(b.value) : key(a.value) > key(b.value);
    if (std::isnan(a.value) != std::isnan(b.value)) return std::isnan(b.value);
    return a.trial < b.trial;
  });
  return results;
}

bool promotable(const std::vector<RungResult>& results, std::int64_t trial, int reduction, bool minimize) {
  const std::vector<RungResult> best_first = ranked(results, minimize);
  const size_t top = best_first.size() / static_cast<size_t>(reduction);
  for (size_t i = 0; i < top; ++i)
    if (best_first[i].trial == trial) return true;
  return false;
}

std::string rung_warning(const SweepSpec& spec) {
  if (!spec.asha) return "";
  const std::vector<std::int64_t> steps = rung_steps(*spec.asha);
  std::int64_t reaching = spec.trials;
  for (size_t rung = 0; rung < steps.size(); ++rung) {
    if (reaching < spec.asha->reduction)
      return fmt::format(
          "{}: warning: ASHA's rung {} (step {}) is reached by at most {} trial{}, fewer than reduction = "
          "{}, so it never promotes: its best trial runs to the end once nothing else is left (more "
          "trials, a smaller reduction or a larger min_steps let every rung choose)",
          where_of(spec, "prune"), rung + 1, steps[rung], reaching, reaching == 1 ? "" : "s", spec.asha->reduction);
    reaching /= spec.asha->reduction;
  }
  return "";
}

}  // namespace runner::sweep
