// Exponential moving average of model weights: diffusers' decay rule, with a host or a device decay.
#include "runtime/train/ema.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

#include "runtime/core/shape_text.h"

#include "runtime/core/dtype.h"

namespace runner::train {
namespace {

constexpr const char* kStateError = "ema state: ";
constexpr const char* kHyperError = "ema hyperparameters: ";

void validate(const EmaOptions& options) {
  const auto fail = [](const std::string& what) { throw std::invalid_argument("ema: " + what); };
  if (!(options.decay >= 0 && options.decay <= 1)) fail(fmt::format("decay must be in [0, 1], got {}", options.decay));
  if (!(options.min_decay >= 0 && options.min_decay <= options.decay)) {
    fail(fmt::format("min_decay must be in [0, decay], got {}", options.min_decay));
  }
  if (options.update_after_step < 0)
    fail(fmt::format("update_after_step must be >= 0, got {}", options.update_after_step));
  if (!(options.inv_gamma > 0)) fail(fmt::format("inv_gamma must be > 0, got {}", options.inv_gamma));
  if (!(options.power > 0)) fail(fmt::format("power must be > 0, got {}", options.power));
  if (options.update_every < 1) fail(fmt::format("update_every must be >= 1, got {}", options.update_every));
}

at::ScalarType shadow_dtype(at::ScalarType dtype) { return dtype == at::kDouble ? at::kDouble : at::kFloat; }

// Empty tensors like `like` (shape, device) with the given dtypes, then one _foreach_copy_ from `sources`.
std::vector<at::Tensor> converted_copies(const std::vector<at::Tensor>& sources,
                                         const std::vector<at::ScalarType>& dtypes) {
  std::vector<at::Tensor> copies;
  copies.reserve(sources.size());
  for (std::size_t i = 0; i < sources.size(); ++i) {
    copies.push_back(at::empty(sources[i].sizes(), sources[i].options().dtype(dtypes[i])));
  }
  if (!copies.empty()) at::_foreach_copy_(copies, sources);
  return copies;
}

// Equal counts and shapes of shadow and source tensors, both defined.
void check_pairs(const char* what, const std::vector<at::Tensor>& shadow, const std::vector<at::Tensor>& sources) {
  if (shadow.size() != sources.size()) {
    throw std::invalid_argument(
        fmt::format("ema: the EMA has {} {}s, the model {}", shadow.size(), what, sources.size()));
  }
  for (std::size_t i = 0; i < shadow.size(); ++i) {
    if (!shadow[i].defined() || !sources[i].defined()) {
      throw std::invalid_argument(fmt::format("ema: {} {} is undefined", what, i + 1));
    }
    if (shadow[i].sizes() != sources[i].sizes()) {
      throw std::invalid_argument(fmt::format("ema: {} {} has shape {} in the EMA and {} in the model", what, i + 1,
                                              core::shape_text(shadow[i].sizes()),
                                              core::shape_text(sources[i].sizes())));
    }
  }
}

// The pairs an update averages (sources converted to their shadow's dtype), and those it copies.
struct UpdatePairs {
  std::vector<at::Tensor> averaged_shadow, averaged_sources, frozen_shadow, frozen_sources;
};

UpdatePairs update_pairs(const std::vector<at::Tensor>& shadow, const std::vector<at::Tensor>& sources,
                         const std::vector<at::Tensor>& shadow_buffers, const std::vector<at::Tensor>& buffers) {
  check_pairs("parameter", shadow, sources);
  check_pairs("buffer", shadow_buffers, buffers);
  UpdatePairs pairs;
  std::vector<at::Tensor> converted_sources;
  std::vector<at::ScalarType> converted_dtypes;
  std::vector<std::size_t> converted_positions;  // positions in averaged_sources that need a converted copy
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const at::Tensor source = sources[i].detach();
    if (!sources[i].requires_grad()) {
      pairs.frozen_shadow.push_back(shadow[i]);
      pairs.frozen_sources.push_back(source);
      continue;
    }
    pairs.averaged_shadow.push_back(shadow[i]);
    pairs.averaged_sources.push_back(source);
    if (source.scalar_type() != shadow[i].scalar_type()) {
      converted_positions.push_back(pairs.averaged_sources.size() - 1);
      converted_sources.push_back(source);
      converted_dtypes.push_back(shadow[i].scalar_type());
    }
  }
  if (!converted_sources.empty()) {
    const std::vector<at::Tensor> converted = converted_copies(converted_sources, converted_dtypes);
    for (std::size_t k = 0; k < converted_positions.size(); ++k)
      pairs.averaged_sources[converted_positions[k]] = converted[k];
  }
  return pairs;
}

// Frozen parameters and buffers are copied.
void copy_unaveraged(const UpdatePairs& pairs, const std::vector<at::Tensor>& shadow_buffers,
                     const std::vector<at::Tensor>& buffers) {
  if (!pairs.frozen_shadow.empty()) at::_foreach_copy_(pairs.frozen_shadow, pairs.frozen_sources);
  if (!shadow_buffers.empty()) {
    std::vector<at::Tensor> detached;
    for (const at::Tensor& buffer : buffers) detached.push_back(buffer.detach());
    at::_foreach_copy_(shadow_buffers, detached);
  }
}

void check_update_weight(const at::Tensor& one_minus_decay) {
  if (!one_minus_decay.defined() || one_minus_decay.numel() != 1 ||
      !at::isFloatingType(one_minus_decay.scalar_type())) {
    throw std::invalid_argument("ema: the update weight 1 - decay must be a one-element floating tensor");
  }
}

}  // namespace

