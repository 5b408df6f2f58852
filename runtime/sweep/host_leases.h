// The cores and GPUs of one host, shared by every sweep worker of the user on it (started by `runner sweep`,
// `--join` or a Slurm task): each worker registers its slots, and each trial leases the cores and GPUs it runs on
// through lock files (flock) in a host-local folder, so that workers started apart never put two trials on one core
// or one GPU, nor give each trial every core.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace runner::sweep {

// A trial's cores and GPUs, held until it is destroyed (or the worker ends: the kernel drops its locks).
class TrialLease {
 public:
  TrialLease() = default;
  ~TrialLease();
  TrialLease(TrialLease&& other) noexcept;
  TrialLease& operator=(TrialLease&& other) noexcept;
  TrialLease(const TrialLease&) = delete;
  TrialLease& operator=(const TrialLease&) = delete;

  int threads() const { return threads_; }
  // The CPUs the trial is pinned to; empty when the cores are counted, not named (RUNNER_CORES above the affinity's).
  const std::vector<int>& cpus() const { return cpus_; }
  const std::vector<std::string>& gpus() const { return gpus_; }

 private:
  friend class HostLeases;
  void release();

  int threads_ = 0;
  std::vector<int> cpus_;
  std::vector<std::string> gpus_;
  std::vector<int> lock_fds_;
};

class HostLeases {
 public:
  // Registers `slots` slots of this worker on the host, in `folder` (empty: host_leases_folder()), for as long
  // as the object lives. Throws std::runtime_error naming the folder when it cannot be made or is another user's.
  HostLeases(int slots, std::string folder = "");
  ~HostLeases();
  HostLeases(const HostLeases&) = delete;
  HostLeases& operator=(const HostLeases&) = delete;

  // The slots of every live worker registered on this host, this one's included (a dead worker's registration is
  // removed on the way).
  int slots_on_host() const;
  // `cores` of the usable cores and `gpu_count` of `gpus`, all free now, or nothing. Cores are named by the CPU
  // ids of this process's affinity when there are at least `usable_cores` of them (the trial is then pinned to
  // its cores), else counted as core-0, core-1, ...
  std::optional<TrialLease> try_lease(int usable_cores, int cores, const std::vector<std::string>& gpus,
                                      int gpu_count) const;
  const std::string& folder() const { return folder_; }

 private:
  std::string folder_;
  int registration_fd_ = -1;
  std::string registration_path_;
};

// RUNNER_HOST_LEASES when set, else /tmp/runner-<uid>/host-leases.
std::string host_leases_folder();

}  // namespace runner::sweep
