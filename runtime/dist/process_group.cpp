// The c10d process group: TCPStore rendezvous, Gloo and NCCL backends, and the collectives runner uses.
#include "runtime/dist/process_group.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef RUNNER_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "runtime/core/enum_table.h"

namespace runner::dist {
namespace {

std::unique_ptr<ProcessGroup> the_group;

bool is_loopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1"; }

std::string describe(const std::exception_ptr& error) {
  try {
    if (error) std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "unknown error";
}

std::mutex collective_failure_mutex;
std::optional<CollectiveFailure> the_first_collective_failure;

// Gloo: "Timed out waiting 300000ms for recv"; the store: "wait timeout"; NCCL's watchdog: "operation timeout".
bool says_timed_out(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text.find("timed out") != std::string::npos || text.find("timeout") != std::string::npos;
}

[[noreturn]] void fail(const std::string& what, const std::string& cause) {
  {
    std::lock_guard lock(collective_failure_mutex);
    if (!the_first_collective_failure)
      the_first_collective_failure =
          CollectiveFailure{what, cause, says_timed_out(cause),
                            std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()};
  }
  throw CollectiveError(
      fmt::format("{} failed: {} (a rank stopped or the network failed; see the launcher's "
                  "report of which rank failed)",
                  what, cause));
}

}  // namespace

std::optional<CollectiveFailure> first_collective_failure() {
  std::lock_guard lock(collective_failure_mutex);
  return the_first_collective_failure;
}

const core::EnumTable<ReduceOp, 4> kReduceOps{
    {{{ReduceOp::sum, "sum"}, {ReduceOp::mean, "mean"}, {ReduceOp::max, "max"}, {ReduceOp::min, "min"}}},
    core::NameQuotes::none,
    "reduce op must be {list}, got '{got}'"};

ReduceOp parse_reduce_op(const std::string& name) { return kReduceOps.parse(name); }

struct ProcessGroup::Backends {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
  c10::intrusive_ptr<c10d::Backend> cuda;  // NCCL, for CUDA tensors
  std::chrono::milliseconds timeout{0};
  std::int64_t text_messages = 0;

  c10d::Backend& backend_for(const at::Tensor& tensor) {
    if (tensor.is_cuda()) {
      if (!cuda) throw std::invalid_argument("collectives on CUDA tensors need NCCL, which this build does not have");
      return *cuda;
    }
    return *gloo;
  }
};

PendingCollective::PendingCollective(c10::intrusive_ptr<c10d::Work> work, std::string what)
    : work_(std::move(work)), what_(std::move(what)) {}
PendingCollective::~PendingCollective() = default;
PendingCollective::PendingCollective(PendingCollective&&) noexcept = default;
PendingCollective& PendingCollective::operator=(PendingCollective&&) noexcept = default;

void PendingCollective::wait() {
  if (!work_) return;
  auto work = std::move(work_);
  try {
    work->wait();
  } catch (const std::exception&) {
    fail(what_, describe(std::current_exception()));
  }
}

ProcessGroup::ProcessGroup(const core::LaunchContext& context, c10::Device device, std::chrono::milliseconds timeout)
    : rank_(context.rank), size_(context.world_size), device_(device), backends_(std::make_unique<Backends>()) {
  if (context.master_addr.empty() || context.master_port <= 0)
    throw std::runtime_error(fmt::format(
        "rank {} of {}: MASTER_ADDR and MASTER_PORT must name the rendezvous host and port (torchrun and runner "
        "--nproc set them; under Slurm set MASTER_ADDR or let runner take the job's first node)",
        rank_, size_));
  const std::string where = fmt::format("{}:{}", context.master_addr, context.master_port);
  backends_->timeout = timeout;
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(context.master_port);
    // Under torchrun the agent already serves the store at MASTER_PORT: a rank 0 that tried to serve it too
    // would fail to bind and have c10d log an error line ("The server socket on PORT has failed to bind").
    options.isServer = rank_ == 0 && !context.agent_store;
    options.numWorkers = static_cast<std::size_t>(size_);
    options.waitWorkers = true;
    options.timeout = timeout;
    backends_->store = c10::make_intrusive<c10d::TCPStore>(context.master_addr, options);
  } catch (const std::exception&) {
    throw std::runtime_error(fmt::format("rank {} of {}: the rendezvous at {} failed: {}", rank_, size_, where,
                                         describe(std::current_exception())));
  }
  try {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
    if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME"); interface && *interface)
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(interface));
    else if (is_loopback(context.master_addr))
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    else
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    backends_->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(
        c10::make_intrusive<c10d::PrefixStore>("gloo", backends_->store), rank_, size_, gloo_options);
#ifdef RUNNER_WITH_NCCL
    if (device.is_cuda()) {
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = timeout;
      backends_->cuda = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          c10::make_intrusive<c10d::PrefixStore>("nccl", backends_->store), rank_, size_, nccl_options);
    }
#endif
  } catch (const std::exception&) {
    throw std::runtime_error(fmt::format("rank {} of {}: joining the process group at {} failed: {}", rank_, size_,
                                         where, describe(std::current_exception())));
  }
}

