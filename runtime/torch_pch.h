// Precompiled header (the runner_pch target): what most files that use LibTorch include, parsed once. Kept to
// ATen's tensor API (no torch/nn.h, torch/optim.h): GCC loads the whole header into every file that uses it, so a
// larger one costs each file more than it saves the few that use the rest (measured in the README's build notes).
#pragma once
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
