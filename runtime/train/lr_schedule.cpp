// Learning-rate schedules: option checking, the closed forms of PyTorch's schedulers, ReduceLROnPlateau's state.
#include "runtime/train/lr_schedule.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <utility>

namespace runner::train {
namespace {

constexpr const char* kKinds = "constant, linear, cosine, step, multistep, exponential, plateau";

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument("lr schedule: " + message); }

// Shortest round-trip form, as Python's repr: 0.1, 0.0001, 1e-08.
std::string number(double value) { return fmt::format("{}", value); }

std::string plural(std::int64_t count, const char* noun) {
  return fmt::format("{} {}{}", count, noun, count == 1 ? "" : "s");
}

std::string join(const std::vector<std::int64_t>& values) { return fmt::format("{}", fmt::join(values, ", ")); }

// Refuses an option that the kind does not use; applies_to lists the kinds that use it.
void require_unset(bool set, const char* option, const std::string& kind, const char* applies_to) {
  if (set) fail(fmt::format("{} does not apply to the {} schedule (only to {})", option, kind, applies_to));
}

std::int64_t at_least(const std::optional<std::int64_t>& value, std::int64_t fallback, std::int64_t minimum,
                      const char* option) {
  const std::int64_t v = value.value_or(fallback);
  if (v < minimum) fail(fmt::format("{} must be an integer >= {}, got {}", option, minimum, v));
  return v;
}

std::int64_t required_at_least(const std::optional<std::int64_t>& value, std::int64_t minimum, const char* option,
                               const std::string& kind) {
  if (!value) fail(fmt::format("{} is required by the {} schedule (an integer >= {})", option, kind, minimum));
  return at_least(value, 0, minimum, option);
}

double in_unit_interval(double value, const char* option) {
  if (!(value >= 0.0 && value <= 1.0)) fail(fmt::format("{} must be in [0, 1], got {}", option, number(value)));
  return value;
}

double non_negative(double value, const char* option) {
  if (!(value >= 0.0) || !std::isfinite(value)) {
    fail(fmt::format("{} must be a finite number >= 0, got {}", option, number(value)));
  }
  return value;
}

double checked_gamma(double value) {
  if (!(value > 0.0 && value <= 1.0)) fail(fmt::format("gamma must be in (0, 1], got {}", number(value)));
  return value;
}

[[noreturn]] void fail_state(const std::string& message) {
  throw std::invalid_argument("lr schedule state: " + message);
}

std::int64_t state_count(const nlohmann::json& state, const char* key) {
  const nlohmann::json& value = state.at(key);
  // An unsigned value beyond int64 reads as negative.
  if (!value.is_number_integer() || value.get<std::int64_t>() < 0) {
    fail_state(fmt::format("{} must be an integer >= 0, got {}", key, value.dump()));
  }
  return value.get<std::int64_t>();
}

}  // namespace

LrScheduleOptions with_total_steps(LrScheduleOptions options, std::optional<std::int64_t> trainer_steps) {
  if ((options.kind != "cosine" && options.kind != "linear") || options.total_steps) return options;
  if (!trainer_steps)
    throw std::invalid_argument(
        fmt::format("runner.trainer: a {} schedule needs schedule.total_steps or the trainer's 'steps'", options.kind));
  options.total_steps = std::max<std::int64_t>(1, *trainer_steps - options.warmup_steps);
  return options;
}