void ema_update(const std::vector<at::Tensor>& shadow, const std::vector<at::Tensor>& sources,
                const std::vector<at::Tensor>& shadow_buffers, const std::vector<at::Tensor>& buffers, double decay) {
  if (!(decay >= 0 && decay <= 1))
    throw std::invalid_argument(fmt::format("ema: decay must be in [0, 1], got {}", decay));
  at::NoGradGuard no_grad;
  const UpdatePairs pairs = update_pairs(shadow, sources, shadow_buffers, buffers);
  if (!pairs.averaged_shadow.empty()) at::_foreach_lerp_(pairs.averaged_shadow, pairs.averaged_sources, 1 - decay);
  copy_unaveraged(pairs, shadow_buffers, buffers);
}

void ema_update(const std::vector<at::Tensor>& shadow, const std::vector<at::Tensor>& sources,
                const std::vector<at::Tensor>& shadow_buffers, const std::vector<at::Tensor>& buffers,
                const at::Tensor& one_minus_decay) {
  check_update_weight(one_minus_decay);
  at::NoGradGuard no_grad;
  const UpdatePairs pairs = update_pairs(shadow, sources, shadow_buffers, buffers);
  // shadow -= w * (shadow - source) with w = 1 - decay: diffusers' EMAModel.step (s.sub_((1 - decay) * (s - p)))
  // op for op, in three multi-tensor launches per (device, dtype) of the shadows, with w read on the device
  // (_foreach_lerp_ has no form with a tensor weight that stays on the multi-tensor path: its .List form needs
  // weights shaped like the shadows). For w < 0.5 the host form's lerp computes s + w * (p - s) with one rounding
  // (a fused multiply-add) where this also rounds the product, so an update differs from it by at most one ulp
  // of the result; for w >= 0.5 lerp computes p - (p - s) * (1 - w), equal up to a few ulps.
  std::vector<std::pair<at::Device, at::ScalarType>> kinds;
  std::vector<std::vector<std::size_t>> members;
  for (std::size_t i = 0; i < pairs.averaged_shadow.size(); ++i) {
    const std::pair<at::Device, at::ScalarType> kind{pairs.averaged_shadow[i].device(),
                                                     pairs.averaged_shadow[i].scalar_type()};
    const auto position = static_cast<std::size_t>(std::find(kinds.begin(), kinds.end(), kind) - kinds.begin());
    if (position == kinds.size()) {
      kinds.push_back(kind);
      members.emplace_back();
    }
    members[position].push_back(i);
  }
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    std::vector<at::Tensor> shadow_part, source_part;
    for (std::size_t i : members[k]) {
      shadow_part.push_back(pairs.averaged_shadow[i]);
      source_part.push_back(pairs.averaged_sources[i]);
    }
    // The multi-tensor multiply takes a 0-dim weight of the shadows' dtype on their device.
    const at::Tensor weight =
        one_minus_decay.reshape({}).to(kinds[k].first, kinds[k].second, /*non_blocking=*/!kinds[k].first.is_cpu());
    std::vector<at::Tensor> differences = at::_foreach_sub(shadow_part, source_part);
    at::_foreach_mul_(differences, weight);
    at::_foreach_sub_(shadow_part, differences);
  }
  copy_unaveraged(pairs, shadow_buffers, buffers);
}

