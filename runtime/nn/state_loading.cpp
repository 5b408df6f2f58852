// Strict, by-name copying of stored tensors into a module's parameters and buffers.
#include "runtime/nn/state_loading.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <set>
#include <stdexcept>

#include "runtime/core/shape_text.h"

namespace runner::nn {

void load_state(torch::nn::Module& module, const std::vector<ckpt::NamedTensor>& tensors, const std::string& origin,
                const std::string& model, const StateLoadOptions& options) {
  std::map<std::string, at::Tensor> targets;
  for (const auto& item : module.named_parameters(true)) targets.emplace(item.key(), item.value());
  for (const auto& item : module.named_buffers(true)) targets.emplace(item.key(), item.value());
  std::set<std::string> loaded;
  std::vector<std::string> unexpected, mismatched;
  at::NoGradGuard no_grad;
  for (const auto& [stored_name, stored] : tensors) {
    const std::string name = options.rename ? options.rename(stored_name) : stored_name;
    const auto target = targets.find(name);
    if (target == targets.end()) {
      unexpected.push_back(stored_name);
      continue;
    }
    at::Tensor source = stored;
    if (options.squeeze_1x1 && source.dim() == 4 && target->second.dim() == 2 && source.size(2) == 1 && source.size(3) == 1)
      source = source.flatten(1);
    if (!source.sizes().equals(target->second.sizes())) {
      mismatched.push_back(fmt::format("{} is {} in the file, {} in the model", stored_name, core::shape_text(source.sizes()),
                                       core::shape_text(target->second.sizes())));
      continue;
    }
    target->second.copy_(source);
    loaded.insert(name);
  }
  std::vector<std::string> missing;
  for (const auto& [name, tensor] : targets)
    if (!loaded.count(name) && !(options.optional && options.optional(name))) missing.push_back(name);
  if (missing.empty() && unexpected.empty() && mismatched.empty()) return;
  auto list = [](const std::vector<std::string>& names) {
    return names.size() <= 6 ? fmt::format("{}", fmt::join(names, ", "))
                             : fmt::format("{}, ... ({} in all)", fmt::join(names.begin(), names.begin() + 6, ", "), names.size());
  };
  std::string message = fmt::format("{}: the weights do not fit {}", origin, model);
  if (!mismatched.empty()) message += "; shapes differ: " + list(mismatched);
  if (!missing.empty()) message += "; missing: " + list(missing);
  if (!unexpected.empty()) message += "; not in the model: " + list(unexpected);
  throw std::invalid_argument(message);
}

}  // namespace runner::nn
