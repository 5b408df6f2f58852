// Strict, by-name copying of stored tensors into a module's parameters and buffers.
#include "runtime/nn/state_loading.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <set>
#include <stdexcept>

#include "runtime/core/shape_text.h"

namespace runner::nn {
namespace {

std::string name_list(const std::vector<std::string>& names) {
  return names.size() <= 6
             ? fmt::format("{}", fmt::join(names, ", "))
             : fmt::format("{}, ... ({} in all)", fmt::join(names.begin(), names.begin() + 6, ", "), names.size());
}

// The first six problems of a kind, then how many there are.
void add_problems(std::vector<std::string>& problems, const std::vector<std::string>& found) {
  for (std::size_t i = 0; i < found.size() && i < 6; ++i) problems.push_back(found[i]);
  if (found.size() > 6) problems.push_back(fmt::format("... ({} in all)", found.size()));
}

}  // namespace

std::vector<ckpt::NamedTensor> named_state(const torch::nn::Module& module) {
  std::vector<ckpt::NamedTensor> tensors;
  for (const auto& item : module.named_parameters(true)) tensors.push_back({item.key(), item.value()});
  for (const auto& item : module.named_buffers(true)) tensors.push_back({item.key(), item.value()});
  return tensors;
}

std::vector<StateCopy> match_state(const std::vector<ckpt::NamedTensor>& targets,
                                   const std::vector<ckpt::NamedTensor>& stored, const std::string& origin,
                                   const std::string& model, const StateLoadOptions& options) {
  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& target : targets) by_name.emplace(target.name, &target.tensor);
  std::map<std::string, at::Tensor> sources;  // by the module's name, those that fit
  std::set<std::string> present;              // every module name the state has, fitting or not
  std::vector<std::string> unexpected, mismatched;
  for (const auto& [stored_name, tensor] : stored) {
    const std::string name = options.rename ? options.rename(stored_name) : stored_name;
    const auto target = by_name.find(name);
    if (target == by_name.end()) {
      unexpected.push_back(stored_name);
      continue;
    }
    present.insert(name);
    at::Tensor source = tensor;
    const at::Tensor& into = *target->second;
    if (options.squeeze_1x1 && source.dim() == 4 && into.dim() == 2 && source.size(2) == 1 && source.size(3) == 1)
      source = source.flatten(1);
    if (!source.sizes().equals(into.sizes()))
      mismatched.push_back(fmt::format("shape mismatch for {}: state has {}, module has {}", stored_name,
                                       core::shape_text(source.sizes()), core::shape_text(into.sizes())));
    else if (options.same_dtype && source.scalar_type() != into.scalar_type())
      mismatched.push_back(fmt::format("dtype mismatch for {}: state has {}, module has {}", stored_name,
                                       c10::toString(source.scalar_type()), c10::toString(into.scalar_type())));
    else
      sources.emplace(name, source);
  }
  std::sort(unexpected.begin(), unexpected.end());
  std::vector<std::string> missing;
  std::vector<StateCopy> copies;
  for (const auto& target : targets) {
    const auto source = sources.find(target.name);
    if (source != sources.end())
      copies.push_back({target.tensor, source->second});
    else if (!present.count(target.name) && !(options.optional && options.optional(target.name)))
      missing.push_back(target.name);
  }
  std::vector<std::string> problems;
  if (options.strict && !missing.empty()) problems.push_back("missing keys: " + name_list(missing));
  add_problems(problems, mismatched);
  if (options.strict && !unexpected.empty()) problems.push_back("unexpected keys: " + name_list(unexpected));
  if (problems.empty()) return copies;
  throw std::invalid_argument(fmt::format(
      "{}: {}{}", origin, model.empty() ? "" : "the weights do not fit " + model + ": ", fmt::join(problems, "; ")));
}

void load_state(const std::vector<ckpt::NamedTensor>& targets, const std::vector<ckpt::NamedTensor>& stored,
                const std::string& origin, const std::string& model, const StateLoadOptions& options) {
  const std::vector<StateCopy> copies = match_state(targets, stored, origin, model, options);
  at::NoGradGuard no_grad;
  for (const auto& copy : copies) const_cast<at::Tensor&>(copy.target).copy_(copy.source);
}

void load_state(torch::nn::Module& module, const std::vector<ckpt::NamedTensor>& stored, const std::string& origin,
                const std::string& model, const StateLoadOptions& options) {
  load_state(named_state(module), stored, origin, model, options);
}

}  // namespace runner::nn
