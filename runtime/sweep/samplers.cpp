// Grid, random and TPE samplers. TPE follows Bergstra et al. (2011) as Optuna's default TPESampler does
// per parameter: the results split into the best gamma(n) = min(ceil(0.1 n), 25) and the rest, a Parzen
// estimator over each (truncated Gaussians with a prior component; categorical counts with a uniform prior),
// and the candidate among 24 drawn from the good estimator with the highest l(x) / g(x).
#include "runtime/sweep/samplers.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fmt/format.h>
#include <limits>

#include "runtime/core/sample_rng.h"

namespace runner::sweep {
namespace {

using nlohmann::json;
using Rng = core::SampleRng;

constexpr int kCandidates = 24;
constexpr double kPi = 3.14159265358979323846;

std::int64_t integer_count(const Parameter& parameter) {
  return static_cast<std::int64_t>((parameter.high - parameter.low) / parameter.step) + 1;
}

json integer_value(const Parameter& parameter, std::int64_t index) {
  return static_cast<std::int64_t>(parameter.low) + index * static_cast<std::int64_t>(parameter.step);
}

// A numeric parameter's sampling space: log for log-scaled ones; an int range widened by half a step so that
// each value has an equal share.
struct Space {
  double low, high;
  bool log;
};

Space space_of(const Parameter& parameter) {
  const bool log = parameter.kind == ParameterKind::log_uniform || parameter.log;
  if (parameter.kind == ParameterKind::integer) {
    if (log) return {std::log(parameter.low - 0.5), std::log(parameter.high + 0.5), true};
    return {parameter.low - parameter.step / 2, parameter.high + parameter.step / 2, false};
  }
  return {log ? std::log(parameter.low) : parameter.low, log ? std::log(parameter.high) : parameter.high, log};
}

// From the sampling space back to a value of the parameter. Real values have 4 significant digits, so the value
// printed (lr=0.004108) is the one the trial ran with, everywhere.
json value_at(const Parameter& parameter, const Space& space, double x) {
  double value = space.log ? std::exp(x) : x;
  if (parameter.kind != ParameterKind::integer)
    return std::clamp(std::strtod(fmt::format("{:.4g}", value).c_str(), nullptr), parameter.low, parameter.high);
  const double index = std::round((value - parameter.low) / parameter.step);
  return integer_value(parameter,
                       std::clamp<std::int64_t>(static_cast<std::int64_t>(index), 0, integer_count(parameter) - 1));
}

double position_of(const Parameter& parameter, const Space& space, const json& value) {
  const double v = value.get<double>();
  return space.log ? std::log(v) : v;
}

json random_value(const Parameter& parameter, Rng& rng) {
  if (parameter.kind == ParameterKind::choice)
    return parameter.values[static_cast<size_t>(rng.below(parameter.values.size()))];
  if (parameter.kind == ParameterKind::integer && !parameter.log)
    return integer_value(parameter,
                         static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(integer_count(parameter)))));
  const Space space = space_of(parameter);
  return value_at(parameter, space, space.low + rng.uniform() * (space.high - space.low));
}

double normal(Rng& rng) {
  const double u1 = std::max(rng.uniform(), 1e-300);
  const double u2 = rng.uniform();
  return std::sqrt(-2 * std::log(u1)) * std::cos(2 * kPi * u2);
}

double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

// A mixture of Gaussians truncated to [low, high]: one per observed point and one wide prior in the middle.
struct Parzen {
  std::vector<double> mus, sigmas;
  double low, high;

  Parzen(std::vector<double> points, double low_, double high_) : low(low_), high(high_) {
    points.push_back(0.5 * (low + high));  // the prior
    std::vector<double> sorted = points;
    std::sort(sorted.begin(), sorted.end());
    const double range = high - low;
    const double smallest = range / std::min(100.0, 1.0 + static_cast<double>(points.size()));
    for (size_t i = 0; i + 1 < points.size(); ++i) {
      const auto at = std::lower_bound(sorted.begin(), sorted.end(), points[i]);
      const double left = at == sorted.begin() ? points[i] - low : points[i] - *(at - 1);
      const double right = at + 1 == sorted.end() ? high - points[i] : *(at + 1) - points[i];
      mus.push_back(points[i]);
      sigmas.push_back(std::clamp(std::max(left, right), smallest, range));
    }
    mus.push_back(points.back());
    sigmas.push_back(range);
  }

  double sample(Rng& rng) const {
    const size_t k = static_cast<size_t>(rng.below(mus.size()));
    for (int attempt = 0; attempt < 100; ++attempt) {
      const double x = mus[k] + sigmas[k] * normal(rng);
      if (x >= low && x <= high) return x;
    }
    return std::clamp(mus[k], low, high);
  }

