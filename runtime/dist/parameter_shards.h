// Sharded data parallel (ZeRO-1, ZeRO-2 and ZeRO-3): each trainable parameter split by rows over the ranks as
// torch.chunk splits it, the optimizer state and the EMA kept for the rank's rows only, the gradients
// reduce-scattered to the rank that updates them, and the weights all-gathered back: after each step into every
// rank's full parameters, or (weights mode) group by group when the forward and the backward reach the group.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/dist/process_group.h"

namespace torch::autograd {
struct Node;
}

namespace runner::dist {

// What each rank keeps a share of. none: every rank holds everything (data parallel). optimizer (ZeRO-1): the
// optimizer state and the EMA; gradients (ZeRO-2): those and the averaged gradients, the full gradients freed as
// soon as they are reduced; weights (ZeRO-3, FSDP's full shard): those and the weights of the groups the model's
// forward brackets (nn/parameter_group_hooks.h), whole only from a group's forward to its end and from the backward
// reaching it until its gradients are in.
enum class ShardMode { none, optimizer, gradients, weights };
// "none", "optimizer", "gradients" or "weights"; std::invalid_argument listing them otherwise.
ShardMode parse_shard_mode(const std::string& name);
std::string shard_mode_name(ShardMode mode);
std::string shard_mode_zero_name(ShardMode mode);  // "ZeRO-1", "ZeRO-2", "ZeRO-3"; "" for none

// The dtype the weights are all-gathered in (weights mode). fp32: as the optimizer holds them, the numbers of
// unsharded training; bf16 (FSDP's param_dtype): half the bytes sent, and every forward and backward sees the
// weights rounded to bf16, while the optimizer and the EMA step the fp32 rows.
enum class WeightGather { fp32, bf16 };
// "fp32" or "bf16"; std::invalid_argument listing them otherwise.
WeightGather parse_weight_gather(const std::string& name);
std::string weight_gather_name(WeightGather gather);

// How ParameterShards runs its collectives.
struct ShardOptions {
  // A group's reduce-scatter starts during the backward of the step's last micro-batch, as soon as every parameter
  // of the group has its gradient (hooks on their gradient accumulators; groups start in reverse order on every
  // rank, a group waiting for the ones after it), and gradients mode frees the group's full gradients then.
  bool overlap = true;
  // Weights mode: the groups whose weights are released between their uses (their storage freed: the parameters
  // keep their shapes but must not be read until the group is gathered); every other group stays whole, updated
  // after each step as in the other modes.
  std::vector<std::string> released;
  WeightGather gather = WeightGather::fp32;  // weights mode
};

// Rows [begin, end) of a first dimension of `rows` that rank `rank` of `ranks` holds: torch.chunk's chunks of
// ceil(rows / ranks) rows, so the last ranks may hold fewer rows or none. A 0-dim tensor counts as one row.
struct RowRange {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
};
RowRange shard_rows(std::int64_t rows, int rank, int ranks);

// The rows of `tensor` that `range` names: a view (of a 0-dim tensor: shape [1] or [0]).
at::Tensor rows_of(const at::Tensor& tensor, RowRange range);

// Parameters are sharded in groups, one collective each: the parameters under one numbered child of the model
// (`blocks.3.*`, `down.1.*`: a DiT block, a UNet level) form a group, and the rest form the root group. In a group
// every rank's share of each parameter is padded to the first rank's size, so rank r's shares are slice r of one
// flat buffer of the group (the layout of the reduce-scatter's input and the all-gather's output).
class ParameterShards {
 public:
  // `parameters` (by state-dict name) in the same order on every rank, holding the same values (rank 0's).
  // Throws std::invalid_argument for mode none, parameters of several devices or dtypes in a group, released groups
  // or a bf16 gather outside weights mode.
  ParameterShards(ProcessGroup& group, std::vector<std::pair<std::string, at::Tensor>> parameters, ShardMode mode,
                  ShardOptions options = {});
  ~ParameterShards();
  ParameterShards(const ParameterShards&) = delete;
  ParameterShards& operator=(const ParameterShards&) = delete;