LrSchedule::LrSchedule(LrScheduleOptions options) : options_(std::move(options)) {
  const LrScheduleOptions& o = options_;
  const std::string& kind = o.kind;
  if (kind == "constant")
    kind_ = Kind::constant;
  else if (kind == "linear")
    kind_ = Kind::linear;
  else if (kind == "cosine")
    kind_ = Kind::cosine;
  else if (kind == "step")
    kind_ = Kind::step;
  else if (kind == "multistep")
    kind_ = Kind::multistep;
  else if (kind == "exponential")
    kind_ = Kind::exponential;
  else if (kind == "plateau")
    kind_ = Kind::plateau;
  else
    fail(fmt::format("kind must be one of {}, got '{}'", kKinds, kind));

  if (o.warmup_steps < 0) fail(fmt::format("warmup_steps must be an integer >= 0, got {}", o.warmup_steps));
  if (o.warmup_start_factor) in_unit_interval(*o.warmup_start_factor, "warmup_start_factor");

  // Options the kind does not use.
  const bool linear_or_cosine = kind_ == Kind::linear || kind_ == Kind::cosine;
  const bool plateau = kind_ == Kind::plateau;
  require_unset(!linear_or_cosine && o.total_steps.has_value(), "total_steps", kind, "linear, cosine");
  require_unset(!linear_or_cosine && !plateau && o.min_lr_factor.has_value(), "min_lr_factor", kind,
                "linear, cosine, plateau");
  require_unset(kind_ != Kind::step && o.step_size.has_value(), "step_size", kind, "step");
  require_unset(kind_ != Kind::step && kind_ != Kind::multistep && kind_ != Kind::exponential && o.gamma.has_value(),
                "gamma", kind, "step, multistep, exponential");
  require_unset(kind_ != Kind::multistep && !o.milestones.empty(), "milestones", kind, "multistep");
  const std::pair<bool, const char*> plateau_options[] = {{o.mode.has_value(), "mode"},
                                                          {o.factor.has_value(), "factor"},
                                                          {o.patience.has_value(), "patience"},
                                                          {o.threshold.has_value(), "threshold"},
                                                          {o.threshold_mode.has_value(), "threshold_mode"},
                                                          {o.cooldown.has_value(), "cooldown"},
                                                          {o.eps.has_value(), "eps"}};
  for (const auto& [set, name] : plateau_options) require_unset(!plateau && set, name, kind, "plateau");

  // The options it uses, with PyTorch's defaults.
  if (linear_or_cosine) total_steps_ = required_at_least(o.total_steps, 1, "total_steps", kind);
  if (linear_or_cosine || plateau) min_lr_factor_ = in_unit_interval(o.min_lr_factor.value_or(0.0), "min_lr_factor");
  if (kind_ == Kind::step) step_size_ = required_at_least(o.step_size, 1, "step_size", kind);
  if (kind_ == Kind::exponential && !o.gamma)
    fail("gamma is required by the exponential schedule (a number in (0, 1])");
  if (kind_ == Kind::step || kind_ == Kind::multistep || kind_ == Kind::exponential) {
    gamma_ = checked_gamma(o.gamma.value_or(0.1));
  }
  if (kind_ == Kind::multistep) {
    if (o.milestones.empty()) {
      fail("milestones is required by the multistep schedule (strictly increasing integers >= 1)");
    }
    for (std::size_t i = 0; i < o.milestones.size(); ++i) {
      if (o.milestones[i] < 1 || (i > 0 && o.milestones[i] <= o.milestones[i - 1])) {
        fail(fmt::format("milestones must be strictly increasing integers >= 1, got [{}]", join(o.milestones)));
      }
    }
  }
  if (plateau) {
    const std::string mode = o.mode.value_or("min");
    if (mode != "min" && mode != "max") fail(fmt::format("mode must be min or max, got '{}'", mode));
    mode_max_ = mode == "max";
    plateau_multiplier_ = o.factor.value_or(0.1);
    if (!(plateau_multiplier_ > 0.0 && plateau_multiplier_ < 1.0)) {
      fail(fmt::format("factor must be in (0, 1), got {}", number(plateau_multiplier_)));
    }
    patience_ = at_least(o.patience, 10, 0, "patience");
    threshold_ = non_negative(o.threshold.value_or(1e-4), "threshold");
    const std::string threshold_mode = o.threshold_mode.value_or("rel");
    if (threshold_mode != "rel" && threshold_mode != "abs") {
      fail(fmt::format("threshold_mode must be rel or abs, got '{}'", threshold_mode));
    }
    threshold_abs_ = threshold_mode == "abs";
    cooldown_ = at_least(o.cooldown, 0, 0, "cooldown");
    eps_ = non_negative(o.eps.value_or(1e-8), "eps");
    plateau_.best = mode_max_ ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  }
}

double LrSchedule::main_factor(std::int64_t t) const {
  switch (kind_) {
    case Kind::constant:
      return 1.0;
    case Kind::linear:
      return 1.0 + (min_lr_factor_ - 1.0) * static_cast<double>(std::min(t, total_steps_)) /
                       static_cast<double>(total_steps_);
    case Kind::cosine:
      if (t >= total_steps_) return min_lr_factor_;
      return min_lr_factor_ +
             (1.0 - min_lr_factor_) *
                 (1.0 + std::cos(std::numbers::pi * static_cast<double>(t) / static_cast<double>(total_steps_))) / 2.0;
    case Kind::step:
      return std::pow(gamma_, static_cast<double>(t / step_size_));
    case Kind::multistep: {
      const auto& m = options_.milestones;
      return std::pow(gamma_, static_cast<double>(std::upper_bound(m.begin(), m.end(), t) - m.begin()));
    }
    case Kind::exponential:
      return std::pow(gamma_, static_cast<double>(t));
    case Kind::plateau:
      return plateau_.factor;
  }
  return 1.0;
}

double LrSchedule::warmup_start() const {
  return options_.warmup_start_factor.value_or(1.0 / static_cast<double>(options_.warmup_steps + 1));
}

double LrSchedule::factor(std::int64_t step) const {
  if (step < 0) fail(fmt::format("step must be >= 0, got {}", step));
  const std::int64_t warmup = options_.warmup_steps;
  if (step >= warmup) return main_factor(step - warmup);
  // LinearLR's closed form: start + (end - start) * min(total_iters, step) / total_iters.
  const double s = warmup_start();
  const double warm = s + (1.0 - s) * static_cast<double>(step) / static_cast<double>(warmup);
  return kind_ == Kind::plateau ? warm * plateau_.factor : warm;
}

bool LrSchedule::is_better(double metric, double best) const {
  if (mode_max_) return threshold_abs_ ? metric > best + threshold_ : metric > best * (threshold_ + 1.0);
  return threshold_abs_ ? metric < best - threshold_ : metric < best * (1.0 - threshold_);
}

