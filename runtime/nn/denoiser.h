// The interface the diffusion code sees in a built-in denoising network (UNet, DiT): forward(x, t, labels)
// plus what samplers and losses need to know about its inputs and outputs.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <optional>

#include "runtime/nn/parameter_group_hooks.h"

namespace runner::nn {

class Denoiser : public torch::nn::Module, public GroupedForward {
 public:
  using torch::nn::Module::Module;

  // x [B, C, H, W], t [B] integer timesteps (any integer or float dtype), labels [B] int64 class ids
  // (0-based; `classes()` is the null label) or nullopt for an unconditional model.
  virtual at::Tensor forward(const at::Tensor& x, const at::Tensor& t, const std::optional<at::Tensor>& labels) = 0;

  virtual std::int64_t in_channels() const = 0;
  virtual std::int64_t out_channels() const = 0;
  virtual std::int64_t image_size() const = 0;
  // Number of classes (0 for an unconditional model).
  virtual std::int64_t classes() const = 0;
  // Probability of replacing a label by the null label in training; > 0 means the null label exists.
  virtual double class_dropout() const = 0;
  bool has_null_label() const { return classes() > 0 && class_dropout() > 0; }
  // Whether the model works on images in [-1, 1] (the UNet, as DDPM) rather than on latents (the DiT, as the
  // official DiT): the sampler clips predicted x0 to [-1, 1] by default only for pixel-space models.
  virtual bool pixel_space() const = 0;

  // Recompute each block's activations in backward instead of storing them.
  void set_checkpointing(bool enabled) { checkpointing_ = enabled; }
  bool checkpointing() const { return checkpointing_; }

 protected:
  // Checks shapes and labels common to every denoiser; throws std::invalid_argument naming the problem.
  void check_inputs(const at::Tensor& x, const at::Tensor& t, const std::optional<at::Tensor>& labels) const;

 private:
  bool checkpointing_ = false;
};

}  // namespace runner::nn