  ShardMode mode() const { return mode_; }
  int rank() const { return group_.rank(); }
  int ranks() const { return group_.size(); }
  ProcessGroup& process_group() const { return group_; }
  std::size_t size() const { return parameters_.size(); }
  const std::string& name(std::size_t parameter) const { return parameters_.at(parameter).name; }
  RowRange rows(std::size_t parameter) const { return parameters_.at(parameter).rows; }
  // The whole parameter's shape (every rank's rows of it: shard_rows over its first dimension).
  c10::IntArrayRef shape(std::size_t parameter) const { return parameters_.at(parameter).full.sizes(); }
  // Per parameter, this rank's rows: a view of the parameter (0 rows where the rank has none), outside autograd's
  // graph but marked as requiring grad as the parameter is, whose .grad is this rank's share of the averaged gradient
  // once reduce_gradients() has run: optimizer mode keeps it in the rows of the parameter's full .grad (whose other
  // rows hold this rank's own gradients), gradients mode in a buffer of the rank's shares. The optimizer steps
  // these; the EMA averages them.
  const std::vector<at::Tensor>& local() const { return local_; }
  std::size_t group_count() const { return groups_.size(); }
  const std::string& group_name(std::size_t group) const { return groups_.at(group).name; }
  // Weights mode: whether parameter `parameter`'s group is released between its uses (its full tensor then holds
  // no storage: only local() holds its values); false in the other modes.
  bool released_between_uses(std::size_t parameter) const {
    return groups_.at(parameters_.at(parameter).group).released;
  }

  // Weights mode, the model's forward (nn::ParameterGroupHooks; groups not released between uses are ignored):
  // the group's weights gathered (an all-gather: every rank's forward must reach the same groups in the same
  // order), then released after its forward; with autograd recording, a hook on `outputs` gathers them again when
  // the backward reaches the group, and they are released once each of its parameters has its gradient (or at
  // finish_backward). Within a step, the group that followed this one in the step's first forward is prefetched
  // (its all-gather started) when the forward reaches this one, and the one that preceded it when the backward
  // does: at most two gathers in flight. Throws std::invalid_argument for a group name this does not have.
  void before_forward(const std::string& group);
  void after_forward(const std::string& group, const std::vector<at::Tensor>& outputs);
  // After each backward (every micro-batch's): releases the groups a backward left whole.
  void finish_backward();

  // Called when a step starts: the full gradients zeroed (optimizer: in place; gradients: dropped, so the
  // backward allocates them).
  void start_step();
  // Called before the backward of a step's last micro-batch (earlier ones only accumulate): arms the hooks.
  void expect_last_backward();
  // After the step's last backward: each group's full gradients (a parameter without one counts as zeros) summed
  // over the ranks by one reduce-scatter (those not started during the backward start now) into this rank's
  // share, which is then scaled to the mean. With gradients the full gradients are dropped. A parameter used twice
  // in the graph must have all its gradient before its group starts (as DDP's static graph asks).
  void reduce_gradients();
  // After the optimizer updated this rank's rows: each group's rows of every rank gathered by one all-gather into
  // every rank's full parameters (weights mode: those of the groups not released between uses).
  void gather_parameters();
  // Weights mode, gathering in another dtype than the parameters': the weights of the groups kept whole rounded to
  // it in place, as their gather gives them, after they were written whole (by the constructor, by a restore).
  void round_whole_weights() const;
  // The full tensor from every rank's rows of it: `share` holds this rank's rows of a tensor shaped as parameter
  // `parameter` (any dtype: its optimizer state, its EMA). An all-gather: every rank must call it with the same
  // dtype.
  at::Tensor gather_one(std::size_t parameter, const at::Tensor& share, const std::string& what);
  // The sum over the ranks of a float scalar (the gradients' squared norms); the mean of a scalar (the loss).
  at::Tensor sum(const at::Tensor& scalar);
  at::Tensor mean(const at::Tensor& scalar);
  // Bytes of this rank's model state between steps: the full parameters (weights mode: those kept whole, and the
  // rows of the released ones), the full gradients kept between steps (optimizer mode) and the gradient shares.
  std::int64_t parameter_bytes() const;
  std::int64_t gradient_bytes() const;
  // Weights mode: how many times the forward or the backward found a group's all-gather already started.
  std::int64_t prefetched_gathers() const { return prefetched_gathers_; }