  double log_density(double x) const {
    double total = 0;
    for (size_t k = 0; k < mus.size(); ++k) {
      const double mass = normal_cdf((high - mus[k]) / sigmas[k]) - normal_cdf((low - mus[k]) / sigmas[k]);
      const double z = (x - mus[k]) / sigmas[k];
      total += std::exp(-0.5 * z * z) / (sigmas[k] * std::sqrt(2 * kPi) * std::max(mass, 1e-12));
    }
    return std::log(total / static_cast<double>(mus.size()) + 1e-300);
  }
};

json tpe_value(const Parameter& parameter, const std::vector<const Observation*>& good,
               const std::vector<const Observation*>& bad, Rng& rng) {
  if (parameter.kind == ParameterKind::choice) {
    const size_t k = parameter.values.size();
    auto weights = [&](const std::vector<const Observation*>& group) {
      std::vector<double> w(k, 1.0 / static_cast<double>(k));  // the prior: one pseudo-observation spread evenly
      for (const Observation* observation : group) {
        const json& value = observation->params.at(parameter.name);
        for (size_t i = 0; i < k; ++i)
          if (parameter.values[i] == value) w[i] += 1;
      }
      double sum = 0;
      for (double x : w) sum += x;
      for (double& x : w) x /= sum;
      return w;
    };
    const std::vector<double> l = weights(good), g = weights(bad);
    size_t best = 0;
    double best_score = -std::numeric_limits<double>::infinity();
    for (int c = 0; c < kCandidates; ++c) {
      double u = rng.uniform();
      size_t i = 0;
      while (i + 1 < k && u >= l[i]) u -= l[i++];
      const double score = std::log(l[i]) - std::log(g[i]);
      if (score > best_score) best_score = score, best = i;
    }
    return parameter.values[best];
  }
  const Space space = space_of(parameter);
  auto points = [&](const std::vector<const Observation*>& group) {
    std::vector<double> xs;
    for (const Observation* observation : group)
      xs.push_back(position_of(parameter, space, observation->params.at(parameter.name)));
    return xs;
  };
  const Parzen l(points(good), space.low, space.high), g(points(bad), space.low, space.high);
  double best = l.sample(rng);
  double best_score = -std::numeric_limits<double>::infinity();
  for (int c = 0; c < kCandidates; ++c) {
    const double x = l.sample(rng);
    const double score = l.log_density(x) - g.log_density(x);
    if (score > best_score) best_score = score, best = x;
  }
  return value_at(parameter, space, best);
}

json grid_point(const SweepSpec& spec, std::int64_t trial) {
  json params = json::object();
  std::int64_t rest = trial;
  for (auto parameter = spec.parameters.rbegin(); parameter != spec.parameters.rend();
       ++parameter) {  // the last varies fastest
    const std::int64_t count = parameter->kind == ParameterKind::choice
                                   ? static_cast<std::int64_t>(parameter->values.size())
                                   : integer_count(*parameter);
    const std::int64_t index = rest % count;
    rest /= count;
    params[parameter->name] = parameter->kind == ParameterKind::choice ? parameter->values[static_cast<size_t>(index)]
                                                                       : integer_value(*parameter, index);
  }
  return params;
}

}  // namespace

json suggest(const SweepSpec& spec, std::int64_t trial, const std::vector<Observation>& history) {
  if (spec.method == Method::grid) return grid_point(spec, trial);
  Rng rng(static_cast<std::uint64_t>(spec.seed), 0x5357454550ull /* "SWEEP" */, static_cast<std::uint64_t>(trial));
  json params = json::object();
  if (spec.method == Method::random || static_cast<int>(history.size()) < kTpeStartupTrials) {
    for (const Parameter& parameter : spec.parameters) params[parameter.name] = random_value(parameter, rng);
    return params;
  }
  std::vector<const Observation*> sorted;
  for (const Observation& observation : history) sorted.push_back(&observation);
  std::stable_sort(sorted.begin(), sorted.end(), [&](const Observation* a, const Observation* b) {
    return spec.minimize ? a->value < b->value : a->value > b->value;
  });
  const size_t n_good = std::min<size_t>(25, static_cast<size_t>(std::ceil(0.1 * static_cast<double>(sorted.size()))));
  const std::vector<const Observation*> good(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(n_good));
  const std::vector<const Observation*> bad(sorted.begin() + static_cast<std::ptrdiff_t>(n_good), sorted.end());
  for (const Parameter& parameter : spec.parameters) params[parameter.name] = tpe_value(parameter, good, bad, rng);
  return params;
}

}  // namespace runner::sweep
