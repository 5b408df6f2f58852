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

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "runtime/core/clock.h"
#include "runtime/core/device.h"
#include "runtime/core/enum_table.h"
#include "runtime/core/logging.h"
#include "runtime/core/shape_text.h"
#include "runtime/dist/process_group.h"
#include "runtime/train/grad_norm.h"
#include "runtime/train/cuda_graph_recorder.h"

namespace runner::train {
namespace {

// The model's group hooks, given to the weights' shards (sharded data parallel over the weights).
class ShardedWeightHooks : public nn::ParameterGroupHooks {
 public:
  explicit ShardedWeightHooks(dist::ParameterShards& shards) : shards_(shards) {}
  void before_forward(const std::string& group) override { shards_.before_forward(group); }
  void after_forward(const std::string& group, const std::vector<at::Tensor>& outputs) override {
    shards_.after_forward(group, outputs);
  }

 private:
  dist::ParameterShards& shards_;
};

}  // namespace

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
    case Precision::fp8:
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
  if (amp == "fp8") {
    // FP8 tensor cores: Ada (8.9), Hopper (9.0) and later.
    if (!device.is_cuda()) {
      throw std::invalid_argument(
          "amp 'fp8' needs a CUDA device of compute capability 8.9 or later (FP8 tensor cores); this device is the "
          "CPU (use 'bf16' or 'fp32')");
    }
    const auto capability = core::cuda_compute_capability(device.has_index() ? device.index() : 0);
    if (capability.major * 10 + capability.minor < 89) {
      throw std::invalid_argument(
          fmt::format("amp 'fp8' needs a CUDA device of compute capability 8.9 or later (FP8 tensor cores); {} is "
                      "compute capability {}.{} (use 'bf16')",
                      core::device_name(device), capability.major, capability.minor));
    }
    return Precision::fp8;
  }
  throw std::invalid_argument(fmt::format("amp must be auto, bf16, fp16, fp32 or fp8, got '{}'", amp));
}

std::string precision_name(Precision precision) {
  switch (precision) {
    case Precision::fp32:
      return "fp32";
    case Precision::bf16:
      return "bf16";
    case Precision::fp16:
      return "fp16";
    case Precision::fp8:
      return "fp8";
  }
  return "fp32";
}

