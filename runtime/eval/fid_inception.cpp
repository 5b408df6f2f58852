// The FID Inception v3: torchvision's layout and names, pytorch-fid's pooling in the A, C and E blocks.
#include "runtime/eval/fid_inception.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/container/sequential.h>

#include <fmt/format.h>

#include <filesystem>
#include <stdexcept>
#include <vector>

#include "runtime/ckpt/weights_file.h"
#include "runtime/core/logging.h"
#include "runtime/core/sha256.h"
#include "runtime/nn/state_loading.h"

namespace runner::eval {
namespace {

// Conv2d without bias, BatchNorm (eps 0.001), ReLU: torchvision's BasicConv2d.
class BasicConvImpl : public torch::nn::Module {
 public:
  BasicConvImpl(std::int64_t in, std::int64_t out, std::vector<std::int64_t> kernel, std::int64_t stride = 1,
                std::vector<std::int64_t> padding = {0, 0}) {
    if (kernel.size() == 1) kernel.push_back(kernel[0]);
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, {kernel[0], kernel[1]})
                                                         .stride(stride)
                                                         .padding({padding[0], padding[1]})
                                                         .bias(false)));
    bn = register_module("bn", torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(out).eps(0.001)));
  }
  at::Tensor forward(const at::Tensor& x) { return at::relu(bn(conv(x))); }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
};
TORCH_MODULE(BasicConv);

// A block: named branches of BasicConvs; their outputs concatenated on channels.
class InceptionBlockImpl : public torch::nn::Module {
 public:
  BasicConv add(const std::string& name, BasicConv conv) { return register_module(name, conv); }
};

// pytorch-fid's blocks pool the last branch as TensorFlow did: an average that leaves out the padding (A, C
// and the first E), or a max (the last E), where torchvision averages with the padding.
enum class BranchPool { average_excluding_padding, max };

at::Tensor branch_pool_input(const at::Tensor& x, BranchPool pool) {
  if (pool == BranchPool::max) return at::max_pool2d(x, {3, 3}, {1, 1}, {1, 1});
  return at::avg_pool2d(x, {3, 3}, {1, 1}, {1, 1}, false, false);
}

class InceptionAImpl : public InceptionBlockImpl {
 public:
  InceptionAImpl(std::int64_t in, std::int64_t pool_features) {
    b1 = add("branch1x1", BasicConv(in, 64, std::vector<std::int64_t>{1}));
    b5_1 = add("branch5x5_1", BasicConv(in, 48, std::vector<std::int64_t>{1}));
    b5_2 = add("branch5x5_2", BasicConv(48, 64, std::vector<std::int64_t>{5}, 1, std::vector<std::int64_t>{2, 2}));
    b3_1 = add("branch3x3dbl_1", BasicConv(in, 64, std::vector<std::int64_t>{1}));
    b3_2 = add("branch3x3dbl_2", BasicConv(64, 96, std::vector<std::int64_t>{3}, 1, std::vector<std::int64_t>{1, 1}));
    b3_3 = add("branch3x3dbl_3", BasicConv(96, 96, std::vector<std::int64_t>{3}, 1, std::vector<std::int64_t>{1, 1}));
    pool = add("branch_pool", BasicConv(in, pool_features, std::vector<std::int64_t>{1}));
  }
  at::Tensor forward(const at::Tensor& x) {
    return at::cat(
        {b1(x), b5_2(b5_1(x)), b3_3(b3_2(b3_1(x))), pool(branch_pool_input(x, BranchPool::average_excluding_padding))},
        1);
  }
  BasicConv b1{nullptr}, b5_1{nullptr}, b5_2{nullptr}, b3_1{nullptr}, b3_2{nullptr}, b3_3{nullptr}, pool{nullptr};
};
TORCH_MODULE(InceptionA);

class InceptionBImpl : public InceptionBlockImpl {
 public:
  explicit InceptionBImpl(std::int64_t in) {
    b3 = add("branch3x3", BasicConv(in, 384, std::vector<std::int64_t>{3}, 2));
    d1 = add("branch3x3dbl_1", BasicConv(in, 64, std::vector<std::int64_t>{1}));
    d2 = add("branch3x3dbl_2", BasicConv(64, 96, std::vector<std::int64_t>{3}, 1, std::vector<std::int64_t>{1, 1}));
    d3 = add("branch3x3dbl_3", BasicConv(96, 96, std::vector<std::int64_t>{3}, 2));
  }
  at::Tensor forward(const at::Tensor& x) {
    return at::cat({b3(x), d3(d2(d1(x))), at::max_pool2d(x, {3, 3}, {2, 2})}, 1);
  }
  BasicConv b3{nullptr}, d1{nullptr}, d2{nullptr}, d3{nullptr};
};
TORCH_MODULE(InceptionB);

