// Sharded data parallel: the row split, the groups, and the reduce-scatter and all-gather of a step.
#include "runtime/dist/parameter_shards.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <stdexcept>

#include "runtime/core/enum_table.h"

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

// A parameter's storage emptied (its shape kept) and given back bytes to fill: the tensors autograd saved of it
// share the storage, so they are released and restored with it.
void free_storage(const at::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, tensor.device()));
  storage->set_nbytes(0);
}

void allocate_storage(const at::Tensor& tensor, std::size_t nbytes) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  c10::Allocator* allocator = storage->allocator() ? storage->allocator() : c10::GetAllocator(tensor.device().type());
  storage->set_data_ptr_noswap(allocator->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

// A tensor over `tensor`'s storage with a version counter of its own: writing through it leaves the parameter's
// version as autograd saved it.
at::Tensor alias_of(const at::Tensor& tensor) {
  at::Tensor alias = at::empty({0}, tensor.options().requires_grad(false));
  alias.set_(tensor.storage(), tensor.storage_offset(), tensor.sizes(), tensor.strides());
  return alias;
}

}  // namespace

const core::EnumTable<ShardMode, 4> kShardModes{{{{ShardMode::none, "none"},
                                                  {ShardMode::optimizer, "optimizer", "ZeRO-1"},
                                                  {ShardMode::gradients, "gradients", "ZeRO-2"},
                                                  {ShardMode::weights, "weights", "ZeRO-3"}}},
                                                core::NameQuotes::double_,
                                                "shard must be {list}, got \"{got}\""};

ShardMode parse_shard_mode(const std::string& name) { return kShardModes.parse(name); }

std::string shard_mode_zero_name(ShardMode mode) { return std::string(kShardModes.note(mode)); }

std::string shard_mode_name(ShardMode mode) { return kShardModes.name(mode); }

const core::EnumTable<WeightGather, 2> kWeightGathers{{{{WeightGather::fp32, "fp32"}, {WeightGather::bf16, "bf16"}}},
                                                      core::NameQuotes::double_,
                                                      "shard_gather must be {list}, got \"{got}\""};

WeightGather parse_weight_gather(const std::string& name) { return kWeightGathers.parse(name); }

std::string weight_gather_name(WeightGather gather) { return kWeightGathers.name(gather); }

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
                                 ShardMode mode, ShardOptions options)
    : group_(group),
      mode_(mode),
      overlap_(options.overlap),
      gather_(options.gather),
      hooked_(parameters.size(), false) {
  if (mode == ShardMode::none) throw std::invalid_argument("ParameterShards: shard mode none shards nothing");
  if (!options.released.empty() && mode != ShardMode::weights)
    throw std::invalid_argument("ParameterShards: only shard mode weights releases groups");
  if (options.gather != WeightGather::fp32 && mode != ShardMode::weights)
    throw std::invalid_argument("ParameterShards: only shard mode weights gathers the weights in another dtype");
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
    p.storage_nbytes = tensor.storage().nbytes();
    p.offset = g.slice_numel;
    g.slice_numel += p.padded_rows * p.row_numel;
    g.parameters.push_back(parameters_.size());
    parameters_.push_back(std::move(p));
  }
  for (const std::string& name : options.released) {
    auto it = group_index.find(name);
    if (it != group_index.end()) groups_[it->second].released = true;  // a group without trainable parameters: none
  }
  std::map<const void*, std::size_t> storages;  // a released parameter must not share its storage
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const Parameter& p = parameters_[i];
    auto [it, added] = storages.emplace(p.full.storage().unsafeGetStorageImpl(), i);
    const Parameter& other = parameters_[it->second];
    if (!added && (groups_[p.group].released || groups_[other.group].released))
      throw std::invalid_argument(fmt::format(
          "sharded data parallel over the weights: '{}' and '{}' share their storage (tied weights), which a group's "
          "release would free for both",
          other.name, p.name));
  }
  for (Group& g : groups_) {
    const at::Tensor& first = parameters_[g.parameters.front()].full;
    g.options = first.options().requires_grad(false);
    // gradients, weights: the rank's averaged gradients live here; optimizer: in the full gradients' rows (below).
    if (mode_ != ShardMode::optimizer) g.gradient_share = at::zeros({g.slice_numel}, g.options);
    if (mode_ == ShardMode::weights) g.weight_share = at::zeros({g.slice_numel}, g.options);
  }
  for (Parameter& p : parameters_) {
    if (mode_ == ShardMode::optimizer) p.full.mutable_grad() = at::zeros_like(p.full).detach();
    const Group& g = groups_[p.group];
    // It requires grad as the parameter does (the EMA averages what trains and copies the rest); nothing
    // differentiates through it: the trainer fills its .grad. Weights mode: the group's buffer of the rank's rows.
    at::Tensor share = rows_of(p.full.detach(), p.rows);
    if (mode_ == ShardMode::weights) {
      at::Tensor rows = g.weight_share.narrow(0, p.offset, p.rows.size() * p.row_numel).view(share.sizes());
      rows.copy_(share);
      share = rows;
    }
    share.requires_grad_(p.full.requires_grad());
    share.mutable_grad() = mode_ != ShardMode::optimizer
                               ? g.gradient_share.narrow(0, p.offset, p.rows.size() * p.row_numel).view(share.sizes())
                               : rows_of(p.full.grad(), p.rows);
    local_.push_back(share);
  }
  for (std::size_t g = groups_.size(); g-- > 0;) order_.push_back(g);  // the backward reaches the last group first
  counted_backward_.assign(parameters_.size(), false);
  next_in_forward_.assign(groups_.size(), std::nullopt);
  previous_in_forward_.assign(groups_.size(), std::nullopt);
  for (std::size_t g = 0; g < groups_.size(); ++g)
    if (groups_[g].released) release(g);
  round_whole_weights();
  if (!overlap_ && mode_ != ShardMode::weights) return;  // weights mode counts gradients to release the groups
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    std::shared_ptr<torch::autograd::Node> accumulator = torch::autograd::impl::grad_accumulator(parameters_[i].full);
    if (!accumulator) continue;  // not a leaf that requires grad: counts as ready
    hook_keys_.push_back(accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          gradient_ready(i);
          return outputs;
        })));
    accumulators_.push_back(std::move(accumulator));
    hooked_[i] = true;
  }
}