NonFinitePolicy parse_nonfinite_policy(const std::string& name) {
  static const core::EnumTable<NonFinitePolicy, 2> kPolicies{
      {{{NonFinitePolicy::skip, "skip"}, {NonFinitePolicy::stop, "stop"}}},
      core::NameQuotes::single,
      "on_nonfinite must be {list}, got '{got}'"};
  return kPolicies.parse(name);
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
                 std::vector<EmaOptions> emas, StepOptions options, c10::Device device, dist::ProcessGroup* group)
    : model_(std::move(model)),
      optimizer_(std::move(optimizer)),
      options_(std::move(options)),
      device_(device),
      precision_(resolve_precision(options_.amp, device)),
      events_(std::make_unique<Events>()),
      group_(group && group->size() > 1 ? group : nullptr) {
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
    group_start_.push_back(trainable_.size());
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
  if (group_) {
    // Data parallel: every rank starts from rank 0's weights (the averages start from them too).
    std::vector<at::Tensor> state = params;
    state.insert(state.end(), buffers.begin(), buffers.end());
    dist::broadcast_from_rank0(*group_, state);
  }
  if (group_ && options_.shard == dist::ShardMode::weights && !model_.grouped)
    throw std::invalid_argument(
        "shard = \"weights\" needs a model whose forward gathers each block's weights: nn.DiT or nn.UNet (a model "
        "built in Lua can use shard = \"gradients\")");
  if (options_.shard_gather != dist::WeightGather::fp32 && options_.shard != dist::ShardMode::weights)
    throw std::invalid_argument(fmt::format(
        "shard_gather = \"{}\" needs shard = \"weights\" (the other modes keep each rank's own rows of the weights in "
        "the model, which a gather in another dtype would round)",
        dist::weight_gather_name(options_.shard_gather)));
  if (group_ && options_.shard != dist::ShardMode::none) {
    // Sharded: the optimizer steps and the EMAs average each rank's rows of the trainable parameters.
    const bool weights = options_.shard == dist::ShardMode::weights;
    dist::ShardOptions sharding;
    sharding.overlap = options_.data_parallel.overlap;
    if (weights) sharding.released = model_.grouped->parameter_groups();
    sharding.gather = options_.shard_gather;
    shards_ = std::make_unique<dist::ParameterShards>(*group_, trainable_, options_.shard, std::move(sharding));
    if (weights) model_.grouped->set_parameter_group_hooks(std::make_shared<ShardedWeightHooks>(*shards_));
    optimizer_->replace_params(
        [this](std::size_t g, std::size_t p) { return shards_->local().at(group_start_.at(g) + p); });
    std::map<const void*, std::int64_t> trainable_index;
    for (std::size_t k = 0; k < trainable_.size(); ++k)
      trainable_index[trainable_[k].second.unsafeGetTensorImpl()] = static_cast<std::int64_t>(k);
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto it = trainable_index.find(params[i].unsafeGetTensorImpl());
      sharded_index_.push_back(it == trainable_index.end() ? -1 : it->second);
      if (it != trainable_index.end()) params[i] = shards_->local()[static_cast<std::size_t>(it->second)];
    }
  }
  for (const auto& ema : emas) emas_.emplace_back(params, buffers, ema);
  if (precision_ == Precision::fp16) scaler_ = std::make_unique<LossScaler>(options_.scaler, device_);
  // Sharded over the weights, the weights are not whole to cast at the start of a step.
  if (const auto dtype = autocast_dtype(precision_);
      dtype && options_.cast_weights_once && options_.shard != dist::ShardMode::weights) {
    std::vector<at::Tensor> weights;
    for (const auto& [name, p] : trainable_) weights.push_back(p);
    weight_casts_ = std::make_unique<nn::WeightCasts>(weights, *dtype);
  }
  skipped_ = at::zeros({}, at::TensorOptions().dtype(at::kLong).device(device_));
  if (options_.on_nonfinite == NonFinitePolicy::stop)
    stop_latch_ = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device_));
  if (group_ && !shards_) {
    // Data parallel: every rank averages its gradients with the others'.
    std::vector<at::Tensor> trainable;
    for (const auto& [name, p] : trainable_) trainable.push_back(p);
    gradients_ = std::make_unique<dist::GradientAverager>(*group_, std::move(trainable), options_.data_parallel);
  }
  graph_policy_ = std::make_unique<StepGraphPolicy>(
      options_.graph, device_, options_.graph == GraphMode::off ? std::nullopt : device_graph_blocker());
}

Trainer::~Trainer() {
  if (shards_ && model_.grouped) model_.grouped->set_parameter_group_hooks(nullptr);
}

at::Tensor Trainer::global_norm(const std::vector<at::Tensor>& grads, std::vector<at::Tensor>* per_tensor) const {
  if (shards_) {  // the norm of every rank's rows: the square root of the sum of the ranks' squared norms
    const at::Tensor mine = grads.empty() ? at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device_))
                                          : total_norm(grads, 2.0, per_tensor).to(at::kDouble);
    return shards_->sum(mine * mine).sqrt().to(at::kFloat);
  }
  if (grads.empty()) return at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
  return total_norm(grads, 2.0, per_tensor).to(at::kFloat);
}

