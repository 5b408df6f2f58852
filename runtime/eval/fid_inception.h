// The FID Inception network of pytorch-fid (TensorFlow's 2015-12-05 Inception v3 as torchvision's Inception3
// with pytorch-fid's FIDInceptionA/C/E blocks): images to the 2048 pool3 features that FID compares.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <functional>
#include <string>
#include <vector>

namespace runner::eval {

class FidInceptionImpl : public torch::nn::Module {
 public:
  FidInceptionImpl();
  // images [N, 3, H, W] with values in [0, 1] -> features [N, 2048] (float32): bilinear resize to 299 x 299
  // (align_corners false), 2x - 1, the network to its final average pool.
  at::Tensor features(const at::Tensor& images);

 private:
  std::vector<std::function<at::Tensor(const at::Tensor&)>> stages_;  // conv blocks, pools and mixed blocks in order
};
TORCH_MODULE(FidInception);

// Weights from a torch.save file (.pth/.pt, e.g. pytorch-fid's pt_inception-2015-12-05-6726825d.pth) or a
// safetensors file, with torchvision's Inception3 parameter names (fc included). Errors name the file and
// every missing, extra or misshapen tensor. In eval mode on the CPU.
FidInception load_fid_inception(const std::string& path);

}  // namespace runner::eval