ParameterShards::~ParameterShards() {
  for (std::size_t h = 0; h < accumulators_.size(); ++h) accumulators_[h]->del_post_hook(hook_keys_[h]);
  // A released parameter left behind gets an empty tensor: a read fails on its shape instead of reading freed memory.
  at::NoGradGuard no_grad;
  for (Parameter& p : parameters_)
    if (!groups_[p.group].whole) p.full.set_data(at::empty({0}, p.full.options().requires_grad(false)));
}

void ParameterShards::start_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = false;
  stepping_ = true;
  last_forward_.reset();
  for (auto& pending : pending_)  // a step whose backward failed may have left reduce-scatters running
    if (pending.work) pending.work->wait();
  pending_.clear();
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

void ParameterShards::expect_last_backward() {
  if (!overlap_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  arm();
}

void ParameterShards::arm() {
  armed_ = true;
  missing_.assign(groups_.size(), 0);
  for (std::size_t i = 0; i < parameters_.size(); ++i)
    if (hooked_[i]) ++missing_[parameters_[i].group];
  counted_.assign(parameters_.size(), false);
  next_ = 0;
  pending_.clear();
  pending_.resize(groups_.size());
}

void ParameterShards::gradient_ready(std::size_t parameter) {
  std::lock_guard<std::mutex> lock(mutex_);
  Group& group = groups_[parameters_[parameter].group];
  if (group.in_backward && !counted_backward_[parameter]) {  // weights mode: the group's backward may be done
    counted_backward_[parameter] = true;
    if (--group.backward_missing == 0) {
      group.in_backward = false;
      release(parameters_[parameter].group);
    }
  }
  if (!armed_ || counted_[parameter]) return;  // an earlier micro-batch, or a second use of the parameter
  counted_[parameter] = true;
  --missing_[parameters_[parameter].group];
  while (next_ < order_.size() && missing_[order_[next_]] == 0) start(order_[next_++]);
}

void ParameterShards::start(std::size_t group) {
  at::NoGradGuard no_grad;
  const int ranks = group_.size();
  Group& g = groups_[group];
  PendingGroup& pending = pending_[group];
  // Rank-major: slice r holds rank r's rows of every parameter of the group, each padded to its slot.
  pending.input = at::zeros({ranks, g.slice_numel}, g.options);
  for (std::size_t index : g.parameters) {
    Parameter& p = parameters_[index];
    const at::Tensor& grad = p.full.grad();
    if (!grad.defined() || p.row_numel == 0) continue;
    const at::Tensor rows = as_rows(grad);
    for (int r = 0; r < ranks; ++r) {
      const RowRange range = shard_rows(rows.size(0), r, ranks);
      if (range.size() == 0) continue;
      pending.input[r]
          .narrow(0, p.offset, range.size() * p.row_numel)
          .view({range.size(), p.row_numel})
          .copy_(rows.narrow(0, range.begin, range.size()));
    }
    if (mode_ != ShardMode::optimizer) p.full.mutable_grad() = at::Tensor();  // reduced from the copy: freed now
  }
  pending.reduced = mode_ != ShardMode::optimizer ? g.gradient_share : at::empty({g.slice_numel}, g.options);
  pending.work.emplace(group_.reduce_scatter_into_async(pending.reduced, pending.input,
                                                        fmt::format("gradient reduce_scatter of '{}'", g.name)));
}

void ParameterShards::reduce_gradients() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!armed_) arm();  // no hooks (overlap off) or expect_last_backward() not called: nothing started yet
  armed_ = false;
  stepping_ = false;  // the optimizer changes the weight shares next
  drop_prefetch();
  while (next_ < order_.size()) start(order_[next_++]);
  std::vector<PendingGroup> pending = std::move(pending_);
  pending_.clear();
  lock.unlock();
  at::NoGradGuard no_grad;
  const double scale = 1.0 / static_cast<double>(group_.size());
  for (std::size_t group : order_) {
    PendingGroup& done = pending[group];
    done.work->wait();
    done.input = at::Tensor();
    done.reduced.mul_(scale);
    if (mode_ != ShardMode::optimizer) continue;
    for (std::size_t index : groups_[group].parameters) {  // into this rank's rows of the full gradient
      Parameter& p = parameters_[index];
      at::Tensor& grad = p.full.mutable_grad();
      if (!grad.defined()) grad = at::zeros_like(p.full).detach();
      at::Tensor rows = rows_of(grad, p.rows);
      rows.copy_(done.reduced.narrow(0, p.offset, p.rows.size() * p.row_numel).view(rows.sizes()));
      local_[index].mutable_grad() = rows;
    }
  }
  if (mode_ != ShardMode::optimizer)  // a gradient accumulated after its group started (a parameter used twice)
    for (Parameter& p : parameters_) p.full.mutable_grad() = at::Tensor();
}

