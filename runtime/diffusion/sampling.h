// What both families' samplers share: classifier-free guidance of the model's output, the noise source of the
// sampling steps, the sample result, autocast turned off, and the step limit.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "runtime/diffusion/model_function.h"

namespace runner::diffusion {

// The most timesteps a schedule has, and steps a sampler or an ODE solver takes: their time grids are built whole,
// so one mistyped number (2^31) would otherwise take the machine's memory.
constexpr std::int64_t kMaxSteps = 1'000'000;

// Turns autocast off for one device type and restores the previous state on exit (the samplers' default).
class AutocastDisabled {
 public:
  explicit AutocastDisabled(at::DeviceType type);
  ~AutocastDisabled();
  AutocastDisabled(const AutocastDisabled&) = delete;
  AutocastDisabled& operator=(const AutocastDisabled&) = delete;

 private:
  at::DeviceType type_;
  bool active_ = false;
};

// Classifier-free guidance: scale 1 runs the conditional model alone; otherwise one run on cat([x, x]) with labels
// cat([y, null_label]) and the first `channels` output channels (default: x's C) are uncond + scale (cond - uncond),
// the rest (learned-sigma channels; SiT's forward_with_cfg guides 3) the conditional half's.
struct Guidance {
  double scale = 1.0;
  std::optional<std::int64_t> null_label;
  std::optional<std::int64_t> channels;
};

// Throws std::invalid_argument unless x_T is [B, C, ...], labels (when given) int64 [B], and guidance != 1 has labels
// and a null label.
void check_sampling_inputs(const at::Tensor& x_T, const std::optional<at::Tensor>& labels, const Guidance& guidance);

// The model's output for x at times t ([B], any dtype the model takes) in float32, guided as `guidance` says.
// Throws std::invalid_argument for outputs that are not C or 2C channels of x's shape.
at::Tensor guided_output(const ModelFunction& model, const at::Tensor& x, const at::Tensor& t,
                         const std::optional<at::Tensor>& labels, const Guidance& guidance);

// Standard normal noise shaped like `like` for sampling step `step` (0 is the first step from x_T).
// An empty NoiseSource draws with randn_like from the default generator.
using NoiseSource = std::function<at::Tensor(std::int64_t step, const at::Tensor& like)>;

// The noise of step `step`, checked to be shaped like `like` (randn_like without a source).
at::Tensor draw_step_noise(const NoiseSource& noise, std::int64_t step, const at::Tensor& like);

struct SampleResult {
  at::Tensor x;                        // float32, the final sample
  std::vector<at::Tensor> trajectory;  // with keep_trajectory: x_T, then x after each step
};

}  // namespace runner::diffusion
