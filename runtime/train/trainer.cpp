// The trainer step: micro-batches, autocast, loss scaling, clipping, the optimizer and EMA updates, timings, and
// the non-finite stop decided one step late (the checkpoint files are runtime/run/checkpoint_format.cpp).
#include "runtime/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>

#include "runtime/core/clock.h"
#include "runtime/core/device.h"
#include "runtime/core/logging.h"
#include "runtime/core/shape_text.h"
#include "runtime/train/grad_norm.h"

namespace runner::train {
namespace {

// Data parallel: how often (in steps, and after the first) the ranks check that their weights agree.
constexpr std::int64_t kRankCheckEvery = 100;

// Autocast for one device type over a scope, restoring what was set before (the cast cache is cleared when
// the outermost autocast region ends, as torch.autocast does).
class AutocastScope {
 public:
  AutocastScope(c10::DeviceType device_type, std::optional<at::ScalarType> dtype) : device_type_(device_type) {
    if (!dtype) return;
    active_ = true;
    previous_enabled_ = at::autocast::is_autocast_enabled(device_type);
    previous_dtype_ = at::autocast::get_autocast_dtype(device_type);
    at::autocast::set_autocast_enabled(device_type, true);
    at::autocast::set_autocast_dtype(device_type, *dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (!active_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
    at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType device_type_;
  bool active_ = false;
  bool previous_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kFloat;
};

std::optional<at::ScalarType> autocast_dtype(Precision precision) {
  switch (precision) {
    case Precision::bf16:
      return at::kBFloat16;
    case Precision::fp16:
      return at::kHalf;
    case Precision::fp32:
      return std::nullopt;
  }
  return std::nullopt;
}

std::string describe_range(const std::string& name, const at::Tensor& tensor) {
  if (!tensor.defined()) return name + " (none)";
  std::string text =
      fmt::format("{} {} {}", name, core::shape_text(tensor.sizes()), c10::toString(tensor.scalar_type()));
  if (tensor.numel() == 0) return text + " (empty)";
  const at::Tensor values = tensor.detach().to(at::kCPU).to(at::kDouble);
  const at::Tensor finite = at::isfinite(values);
  const int64_t bad = values.numel() - finite.sum().item<int64_t>();
  if (bad < values.numel()) {
    const at::Tensor finite_values = values.masked_select(finite);
    text +=
        fmt::format(" range [{:.6g}, {:.6g}]", finite_values.min().item<double>(), finite_values.max().item<double>());
  }
  if (bad > 0) text += fmt::format(", {} non-finite", bad);
  return text;
}

// "3 NaN, 1 inf" for a tensor with non-finite values; empty when every value is finite.
std::string nonfinite_counts(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.is_floating_point()) return "";
  const int64_t nan = at::isnan(tensor).sum().item<int64_t>();
  const int64_t inf = at::isinf(tensor).sum().item<int64_t>();
  if (nan == 0 && inf == 0) return "";
  std::vector<std::string> parts;
  if (nan) parts.push_back(fmt::format("{} NaN", nan));
  if (inf) parts.push_back(fmt::format("{} inf", inf));
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string list_nonfinite(const NamedTensorList& tensors) {
  std::vector<std::string> found;
  int64_t more = 0;
  for (const auto& [name, tensor] : tensors) {
    const std::string counts = nonfinite_counts(tensor.detach());
    if (counts.empty()) continue;
    if (found.size() < 8)
      found.push_back(fmt::format("{} ({})", name, counts));
    else
      ++more;
  }
  if (found.empty()) return "none";
  return fmt::format("{}", fmt::join(found, ", ")) + (more ? fmt::format(" and {} more", more) : "");
}

}  // namespace

Precision resolve_precision(const std::string& amp, const c10::Device& device) {
  if (amp == "auto") return device.is_cuda() ? Precision::bf16 : Precision::fp32;
  if (amp == "bf16" || amp == "bfloat16") return Precision::bf16;
  if (amp == "fp32" || amp == "none" || amp == "float32") return Precision::fp32;
  if (amp == "fp16" || amp == "float16") {
    if (!device.is_cuda())
      throw std::invalid_argument("amp 'fp16' needs a CUDA device (use 'bf16' or 'fp32' on the CPU)");
    return Precision::fp16;
  }
  throw std::invalid_argument(fmt::format("amp must be auto, bf16, fp16 or fp32, got '{}'", amp));
}

std::string precision_name(Precision precision) {
  switch (precision) {
    case Precision::fp32:
      return "fp32";
    case Precision::bf16:
      return "bf16";
    case Precision::fp16:
      return "fp16";
  }
  return "fp32";
}

NonFinitePolicy parse_nonfinite_policy(const std::string& name) {
  if (name == "skip") return NonFinitePolicy::skip;
  if (name == "stop") return NonFinitePolicy::stop;
  throw std::invalid_argument(fmt::format("on_nonfinite must be 'skip' or 'stop', got '{}'", name));
}

// Device events around the parts of a CUDA step; read once they have completed.
struct Trainer::Events {
  std::vector<c10::Event> marks;  // start, after backward, after the optimizer, after EMA
  bool pending = false;
};

// A step's stop latch on its way to the host, and what the report of its non-finite values says.
struct Trainer::PendingStop {
  std::int64_t step = 0;
  at::Tensor flag;                   // float [1] on the host (pinned on CUDA)
  std::optional<c10::Event> copied;  // CUDA: the copy into `flag` is done
  std::vector<at::Tensor> micro_losses;
  NamedTensorList grad_norms;  // the trainable parameters' gradient norms, by name
  NamedTensorList inputs;
};

Trainer::Trainer(TrainerModel model, std::shared_ptr<Optimizer> optimizer, LrScheduleOptions schedule,
                 std::vector<EmaOptions> emas, StepOptions options, c10::Device device)
    : model_(std::move(model)),
      optimizer_(std::move(optimizer)),
      options_(std::move(options)),
      device_(device),
      precision_(resolve_precision(options_.amp, device)),
      events_(std::make_unique<Events>()) {
  if (options_.accumulate < 1)
    throw std::invalid_argument(fmt::format("accumulate must be 1 or more, got {}", options_.accumulate));
  if (options_.clip && !(*options_.clip > 0))
    throw std::invalid_argument(fmt::format("clip must be a positive gradient norm, got {}", *options_.clip));
  std::map<const void*, std::string> names;
  for (const auto& [name, tensor] : model_.parameters) names[tensor.unsafeGetTensorImpl()] = name;
  if (!optimizer_) throw std::invalid_argument("the trainer needs an optimizer");
  const std::vector<ParamGroup>& groups = optimizer_->groups();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    base_lrs_.push_back(groups[g].lr);
    for (const auto& p : groups[g].params) {
      auto it = names.find(p.unsafeGetTensorImpl());
      if (it == names.end())
        throw std::invalid_argument(
            fmt::format("parameter group {} holds a tensor that is not a parameter of the model", g + 1));
      trainable_.emplace_back(it->second, p);
    }
  }
  schedule_ = std::make_unique<LrSchedule>(std::move(schedule));
  std::vector<at::Tensor> params, buffers;
  for (const auto& [name, tensor] : model_.parameters) params.push_back(tensor);
  for (const auto& [name, tensor] : model_.buffers) buffers.push_back(tensor);
  if (dist::ProcessGroup* group = dist::process_group(); group && group->size() > 1) {
    // Data parallel: every rank starts from rank 0's weights (the averages start from them too).
    std::vector<at::Tensor> state = params;
    state.insert(state.end(), buffers.begin(), buffers.end());
    dist::broadcast_from_rank0(*group, state);
  }
  for (const auto& ema : emas) emas_.emplace_back(params, buffers, ema);
  if (precision_ == Precision::fp16) scaler_ = std::make_unique<LossScaler>(options_.scaler, device_);
  skipped_ = at::zeros({}, at::TensorOptions().dtype(at::kLong).device(device_));
  if (dist::ProcessGroup* group = dist::process_group(); group && group->size() > 1) {
    // Data parallel: every rank averages its gradients with the others'.
    std::vector<at::Tensor> trainable;
    for (const auto& [name, p] : trainable_) trainable.push_back(p);
    gradients_ = std::make_unique<dist::GradientAverager>(*group, std::move(trainable), options_.data_parallel);
  }
}

Trainer::~Trainer() = default;

at::Tensor Trainer::global_norm(const std::vector<at::Tensor>& grads, std::vector<at::Tensor>* per_tensor) const {
  if (grads.empty()) return at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
  return total_norm(grads, 2.0, per_tensor).to(at::kFloat);
}

std::vector<at::Tensor> Trainer::trainable_grads() const {
  std::vector<at::Tensor> grads;
  for (const auto& [name, p] : trainable_)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

StepTiming Trainer::timing() {
  Events& events = *events_;
  if (events.pending) {
    bool done = true;
    for (const auto& mark : events.marks) done = done && mark.query();
    if (done) {
      timing_.forward_backward = events.marks[0].elapsedTime(events.marks[1]) / 1000.0;
      timing_.optimizer = events.marks[1].elapsedTime(events.marks[2]) / 1000.0;
      timing_.ema = events.marks[2].elapsedTime(events.marks[3]) / 1000.0;
      events.pending = false;
    }
  }
  return timing_;
}

StepResult Trainer::step(const LossFunction& loss_of, const NamedTensorList& inputs) {
  if (before_step_) before_step_();
  const bool cuda = device_.is_cuda();
  // Captured into a CUDA graph, the step queries and records no events (a query would fail the capture).
  const bool captured = core::stream_capturing(device_);
  // A new set of device events only when the previous one has been read (timing() reads completed ones).
  if (!captured) timing();
  const bool record = cuda && !captured && !events_->pending;
  std::optional<c10::impl::VirtualGuardImpl> guard;
  if (record) {
    guard.emplace(c10::DeviceType::CUDA);
    events_->marks.clear();
    for (int i = 0; i < 4; ++i) events_->marks.emplace_back(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
  }
  auto mark = [&](int index) {
    if (record) events_->marks[index].record(guard->getStream(device_));
  };
  double host_time = core::steady_seconds();
  auto host_lap = [&](double& slot) {
    const double now = core::steady_seconds();
    if (!cuda) slot = now - host_time;
    host_time = now;
  };

  mark(0);
  // Data parallel: the gradients are views of the averager's buckets, zeroed in place (set_to_none would drop them).
  if (gradients_)
    gradients_->start_step();
  else
    optimizer_->zero_grad();
  const int64_t count = options_.accumulate;
  std::vector<at::Tensor> micro_losses;
  for (int64_t micro = 0; micro < count; ++micro) {
    at::Tensor loss;
    {
      AutocastScope autocast(device_.type(), autocast_dtype(precision_));
      loss = loss_of(micro, count);
    }
    if (!loss.defined() || loss.numel() != 1 || !loss.is_floating_point())
      throw std::invalid_argument(
          fmt::format("the loss function must return a floating-point scalar tensor, got {}",
                      loss.defined() ? core::shape_text(loss.sizes()) + " " + c10::toString(loss.scalar_type())
                                     : std::string("nothing")));
    if (!loss.requires_grad())
      throw std::invalid_argument(
          "the loss does not require grad: it was computed without the model's parameters or under no_grad");
    at::Tensor objective = loss.reshape({}).to(at::kFloat);
    if (count > 1) objective = objective / static_cast<double>(count);
    if (scaler_) objective = scaler_->scale_loss(objective);
    // Data parallel: the last micro-batch's backward starts averaging buckets as their gradients come in.
    if (gradients_ && micro == count - 1) gradients_->expect_last_backward();
    objective.backward();
    micro_losses.push_back(loss.detach().reshape({}).to(at::kFloat));
  }
  at::Tensor loss_mean = micro_losses.front();
  if (count > 1) loss_mean = at::stack(micro_losses).sum() / static_cast<double>(count);
  if (gradients_) {  // finishes the averaging; the mean loss makes every rank agree on a non-finite step
    gradients_->average();
    loss_mean = gradients_->mean(loss_mean);
  }
  mark(1);
  host_lap(timing_.forward_backward);

  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads = trainable_grads();
  const at::Tensor loss_bad = at::logical_not(at::isfinite(loss_mean)).to(at::kFloat).reshape({1});
  at::Tensor found;
  at::Tensor grad_norm;
  std::vector<at::Tensor> grad_norms;
  if (scaler_) {
    const at::Tensor found_inf = scaler_->unscale(grads);
    grad_norm = global_norm(grads, &grad_norms);
    found = at::maximum(found_inf, loss_bad);
    found_inf.copy_(found);
    found = found_inf;
  } else {
    grad_norm = global_norm(grads, &grad_norms);
    found = at::maximum(loss_bad, at::logical_not(at::isfinite(grad_norm)).to(at::kFloat).reshape({1}));
  }
  // The update is skipped on the device when `skip` is set: a non-finite step, and under on_nonfinite = "stop"
  // every step after one (the latch), until the stop is raised from the host one step later.
  at::Tensor skip = found;
  const bool stop_policy = options_.on_nonfinite == NonFinitePolicy::stop;
  if (stop_policy) {
    if (!stop_latch_.defined()) stop_latch_ = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device_));
    at::maximum_out(stop_latch_, stop_latch_, scaler_ ? loss_bad : found);  // with fp16, overflow is the scaler's
    skip = at::maximum(found, stop_latch_);
  }
  if (options_.clip) clip_by_norm(grads, *options_.clip, grad_norm);
  const double factor = schedule_->factor(step_);
  // The learning rates and the EMAs' weights reach the device in one copy; the capturable optimizer and the
  // EMA updates read them there.
  std::vector<double> scalars;
  for (double base_lr : base_lrs_) scalars.push_back(base_lr * factor);
  for (const Ema& ema : emas_) scalars.push_back(1 - ema.current_decay(step_ + 1));
  if (!step_scalars_.defined()) step_scalars_ = DeviceScalars(scalars.size(), device_);
  step_scalars_.write(scalars);
  for (std::size_t g = 0; g < base_lrs_.size(); ++g) optimizer_->set_lr(g, scalars[g], step_scalars_.element(g));
  optimizer_->step(skip);
  skipped_.add_(skip.reshape({}).to(at::kLong));
  if (scaler_) scaler_->update(found);
  ++step_;
  ++state_version_;
  mark(2);
  host_lap(timing_.optimizer);

  for (std::size_t e = 0; e < emas_.size(); ++e) emas_[e].update(step_, step_scalars_.element(base_lrs_.size() + e));
  if (gradients_ && (step_ == 1 || step_ % kRankCheckEvery == 0)) gradients_->check_in_step(step_);
  mark(3);
  host_lap(timing_.ema);
  if (record) events_->pending = true;

  StepResult result;
  result.loss = loss_mean;
  result.grad_norm = grad_norm;
  if (scaler_) result.loss_scale = scaler_->scale_tensor();
  result.skipped = skipped_;
  result.lr = base_lrs_.empty() ? 0.0 : base_lrs_[0] * factor;
  result.step = step_;
  if (observer_) observer_(step_);
  if (stop_policy && !captured) {
    raise_pending_stop();  // the previous step's flag, read while this step runs on the device
    watch_for_stop(micro_losses, grad_norms, inputs);
  }
  return result;
}

// The latch after this step goes to the host without blocking; the report's material is kept with it.
void Trainer::watch_for_stop(const std::vector<at::Tensor>& micro_losses, const std::vector<at::Tensor>& grad_norms,
                             const NamedTensorList& inputs) {
  auto pending = std::make_unique<PendingStop>();
  pending->step = step_;
  pending->micro_losses = micro_losses;
  std::size_t next = 0;
  for (const auto& [name, p] : trainable_)
    if (p.grad().defined() && next < grad_norms.size()) pending->grad_norms.emplace_back(name, grad_norms[next++]);
  pending->inputs = inputs;
  if (device_.is_cuda()) {
    pending->flag = at::empty({1}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
    pending->flag.copy_(stop_latch_, /*non_blocking=*/true);
    c10::impl::VirtualGuardImpl guard(c10::DeviceType::CUDA);
    pending->copied.emplace(c10::DeviceType::CUDA, c10::EventFlag::PYTORCH_DEFAULT);
    pending->copied->record(guard.getStream(device_));
  } else {
    pending->flag = stop_latch_.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
  }
  pending_stop_ = std::move(pending);
}

void Trainer::raise_pending_stop() {
  if (!pending_stop_) return;
  std::unique_ptr<PendingStop> pending = std::move(pending_stop_);
  if (pending->copied) pending->copied->synchronize();
  if (pending->flag.data_ptr<float>()[0] == 0) return;
  stop_latch_.zero_();  // raised once: a caller that goes on trains again
  throw NonFiniteError(nonfinite_report(*pending));
}

StepResult Trainer::step(Objective& objective, const Batch& batch) {
  const std::vector<Batch> micro = split_batch(batch, options_.accumulate);
  return step([&](std::int64_t index, std::int64_t) { return objective.loss(micro[static_cast<std::size_t>(index)]); },
              batch.tensors);
}

StepResult Trainer::step(const Batch& batch) {
  if (!objective_) throw std::logic_error("train:step(batch) needs an objective: runner.trainer { objective = ... }");
  return step(*objective_, batch);
}

std::string Trainer::nonfinite_report(const PendingStop& pending) const {
  std::vector<std::string> losses;
  for (const auto& l : pending.micro_losses) {
    const double value = l.item<double>();
    losses.push_back(std::isnan(value) ? std::string("nan") : fmt::format("{:.6g}", value));  // never "-nan"
  }
  std::vector<std::string> gradients;
  std::int64_t more = 0;
  for (const auto& [name, norm] : pending.grad_norms) {
    const double value = norm.item<double>();
    if (std::isfinite(value)) continue;
    if (gradients.size() < 8)
      gradients.push_back(fmt::format("{} (norm {})", name, std::isnan(value) ? "NaN" : "inf"));
    else
      ++more;
  }
  std::vector<std::string> input_ranges;
  for (const auto& [name, tensor] : pending.inputs) input_ranges.push_back(describe_range(name, tensor));
  return fmt::format(
      "non-finite values at step {}: loss per micro-batch [{}]; gradients: {}; parameters: {}; inputs: {} (its "
      "update and those of later steps were skipped; stopped after step {})",
      pending.step, fmt::join(losses, ", "),
      gradients.empty()
          ? std::string("none")
          : fmt::format("{}", fmt::join(gradients, ", ")) + (more ? fmt::format(" and {} more", more) : ""),
      list_nonfinite(model_.parameters),
      input_ranges.empty() ? std::string("not given") : fmt::format("{}", fmt::join(input_ranges, "; ")), step_);
}

void Trainer::restore_counters(std::int64_t step, const at::Tensor& skipped) {
  if (step < 0) throw std::invalid_argument(fmt::format("the step count must be 0 or more, got {}", step));
  if (skipped.defined()) skipped_.copy_(skipped.reshape({}));
  step_ = step;
  ++state_version_;
}

void Trainer::set_base_lr(std::size_t group, double lr) {
  if (group >= base_lrs_.size())
    throw std::out_of_range(
        fmt::format("parameter group {} does not exist (the optimizer has {})", group + 1, base_lrs_.size()));
  if (!std::isfinite(lr) || lr < 0)
    throw std::invalid_argument(fmt::format("the learning rate must be a finite number >= 0, got {}", lr));
  base_lrs_[group] = lr;
}

void set_deterministic(bool enabled) {
  if (enabled) ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(enabled, /*warn_only=*/false);
  at::globalContext().setDeterministicCuDNN(enabled);
  at::globalContext().setBenchmarkCuDNN(false);
}

}  // namespace runner::train