Ema::Ema(std::vector<at::Tensor> parameters, std::vector<at::Tensor> buffers, EmaOptions options)
    : params_(std::move(parameters)), buffers_(std::move(buffers)), options_(options) {
  validate(options_);
  at::NoGradGuard no_grad;
  std::vector<at::ScalarType> dtypes;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& param = params_[i];
    if (!param.defined()) throw std::invalid_argument(fmt::format("ema: parameter {} is undefined", i));
    if (!at::isFloatingType(param.scalar_type())) {
      throw std::invalid_argument(fmt::format("ema: parameter {} has dtype {}; parameters must be floating point", i,
                                              core::dtype_name(param.scalar_type())));
    }
    dtypes.push_back(shadow_dtype(param.scalar_type()));
  }
  std::vector<at::ScalarType> buffer_dtypes;
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    if (!buffers_[i].defined()) throw std::invalid_argument(fmt::format("ema: buffer {} is undefined", i));
    buffer_dtypes.push_back(buffers_[i].scalar_type());
  }
  std::vector<at::Tensor> detached_params, detached_buffers;
  for (const at::Tensor& param : params_) detached_params.push_back(param.detach());
  for (const at::Tensor& buffer : buffers_) detached_buffers.push_back(buffer.detach());
  shadow_ = converted_copies(detached_params, dtypes);
  shadow_buffers_ = converted_copies(detached_buffers, buffer_dtypes);
}

double Ema::current_decay(std::int64_t step) const {
  const std::int64_t s = std::max<std::int64_t>(0, step - options_.update_after_step - 1);
  if (s <= 0) return 0.0;
  double value =
      options_.warmup ? 1 - std::pow(1 + static_cast<double>(s) / options_.inv_gamma, -options_.power) : options_.decay;
  value = std::min(value, options_.decay);
  return std::max(value, options_.min_decay);
}

bool Ema::due(std::int64_t step) const { return step >= 1 && step % options_.update_every == 0; }

void Ema::update(std::int64_t step) {
  if (step < 1) throw std::invalid_argument(fmt::format("ema: update needs an optimizer step >= 1, got {}", step));
  if (!due(step)) return;
  ema_update(shadow_, params_, shadow_buffers_, buffers_, current_decay(step));
  ++update_count_;
  last_update_step_ = step;
}

void Ema::update(std::int64_t step, const at::Tensor& one_minus_decay) {
  if (step < 1) throw std::invalid_argument(fmt::format("ema: update needs an optimizer step >= 1, got {}", step));
  check_update_weight(one_minus_decay);
  if (!due(step)) return;
  // Decay 0 (known from the step): the host form, whose lerp with weight 1 is an exact copy of the weights
  // (s - 1 * (s - p) need not be).
  if (current_decay(step) == 0) {
    ema_update(shadow_, params_, shadow_buffers_, buffers_, 0.0);
  } else {
    ema_update(shadow_, params_, shadow_buffers_, buffers_, one_minus_decay);
  }
  ++update_count_;
  last_update_step_ = step;
}

void Ema::count_replayed_update(std::int64_t step) {
  if (!due(step)) return;
  ++update_count_;
  last_update_step_ = step;
}

void Ema::copy_to(std::vector<at::Tensor> params, std::vector<at::Tensor> buffers) const {
  if (params.size() != shadow_.size()) {
    throw std::invalid_argument(
        fmt::format("ema: copy_to got {} parameters, the EMA has {}", params.size(), shadow_.size()));
  }
  if (!buffers.empty() && buffers.size() != shadow_buffers_.size()) {
    throw std::invalid_argument(
        fmt::format("ema: copy_to got {} buffers, the EMA has {}", buffers.size(), shadow_buffers_.size()));
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined() || params[i].sizes() != shadow_[i].sizes()) {
      throw std::invalid_argument(fmt::format("ema: copy_to parameter {} has shape {}, the shadow has {}", i,
                                              params[i].defined() ? core::shape_text(params[i].sizes()) : "(undefined)",
                                              core::shape_text(shadow_[i].sizes())));
    }
  }
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (!buffers[i].defined() || buffers[i].sizes() != shadow_buffers_[i].sizes()) {
      throw std::invalid_argument(
          fmt::format("ema: copy_to buffer {} has shape {}, the shadow has {}", i,
                      buffers[i].defined() ? core::shape_text(buffers[i].sizes()) : "(undefined)",
                      core::shape_text(shadow_buffers_[i].sizes())));
    }
  }
  at::NoGradGuard no_grad;
  if (!params.empty()) at::_foreach_copy_(params, shadow_);
  if (!buffers.empty()) at::_foreach_copy_(buffers, shadow_buffers_);
}

std::vector<std::pair<std::string, at::Tensor>> Ema::state_tensors() const {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (std::size_t i = 0; i < shadow_.size(); ++i) tensors.emplace_back(fmt::format("param{}", i), shadow_[i]);
  for (std::size_t i = 0; i < shadow_buffers_.size(); ++i) {
    tensors.emplace_back(fmt::format("buffer{}", i), shadow_buffers_[i]);
  }
  return tensors;
}