ProcessGroup::~ProcessGroup() {
  try {
    if (backends_->cuda) backends_->cuda->shutdown();
  } catch (const std::exception&) {
  }
}

c10d::Store& ProcessGroup::store() { return *backends_->store; }

std::chrono::milliseconds ProcessGroup::timeout() const { return backends_->timeout; }

void ProcessGroup::all_reduce(std::vector<at::Tensor>& tensors, ReduceOp op) {
  if (tensors.empty()) return;
  c10d::AllreduceOptions options;
  options.reduceOp = op == ReduceOp::max   ? c10d::ReduceOp::MAX
                     : op == ReduceOp::min ? c10d::ReduceOp::MIN
                                           : c10d::ReduceOp::SUM;
  options.timeout = backends_->timeout;
  c10d::Backend& backend = backends_->backend_for(tensors.front());
  for (at::Tensor& tensor : tensors) {  // NCCL takes one tensor per call; Gloo would take several
    std::vector<at::Tensor> one{tensor};
    PendingCollective(backend.allreduce(one, options), "all_reduce").wait();
    if (op == ReduceOp::mean) {
      if (tensor.is_floating_point())
        tensor.div_(size_);
      else
        tensor.div_(size_, "floor");
    }
  }
}

PendingCollective ProcessGroup::all_reduce_async(std::vector<at::Tensor>& tensors) {
  c10d::AllreduceOptions options;
  options.timeout = backends_->timeout;
  return PendingCollective(backends_->backend_for(tensors.front()).allreduce(tensors, options), "gradient all_reduce");
}

void ProcessGroup::broadcast(std::vector<at::Tensor>& tensors, int root) {
  if (tensors.empty()) return;
  if (root < 0 || root >= size_)
    throw std::invalid_argument(fmt::format("broadcast: root {} is not a rank of {}", root, size_));
  c10d::BroadcastOptions options;
  options.rootRank = root;
  options.timeout = backends_->timeout;
  c10d::Backend& backend = backends_->backend_for(tensors.front());
  for (at::Tensor& tensor : tensors) {
    std::vector<at::Tensor> one{tensor};
    PendingCollective(backend.broadcast(one, options), "broadcast").wait();
  }
}

std::vector<at::Tensor> ProcessGroup::all_gather(const at::Tensor& tensor) {
  std::vector<at::Tensor> input{tensor.contiguous()};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int r = 0; r < size_; ++r) output[0].push_back(at::empty_like(input[0]));
  c10d::AllgatherOptions options;
  options.timeout = backends_->timeout;
  PendingCollective(backends_->backend_for(tensor).allgather(output, input, options), "all_gather").wait();
  return output[0];
}

PendingCollective ProcessGroup::all_gather_into_async(at::Tensor& output, const at::Tensor& input,
                                                      const std::string& what) {
  c10d::AllgatherOptions options;
  options.timeout = backends_->timeout;
  at::Tensor source = input.is_contiguous() ? input.view({-1}) : input.contiguous().view({-1});
  return PendingCollective(backends_->backend_for(input)._allgather_base(output, source, options), what);
}

