// The job's process group on PyTorch's c10d: a TCPStore rendezvous at MASTER_ADDR:MASTER_PORT (rank 0 serves
// it), Gloo for CPU tensors and control messages, NCCL for CUDA tensors where the build has it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/launch_context.h"

namespace c10d {
class Store;
class Work;
}  // namespace c10d

namespace runner::dist {

enum class ReduceOp { sum, mean, max, min };
ReduceOp parse_reduce_op(const std::string& name);  // "sum", "mean", "max" or "min"

// A collective that failed (a rank died, a timeout): the message names the operation and the cause.
struct CollectiveError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The first collective of this process that failed. Every later error of the rank follows from it: another rank
// stopped, hung or lost its network first.
struct CollectiveFailure {
  std::string collective;  // "all_reduce", "gradient all_reduce", "broadcast", ...
  std::string cause;       // the backend's error
  bool timed_out = false;  // a rank did not take part within the timeout
  double time = 0;         // seconds since the epoch
};
std::optional<CollectiveFailure> first_collective_failure();

// A collective in flight (bucketed gradient all-reduce); wait() throws CollectiveError.
class PendingCollective {
 public:
  explicit PendingCollective(c10::intrusive_ptr<c10d::Work> work, std::string what);
  ~PendingCollective();
  PendingCollective(PendingCollective&&) noexcept;
  PendingCollective& operator=(PendingCollective&&) noexcept;
  void wait();

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;
};

class ProcessGroup {
 public:
  // Joins the job `context` describes (world_size > 1): the rendezvous waits up to `timeout` for every rank;
  // collectives time out after `timeout` too. `device` is this rank's compute device: a CUDA device gets an
  // NCCL communicator. Throws std::runtime_error naming MASTER_ADDR:MASTER_PORT when the rendezvous fails.
  ProcessGroup(const core::LaunchContext& context, c10::Device device, std::chrono::milliseconds timeout);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  c10::Device device() const { return device_; }
  std::chrono::milliseconds timeout() const;  // of the rendezvous and of every collective
  c10d::Store& store();

  // In place on every rank; tensors of one device (CPU: Gloo, CUDA: NCCL). mean divides the sum by size().
  void all_reduce(std::vector<at::Tensor>& tensors, ReduceOp op);
  PendingCollective all_reduce_async(std::vector<at::Tensor>& tensors);  // sum
  void broadcast(std::vector<at::Tensor>& tensors, int root);
  // Every rank's `tensor` (same shape on all ranks), in rank order.
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor);
  // all_gather_into_tensor: every rank's `input` into `output` (size() times its numel, flat, rank after rank).
  // `what` names the collective in errors. The _async forms return at once: `input` and `output` must stay as
  // they are until wait().
  void all_gather_into(at::Tensor& output, const at::Tensor& input, const std::string& what);
  PendingCollective all_gather_into_async(at::Tensor& output, const at::Tensor& input, const std::string& what);
  // reduce_scatter_tensor with SUM: `input` (size() equal flat slices, rank after rank) summed over the ranks,
  // this rank's slice into `output`.
  void reduce_scatter_into(at::Tensor& output, const at::Tensor& input, const std::string& what);
  PendingCollective reduce_scatter_into_async(at::Tensor& output, const at::Tensor& input, const std::string& what);
  void barrier();
  // Control messages over Gloo: whether `flag` is true on any rank; the maximum of `value` over ranks; rank
  // `root`'s text on every rank.
  bool any(bool flag);
  std::int64_t max(std::int64_t value);
  std::string broadcast_text(const std::string& text, int root);
  // Every rank's `bytes` (of any length) over Gloo, in rank order.
  std::vector<std::string> all_gather_bytes(const std::string& bytes);
  // Notes in the job's store, outside the collectives (a failing rank's report to rank 0): set_note waits for no
  // other rank; note() is the text under `key`, nullopt while nobody has set it. Both throw CollectiveError
  // when the store cannot be reached.
  void set_note(const std::string& key, const std::string& text);
  std::optional<std::string> note(const std::string& key);

 private:
  struct Backends;
  int rank_ = 0;
  int size_ = 1;
  c10::Device device_;
  std::unique_ptr<Backends> backends_;
};

// The process's group: made by join_process_group (the program's entry point, when the launch context is
// distributed); nullptr for a single process.
ProcessGroup* process_group();
// Joins the job of the process's launch context; `device` as for ProcessGroup. The collective timeout is the
// context's dist_timeout_seconds (RUNNER_DIST_TIMEOUT, default 300).
void join_process_group(c10::Device device);
void leave_process_group();

}  // namespace runner::dist