void ParameterShards::gather_parameters() {
  at::NoGradGuard no_grad;
  const int ranks = group_.size();
  std::vector<std::size_t> gathered;  // weights mode: the groups kept whole
  for (std::size_t group = 0; group < groups_.size(); ++group)
    if (!groups_[group].released) gathered.push_back(group);
  // At most two all-gathers in flight: the next group's runs while this one's rows are copied out.
  std::vector<PendingGroup> pending(groups_.size());
  auto start_gather = [&](std::size_t group) {
    const Group& g = groups_[group];
    if (mode_ == ShardMode::weights) {  // from the rows the optimizer stepped, in the gather dtype
      pending[group] = start_weight_gather(group);
      return;
    }
    pending[group].input = at::zeros({g.slice_numel}, g.options);
    for (std::size_t index : g.parameters) {
      const Parameter& p = parameters_[index];
      if (p.rows.size() > 0 && p.row_numel > 0)
        pending[group].input.narrow(0, p.offset, p.rows.size() * p.row_numel).copy_(local_[index].reshape({-1}));
    }
    pending[group].reduced = at::empty({ranks * g.slice_numel}, g.options);
    pending[group].work.emplace(group_.all_gather_into_async(pending[group].reduced, pending[group].input,
                                                             fmt::format("parameter all_gather of '{}'", g.name)));
  };
  if (!gathered.empty()) start_gather(gathered.front());
  for (std::size_t n = 0; n < gathered.size(); ++n) {
    const std::size_t group = gathered[n];
    if (n + 1 < gathered.size()) start_gather(gathered[n + 1]);
    pending[group].work->wait();
    pending[group].input = at::Tensor();
    copy_out(group, pending[group].reduced, /*own_rows=*/mode_ == ShardMode::weights);
    pending[group].reduced = at::Tensor();
  }
}

void ParameterShards::copy_out(std::size_t group, const at::Tensor& gathered, bool own_rows) {
  const int ranks = group_.size();
  const Group& g = groups_[group];
  const at::Tensor slices = gathered.view({ranks, g.slice_numel});
  for (std::size_t index : g.parameters) {
    const Parameter& p = parameters_[index];
    if (p.row_numel == 0) continue;
    at::Tensor target = alias_of(p.full);
    at::Tensor rows = as_rows(target.is_contiguous() ? target : target.contiguous());
    for (int r = 0; r < ranks; ++r) {
      if (r == group_.rank() && !own_rows) continue;  // updated in place
      const RowRange range = shard_rows(rows.size(0), r, ranks);
      if (range.size() == 0) continue;
      rows.narrow(0, range.begin, range.size())
          .copy_(slices[r].narrow(0, p.offset, range.size() * p.row_numel).view({range.size(), p.row_numel}));
    }
    if (!target.is_contiguous()) target.copy_(rows.view(target.sizes()));
  }
}

std::size_t ParameterShards::group_index(const std::string& name) const {
  for (std::size_t g = 0; g < groups_.size(); ++g)
    if (groups_[g].name == name) return g;
  return groups_.size();
}

