// Precompiled header: the LibTorch headers every runtime and binding file uses.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn.h>
#include <torch/optim.h>
#include <torch/utils.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