void LrSchedule::observe(double metric) {
  if (kind_ != Kind::plateau) {
    throw std::logic_error(
        fmt::format("lr schedule: observe() applies to the plateau schedule, not {}", options_.kind));
  }
  PlateauState& s = plateau_;
  ++s.observations;
  if (is_better(metric, s.best)) {
    s.best = metric;
    s.num_bad_epochs = 0;
  } else {
    ++s.num_bad_epochs;
  }
  if (s.cooldown_counter > 0) {
    --s.cooldown_counter;
    s.num_bad_epochs = 0;  // bad observations during cooldown are ignored
  }
  if (s.num_bad_epochs > patience_) {
    const double reduced = std::max(s.factor * plateau_multiplier_, min_lr_factor_);
    if (s.factor - reduced > eps_) s.factor = reduced;
    s.cooldown_counter = cooldown_;
    s.num_bad_epochs = 0;
  }
}

nlohmann::json LrSchedule::state() const {
  nlohmann::json state = {{"kind", options_.kind}};
  if (kind_ != Kind::plateau) return state;
  const double best = plateau_.best;
  state["factor"] = plateau_.factor;
  state["best"] = std::isfinite(best) ? nlohmann::json(best) : nlohmann::json(best > 0 ? "inf" : "-inf");
  state["num_bad_epochs"] = plateau_.num_bad_epochs;
  state["cooldown_counter"] = plateau_.cooldown_counter;
  state["observations"] = plateau_.observations;
  return state;
}

void LrSchedule::load_state(const nlohmann::json& state) {
  if (!state.is_object()) fail_state(fmt::format("expected an object, got {}", state.dump()));
  if (!state.contains("kind") || !state["kind"].is_string()) fail_state("kind is missing or not a string");
  const std::string kind = state["kind"].get<std::string>();
  if (kind != options_.kind) {
    fail_state(fmt::format("the state is for the {} schedule, not {}", kind, options_.kind));
  }
  static const char* const plateau_keys[] = {"kind",           "factor",           "best",
                                             "num_bad_epochs", "cooldown_counter", "observations"};
  const bool plateau = kind_ == Kind::plateau;
  for (const auto& [key, value] : state.items()) {
    const bool known = key == "kind" || (plateau && std::find(std::begin(plateau_keys), std::end(plateau_keys), key) !=
                                                        std::end(plateau_keys));
    if (!known) fail_state(fmt::format("unknown key '{}' for the {} schedule", key, options_.kind));
  }
  if (!plateau) return;
  for (const char* key : plateau_keys) {
    if (!state.contains(key)) fail_state(fmt::format("{} is missing", key));
  }

  PlateauState loaded;
  const nlohmann::json& factor = state["factor"];
  if (!factor.is_number() || !(factor.get<double>() >= 0.0 && factor.get<double>() <= 1.0)) {
    fail_state(fmt::format("factor must be a number in [0, 1], got {}", factor.dump()));
  }
  loaded.factor = factor.get<double>();
  const nlohmann::json& best = state["best"];
  if (best.is_number()) {
    loaded.best = best.get<double>();
  } else if (best == "inf" || best == "-inf") {
    loaded.best = (best == "inf" ? 1 : -1) * std::numeric_limits<double>::infinity();
  } else {
    fail_state(fmt::format("best must be a number, \"inf\" or \"-inf\", got {}", best.dump()));
  }
  loaded.num_bad_epochs = state_count(state, "num_bad_epochs");
  loaded.cooldown_counter = state_count(state, "cooldown_counter");
  loaded.observations = state_count(state, "observations");
  plateau_ = loaded;
}

std::string LrSchedule::describe() const {
  std::string text;
  switch (kind_) {
    case Kind::constant:
      text = "constant";
      break;
    case Kind::linear:
    case Kind::cosine:
      text = fmt::format("{} over {} to {}x", options_.kind, plural(total_steps_, "step"), number(min_lr_factor_));
      break;
    case Kind::step:
      text = step_size_ == 1 ? fmt::format("step x{} every step", number(gamma_))
                             : fmt::format("step x{} every {} steps", number(gamma_), step_size_);
      break;
    case Kind::multistep:
      text = fmt::format("multistep x{} at step{} {}", number(gamma_), options_.milestones.size() == 1 ? "" : "s",
                         join(options_.milestones));
      break;
    case Kind::exponential:
      text = fmt::format("exponential x{} per step", number(gamma_));
      break;
    case Kind::plateau:
      text = fmt::format("reduce on plateau x{} ({} metric, patience {}, threshold {} {}, cooldown {}, floor {}x)",
                         number(plateau_multiplier_), mode_max_ ? "max" : "min", patience_, number(threshold_),
                         threshold_abs_ ? "abs" : "rel", cooldown_, number(min_lr_factor_));
      break;
  }
  if (options_.warmup_steps > 0) {
    text += fmt::format(" after {} warmup {}", options_.warmup_steps, options_.warmup_steps == 1 ? "step" : "steps");
    if (options_.warmup_start_factor) text += fmt::format(" from {}x", number(*options_.warmup_start_factor));
  }
  return text;
}

}  // namespace runner::train
