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

// pytorch-fid's weights file, where pytorch-fid publishes it (a GitHub release asset; torch.hub downloads it
// and checks that its sha256 starts with the name's suffix), and its sha256.
inline constexpr const char* kFidWeightsName = "pt_inception-2015-12-05-6726825d.pth";
inline constexpr const char* kFidWeightsUrl =
    "https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/pt_inception-2015-12-05-6726825d.pth";
inline constexpr const char* kFidWeightsSha256 = "6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2";

// Where the weights come from and what measures samples without them, for the errors that ask for them.
std::string fid_weights_help();

// Weights from a torch.save file (.pth/.pt, e.g. pytorch-fid's pt_inception-2015-12-05-6726825d.pth) or a
// safetensors file, with torchvision's Inception3 parameter names (fc included). Errors name the file and
// every missing, extra or misshapen tensor. In eval mode on the CPU.
// The file's sha256 is checked first: a file named as pytorch-fid's whose sha256 differs is an error (a
// damaged download), any other file is used with a warning that names both sha256s (its FID is not
// comparable with published numbers; a safetensors copy of the right tensors differs in its bytes only).
FidInception load_fid_inception(const std::string& path);

}  // namespace runner::eval