void Ema::load_state_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::map<std::string, const at::Tensor*> expected;  // name -> shadow tensor
  for (std::size_t i = 0; i < shadow_.size(); ++i) expected[fmt::format("param{}", i)] = &shadow_[i];
  for (std::size_t i = 0; i < shadow_buffers_.size(); ++i) expected[fmt::format("buffer{}", i)] = &shadow_buffers_[i];
  std::map<std::string, at::Tensor> loaded;
  for (const auto& [name, tensor] : tensors) {
    const auto found = expected.find(name);
    if (found == expected.end()) {
      throw std::invalid_argument(
          fmt::format("{}unexpected tensor name '{}' (expected param<I> for I < {} and buffer<I> for I < {})",
                      kStateError, name, shadow_.size(), shadow_buffers_.size()));
    }
    if (loaded.count(name)) throw std::invalid_argument(fmt::format("{}duplicate tensor '{}'", kStateError, name));
    if (!tensor.defined()) throw std::invalid_argument(fmt::format("{}'{}' is an undefined tensor", kStateError, name));
    const at::Tensor& target = *found->second;
    if (tensor.sizes() != target.sizes()) {
      throw std::invalid_argument(fmt::format("{}'{}' has shape {}, expected {}", kStateError, name,
                                              core::shape_text(tensor.sizes()), core::shape_text(target.sizes())));
    }
    if (tensor.scalar_type() != target.scalar_type()) {
      throw std::invalid_argument(fmt::format("{}'{}' has dtype {}, expected {}", kStateError, name,
                                              core::dtype_name(tensor.scalar_type()),
                                              core::dtype_name(target.scalar_type())));
    }
    loaded.emplace(name, tensor);
  }
  std::vector<std::string> missing;
  for (const auto& [name, target] : expected) {
    if (!loaded.count(name)) missing.push_back(name);
  }
  if (!missing.empty()) {
    throw std::invalid_argument(fmt::format("{}missing {}", kStateError, fmt::join(missing, ", ")));
  }
  std::vector<at::Tensor> targets, sources;
  for (const auto& [name, target] : expected) {
    targets.push_back(*target);
    sources.push_back(loaded.at(name));
  }
  at::NoGradGuard no_grad;
  if (!targets.empty()) at::_foreach_copy_(targets, sources);
}

nlohmann::json Ema::hyperparameters() const {
  return {{"decay", options_.decay},
          {"min_decay", options_.min_decay},
          {"update_after_step", options_.update_after_step},
          {"warmup", options_.warmup},
          {"inv_gamma", options_.inv_gamma},
          {"warmup_power", options_.power},
          {"update_every", options_.update_every},
          {"update_count", update_count_},
          {"last_update_step", last_update_step_},
          {"params", shadow_.size()},
          {"buffers", shadow_buffers_.size()}};
}

void Ema::load_hyperparameters(const nlohmann::json& hyperparameters) {
  if (!hyperparameters.is_object()) throw std::invalid_argument(fmt::format("{}expected a JSON object", kHyperError));
  const auto number = [&](const char* key) {
    const auto found = hyperparameters.find(key);
    if (found == hyperparameters.end() || !found->is_number()) {
      throw std::invalid_argument(fmt::format("{}missing or non-numeric '{}'", kHyperError, key));
    }
    return found->get<double>();
  };
  const auto integer = [&](const char* key) {
    const auto found = hyperparameters.find(key);
    if (found == hyperparameters.end() || !found->is_number_integer()) {
      throw std::invalid_argument(fmt::format("{}missing or non-integer '{}'", kHyperError, key));
    }
    return found->get<std::int64_t>();
  };
  const auto warmup = hyperparameters.find("warmup");
  if (warmup == hyperparameters.end() || !warmup->is_boolean()) {
    throw std::invalid_argument(fmt::format("{}missing or non-boolean 'warmup'", kHyperError));
  }
  if (integer("params") != static_cast<std::int64_t>(shadow_.size())) {
    throw std::invalid_argument(
        fmt::format("{}{} parameters, this EMA has {}", kHyperError, integer("params"), shadow_.size()));
  }
  if (integer("buffers") != static_cast<std::int64_t>(shadow_buffers_.size())) {
    throw std::invalid_argument(
        fmt::format("{}{} buffers, this EMA has {}", kHyperError, integer("buffers"), shadow_buffers_.size()));
  }
  EmaOptions options;
  options.decay = number("decay");
  options.min_decay = number("min_decay");
  options.update_after_step = integer("update_after_step");
  options.warmup = warmup->get<bool>();
  options.inv_gamma = number("inv_gamma");
  options.power = number("warmup_power");
  options.update_every = integer("update_every");
  const std::int64_t update_count = integer("update_count");
  const std::int64_t last_update_step = integer("last_update_step");
  try {
    validate(options);
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument(kHyperError + std::string(error.what()));
  }
  if (update_count < 0 || last_update_step < 0) {
    throw std::invalid_argument(fmt::format("{}negative update_count or last_update_step", kHyperError));
  }
  options_ = options;
  update_count_ = update_count;
  last_update_step_ = last_update_step;
}

}  // namespace runner::train
