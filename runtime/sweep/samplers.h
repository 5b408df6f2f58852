// Where each trial of a sweep samples its parameters: the grid's n-th point, a seeded random point, or the
// tree-structured Parzen estimator (TPE) over the trials done so far. Each is reproducible from the
// sweep's seed and the trial number (TPE: and the results it was given).
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/sweep/sweep_spec.h"

namespace runner::sweep {

// A trial with a result: its parameters and its objective value.
struct Observation {
  nlohmann::json params;
  double value = 0;
};

// The parameters of trial `trial` (0-based): name -> value (whole numbers for int parameters).
nlohmann::json suggest(const SweepSpec& spec, std::int64_t trial, const std::vector<Observation>& history);

// TPE samples at random until it has this many results (Optuna's default).
inline constexpr int kTpeStartupTrials = 10;

}  // namespace runner::sweep
