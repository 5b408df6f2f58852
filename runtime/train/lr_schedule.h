// Learning-rate schedules: PyTorch's LR schedulers as multipliers of the base LR per optimizer step, with warmup.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace runner::train {

// The options of one schedule. Options marked "(kind)" apply to some kinds only: leave them unset for the
// others (setting one for a kind that does not use it is an error, so a typo in a config is not silently
// ignored). The defaults in brackets are those of PyTorch's schedulers.
struct LrScheduleOptions {
  // constant, linear, cosine, step, multistep, exponential or plateau.
  std::string kind = "constant";

  // Linear warmup before the main schedule, for every kind: the factor goes from warmup_start_factor
  // (in [0, 1]) toward 1 over warmup_steps optimizer steps. The default start 1 / (warmup_steps + 1) makes
  // the ramp even, 1/(W+1), 2/(W+1), ..., W/(W+1), then 1, so the first step already learns. PyTorch's
  // LinearLR refuses start_factor 0 (its recursive update divides by it); runner uses LinearLR's closed
  // form, which is well defined at 0 (a first step at LR 0). No effect when warmup_steps is 0.
  std::int64_t warmup_steps = 0;
  std::optional<double> warmup_start_factor;

  // (linear, cosine; required) Length of the main schedule in optimizer steps, counted after warmup.
  std::optional<std::int64_t> total_steps;
  // (linear, cosine, plateau) [0] The lowest factor, in [0, 1]: linear's end factor, cosine's eta_min and
  // plateau's min_lr, each as a fraction of the base LR.
  std::optional<double> min_lr_factor;
  // (step; required) Steps between two decays, >= 1.
  std::optional<std::int64_t> step_size;
  // (step, multistep [0.1]; exponential, required) The decay multiplier, in (0, 1].
  std::optional<double> gamma;
  // (multistep; required) Strictly increasing steps >= 1 of the main schedule (counted after warmup) at which
  // the factor is multiplied by gamma.
  std::vector<std::int64_t> milestones;

  // (plateau) torch.optim.lr_scheduler.ReduceLROnPlateau's settings.
  std::optional<std::string> mode;            // ["min"] min or max: whether a lower or a higher metric is better
  std::optional<double> factor;               // [0.1] in (0, 1): multiplier of each reduction
  std::optional<std::int64_t> patience;       // [10] >= 0: bad observations tolerated before a reduction
  std::optional<double> threshold;            // [1e-4] >= 0: the margin an observation must beat the best by
  std::optional<std::string> threshold_mode;  // ["rel"] rel or abs
  std::optional<std::int64_t> cooldown;       // [0] >= 0: observations ignored after a reduction
  std::optional<double> eps;                  // [1e-8] >= 0: reductions smaller than this are skipped
};

