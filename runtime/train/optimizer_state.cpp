// The optimizer's state and hyperparameters as checkpoints store them: the state tensors by name, the
// hyperparameters as JSON, each read back with every check made before anything changes.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include "runtime/core/dtype.h"
#include "runtime/core/shape_text.h"
#include "runtime/train/optimizer.h"

namespace runner::train {
namespace {

constexpr const char* kStateError = "optimizer state: ";
constexpr const char* kHyperError = "optimizer hyperparameters: ";

// The state entries a group keeps, in state_tensors() order.
std::vector<std::string> entries_of(OptimizerKind kind, const ParamGroup& group) {
  if (kind == OptimizerKind::sgd) {
    if (group.momentum == 0) return {};
    return {"momentum_buffer"};
  }
  if (group.amsgrad) return {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return {"step", "exp_avg", "exp_avg_sq"};
}

// Parses "group<G>.param<P>.<entry>" with canonical decimal indices; false if the text has another form.
bool parse_state_name(const std::string& name, std::size_t& group, std::size_t& param, std::string& entry) {
  const auto number = [](const std::string& text, std::size_t& value) {
    if (text.empty() || text.size() > 9 ||
        !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return false;
    }
    if (text.size() > 1 && text[0] == '0') return false;
    value = std::stoul(text);
    return true;
  };
  if (name.rfind("group", 0) != 0) return false;
  const std::size_t dot1 = name.find('.');
  if (dot1 == std::string::npos || name.compare(dot1 + 1, 5, "param") != 0) return false;
  const std::size_t dot2 = name.find('.', dot1 + 1);
  if (dot2 == std::string::npos) return false;
  entry = name.substr(dot2 + 1);
  return number(name.substr(5, dot1 - 5), group) && number(name.substr(dot1 + 6, dot2 - dot1 - 6), param) &&
         !entry.empty();
}

double json_number(const nlohmann::json& object, const char* key, const std::string& where) {
  const auto found = object.find(key);
  if (found == object.end() || !found->is_number()) {
    throw std::invalid_argument(fmt::format("{}missing or non-numeric '{}' in {}", kHyperError, key, where));
  }
  return found->get<double>();
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> Optimizer::state_tensors() const {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (std::size_t g = 0; g < state_.size(); ++g) {
    for (std::size_t p = 0; p < state_[g].size(); ++p) {
      const ParamState& state = state_[g][p];
      const std::string prefix = fmt::format("group{}.param{}.", g, p);
      if (kind_ == OptimizerKind::sgd) {
        if (state.momentum_buffer.defined()) tensors.emplace_back(prefix + "momentum_buffer", state.momentum_buffer);
      } else if (state.step.defined()) {
        tensors.emplace_back(prefix + "step", state.step);
        tensors.emplace_back(prefix + "exp_avg", state.exp_avg);
        tensors.emplace_back(prefix + "exp_avg_sq", state.exp_avg_sq);
        if (state.max_exp_avg_sq.defined()) tensors.emplace_back(prefix + "max_exp_avg_sq", state.max_exp_avg_sq);
      }
    }
  }
  return tensors;
}

void Optimizer::load_state_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  // (group, param) -> entry -> tensor; everything is checked before the state changes.
  std::map<std::pair<std::size_t, std::size_t>, std::map<std::string, at::Tensor>> loaded;
  std::set<std::string> names;
  for (const auto& [name, tensor] : tensors) {
    if (!names.insert(name).second)
      throw std::invalid_argument(fmt::format("{}duplicate tensor '{}'", kStateError, name));
    std::size_t g = 0, p = 0;
    std::string entry;
    const bool parsed = parse_state_name(name, g, p, entry);
    if (parsed && g >= groups_.size()) {
      throw std::invalid_argument(
          fmt::format("{}'{}' names group {} (group<G> counts from 0), but the optimizer has {} groups", kStateError,
                      name, g + 1, groups_.size()));
    }
    const std::vector<std::string> expected = parsed ? entries_of(kind_, groups_[g]) : std::vector<std::string>{};
    if (!parsed || std::find(expected.begin(), expected.end(), entry) == expected.end()) {
      if (parsed && kind_ == OptimizerKind::sgd && expected.empty() && entry == "momentum_buffer") {
        throw std::invalid_argument(fmt::format("{}'{}' is not expected: group {} has no momentum and keeps no state",
                                                kStateError, name, g + 1));
      }
      if (parsed && kind_ != OptimizerKind::sgd && entry == "max_exp_avg_sq") {
        throw std::invalid_argument(
            fmt::format("{}'{}' is not expected: group {} does not use amsgrad", kStateError, name, g + 1));
      }
      std::string entries = "momentum_buffer";
      if (kind_ != OptimizerKind::sgd) {
        const bool any_amsgrad =
            std::any_of(groups_.begin(), groups_.end(), [](const ParamGroup& group) { return group.amsgrad; });
        entries = any_amsgrad ? "step, exp_avg, exp_avg_sq or max_exp_avg_sq (amsgrad groups)"
                              : "step, exp_avg or exp_avg_sq";
      }
      throw std::invalid_argument(
          fmt::format("{}unexpected tensor name '{}' (expected group<G>.param<P>.<entry> with entry {})", kStateError,
                      name, entries));
    }
    if (p >= groups_[g].params.size()) {
      throw std::invalid_argument(fmt::format("{}'{}' names parameter {} of group {}, which has {} parameters",
                                              kStateError, name, p + 1, g + 1, groups_[g].params.size()));
    }
    if (!tensor.defined()) throw std::invalid_argument(fmt::format("{}'{}' is an undefined tensor", kStateError, name));
    const at::Tensor& param = groups_[g].params[p];
    const bool is_step = entry == "step";
    const at::ScalarType dtype = is_step ? at::kFloat : param.scalar_type();
    const std::vector<std::int64_t> shape = is_step ? std::vector<std::int64_t>{} : param.sizes().vec();
    if (tensor.sizes() != at::IntArrayRef(shape)) {
      throw std::invalid_argument(fmt::format("{}'{}' has shape {}, expected {}", kStateError, name,
                                              core::shape_text(tensor.sizes()), core::shape_text(shape)));
    }
    if (tensor.scalar_type() != dtype) {
      throw std::invalid_argument(fmt::format("{}'{}' has dtype {}, expected {}", kStateError, name,
                                              core::dtype_name(tensor.scalar_type()), core::dtype_name(dtype)));
    }
    loaded[{g, p}][entry] = tensor;
  }
  for (const auto& [key, entries] : loaded) {
    std::vector<std::string> missing;
    for (const std::string& entry : entries_of(kind_, groups_[key.first])) {
      if (!entries.count(entry)) missing.push_back(entry);
    }
    if (!missing.empty()) {
      throw std::invalid_argument(fmt::format("{}incomplete state for group{}.param{}: missing {}", kStateError,
                                              key.first, key.second, fmt::join(missing, ", ")));
    }
  }

  std::vector<std::vector<ParamState>> state;
  for (const ParamGroup& group : groups_) state.emplace_back(group.params.size());
  for (const auto& [key, entries] : loaded) {
    const at::Tensor& param = groups_[key.first].params[key.second];
    ParamState& target = state[key.first][key.second];
    const auto like_param = [&](const at::Tensor& source) {
      return at::empty_like(param, at::MemoryFormat::Preserve).copy_(source);
    };
    if (kind_ == OptimizerKind::sgd) {
      target.momentum_buffer = like_param(entries.at("momentum_buffer"));
      continue;
    }
    const at::Tensor& step = entries.at("step");
    target.step =
        at::empty({}, at::TensorOptions().dtype(at::kFloat).device(use_fused(param) ? param.device() : at::kCPU))
            .copy_(step);
    target.step_value = step.item<float>();
    target.exp_avg = like_param(entries.at("exp_avg"));
    target.exp_avg_sq = like_param(entries.at("exp_avg_sq"));
    if (groups_[key.first].amsgrad) target.max_exp_avg_sq = like_param(entries.at("max_exp_avg_sq"));
  }
  state_ = std::move(state);
}

nlohmann::json Optimizer::hyperparameters() const {
  nlohmann::json groups = nlohmann::json::array();
  for (const ParamGroup& group : groups_) {
    nlohmann::json entry = {{"params", group.params.size()}, {"lr", group.lr}, {"weight_decay", group.weight_decay}};
    if (kind_ == OptimizerKind::sgd) {
      entry["momentum"] = group.momentum;
      entry["dampening"] = group.dampening;
      entry["nesterov"] = group.nesterov;
    } else {
      entry["beta1"] = group.beta1;
      entry["beta2"] = group.beta2;
      entry["eps"] = group.eps;
      entry["amsgrad"] = group.amsgrad;
    }
    groups.push_back(std::move(entry));
  }
  return {{"kind", optimizer_kind_name(kind_)}, {"step_count", step_count_}, {"groups", std::move(groups)}};
}

void Optimizer::load_hyperparameters(const nlohmann::json& hyperparameters) {
  if (!hyperparameters.is_object()) throw std::invalid_argument(fmt::format("{}expected a JSON object", kHyperError));
  const auto kind = hyperparameters.find("kind");
  if (kind == hyperparameters.end() || !kind->is_string()) {
    throw std::invalid_argument(fmt::format("{}missing or non-string 'kind'", kHyperError));
  }
  if (kind->get<std::string>() != optimizer_kind_name(kind_)) {
    throw std::invalid_argument(fmt::format("{}kind is '{}', this optimizer is '{}'", kHyperError,
                                            kind->get<std::string>(), optimizer_kind_name(kind_)));
  }
  const auto step_count = hyperparameters.find("step_count");
  if (step_count == hyperparameters.end() || !step_count->is_number_integer() || step_count->get<std::int64_t>() < 0) {
    throw std::invalid_argument(fmt::format("{}missing or invalid 'step_count' (a non-negative integer)", kHyperError));
  }
  const auto groups = hyperparameters.find("groups");
  if (groups == hyperparameters.end() || !groups->is_array()) {
    throw std::invalid_argument(fmt::format("{}missing or non-array 'groups'", kHyperError));
  }
  if (groups->size() != groups_.size()) {
    throw std::invalid_argument(
        fmt::format("{}{} groups, this optimizer has {}", kHyperError, groups->size(), groups_.size()));
  }
  std::vector<ParamGroup> updated = groups_;
  for (std::size_t g = 0; g < updated.size(); ++g) {
    const nlohmann::json& entry = (*groups)[g];
    const std::string where = fmt::format("group {}", g + 1);
    if (!entry.is_object()) throw std::invalid_argument(fmt::format("{}{} is not an object", kHyperError, where));
    const auto params = entry.find("params");
    if (params == entry.end() || !params->is_number_integer() || params->get<std::int64_t>() < 0) {
      throw std::invalid_argument(fmt::format("{}missing or invalid 'params' in {}", kHyperError, where));
    }
    if (params->get<std::int64_t>() != static_cast<std::int64_t>(updated[g].params.size())) {
      throw std::invalid_argument(fmt::format("{}group {} has {} parameters, this optimizer's group {} has {}",
                                              kHyperError, g + 1, params->get<std::int64_t>(), g + 1,
                                              updated[g].params.size()));
    }
    ParamGroup& group = updated[g];
    group.lr = json_number(entry, "lr", where);
    group.weight_decay = json_number(entry, "weight_decay", where);
    if (kind_ == OptimizerKind::sgd) {
      group.momentum = json_number(entry, "momentum", where);
      group.dampening = json_number(entry, "dampening", where);
      const auto nesterov = entry.find("nesterov");
      if (nesterov == entry.end() || !nesterov->is_boolean()) {
        throw std::invalid_argument(fmt::format("{}missing or non-boolean 'nesterov' in {}", kHyperError, where));
      }
      group.nesterov = nesterov->get<bool>();
    } else {
      group.beta1 = json_number(entry, "beta1", where);
      group.beta2 = json_number(entry, "beta2", where);
      group.eps = json_number(entry, "eps", where);
      // Absent in hyperparameters saved before amsgrad existed: those groups ran without it.
      const auto amsgrad = entry.find("amsgrad");
      if (amsgrad != entry.end() && !amsgrad->is_boolean()) {
        throw std::invalid_argument(fmt::format("{}non-boolean 'amsgrad' in {}", kHyperError, where));
      }
      group.amsgrad = amsgrad != entry.end() && amsgrad->get<bool>();
      const bool has_state =
          std::any_of(state_[g].begin(), state_[g].end(), [](const ParamState& state) { return state.step.defined(); });
      if (group.amsgrad != groups_[g].amsgrad && has_state) {
        throw std::invalid_argument(fmt::format(
            "{}group {} has amsgrad {}, this optimizer's group {} has amsgrad {} and keeps state for its parameters",
            kHyperError, g + 1, group.amsgrad, g + 1, groups_[g].amsgrad));
      }
    }
    try {
      validate_param_group(kind_, group, g);
    } catch (const std::invalid_argument& error) {
      throw std::invalid_argument(kHyperError + std::string(error.what()));
    }
  }
  groups_ = std::move(updated);
  for (LrTensor& lr : lr_tensors_) lr = LrTensor{};
  step_count_ = step_count->get<std::int64_t>();
}

}  // namespace runner::train
