// Sharded data parallel: the row split, the groups, and the reduce-scatter and all-gather of a step.
#include "runtime/dist/parameter_shards.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <stdexcept>

namespace runner::dist {
namespace {

// The name of the group a parameter belongs to: its name up to the first numbered part ("blocks.3"), or "" (the
// root group) when no part is a number.
std::string group_of(const std::string& name) {
  std::size_t start = 0;
  while (start < name.size()) {
    std::size_t end = name.find('.', start);
    if (end == std::string::npos) end = name.size();
    const bool number =
        end > start && end < name.size() &&
        std::all_of(name.begin() + static_cast<std::ptrdiff_t>(start), name.begin() + static_cast<std::ptrdiff_t>(end),
                    [](unsigned char c) { return std::isdigit(c) != 0; });
    if (number) return name.substr(0, end);
    start = end + 1;
  }
  return std::string();
}

std::int64_t rows_in(const at::Tensor& tensor) { return tensor.dim() == 0 ? 1 : tensor.size(0); }

// The tensor as [rows, row_numel].
at::Tensor as_rows(const at::Tensor& tensor) {
  const std::int64_t rows = rows_in(tensor);
  return tensor.reshape({rows, rows == 0 ? 0 : tensor.numel() / rows});
}

}  // namespace

ShardMode parse_shard_mode(const std::string& name) {
  if (name == "none") return ShardMode::none;
  if (name == "optimizer") return ShardMode::optimizer;
  if (name == "gradients") return ShardMode::gradients;
  throw std::invalid_argument(
      fmt::format("shard must be \"none\", \"optimizer\" (ZeRO-1) or \"gradients\" (ZeRO-2), got \"{}\"", name));
}

std::string shard_mode_name(ShardMode mode) {
  switch (mode) {
    case ShardMode::none:
      return "none";
    case ShardMode::optimizer:
      return "optimizer";
    case ShardMode::gradients:
      return "gradients";
  }
  return "none";
}

RowRange shard_rows(std::int64_t rows, int rank, int ranks) {
  const std::int64_t chunk = (rows + ranks - 1) / ranks;
  const std::int64_t begin = std::min(rows, chunk * rank);
  return RowRange{begin, std::min(rows, begin + chunk)};
}

at::Tensor rows_of(const at::Tensor& tensor, RowRange range) {
  if (tensor.dim() == 0) return tensor.reshape({1}).narrow(0, range.begin, range.size());
  return tensor.narrow(0, range.begin, range.size());
}

ParameterShards::ParameterShards(ProcessGroup& group, std::vector<std::pair<std::string, at::Tensor>> parameters,
                                 ShardMode mode)
    : group_(group), mode_(mode) {
  if (mode == ShardMode::none) throw std::invalid_argument("ParameterShards: shard mode none shards nothing");
  const int ranks = group_.size();
  std::map<std::string, std::size_t> group_index;
  for (auto& [name, tensor] : parameters) {
    Parameter p;
    p.name = name;
    p.full = tensor;
    const std::int64_t rows = rows_in(tensor);
    p.rows = shard_rows(rows, group_.rank(), ranks);
    p.row_numel = rows == 0 ? 0 : tensor.numel() / rows;
    p.padded_rows = (rows + ranks - 1) / ranks;
    const std::string key = group_of(name);
    auto [it, added] = group_index.emplace(key, groups_.size());
    if (added) groups_.push_back(Group{key, {}, 0, {}});
    Group& g = groups_[it->second];
    if (!g.parameters.empty()) {
      const at::Tensor& first = parameters_[g.parameters.front()].full;
      if (first.scalar_type() != tensor.scalar_type() || first.device() != tensor.device())
        throw std::invalid_argument(fmt::format(
            "sharded data parallel: the parameters of group '{}' must share a dtype and device ('{}' is {} on {}, "
            "'{}' {} on {})",
            key, parameters_[g.parameters.front()].name, c10::toString(first.scalar_type()), first.device().str(), name,
            c10::toString(tensor.scalar_type()), tensor.device().str()));
    }
    p.group = it->second;
    p.offset = g.slice_numel;
    g.slice_numel += p.padded_rows * p.row_numel;
    g.parameters.push_back(parameters_.size());
    parameters_.push_back(std::move(p));
  }
  for (Group& g : groups_) {
    const at::Tensor& first = parameters_[g.parameters.front()].full;
    g.options = first.options().requires_grad(false);
    // gradients: the rank's averaged gradients live here; optimizer: in the full gradients' rows (below).
    if (mode_ == ShardMode::gradients) g.gradient_share = at::zeros({g.slice_numel}, g.options);
  }
  for (Parameter& p : parameters_) {
    if (mode_ == ShardMode::optimizer) p.full.mutable_grad() = at::zeros_like(p.full).detach();
    // It requires grad as the parameter does (the EMA averages what trains and copies the rest); nothing
    // differentiates through it: the trainer fills its .grad.
    at::Tensor share = rows_of(p.full.detach(), p.rows).requires_grad_(p.full.requires_grad());
    const Group& g = groups_[p.group];
    share.mutable_grad() = mode_ == ShardMode::gradients ? g.gradient_share.narrow(0, p.offset, p.rows.size() * p.row_numel)
                                                               .view(share.sizes())
                                                         : rows_of(p.full.grad(), p.rows);
    local_.push_back(share);
  }
}

void ParameterShards::start_step() {
  at::NoGradGuard no_grad;
  for (Parameter& p : parameters_) {
    at::Tensor& grad = p.full.mutable_grad();
    if (!grad.defined()) continue;
    if (mode_ == ShardMode::optimizer)
      grad.zero_();
    else
      grad = at::Tensor();
  }
}

void ParameterShards::reduce_gradients() {
  at::NoGradGuard no_grad;
  const int ranks = group_.size();
  const double scale = 1.0 / static_cast<double>(ranks);
  for (Group& g : groups_) {
    // Rank-major: slice r holds rank r's rows of every parameter of the group, each padded to its slot.
    at::Tensor input = at::zeros({ranks, g.slice_numel}, g.options);
    for (std::size_t index : g.parameters) {
      const Parameter& p = parameters_[index];
      const at::Tensor& grad = p.full.grad();
      if (!grad.defined() || p.row_numel == 0) continue;
      const at::Tensor rows = as_rows(grad);
      for (int r = 0; r < ranks; ++r) {
        const RowRange range = shard_rows(rows.size(0), r, ranks);
        if (range.size() == 0) continue;
        input[r]
            .narrow(0, p.offset, range.size() * p.row_numel)
            .view({range.size(), p.row_numel})
            .copy_(rows.narrow(0, range.begin, range.size()));
      }
    }
    at::Tensor reduced = mode_ == ShardMode::gradients ? g.gradient_share : at::empty({g.slice_numel}, g.options);
    group_.reduce_scatter_into(reduced, input, fmt::format("gradient reduce_scatter of '{}'", g.name));
    reduced.mul_(scale);
    if (mode_ == ShardMode::optimizer)
      for (std::size_t index : g.parameters) {  // into this rank's rows of the full gradient, which the share views
        Parameter& p = parameters_[index];
        at::Tensor& grad = p.full.mutable_grad();
        if (!grad.defined()) grad = at::zeros_like(p.full).detach();
        at::Tensor rows = rows_of(grad, p.rows);
        rows.copy_(reduced.narrow(0, p.offset, p.rows.size() * p.row_numel).view(rows.sizes()));
        local_[index].mutable_grad() = rows;
      }
  }
  if (mode_ == ShardMode::gradients)
    for (Parameter& p : parameters_) p.full.mutable_grad() = at::Tensor();
}

void ParameterShards::gather_parameters() {
  at::NoGradGuard no_grad;
  const int ranks = group_.size();
  for (Group& g : groups_) {
    const at::TensorOptions& options = g.options;
    at::Tensor mine = at::zeros({g.slice_numel}, options);
    for (std::size_t index : g.parameters) {
      const Parameter& p = parameters_[index];
      if (p.rows.size() > 0 && p.row_numel > 0)
        mine.narrow(0, p.offset, p.rows.size() * p.row_numel).copy_(local_[index].reshape({-1}));
    }
    at::Tensor all = at::empty({ranks * g.slice_numel}, options);
    group_.all_gather_into(all, mine, fmt::format("parameter all_gather of '{}'", g.name));
    const at::Tensor slices = all.view({ranks, g.slice_numel});
    for (std::size_t index : g.parameters) {
      const Parameter& p = parameters_[index];
      if (p.row_numel == 0) continue;
      at::Tensor target = p.full.detach();
      at::Tensor rows = as_rows(target.is_contiguous() ? target : target.contiguous());
      for (int r = 0; r < ranks; ++r) {
        if (r == group_.rank()) continue;  // updated in place
        const RowRange range = shard_rows(rows.size(0), r, ranks);
        if (range.size() == 0) continue;
        rows.narrow(0, range.begin, range.size())
            .copy_(slices[r].narrow(0, p.offset, range.size() * p.row_numel).view({range.size(), p.row_numel}));
      }
      if (!target.is_contiguous()) target.copy_(rows.view(target.sizes()));
    }
  }
}

at::Tensor ParameterShards::gather_one(std::size_t parameter, const at::Tensor& share, const std::string& what) {
  at::NoGradGuard no_grad;
  const Parameter& p = parameters_.at(parameter);
  const int ranks = group_.size();
  at::Tensor mine = at::zeros({p.padded_rows * p.row_numel}, share.options());
  if (p.rows.size() > 0 && p.row_numel > 0) mine.narrow(0, 0, p.rows.size() * p.row_numel).copy_(share.reshape({-1}));
  at::Tensor all = at::empty({ranks * p.padded_rows * p.row_numel}, share.options());
  group_.all_gather_into(all, mine, what);
  return all.view({ranks * p.padded_rows, p.row_numel}).narrow(0, 0, rows_in(p.full)).reshape(p.full.sizes()).clone();
}

at::Tensor ParameterShards::sum(const at::Tensor& scalar) {
  std::vector<at::Tensor> one{scalar.detach().reshape({1}).clone()};
  group_.all_reduce(one, ReduceOp::sum);
  return one[0].reshape({});
}

at::Tensor ParameterShards::mean(const at::Tensor& scalar) {
  std::vector<at::Tensor> one{scalar.detach().reshape({1}).clone()};
  group_.all_reduce(one, ReduceOp::mean);
  return one[0].reshape({});
}

std::int64_t ParameterShards::parameter_bytes() const {
  std::int64_t bytes = 0;
  for (const Parameter& p : parameters_) bytes += p.full.numel() * static_cast<std::int64_t>(p.full.element_size());
  return bytes;
}

std::int64_t ParameterShards::gradient_bytes() const {
  std::int64_t bytes = 0;
  if (mode_ == ShardMode::gradients)
    for (const Group& g : groups_) bytes += g.slice_numel * static_cast<std::int64_t>(g.gradient_share.element_size());
  else
    for (const Parameter& p : parameters_) bytes += p.full.numel() * static_cast<std::int64_t>(p.full.element_size());
  return bytes;
}

void check_ranks_agree(ProcessGroup& group, const std::vector<at::Tensor>& tensors, std::int64_t step) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> sums;
  for (const at::Tensor& p : tensors) sums.push_back(p.detach().sum(at::kDouble));
  const at::Tensor checksum = sums.empty() ? at::zeros({1}, at::kDouble) : at::stack(sums).sum().reshape({1});
  std::vector<at::Tensor> high{checksum.clone()}, low{checksum.clone()};
  group.all_reduce(high, ReduceOp::max);
  group.all_reduce(low, ReduceOp::min);
  const double mine = checksum.item<double>(), top = high[0].item<double>(), bottom = low[0].item<double>();
  if (top != bottom)
    throw std::runtime_error(fmt::format(
        "the ranks' weights differ after step {} (parameter checksums from {:.17g} to {:.17g}; rank {} has {:.17g}): "
        "something made a rank train differently (a rank-dependent model change, or a step skipped on one rank)",
        step, bottom, top, group.rank(), mine));
}

}  // namespace runner::dist
