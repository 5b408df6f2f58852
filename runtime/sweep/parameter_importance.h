// How much each sweep parameter matters for the objective: the squared Spearman rank correlation over the
// finished trials (for a parameter whose values are not all numbers, the correlation ratio eta^2 of the
// objective's ranks between its values). A stated, simple method in place of Optuna's fANOVA.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace runner::sweep {

// The method in one sentence, for the pages that show the importances.
inline constexpr const char* kImportanceMethod =
    "importance: the squared Spearman rank correlation between the parameter and the objective over the finished "
    "trials (for a parameter with values that are not numbers, the share of the variance of the objective's ranks "
    "between its values, eta squared); 0: the objective's order does not follow the parameter, 1: it follows it "
    "exactly";

// In [0, 1]; none with fewer than 3 pairs, or when the parameter or the objective takes a single value. values[i]
// is the parameter's value in the trial whose objective is objective[i]; pairs with a non-finite objective or a
// null value are left out. Ties get their average rank.
std::optional<double> parameter_importance(const std::vector<nlohmann::json>& values,
                                           const std::vector<double>& objective);

}  // namespace runner::sweep