// A learning-rate schedule: factor(step) multiplies the base LR of the optimizer step that follows `step`
// completed steps (step 0 is the first optimizer step). It equals the LR that PyTorch's scheduler (stepped
// once after every optimizer step, on an optimizer whose base LR is 1) sets for that step.
//
// Warmup (W = warmup_steps > 0, s = warmup_start_factor, default 1 / (W + 1)) is PyTorch's
//   SequentialLR([LinearLR(start_factor=s, end_factor=1, total_iters=W), main], milestones=[W]):
//   factor(step) = s + (1 - s) * step / W   for step < W   (reaches 1 - (1 - s) / W at step W - 1)
//   factor(step) = main(step - W)           for step >= W
// At the milestone SequentialLR calls the main scheduler's step(0), its closed form at epoch 0 (the base LR
// for every kind here), so the main schedule starts from its beginning at step W and sees t = step - W; the
// warmup's own end value 1 is never used. Without warmup, factor(step) = main(step).
//
// main(t), with T = total_steps, m = min_lr_factor, g = gamma:
//   constant     1 (no schedule; PyTorch's ConstantLR, a temporary multiplier, is something else)
//   linear       1 + (m - 1) * min(t, T) / T                  LinearLR(start_factor=1, end_factor=m, total_iters=T)
//   cosine       m + (1 - m) * (1 + cos(pi * t / T)) / 2 for t <= T, m for t > T
//                                                            CosineAnnealingLR(T_max=T, eta_min=m * base_lr)
//                PyTorch continues the cosine past T_max: its LR rises again and is back at the base LR at
//                2 * T_max (diffusers' get_cosine_schedule_with_warmup rises past its end too). runner holds m.
//   step         g ^ floor(t / step_size)                     StepLR(step_size, gamma=g)
//   multistep    g ^ (number of milestones <= t)               MultiStepLR(milestones, gamma=g)
//   exponential  g ^ t                                         ExponentialLR(gamma=g)
//   plateau      p, the factor that observe() maintains        ReduceLROnPlateau(mode, factor, patience,
//                                                              threshold, threshold_mode, cooldown, min_lr=m, eps)
// PyTorch computes most of these recursively (lr *= ratio); the closed forms agree to rounding (1e-12
// relative over the tests' sequences).
//
// Every kind except plateau is a pure function of the step. Plateau's p starts at 1 and changes only in
// observe(); during warmup the factor is warmup(step) * p, which is what LinearLR stepped per optimizer step and
// ReduceLROnPlateau on the same optimizer give, except that runner applies the floor m and eps to p while
// PyTorch applies them to the LR it reduces (the two differ only when a reduction during warmup reaches the
// floor). eps is compared with the reduction of p, i.e. relative to the base LR (PyTorch's eps is in LR units:
// both agree for a base LR of 1).
// The options with a linear or cosine schedule's total_steps, when not given, filled in from the trainer's `steps`:
// the steps after warmup (at least 1). Throws std::invalid_argument when neither says it.
LrScheduleOptions with_total_steps(LrScheduleOptions options, std::optional<std::int64_t> trainer_steps);

class LrSchedule {
 public:
  // Validates every option; throws std::invalid_argument naming the option, its value and what is accepted.
  explicit LrSchedule(LrScheduleOptions options);

  const LrScheduleOptions& options() const { return options_; }

  // The multiplier of the base LR for the optimizer step after `step` (>= 0) completed steps.
  double factor(std::int64_t step) const;

  // Plateau only (throws std::logic_error for other kinds): feeds a validation metric, exactly like
  // ReduceLROnPlateau.step(metric). The first observation sets the best; an observation is better when it
  // beats the best by the threshold (min rel: metric < best * (1 - threshold); min abs: metric < best -
  // threshold; max mirrors them), otherwise it is bad. During cooldown the counter of bad observations stays
  // 0. After more than `patience` bad observations p becomes max(p * factor, m) if that lowers it by more than
  // eps, cooldown starts and the count restarts. A NaN metric is never better, so it counts as bad.
  void observe(double metric);

  // What a resumed run needs to continue identically: {"kind": ...} and, for plateau, "factor" (p), "best" (a
  // number, or "inf" / "-inf" before a finite best exists), "num_bad_epochs", "cooldown_counter" and
  // "observations". The options themselves come from the configuration, not from the state.
  nlohmann::json state() const;
  // Restores state(); throws std::invalid_argument for a state of another kind, a missing, unknown or
  // ill-typed key, or a value out of range. On error the schedule is unchanged.
  void load_state(const nlohmann::json& state);

  // One line, e.g. "cosine over 10000 steps to 0.1x after 500 warmup steps".
  std::string describe() const;

 private:
  double warmup_start() const;  // the warmup's first factor
  enum class Kind { constant, linear, cosine, step, multistep, exponential, plateau };

  struct PlateauState {
    double factor = 1.0;
    double best = 0.0;  // set to the mode's worst value (+-inf) by the constructor
    std::int64_t num_bad_epochs = 0;
    std::int64_t cooldown_counter = 0;
    std::int64_t observations = 0;
  };

  double main_factor(std::int64_t t) const;
  bool is_better(double metric, double best) const;

  LrScheduleOptions options_;
  Kind kind_;
  // Resolved values (defaults applied) of the options the kind uses.
  std::int64_t total_steps_ = 0;
  double min_lr_factor_ = 0.0;
  std::int64_t step_size_ = 0;
  double gamma_ = 0.1;
  bool mode_max_ = false;
  double plateau_multiplier_ = 0.1;
  std::int64_t patience_ = 10;
  double threshold_ = 1e-4;
  bool threshold_abs_ = false;
  std::int64_t cooldown_ = 0;
  double eps_ = 1e-8;
  PlateauState plateau_;
};

}  // namespace runner::train