class InceptionCImpl : public InceptionBlockImpl {
 public:
  InceptionCImpl(std::int64_t in, std::int64_t c7) {
    const std::vector<std::int64_t> k1{1}, k17{1, 7}, k71{7, 1}, p17{0, 3}, p71{3, 0};
    b1 = add("branch1x1", BasicConv(in, 192, k1));
    s1 = add("branch7x7_1", BasicConv(in, c7, k1));
    s2 = add("branch7x7_2", BasicConv(c7, c7, k17, 1, p17));
    s3 = add("branch7x7_3", BasicConv(c7, 192, k71, 1, p71));
    d1 = add("branch7x7dbl_1", BasicConv(in, c7, k1));
    d2 = add("branch7x7dbl_2", BasicConv(c7, c7, k71, 1, p71));
    d3 = add("branch7x7dbl_3", BasicConv(c7, c7, k17, 1, p17));
    d4 = add("branch7x7dbl_4", BasicConv(c7, c7, k71, 1, p71));
    d5 = add("branch7x7dbl_5", BasicConv(c7, 192, k17, 1, p17));
    pool = add("branch_pool", BasicConv(in, 192, k1));
  }
  at::Tensor forward(const at::Tensor& x) {
    return at::cat({b1(x), s3(s2(s1(x))), d5(d4(d3(d2(d1(x))))),
                    pool(branch_pool_input(x, BranchPool::average_excluding_padding))},
                   1);
  }
  BasicConv b1{nullptr}, s1{nullptr}, s2{nullptr}, s3{nullptr}, d1{nullptr}, d2{nullptr}, d3{nullptr}, d4{nullptr},
      d5{nullptr}, pool{nullptr};
};
TORCH_MODULE(InceptionC);

class InceptionDImpl : public InceptionBlockImpl {
 public:
  explicit InceptionDImpl(std::int64_t in) {
    t1 = add("branch3x3_1", BasicConv(in, 192, std::vector<std::int64_t>{1}));
    t2 = add("branch3x3_2", BasicConv(192, 320, std::vector<std::int64_t>{3}, 2));
    s1 = add("branch7x7x3_1", BasicConv(in, 192, std::vector<std::int64_t>{1}));
    s2 = add("branch7x7x3_2", BasicConv(192, 192, std::vector<std::int64_t>{1, 7}, 1, std::vector<std::int64_t>{0, 3}));
    s3 = add("branch7x7x3_3", BasicConv(192, 192, std::vector<std::int64_t>{7, 1}, 1, std::vector<std::int64_t>{3, 0}));
    s4 = add("branch7x7x3_4", BasicConv(192, 192, std::vector<std::int64_t>{3}, 2));
  }
  at::Tensor forward(const at::Tensor& x) {
    return at::cat({t2(t1(x)), s4(s3(s2(s1(x)))), at::max_pool2d(x, {3, 3}, {2, 2})}, 1);
  }
  BasicConv t1{nullptr}, t2{nullptr}, s1{nullptr}, s2{nullptr}, s3{nullptr}, s4{nullptr};
};
TORCH_MODULE(InceptionD);

class InceptionEImpl : public InceptionBlockImpl {
 public:
  InceptionEImpl(std::int64_t in, BranchPool pool_kind) : pool_kind_(pool_kind) {
    const std::vector<std::int64_t> k1{1}, k13{1, 3}, k31{3, 1}, p13{0, 1}, p31{1, 0};
    b1 = add("branch1x1", BasicConv(in, 320, k1));
    t1 = add("branch3x3_1", BasicConv(in, 384, k1));
    t2a = add("branch3x3_2a", BasicConv(384, 384, k13, 1, p13));
    t2b = add("branch3x3_2b", BasicConv(384, 384, k31, 1, p31));
    d1 = add("branch3x3dbl_1", BasicConv(in, 448, k1));
    d2 = add("branch3x3dbl_2", BasicConv(448, 384, std::vector<std::int64_t>{3}, 1, std::vector<std::int64_t>{1, 1}));
    d3a = add("branch3x3dbl_3a", BasicConv(384, 384, k13, 1, p13));
    d3b = add("branch3x3dbl_3b", BasicConv(384, 384, k31, 1, p31));
    pool = add("branch_pool", BasicConv(in, 192, k1));
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor t = t1(x);
    const at::Tensor d = d2(d1(x));
    return at::cat(
        {b1(x), at::cat({t2a(t), t2b(t)}, 1), at::cat({d3a(d), d3b(d)}, 1), pool(branch_pool_input(x, pool_kind_))}, 1);
  }
  BasicConv b1{nullptr}, t1{nullptr}, t2a{nullptr}, t2b{nullptr}, d1{nullptr}, d2{nullptr}, d3a{nullptr}, d3b{nullptr},
      pool{nullptr};

