// Versions of runner and the libraries it runs on, for `runner --version` and run records.
#pragma once
#include <string>
#include <vector>

namespace runner::core {

struct VersionInfo {
  std::string runner;
  std::string libtorch;
  std::string sqlite;
  bool cuda_available = false;
  std::string cuda_runtime;               // empty when LibTorch was built without CUDA
  std::vector<std::string> cuda_devices;  // "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)"
};

VersionInfo version_info();

}  // namespace runner::core
