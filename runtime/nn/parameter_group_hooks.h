// The points where a built-in model's forward uses each group of its parameters (a numbered child: "blocks.3",
// "down.1"), for sharded data parallel over the weights, which holds a group's whole weights only between them.
#pragma once

#include <ATen/core/Tensor.h>
#include <fmt/format.h>

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace runner::nn {

class ParameterGroupHooks {
 public:
  virtual ~ParameterGroupHooks() = default;
  // The group's parameters are read from here...
  virtual void before_forward(const std::string& group) = 0;
  // ...to here. `outputs`: the tensors through which the backward enters the group (the group's parameters are read
  // again from when a gradient reaches one of them until the group's backward is done).
  virtual void after_forward(const std::string& group, const std::vector<at::Tensor>& outputs) = 0;
};

// A model whose forward brackets the use of each of its parameter groups with the hooks (none set: nothing happens).
class GroupedForward {
 public:
  virtual ~GroupedForward() = default;
  // The groups it brackets, by state-dict prefix ("blocks.0", ...); its other parameters are read anywhere.
  virtual std::vector<std::string> parameter_groups() const = 0;
  void set_parameter_group_hooks(std::shared_ptr<ParameterGroupHooks> hooks) { hooks_ = std::move(hooks); }
  bool has_parameter_group_hooks() const { return hooks_ != nullptr; }

 protected:
  // Group "<prefix>.<index>" ("blocks.3"): its name is made only when hooks are set (not on every forward).
  void before_group(const char* prefix, std::size_t index) const {
    if (hooks_) hooks_->before_forward(fmt::format("{}.{}", prefix, index));
  }
  void after_group(const char* prefix, std::size_t index, const std::vector<at::Tensor>& outputs) const {
    if (hooks_) hooks_->after_forward(fmt::format("{}.{}", prefix, index), outputs);
  }

 private:
  std::shared_ptr<ParameterGroupHooks> hooks_;
};

}  // namespace runner::nn