std::vector<at::Tensor> Trainer::trainable_grads() const {
  std::vector<at::Tensor> grads;
  if (shards_) {
    for (const at::Tensor& share : shards_->local()) grads.push_back(share.grad());
    return grads;
  }
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

// What the device work of a step leaves: device tensors only.
struct Trainer::DeviceStep {
  at::Tensor loss;       // float32 scalar: the mean of the micro-batch losses
  at::Tensor grad_norm;  // float32 scalar
  std::vector<at::Tensor> micro_losses;
  std::vector<at::Tensor> grad_norms;  // of the trainable parameters that have a gradient, in order
};

namespace {

LossFunction loss_over(Objective& objective, const std::vector<StepBatch>& micro) {
  return [&objective, &micro](std::int64_t index, std::int64_t) {
    return objective.loss(micro[static_cast<std::size_t>(index)]);
  };
}

// A batch tensor into the graph's buffer, on the current stream (host tensors through pinned memory).
void copy_into(at::Tensor& buffer, const at::Tensor& value) {
  if (value.is_cpu() && !value.is_pinned())
    buffer.copy_(value.pin_memory(), /*non_blocking=*/true);
  else
    buffer.copy_(value, /*non_blocking=*/true);
}

}  // namespace

StepResult Trainer::step(const LossFunction& loss_of, const NamedTensorList& inputs, double batch_wait_seconds) {
  std::optional<std::int64_t> batch_size;
  for (const auto& [name, tensor] : inputs)
    if (name == "data" && tensor.dim() > 0) batch_size = tensor.size(0);
  begin_step(batch_size, batch_wait_seconds);
  graph_policy_->decide(nullptr, std::string(), core::stream_capturing(device_));  // eager; says why under "auto"
  return eager_step(loss_of, inputs);
}

StepResult Trainer::eager_step(const LossFunction& loss_of, const NamedTensorList& inputs) {
  const bool cuda = device_.is_cuda();
  // Captured into a CUDA graph, the step queries and records no events (a query would fail the capture).
  const bool stream_capturing = core::stream_capturing(device_);
  // A new set of device events only when the previous one has been read (timing() reads completed ones).
  if (!stream_capturing) timing();
  const bool record = cuda && !stream_capturing && !events_->pending;
  std::optional<c10::impl::VirtualGuardImpl> guard;
  if (record) {
    guard.emplace(c10::DeviceType::CUDA);
    events_->marks.clear();
    for (int i = 0; i < 4; ++i) events_->marks.emplace_back(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
  }
  double host_time = core::steady_seconds();
  auto mark = [&](int index) {
    if (record) events_->marks[index].record(guard->getStream(device_));
    const double now = core::steady_seconds();
    double* slot = index == 1 ? &timing_.forward_backward : index == 2 ? &timing_.optimizer : &timing_.ema;
    if (!cuda && index > 0) *slot = now - host_time;
    host_time = now;
  };
  mark(0);
  const double factor = write_step_scalars();
  const DeviceStep done = device_step(loss_of, mark);
  if (record) events_->pending = true;
  return finish_step(done, factor, inputs, stream_capturing);
}

double Trainer::next_lr(std::size_t group) const { return base_lrs_.at(group) * schedule_->factor(step_); }

double Trainer::write_step_scalars() {
  const double factor = schedule_->factor(step_);
  // The learning rates and the EMAs' weights reach the device in one copy; the capturable optimizer and the
  // EMA updates read them there.
  std::vector<double> scalars;
  for (std::size_t g = 0; g < base_lrs_.size(); ++g) scalars.push_back(next_lr(g));
  for (const Ema& ema : emas_) scalars.push_back(1 - ema.current_decay(step_ + 1));
  if (!step_scalars_.defined()) step_scalars_ = DeviceScalars(scalars.size(), device_);
  step_scalars_.write(scalars);
  for (std::size_t g = 0; g < base_lrs_.size(); ++g) optimizer_->set_lr(g, scalars[g], step_scalars_.element(g));
  return factor;
}

Trainer::DeviceStep Trainer::device_step(const LossFunction& loss_of, const std::function<void(int)>& mark) {
  // Data parallel: the gradients are views of the averager's buckets, zeroed in place (set_to_none would drop them).
  if (shards_)
    shards_->start_step();
  else if (gradients_)
    gradients_->start_step();
  else
    optimizer_->zero_grad();
  if (weight_casts_) weight_casts_->refresh();
  const int64_t count = options_.accumulate;
  std::vector<at::Tensor> micro_losses;
  for (int64_t micro = 0; micro < count; ++micro) {
    at::Tensor loss;
    {
      AutocastScope autocast(device_.type(), autocast_dtype(precision_));
      std::optional<nn::WeightCastScope> weight_casts;
      if (weight_casts_) weight_casts.emplace(*weight_casts_);
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
    if (shards_ && micro == count - 1) shards_->expect_last_backward();
    objective.backward();
    if (shards_) shards_->finish_backward();
    micro_losses.push_back(loss.detach().reshape({}).to(at::kFloat));
  }
  at::Tensor loss_mean = micro_losses.front();
  if (count > 1) loss_mean = at::stack(micro_losses).sum() / static_cast<double>(count);
  if (gradients_) {  // finishes the averaging; the mean loss makes every rank agree on a non-finite step
    gradients_->average();
    loss_mean = gradients_->mean(loss_mean);
  }
  if (shards_) {
    shards_->reduce_gradients();
    loss_mean = shards_->mean(loss_mean);
  }
  mark(1);

  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads = trainable_grads();
  const at::Tensor loss_bad = at::logical_not(at::isfinite(loss_mean)).to(at::kFloat).reshape({1});
  at::Tensor found;
  at::Tensor grad_norm;
  std::vector<at::Tensor> grad_norms;
  if (scaler_) {
    const at::Tensor found_inf = scaler_->unscale(grads);
    if (shards_) {  // an overflow in any rank's rows skips the step on every rank
      std::vector<at::Tensor> any{found_inf};
      shards_->process_group().all_reduce(any, dist::ReduceOp::max);
    }
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
  if (options_.on_nonfinite == NonFinitePolicy::stop) {
    at::maximum_out(stop_latch_, stop_latch_, scaler_ ? loss_bad : found);  // with fp16, overflow is the scaler's
    skip = at::maximum(found, stop_latch_);
  }
  if (options_.clip) clip_by_norm(grads, *options_.clip, grad_norm);
  optimizer_->step(skip);
  if (shards_) shards_->gather_parameters();
  skipped_.add_(skip.reshape({}).to(at::kLong));
  if (scaler_) scaler_->update(found);
  mark(2);

  const std::int64_t next = step_ + 1;
  for (std::size_t e = 0; e < emas_.size(); ++e) emas_[e].update(next, step_scalars_.element(base_lrs_.size() + e));
  if (group_ && (next == 1 || next % kRankCheckEvery == 0)) check_ranks_agree_at(next);
  mark(3);
  return DeviceStep{loss_mean, grad_norm, std::move(micro_losses), std::move(grad_norms)};
}

StepResult Trainer::finish_step(const DeviceStep& done, double factor, const NamedTensorList& inputs,
                                bool stream_capturing) {
  ++step_;
  ++state_version_;
  StepResult result;
  result.loss = done.loss;
  result.grad_norm = done.grad_norm;
  if (scaler_) result.loss_scale = scaler_->scale_tensor();
  result.skipped = skipped_;
  result.lr = base_lrs_.empty() ? 0.0 : base_lrs_[0] * factor;
  result.step = step_;
  if (options_.on_nonfinite == NonFinitePolicy::stop && !stream_capturing) {
    raise_pending_stop();  // the previous step's flag, read while this step runs on the device
    watch_for_stop(done.micro_losses, done.grad_norms, inputs);
    if (step_ == options_.steps) raise_pending_stop();  // no later step reads it
  }
  for (const std::shared_ptr<StepObserver>& observer : observers_) observer->after_step(result);
  returned_at_ = core::steady_seconds();
  return result;
}

void Trainer::begin_step(std::optional<std::int64_t> batch_size, double batch_wait_seconds) {
  const double now = core::steady_seconds();
  const double outside = returned_at_ ? now - *returned_at_ : 0.0;
  timing_.batch_wait = std::min(outside, std::max(0.0, batch_wait_seconds));
  timing_.between_steps = outside - timing_.batch_wait;
  if (group_ && !announced_ && group_->rank() == 0) {
    announced_ = true;
    const int ranks = group_->size();
    if (shards_) {
      const StateBytes bytes = state_bytes();
      core::log(core::LogLevel::info,
                fmt::format("sharded data parallel: {} (weights {:.1f}, gradients {:.1f}, optimizer {:.1f}, EMA "
                            "{:.1f})",
                            *sharding_text(), static_cast<double>(bytes.weights) / 1e6,
                            static_cast<double>(bytes.gradients) / 1e6, static_cast<double>(bytes.optimizer) / 1e6,
                            static_cast<double>(bytes.ema) / 1e6));
    }
    if (!batch_size) {
      core::log(core::LogLevel::info, fmt::format("data parallel: {} ranks", ranks));
    } else {
      const std::string micro = options_.accumulate > 1
                                    ? fmt::format(" ({} micro-batches of {} per rank)", options_.accumulate,
                                                  *batch_size / options_.accumulate)
                                    : std::string();
      core::log(core::LogLevel::info, fmt::format("data parallel: {} ranks, global batch {} = {} x {}{}", ranks,
                                                  ranks * *batch_size, ranks, *batch_size, micro));
    }
  }
  StepStart start;
  start.step = step_ + 1;
  start.batch_size = batch_size;
  start.batch_wait_seconds = batch_wait_seconds;
  for (const std::shared_ptr<StepObserver>& observer : observers_) observer->before_step(start);
}

void Trainer::add_observer(std::shared_ptr<StepObserver> observer) { observers_.push_back(std::move(observer)); }

void Trainer::remove_observer(const StepObserver* observer) {
  observers_.erase(std::remove_if(observers_.begin(), observers_.end(),
                                  [observer](const std::shared_ptr<StepObserver>& o) { return o.get() == observer; }),
                   observers_.end());
}

StepResult Trainer::graph_step(Objective& objective, StepGraphPolicy::Graph& graph, bool capture,
                               const StepBatch& prepared, const NamedTensorList& inputs) {
  const std::int64_t next = step_ + 1;
  timing();
  const bool record = !events_->pending;
  c10::impl::VirtualGuardImpl guard(c10::DeviceType::CUDA);
  if (record) {
    events_->marks.clear();
    for (int i = 0; i < 4; ++i) events_->marks.emplace_back(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
  }
  const double factor = write_step_scalars();
  if (graph.inputs.tensors.empty()) {
    for (const auto& [name, tensor] : prepared.tensors)
      graph.inputs.tensors.emplace_back(name, at::empty(tensor.sizes(), tensor.options().device(device_)));
  }
  graph.inputs.epoch = prepared.epoch;
  for (std::size_t i = 0; i < prepared.tensors.size(); ++i)
    copy_into(graph.inputs.tensors[i].second, prepared.tensors[i].second);
  if (capture) {
    const std::vector<StepBatch> micro = split_batch(graph.inputs, options_.accumulate);
    try {
      graph_policy_->recorder().capture(graph.id, [&] {
        const DeviceStep done = device_step(loss_over(objective, micro), [](int) {});
        std::vector<at::Tensor> parts{done.loss.reshape({1}), done.grad_norm.reshape({1})};
        for (const at::Tensor& loss : done.micro_losses) parts.push_back(loss.reshape({1}));
        for (const at::Tensor& norm : done.grad_norms) parts.push_back(norm.reshape({1}).to(at::kFloat));
        graph.report = at::cat(parts);
        graph.micro = static_cast<std::int64_t>(done.micro_losses.size());
      });
    } catch (const std::exception& error) {
      graph_policy_->forget(graph);
      throw std::runtime_error(fmt::format(
          "runner.trainer: capturing step {} in a CUDA graph failed: {} (graph = false runs every step eagerly)", next,
          error.what()));
    }
    graph.recorded = true;
    graph_policy_->count_capture();
  }
  if (record) events_->marks[0].record(guard.getStream(device_));
  graph_policy_->recorder().replay(graph.id);
  if (record) {
    for (int i = 1; i < 4; ++i) events_->marks[i].record(guard.getStream(device_));
    events_->pending = true;
  }
  // The capture counted its own step on the host; a replay counts what the graph's device work did.
  if (!capture) {
    optimizer_->count_replayed_step();
    for (Ema& ema : emas_) ema.count_replayed_update(next);
  }
  graph_policy_->count_replay();
  // The graph's outputs are overwritten by its next replay: the step returns a copy.
  const at::Tensor report = graph.report.clone();
  DeviceStep done{report.select(0, 0), report.select(0, 1), {}, {}};
  for (std::int64_t i = 0; i < graph.micro; ++i) done.micro_losses.push_back(report.select(0, 2 + i));
  for (std::int64_t i = 2 + graph.micro; i < report.size(0); ++i) done.grad_norms.push_back(report.select(0, i));
  return finish_step(done, factor, inputs, /*stream_capturing=*/false);
}

std::optional<std::string> Trainer::device_graph_blocker() const {
  if (!device_.is_cuda())
    return fmt::format("CUDA graphs need a CUDA device; the model is on {}", core::device_name(device_));
  if (!cuda_graphs_built()) return std::string("this build of runner has no CUDA");
  if (gradients_) return std::string("the gradient averaging of data parallel over several ranks is not captured");
  if (shards_) return std::string("the reduce-scatter and all-gather of sharded data parallel are not captured");
  if (!optimizer_->capturable())
    return std::string(
        "the optimizer is not capturable (a parameter takes its foreach path: implementation = \"foreach\", or a "
        "parameter off the GPU)");
  return std::nullopt;
}

void Trainer::set_objective(std::shared_ptr<Objective> objective) {
  objective_ = std::move(objective);
  graph_policy_->clear();
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

StepResult Trainer::step(Objective& objective, const StepBatch& batch) {
  const at::Tensor* data = batch.find("data");
  begin_step(data && data->dim() > 0 ? std::optional<std::int64_t>(data->size(0)) : std::nullopt, batch.wait_seconds);
  const StepBatch prepared = objective.prepare(batch);
  std::string signature;
  if (options_.graph != GraphMode::off) {
    signature = batch_signature(prepared);
    const std::int64_t next = step_ + 1;
    for (const Ema& ema : emas_)
      signature += !ema.due(next) ? "ema idle; " : ema.current_decay(next) == 0 ? "ema copy; " : "ema average; ";
  }
  const StepGraphPolicy::Decision decision =
      graph_policy_->decide(&objective, signature, core::stream_capturing(device_));
  switch (decision.run) {
    case StepGraphPolicy::Run::capture:
    case StepGraphPolicy::Run::replay:
      return graph_step(objective, *decision.graph, decision.run == StepGraphPolicy::Run::capture, prepared,
                        batch.tensors);
    case StepGraphPolicy::Run::warmup: {
      const std::vector<StepBatch> micro = split_batch(prepared, options_.accumulate);
      StepResult result;
      graph_policy_->recorder().on_side_stream(
          [&] { result = eager_step(loss_over(objective, micro), batch.tensors); });
      return result;
    }
    case StepGraphPolicy::Run::eager:
      break;
  }
  const std::vector<StepBatch> micro = split_batch(prepared, options_.accumulate);
  return eager_step(loss_over(objective, micro), batch.tensors);
}

StepResult Trainer::step(const StepBatch& batch) {
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
      list_nonfinite(readable_parameters()),
      input_ranges.empty() ? std::string("not given") : fmt::format("{}", fmt::join(input_ranges, "; ")), step_);
}

void Trainer::check_ranks_agree() { check_ranks_agree_at(step_); }

void Trainer::check_ranks_agree_at(std::int64_t step) {
  if (!group_) return;
  if (gradients_) {
    gradients_->check_in_step(step);
    return;
  }
  std::vector<at::Tensor> weights;  // sharded over the weights: those kept whole
  for (std::size_t k = 0; k < trainable_.size(); ++k)
    if (!shards_ || !shards_->released_between_uses(k)) weights.push_back(trainable_[k].second);
  dist::check_ranks_agree(*group_, weights, step);
}

namespace {

// "group<G>.param<P>.<entry>" -> (G, P) for an entry shaped as the parameter; nullopt for another name and for the
// step count, which is the same on every rank.
std::optional<std::pair<std::size_t, std::size_t>> sharded_state_owner(const std::string& name) {
  unsigned long g = 0, p = 0;
  int consumed = 0;
  if (std::sscanf(name.c_str(), "group%lu.param%lu.%n", &g, &p, &consumed) != 2 || consumed == 0) return std::nullopt;
  if (name.substr(static_cast<std::size_t>(consumed)) == "step") return std::nullopt;
  return std::make_pair(static_cast<std::size_t>(g), static_cast<std::size_t>(p));
}

}  // namespace

NamedTensorList Trainer::full_optimizer_state() {
  NamedTensorList state = optimizer_->state_tensors();
  if (!shards_) return state;
  for (auto& [name, tensor] : state) {
    const auto owner = sharded_state_owner(name);
    if (!owner) continue;
    tensor = shards_->gather_one(group_start_.at(owner->first) + owner->second, tensor, "optimizer state all_gather");
  }
  return state;
}

std::vector<at::Tensor> Trainer::full_ema_shadow(std::size_t index) {
  const std::vector<at::Tensor>& shadow = emas_.at(index).shadow();
  std::vector<at::Tensor> full;
  for (std::size_t i = 0; i < shadow.size(); ++i) {
    const std::int64_t k = shards_ ? sharded_index_.at(i) : -1;
    full.push_back(k < 0 ? shadow[i] : shards_->gather_one(static_cast<std::size_t>(k), shadow[i], "EMA all_gather"));
  }
  return full;
}

std::optional<std::size_t> Trainer::optimizer_state_shard(const std::string& name) const {
  if (!shards_) return std::nullopt;
  const auto owner = sharded_state_owner(name);
  if (!owner || owner->first >= group_start_.size()) return std::nullopt;
  const std::size_t k = group_start_[owner->first] + owner->second;
  return k < shards_->size() ? std::optional<std::size_t>(k) : std::nullopt;
}

std::optional<std::size_t> Trainer::weight_shard(std::size_t parameter) const {
  if (!shards_ || shards_->mode() != dist::ShardMode::weights) return std::nullopt;
  return ema_shard(parameter);
}

NamedTensorList Trainer::readable_parameters() const {
  NamedTensorList readable = model_.parameters;
  for (std::size_t i = 0; i < readable.size(); ++i)
    if (const auto k = weight_shard(i)) readable[i].second = shards_->local().at(*k);
  return readable;
}

NamedTensorList Trainer::full_model_state() {
  NamedTensorList state = model_.parameters;
  for (std::size_t i = 0; i < state.size(); ++i)
    if (const auto k = weight_shard(i))
      state[i].second = shards_->gather_one(*k, shards_->local().at(*k), "weights all_gather");
  state.insert(state.end(), model_.buffers.begin(), model_.buffers.end());
  return state;
}

std::optional<std::size_t> Trainer::ema_shard(std::size_t parameter) const {
  if (!shards_ || parameter >= sharded_index_.size() || sharded_index_[parameter] < 0) return std::nullopt;
  return static_cast<std::size_t>(sharded_index_[parameter]);
}

NamedTensorList Trainer::local_optimizer_state(const NamedTensorList& full) const {
  NamedTensorList local;
  for (const auto& [name, tensor] : full) {
    const auto k = optimizer_state_shard(name);
    local.emplace_back(name, k ? dist::rows_of(tensor, shards_->rows(*k)) : tensor);
  }
  return local;
}

void Trainer::copy_ema(std::size_t index, std::vector<at::Tensor> params, std::vector<at::Tensor> buffers) {
  if (index >= emas_.size())
    throw std::invalid_argument(fmt::format("the trainer has {} EMA averages, not {}", emas_.size(), index + 1));
  if (!shards_) {
    emas_[index].copy_to(std::move(params), std::move(buffers));
    return;
  }
  const std::vector<at::Tensor> shadow = full_ema_shadow(index);
  if (params.size() != shadow.size())
    throw std::invalid_argument(
        fmt::format("the EMA holds {} parameters, {} were given to copy it into", shadow.size(), params.size()));
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < shadow.size(); ++i) {
    if (!params[i].sizes().equals(shadow[i].sizes()))
      throw std::invalid_argument(fmt::format("the EMA's parameter {} has shape {}, its target {}", i + 1,
                                              core::shape_text(shadow[i].sizes()),
                                              core::shape_text(params[i].sizes())));
    params[i].copy_(shadow[i]);
  }
  const std::vector<at::Tensor>& shadow_buffers = emas_[index].shadow_buffers();
  if (!buffers.empty()) {
    if (buffers.size() != shadow_buffers.size())
      throw std::invalid_argument(fmt::format("the EMA holds {} buffers, {} were given to copy it into",
                                              shadow_buffers.size(), buffers.size()));
    for (std::size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(shadow_buffers[i]);
  }
}

Trainer::StateBytes Trainer::state_bytes() const {
  auto bytes_of = [](const at::Tensor& t) {
    return t.defined() ? t.numel() * static_cast<std::int64_t>(t.element_size()) : std::int64_t{0};
  };
  StateBytes bytes;
  for (std::size_t i = 0; i < model_.parameters.size(); ++i)
    if (!shards_ || sharded_index_.at(i) < 0) bytes.weights += bytes_of(model_.parameters[i].second);
  if (shards_) {
    bytes.weights += shards_->parameter_bytes();
    bytes.gradients = shards_->gradient_bytes();
  } else {
    for (const auto& [name, p] : trainable_) bytes.gradients += p.numel() * static_cast<std::int64_t>(p.element_size());
  }
  for (const auto& [name, t] : optimizer_->state_tensors()) bytes.optimizer += bytes_of(t);
  if (optimizer_->state_tensors().empty()) {  // before the first step: what the state will hold
    for (const ParamGroup& g : optimizer_->groups()) {
      const std::int64_t per =
          optimizer_->kind() == OptimizerKind::sgd ? (g.momentum != 0 ? 1 : 0) : (g.amsgrad ? 3 : 2);
      for (const at::Tensor& p : g.params) bytes.optimizer += per * bytes_of(p);
    }
  }
  for (const Ema& ema : emas_)
    for (const at::Tensor& t : ema.shadow()) bytes.ema += bytes_of(t);
  return bytes;
}

std::optional<std::string> Trainer::sharding_text() const {
  if (!shards_) return std::nullopt;
  return fmt::format("shard {} ({}{}), model state {:.1f} MB per rank", dist::shard_mode_name(shards_->mode()),
                     dist::shard_mode_zero_name(shards_->mode()),
                     options_.shard_gather == dist::WeightGather::bf16 ? ", bf16 gathers" : "",
                     static_cast<double>(state_bytes().total()) / 1e6);
}

void Trainer::restore_counters(std::int64_t step, const at::Tensor& skipped) {
  if (step < 0) throw std::invalid_argument(fmt::format("the step count must be 0 or more, got {}", step));
  if (skipped.defined()) skipped_.copy_(skipped.reshape({}));
  step_ = step;
  ++state_version_;
  graph_policy_->clear();
}

void Trainer::set_base_lr(std::size_t group, double lr) {
  if (group >= base_lrs_.size())
    throw std::out_of_range(
        fmt::format("parameter group {} does not exist (the optimizer has {})", group + 1, base_lrs_.size()));
  check_learning_rate(lr, "train:set_lr");
  base_lrs_[group] = lr;
}

void set_deterministic(bool enabled) {
  if (enabled) ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(enabled, /*warn_only=*/false);
  at::globalContext().setDeterministicCuDNN(enabled);
  at::globalContext().setBenchmarkCuDNN(false);
}

}  // namespace runner::train