void ProcessGroup::all_gather_into(at::Tensor& output, const at::Tensor& input, const std::string& what) {
  all_gather_into_async(output, input, what).wait();
}

PendingCollective ProcessGroup::reduce_scatter_into_async(at::Tensor& output, const at::Tensor& input,
                                                          const std::string& what) {
  c10d::ReduceScatterOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  options.timeout = backends_->timeout;
  at::Tensor source = input.is_contiguous() ? input.view({-1}) : input.contiguous().view({-1});
  return PendingCollective(backends_->backend_for(input)._reduce_scatter_base(output, source, options), what);
}

void ProcessGroup::reduce_scatter_into(at::Tensor& output, const at::Tensor& input, const std::string& what) {
  reduce_scatter_into_async(output, input, what).wait();
}

void ProcessGroup::barrier() {
  c10d::BarrierOptions options;
  options.timeout = backends_->timeout;
  PendingCollective(backends_->gloo->barrier(options), "barrier").wait();
}

std::int64_t ProcessGroup::max(std::int64_t value) {
  std::vector<at::Tensor> one{at::full({1}, value, at::kLong)};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  options.timeout = backends_->timeout;
  PendingCollective(backends_->gloo->allreduce(one, options), "all_reduce").wait();
  return one[0].item<std::int64_t>();
}

bool ProcessGroup::any(bool flag) { return max(flag ? 1 : 0) != 0; }

std::string ProcessGroup::broadcast_text(const std::string& text, int root) {
  const std::string key = fmt::format("runner/text/{}", backends_->text_messages++);
  try {
    if (rank_ == root) backends_->store->set(key, std::vector<std::uint8_t>(text.begin(), text.end()));
    const std::vector<std::uint8_t> bytes = backends_->store->get(key);
    return std::string(bytes.begin(), bytes.end());
  } catch (const std::exception&) {
    fail("broadcast of a message from rank " + std::to_string(root), describe(std::current_exception()));
  }
}

std::vector<std::string> ProcessGroup::all_gather_bytes(const std::string& bytes) {
  const std::vector<at::Tensor> lengths = all_gather(at::full({1}, static_cast<std::int64_t>(bytes.size()), at::kLong));
  std::int64_t longest = 1;
  for (const at::Tensor& length : lengths) longest = std::max(longest, length.item<std::int64_t>());
  at::Tensor padded = at::zeros({longest}, at::kByte);
  std::memcpy(padded.data_ptr(), bytes.data(), bytes.size());
  std::vector<std::string> gathered;
  const std::vector<at::Tensor> pieces = all_gather(padded);
  for (std::size_t r = 0; r < pieces.size(); ++r)
    gathered.emplace_back(static_cast<const char*>(pieces[r].const_data_ptr()),
                          static_cast<std::size_t>(lengths[r].item<std::int64_t>()));
  return gathered;
}

void ProcessGroup::set_note(const std::string& key, const std::string& text) {
  try {
    backends_->store->set(key, std::vector<std::uint8_t>(text.begin(), text.end()));
  } catch (const std::exception&) {
    throw CollectiveError(
        fmt::format("the job's store: setting {} failed: {}", key, describe(std::current_exception())));
  }
}

std::optional<std::string> ProcessGroup::note(const std::string& key) {
  try {
    if (!backends_->store->check({key})) return std::nullopt;
    const std::vector<std::uint8_t> bytes = backends_->store->get(key);
    return std::string(bytes.begin(), bytes.end());
  } catch (const std::exception&) {
    throw CollectiveError(
        fmt::format("the job's store: reading {} failed: {}", key, describe(std::current_exception())));
  }
}

ProcessGroup* process_group() { return the_group.get(); }

void join_process_group(c10::Device device) {
  const core::LaunchContext& context = core::launch_context();
  if (!context.distributed() || the_group) return;
  the_group = std::make_unique<ProcessGroup>(
      context, device, std::chrono::milliseconds(static_cast<std::int64_t>(context.dist_timeout_seconds * 1000)));
}

void leave_process_group() { the_group.reset(); }

}  // namespace runner::dist