ParameterShards::PendingGroup ParameterShards::start_weight_gather(std::size_t group) {
  at::NoGradGuard no_grad;
  const Group& g = groups_[group];
  PendingGroup pending;
  const at::ScalarType dtype = gather_ == WeightGather::bf16 ? at::kBFloat16 : g.weight_share.scalar_type();
  pending.input = g.weight_share.to(dtype);
  pending.reduced = at::empty({group_.size() * g.slice_numel}, g.options.dtype(dtype));
  pending.work.emplace(group_.all_gather_into_async(pending.reduced, pending.input,
                                                    fmt::format("parameter all_gather of '{}'", g.name)));
  return pending;
}

void ParameterShards::gather_whole(std::size_t group) {
  Group& g = groups_[group];
  if (g.whole) return;
  at::NoGradGuard no_grad;
  PendingGroup gather;
  if (prefetch_ && prefetch_->group == group) {
    gather = std::move(prefetch_->gather);
    prefetch_.reset();
    ++prefetched_gathers_;
  } else {
    gather = start_weight_gather(group);
  }
  gather.work->wait();
  for (std::size_t index : g.parameters) allocate_storage(parameters_[index].full, parameters_[index].storage_nbytes);
  copy_out(group, gather.reduced, /*own_rows=*/true);
  g.whole = true;
}

void ParameterShards::prefetch(std::optional<std::size_t> group) {
  if (!stepping_ || !group || !groups_[*group].released || groups_[*group].whole) return;
  if (prefetch_ && prefetch_->group == *group) return;
  drop_prefetch();
  prefetch_ = Prefetch{*group, start_weight_gather(*group)};
}

void ParameterShards::drop_prefetch() {
  if (prefetch_) prefetch_->gather.work->wait();
  prefetch_.reset();
}

void ParameterShards::release(std::size_t group) {
  Group& g = groups_[group];
  if (!g.released || !g.whole) return;
  for (std::size_t index : g.parameters) free_storage(parameters_[index].full);
  g.whole = false;
}

void ParameterShards::before_forward(const std::string& name) {
  const std::size_t group = group_index(name);
  if (group == groups_.size() || !groups_[group].released) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const bool recomputed = torch::autograd::get_current_graph_task_id() != -1;  // activation checkpointing's
  if (stepping_ && !recomputed && last_forward_) {
    next_in_forward_[*last_forward_] = group;
    previous_in_forward_[group] = *last_forward_;
  }
  gather_whole(group);
  prefetch(recomputed ? previous_in_forward_[group] : next_in_forward_[group]);
}

void ParameterShards::after_forward(const std::string& name, const std::vector<at::Tensor>& outputs) {
  const std::size_t group = group_index(name);
  if (group == groups_.size() || !groups_[group].released) return;
  if (at::GradMode::is_enabled())
    for (const at::Tensor& output : outputs)
      if (output.defined() && output.requires_grad())
        output.register_hook([this, group](const at::Tensor&) { gather_for_backward(group); });
  std::lock_guard<std::mutex> lock(mutex_);
  if (stepping_ && torch::autograd::get_current_graph_task_id() == -1) last_forward_ = group;
  groups_[group].in_backward = false;
  release(group);
}

void ParameterShards::gather_for_backward(std::size_t group) {
  std::lock_guard<std::mutex> lock(mutex_);
  Group& g = groups_[group];
  gather_whole(group);
  prefetch(previous_in_forward_[group]);
  if (g.in_backward) return;  // another output of the group reached it first
  g.in_backward = true;
  g.backward_missing = 0;
  for (std::size_t index : g.parameters) {
    counted_backward_[index] = false;
    if (hooked_[index]) ++g.backward_missing;
  }
  if (g.backward_missing == 0) g.in_backward = false;  // nothing to wait for: released at finish_backward
}

void ParameterShards::finish_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  last_forward_.reset();
  for (std::size_t group = 0; group < groups_.size(); ++group) {
    groups_[group].in_backward = false;
    release(group);
  }
}

void ParameterShards::round_whole_weights() const {
  if (mode_ != ShardMode::weights) return;
  at::NoGradGuard no_grad;
  for (const Parameter& p : parameters_)
    if (!groups_[p.group].released && gather_ == WeightGather::bf16) alias_of(p.full).copy_(p.full.to(at::kBFloat16));
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
  for (const Parameter& p : parameters_)
    if (!groups_[p.group].released) bytes += p.full.numel() * static_cast<std::int64_t>(p.full.element_size());
  for (const Group& g : groups_)
    if (g.weight_share.defined()) bytes += g.slice_numel * static_cast<std::int64_t>(g.weight_share.element_size());
  return bytes;
}

std::int64_t ParameterShards::gradient_bytes() const {
  std::int64_t bytes = 0;
  if (mode_ != ShardMode::optimizer)
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