 private:
  struct Parameter {
    std::string name;
    at::Tensor full;  // the model's parameter
    RowRange rows;    // this rank's
    std::int64_t row_numel = 1;
    std::int64_t padded_rows = 0;  // ceil(rows / ranks): every rank's slot in the group's buffer
    std::int64_t offset = 0;       // of the slot in the group's slice
    std::size_t group = 0;
    std::size_t storage_nbytes = 0;  // of the full tensor's storage, to allocate again after a release
  };
  struct Group {
    std::string name;
    std::vector<std::size_t> parameters;
    std::int64_t slice_numel = 0;  // one rank's padded shares
    at::TensorOptions options;     // of its parameters
    at::Tensor gradient_share;     // gradients and weights modes, flat [slice_numel]: this rank's averaged gradients
    at::Tensor weight_share;       // weights mode, flat [slice_numel]: this rank's rows (what local() views)
    bool released = false;         // weights mode: released between its uses
    bool whole = true;             // its full parameters hold their values now
    bool in_backward = false;      // gathered by the backward, released once `backward_missing` reaches 0
    std::size_t backward_missing = 0;
  };

  // A collective in flight and the buffers it reads and writes.
  struct PendingGroup {
    at::Tensor input, reduced;
    std::optional<PendingCollective> work;
  };
  struct Prefetch {
    std::size_t group = 0;
    PendingGroup gather;
  };
  void gradient_ready(std::size_t parameter);
  void start(std::size_t group);  // with mutex_ held (or no hooks armed)
  std::size_t group_index(const std::string& name) const;
  // The all-gather of the group's rows (weights mode: its weight share, in the gather dtype) started.
  PendingGroup start_weight_gather(std::size_t group);
  // Weights mode, with mutex_ held: the group's full parameters allocated and filled from every rank's rows (the
  // prefetched gather when it is the group's); freed.
  void gather_whole(std::size_t group);
  // Weights mode, with mutex_ held: the group's gather started ahead (within a step, unless it is whole or started).
  void prefetch(std::optional<std::size_t> group);
  void drop_prefetch();
  void release(std::size_t group);
  void gather_for_backward(std::size_t group);
  // Every rank's rows of the group (`gathered`: the all-gather's output) into its full parameters; this rank's own
  // too with `own_rows` (they are views of the parameters outside weights mode).
  void copy_out(std::size_t group, const at::Tensor& gathered, bool own_rows);
  void arm();  // with mutex_ held: the counts of the last backward's gradients

  ProcessGroup& group_;
  ShardMode mode_;
  bool overlap_;
  WeightGather gather_;
  std::vector<Parameter> parameters_;
  std::vector<Group> groups_;
  std::vector<at::Tensor> local_;
  std::vector<std::size_t> order_;  // the order groups start their reduce-scatter: the last group first

  std::vector<bool> hooked_;  // per parameter: its accumulator calls gradient_ready
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<std::uintptr_t> hook_keys_;
  std::mutex mutex_;  // the hooks run on autograd's threads
  bool armed_ = false;
  std::vector<std::size_t> missing_;    // per group: hooked gradients not in yet
  std::vector<bool> counted_;           // per parameter
  std::vector<bool> counted_backward_;  // per parameter: its gradient is in, in the current backward (weights mode)
  std::size_t next_ = 0;                // into order_
  std::vector<PendingGroup> pending_;

  // Weights mode: the order of the groups in the forward, learned in steps (one micro-batch's forward).
  bool stepping_ = false;  // from start_step to reduce_gradients: the weight shares stay as they are
  std::optional<std::size_t> last_forward_;
  std::vector<std::optional<std::size_t>> next_in_forward_, previous_in_forward_;
  std::optional<Prefetch> prefetch_;
  std::int64_t prefetched_gathers_ = 0;
};

// Throws std::runtime_error naming `step` when the ranks' `tensors` differ (a float64 checksum compared over the
// ranks): they apply the same averaged gradients, so their weights agree bit for bit.
void check_ranks_agree(ProcessGroup& group, const std::vector<at::Tensor>& tensors, std::int64_t step);

}  // namespace runner::dist