 private:
  BranchPool pool_kind_;
};
TORCH_MODULE(InceptionE);

}  // namespace

FidInceptionImpl::FidInceptionImpl() {
  using K = std::vector<std::int64_t>;
  auto stage = [this](const std::string& name, auto holder) {
    register_module(name, holder);
    stages_.push_back([holder](const at::Tensor& x) mutable { return holder->forward(x); });
  };
  auto max_pool = [this] { stages_.push_back([](const at::Tensor& x) { return at::max_pool2d(x, {3, 3}, {2, 2}); }); };
  stage("Conv2d_1a_3x3", BasicConv(3, 32, K{3}, 2));
  stage("Conv2d_2a_3x3", BasicConv(32, 32, K{3}));
  stage("Conv2d_2b_3x3", BasicConv(32, 64, K{3}, 1, K{1, 1}));
  max_pool();
  stage("Conv2d_3b_1x1", BasicConv(64, 80, K{1}));
  stage("Conv2d_4a_3x3", BasicConv(80, 192, K{3}));
  max_pool();
  stage("Mixed_5b", InceptionA(192, 32));
  stage("Mixed_5c", InceptionA(256, 64));
  stage("Mixed_5d", InceptionA(288, 64));
  stage("Mixed_6a", InceptionB(288));
  stage("Mixed_6b", InceptionC(768, 128));
  stage("Mixed_6c", InceptionC(768, 160));
  stage("Mixed_6d", InceptionC(768, 160));
  stage("Mixed_6e", InceptionC(768, 192));
  stage("Mixed_7a", InceptionD(768));
  stage("Mixed_7b", InceptionE(1280, BranchPool::average_excluding_padding));
  stage("Mixed_7c", InceptionE(2048, BranchPool::max));
  register_module("fc", torch::nn::Linear(2048, 1008));  // the classifier of the weights file; FID does not use it
}

at::Tensor FidInceptionImpl::features(const at::Tensor& images) {
  at::Tensor x = 2 * at::upsample_bilinear2d(images, {299, 299}, false) - 1;
  for (auto& stage : stages_) x = stage(x);
  return at::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
}

std::string fid_weights_help() {
  return fmt::format(
      "the FID Inception weights are pytorch-fid's {} (sha256 {}), published at {}; runner downloads nothing, so "
      "copy that file here from a machine with network access. Without it, runner.eval.sliced_wasserstein(samples, "
      "real_images) measures sample quality with no download (its numbers are not FIDs)",
      kFidWeightsName, kFidWeightsSha256, kFidWeightsUrl);
}

FidInception load_fid_inception(const std::string& path) {
  const std::string sha256 = core::sha256_file(path);
  if (sha256 != kFidWeightsSha256) {
    if (std::filesystem::path(path).filename() == kFidWeightsName)
      throw std::invalid_argument(
          fmt::format("{}: sha256 {}, not {} as pytorch-fid publishes it: the file is damaged or "
                      "another one; download it again from {}",
                      path, sha256, kFidWeightsSha256, kFidWeightsUrl));
    core::log(
        core::LogLevel::warn,
        fmt::format("{}: sha256 {} is not that of pytorch-fid's {} ({}): FIDs with other weights are not comparable "
                    "with published ones",
                    path, sha256, kFidWeightsName, kFidWeightsSha256));
  }
  FidInception model;
  nn::StateLoadOptions options;
  options.optional = [](const std::string& name) { return name.size() > 20 && name.ends_with("num_batches_tracked"); };
  nn::load_state(*model, ckpt::read_weights_file(path), path, "the FID Inception (pytorch-fid's pt_inception weights)",
                 options);
  model->eval();
  return model;
}

}  // namespace runner::eval
