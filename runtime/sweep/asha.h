// Asynchronous successive halving (Li et al., 2020): the rungs' steps and the promotion rule.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/sweep/sweep_spec.h"

namespace runner::sweep {

// min_steps * reduction^k for every k whose step is below max_steps.
std::vector<std::int64_t> rung_steps(const AshaOptions& asha);

struct RungResult {
  std::int64_t trial = 0;
  double value = 0;
};

// Whether `trial` is among the best floor(n / reduction) of the n results at its rung (ties: the lower
// trial number first). Trials that have not reached the rung do not count.
bool promotable(const std::vector<RungResult>& results, std::int64_t trial, int reduction, bool minimize);

// The results of a rung best first: NaN last, ties by the lower trial number.
std::vector<RungResult> ranked(std::vector<RungResult> results, bool minimize);

// "sweep.lua:9: warning: ..." when a rung can never promote: the trials that reach it (at most
// trials / reduction^k) are fewer than `reduction`. Then its best trial runs to the end when nothing else is
// left. Empty when every rung can promote. Needs asha.max_steps (check_against_config).
std::string rung_warning(const SweepSpec& spec);

}  // namespace runner::sweep
