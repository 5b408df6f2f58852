// The squared Spearman correlation and eta^2 of ranks behind a sweep's parameter importances.
#include "runtime/sweep/parameter_importance.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "runtime/core/json_text.h"

namespace runner::sweep {
namespace {

// Ranks 1..n, ties sharing their average rank.
std::vector<double> ranks(const std::vector<double>& values) {
  std::vector<std::size_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return values[a] < values[b]; });
  std::vector<double> result(values.size());
  for (std::size_t i = 0; i < order.size();) {
    std::size_t j = i;
    while (j + 1 < order.size() && values[order[j + 1]] == values[order[i]]) ++j;
    const double average = (static_cast<double>(i) + static_cast<double>(j)) / 2 + 1;
    for (std::size_t k = i; k <= j; ++k) result[order[k]] = average;
    i = j + 1;
  }
  return result;
}

double mean(const std::vector<double>& values) {
  return std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
}

}  // namespace

std::optional<double> parameter_importance(const std::vector<nlohmann::json>& values,
                                           const std::vector<double>& objective) {
  std::vector<nlohmann::json> kept;
  std::vector<double> results;
  for (std::size_t i = 0; i < values.size() && i < objective.size(); ++i) {
    if (values[i].is_null() || !std::isfinite(objective[i])) continue;
    kept.push_back(values[i]);
    results.push_back(objective[i]);
  }
  if (kept.size() < 3) return std::nullopt;
  const std::vector<double> result_ranks = ranks(results);
  const double result_mean = mean(result_ranks);
  double result_variance = 0;
  for (double r : result_ranks) result_variance += (r - result_mean) * (r - result_mean);
  if (!(result_variance > 0)) return std::nullopt;

  const bool numeric = std::all_of(kept.begin(), kept.end(), [](const nlohmann::json& v) { return v.is_number(); });
  if (numeric) {
    std::vector<double> numbers;
    for (const nlohmann::json& v : kept) numbers.push_back(v.get<double>());
    const std::vector<double> value_ranks = ranks(numbers);
    const double value_mean = mean(value_ranks);
    double covariance = 0, value_variance = 0;
    for (std::size_t i = 0; i < value_ranks.size(); ++i) {
      covariance += (value_ranks[i] - value_mean) * (result_ranks[i] - result_mean);
      value_variance += (value_ranks[i] - value_mean) * (value_ranks[i] - value_mean);
    }
    if (!(value_variance > 0)) return std::nullopt;
    return covariance * covariance / (value_variance * result_variance);
  }
  // eta^2: the variance of the group means of the ranks over the total variance.
  std::map<std::string, std::vector<double>> groups;
  for (std::size_t i = 0; i < kept.size(); ++i) groups[core::json_text(kept[i])].push_back(result_ranks[i]);
  if (groups.size() < 2) return std::nullopt;
  double between = 0;
  for (const auto& [value, group] : groups) {
    const double group_mean = mean(group);
    between += static_cast<double>(group.size()) * (group_mean - result_mean) * (group_mean - result_mean);
  }
  return std::clamp(between / result_variance, 0.0, 1.0);
}

}  // namespace runner::sweep
