// Tests for runner::core::format_tensor against torch 2.11's repr.
#include "runtime/core/tensor_format.h"
#include "tests/cpp/cuda_skip.h"

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <vector>

using runner::core::format_tensor;
using runner::core::TensorFormatOptions;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Names the dims of t; nullptr leaves a dim unnamed (Python's None).
at::Tensor with_names(const at::Tensor& t, std::initializer_list<const char*> names) {
  std::vector<at::Dimname> dimnames;
  for (const char* name : names)
    dimnames.push_back(name ? at::Dimname::fromSymbol(at::Symbol::dimname(name)) : at::Dimname::wildcard());
  return t.rename(at::DimnameList(dimnames));
}

}  // namespace

// The expected strings below were taken from torch 2.11's repr() of the tensors named in the comments
// (with torch.set_printoptions where noted), then given the Lua spellings: dtype=float64 for
// dtype=torch.float64, requires_grad=true, and true/false for boolean elements.

TEST_CASE("format_tensor: integers", "[tensor_format]") {
  // torch.arange(10)
  CHECK(format_tensor(at::arange(10)) == "tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])");
  // torch.tensor([-5, 10, -100, 7])
  CHECK(format_tensor(at::tensor({-5, 10, -100, 7}, at::kLong)) == "tensor([  -5,   10, -100,    7])");
  // torch.tensor([[1, -20], [300, 4]])
  CHECK(format_tensor(at::tensor({1, -20, 300, 4}, at::kLong).reshape({2, 2})) ==
        "tensor([[  1, -20],\n"
        "        [300,   4]])");
}

TEST_CASE("format_tensor: fixed point", "[tensor_format]") {
  // torch.tensor([1.5, -2.25, 3.14159, 100.0])
  CHECK(format_tensor(at::tensor({1.5, -2.25, 3.14159, 100.0}, at::kFloat)) ==
        "tensor([  1.5000,  -2.2500,   3.1416, 100.0000])");
  // torch.tensor([-1.5, 0.25, -0.125])
  CHECK(format_tensor(at::tensor({-1.5, 0.25, -0.125}, at::kFloat)) == "tensor([-1.5000,  0.2500, -0.1250])");
  // torch.arange(6.)
  CHECK(format_tensor(at::arange(6.0)) == "tensor([0., 1., 2., 3., 4., 5.])");
  // torch.tensor([-0., 1.])
  CHECK(format_tensor(at::tensor({-0.0, 1.0}, at::kFloat)) == "tensor([-0., 1.])");
  // torch.tensor([0., 0.])
  CHECK(format_tensor(at::zeros({2})) == "tensor([0., 0.])");
  // torch.tensor([0.1, 0.2, 0.3]) * 3
  CHECK(format_tensor(at::tensor({0.1, 0.2, 0.3}, at::kFloat) * 3) == "tensor([0.3000, 0.6000, 0.9000])");
}

TEST_CASE("format_tensor: scientific", "[tensor_format]") {
  // torch.tensor([1e-5, 1.0, 123456.0])
  CHECK(format_tensor(at::tensor({1e-5, 1.0, 123456.0}, at::kFloat)) == "tensor([1.0000e-05, 1.0000e+00, 1.2346e+05])");
  // torch.tensor([1e10, -2.0])
  CHECK(format_tensor(at::tensor({1e10, -2.0}, at::kFloat)) == "tensor([ 1.0000e+10, -2.0000e+00])");
  // torch.tensor([0.00001])
  CHECK(format_tensor(at::tensor({0.00001}, at::kFloat)) == "tensor([1.0000e-05])");
  // torch.tensor([1e9, 3e9])
  CHECK(format_tensor(at::tensor({1e9, 3e9}, at::kFloat)) == "tensor([1.0000e+09, 3.0000e+09])");
  // torch.tensor([123456789., 1.])
  CHECK(format_tensor(at::tensor({123456789.0, 1.0}, at::kFloat)) == "tensor([1.2346e+08, 1.0000e+00])");
  // torch.tensor([[0., 1e-7], [2.5, -1e3]])
  CHECK(format_tensor(at::tensor({0.0, 1e-7, 2.5, -1e3}, at::kFloat).reshape({2, 2})) ==
        "tensor([[ 0.0000e+00,  1.0000e-07],\n"
        "        [ 2.5000e+00, -1.0000e+03]])");
}

TEST_CASE("format_tensor: nan and inf", "[tensor_format]") {
  // torch.tensor([nan, inf, -inf, 1.5])
  CHECK(format_tensor(at::tensor({kNaN, kInf, -kInf, 1.5}, at::kFloat)) == "tensor([   nan,    inf,   -inf, 1.5000])");
  // torch.tensor([1., nan, -inf, 100.])
  CHECK(format_tensor(at::tensor({1.0, kNaN, -kInf, 100.0}, at::kFloat)) == "tensor([  1.,  nan, -inf, 100.])");
  // torch.tensor([nan, nan])
  CHECK(format_tensor(at::tensor({kNaN, kNaN}, at::kFloat)) == "tensor([nan, nan])");
  // torch.tensor([-inf, inf])
  CHECK(format_tensor(at::tensor({-kInf, kInf}, at::kFloat)) == "tensor([-inf, inf])");
  // torch.tensor([1e-6, nan, inf])
  CHECK(format_tensor(at::tensor({1e-6, kNaN, kInf}, at::kFloat)) == "tensor([1.0000e-06,        nan,        inf])");
  // torch.tensor([-nan, 2.])
  CHECK(format_tensor(at::tensor({-kNaN, 2.0}, at::kFloat)) == "tensor([nan, 2.])");
}

TEST_CASE("format_tensor: booleans", "[tensor_format]") {
  // torch.tensor([True, False, True])
  CHECK(format_tensor(at::tensor({1, 0, 1}).to(at::kBool)) == "tensor([ true, false,  true])");
  // torch.tensor([[True, True], [True, True]])
  CHECK(format_tensor(at::ones({2, 2}, at::kBool)) ==
        "tensor([[true, true],\n"
        "        [true, true]])");
}

TEST_CASE("format_tensor: zero-dim", "[tensor_format]") {
  // torch.tensor(3.)
  CHECK(format_tensor(at::scalar_tensor(3.0, at::kFloat)) == "tensor(3.)");
  // torch.tensor(7)
  CHECK(format_tensor(at::scalar_tensor(7, at::kLong)) == "tensor(7)");
  // torch.tensor(-2.5)
  CHECK(format_tensor(at::scalar_tensor(-2.5, at::kFloat)) == "tensor(-2.5000)");
  // torch.tensor(True)
  CHECK(format_tensor(at::scalar_tensor(true, at::kBool)) == "tensor(true)");
  // torch.tensor(nan)
  CHECK(format_tensor(at::scalar_tensor(kNaN, at::kFloat)) == "tensor(nan)");
  // torch.tensor(1e-8)
  CHECK(format_tensor(at::scalar_tensor(1e-8, at::kFloat)) == "tensor(1.0000e-08)");
  // torch.tensor(0.1, dtype=torch.float64)
  CHECK(format_tensor(at::scalar_tensor(0.1, at::kDouble)) == "tensor(0.1000, dtype=float64)");
}

TEST_CASE("format_tensor: empty", "[tensor_format]") {
  // torch.empty(0)
  CHECK(format_tensor(at::empty({0})) == "tensor([])");
  // torch.zeros(0, 3)
  CHECK(format_tensor(at::zeros({0, 3})) == "tensor([], size=(0, 3))");
  // torch.zeros(0, dtype=torch.int64)
  CHECK(format_tensor(at::zeros({0}, at::kLong)) == "tensor([], dtype=int64)");
  // torch.zeros(2, 0, dtype=torch.bool)
  CHECK(format_tensor(at::zeros({2, 0}, at::kBool)) == "tensor([], size=(2, 0), dtype=bool)");
  // torch.zeros(0, dtype=torch.float64)
  CHECK(format_tensor(at::zeros({0}, at::kDouble)) == "tensor([], dtype=float64)");
}

TEST_CASE("format_tensor: two-dim", "[tensor_format]") {
  // torch.arange(12.).reshape(3, 4) / 4
  CHECK(format_tensor(at::arange(12.0).reshape({3, 4}) / 4) ==
        "tensor([[0.0000, 0.2500, 0.5000, 0.7500],\n"
        "        [1.0000, 1.2500, 1.5000, 1.7500],\n"
        "        [2.0000, 2.2500, 2.5000, 2.7500]])");
  // torch.arange(6.).reshape(2, 3).t()
  CHECK(format_tensor(at::arange(6.0).reshape({2, 3}).t()) ==
        "tensor([[0., 3.],\n"
        "        [1., 4.],\n"
        "        [2., 5.]])");
  // torch.ones(1, 1)
  CHECK(format_tensor(at::ones({1, 1})) == "tensor([[1.]])");
}

TEST_CASE("format_tensor: higher-dim", "[tensor_format]") {
  // torch.arange(24).reshape(2, 3, 4)
  CHECK(format_tensor(at::arange(24).reshape({2, 3, 4})) ==
        "tensor([[[ 0,  1,  2,  3],\n"
        "         [ 4,  5,  6,  7],\n"
        "         [ 8,  9, 10, 11]],\n"
        "\n"
        "        [[12, 13, 14, 15],\n"
        "         [16, 17, 18, 19],\n"
        "         [20, 21, 22, 23]]])");
  // torch.arange(16.).reshape(2, 2, 2, 2) - 8
  CHECK(format_tensor(at::arange(16.0).reshape({2, 2, 2, 2}) - 8) ==
        "tensor([[[[-8., -7.],\n"
        "          [-6., -5.]],\n"
        "\n"
        "         [[-4., -3.],\n"
        "          [-2., -1.]]],\n"
        "\n"
        "\n"
        "        [[[ 0.,  1.],\n"
        "          [ 2.,  3.]],\n"
        "\n"
        "         [[ 4.,  5.],\n"
        "          [ 6.,  7.]]]])");
  // torch.arange(3.).reshape(1, 3, 1)
  CHECK(format_tensor(at::arange(3.0).reshape({1, 3, 1})) ==
        "tensor([[[0.],\n"
        "         [1.],\n"
        "         [2.]]])");
}

TEST_CASE("format_tensor: summarized", "[tensor_format]") {
  // torch.arange(2000.).reshape(40, 50)
  CHECK(format_tensor(at::arange(2000.0).reshape({40, 50})) ==
        "tensor([[0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 4.7000e+01, 4.8000e+01,\n"
        "         4.9000e+01],\n"
        "        [5.0000e+01, 5.1000e+01, 5.2000e+01,  ..., 9.7000e+01, 9.8000e+01,\n"
        "         9.9000e+01],\n"
        "        [1.0000e+02, 1.0100e+02, 1.0200e+02,  ..., 1.4700e+02, 1.4800e+02,\n"
        "         1.4900e+02],\n"
        "        ...,\n"
        "        [1.8500e+03, 1.8510e+03, 1.8520e+03,  ..., 1.8970e+03, 1.8980e+03,\n"
        "         1.8990e+03],\n"
        "        [1.9000e+03, 1.9010e+03, 1.9020e+03,  ..., 1.9470e+03, 1.9480e+03,\n"
        "         1.9490e+03],\n"
        "        [1.9500e+03, 1.9510e+03, 1.9520e+03,  ..., 1.9970e+03, 1.9980e+03,\n"
        "         1.9990e+03]])");
  // torch.arange(2000)
  CHECK(format_tensor(at::arange(2000)) == "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
  // torch.arange(1400.).reshape(7, 2, 100) / 7
  CHECK(format_tensor(at::arange(1400.0).reshape({7, 2, 100}) / 7) ==
        "tensor([[[0.0000e+00, 1.4286e-01, 2.8571e-01,  ..., 1.3857e+01,\n"
        "          1.4000e+01, 1.4143e+01],\n"
        "         [1.4286e+01, 1.4429e+01, 1.4571e+01,  ..., 2.8143e+01,\n"
        "          2.8286e+01, 2.8429e+01]],\n"
        "\n"
        "        [[2.8571e+01, 2.8714e+01, 2.8857e+01,  ..., 4.2429e+01,\n"
        "          4.2571e+01, 4.2714e+01],\n"
        "         [4.2857e+01, 4.3000e+01, 4.3143e+01,  ..., 5.6714e+01,\n"
        "          5.6857e+01, 5.7000e+01]],\n"
        "\n"
        "        [[5.7143e+01, 5.7286e+01, 5.7429e+01,  ..., 7.1000e+01,\n"
        "          7.1143e+01, 7.1286e+01],\n"
        "         [7.1429e+01, 7.1571e+01, 7.1714e+01,  ..., 8.5286e+01,\n"
        "          8.5429e+01, 8.5571e+01]],\n"
        "\n"
        "        ...,\n"
        "\n"
        "        [[1.1429e+02, 1.1443e+02, 1.1457e+02,  ..., 1.2814e+02,\n"
        "          1.2829e+02, 1.2843e+02],\n"
        "         [1.2857e+02, 1.2871e+02, 1.2886e+02,  ..., 1.4243e+02,\n"
        "          1.4257e+02, 1.4271e+02]],\n"
        "\n"
        "        [[1.4286e+02, 1.4300e+02, 1.4314e+02,  ..., 1.5671e+02,\n"
        "          1.5686e+02, 1.5700e+02],\n"
        "         [1.5714e+02, 1.5729e+02, 1.5743e+02,  ..., 1.7100e+02,\n"
        "          1.7114e+02, 1.7129e+02]],\n"
        "\n"
        "        [[1.7143e+02, 1.7157e+02, 1.7171e+02,  ..., 1.8529e+02,\n"
        "          1.8543e+02, 1.8557e+02],\n"
        "         [1.8571e+02, 1.8586e+02, 1.8600e+02,  ..., 1.9957e+02,\n"
        "          1.9971e+02, 1.9986e+02]]])");
  // torch.arange(1001.) * 0.001
  CHECK(format_tensor(at::arange(1001.0) * 0.001) == "tensor([0.0000, 0.0010, 0.0020,  ..., 0.9980, 0.9990, 1.0000])");
  // torch.arange(2000.).reshape(2, 1000)
  CHECK(format_tensor(at::arange(2000.0).reshape({2, 1000})) ==
        "tensor([[0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 9.9700e+02, 9.9800e+02,\n"
        "         9.9900e+02],\n"
        "        [1.0000e+03, 1.0010e+03, 1.0020e+03,  ..., 1.9970e+03, 1.9980e+03,\n"
        "         1.9990e+03]])");
}

TEST_CASE("format_tensor: wrapped rows", "[tensor_format]") {
  // torch.arange(30.) / 7
  CHECK(format_tensor(at::arange(30.0) / 7) ==
        "tensor([0.0000, 0.1429, 0.2857, 0.4286, 0.5714, 0.7143, 0.8571, 1.0000, 1.1429,\n"
        "        1.2857, 1.4286, 1.5714, 1.7143, 1.8571, 2.0000, 2.1429, 2.2857, 2.4286,\n"
        "        2.5714, 2.7143, 2.8571, 3.0000, 3.1429, 3.2857, 3.4286, 3.5714, 3.7143,\n"
        "        3.8571, 4.0000, 4.1429])");
  // torch.arange(40) * 1000
  CHECK(format_tensor(at::arange(40) * 1000) ==
        "tensor([    0,  1000,  2000,  3000,  4000,  5000,  6000,  7000,  8000,  9000,\n"
        "        10000, 11000, 12000, 13000, 14000, 15000, 16000, 17000, 18000, 19000,\n"
        "        20000, 21000, 22000, 23000, 24000, 25000, 26000, 27000, 28000, 29000,\n"
        "        30000, 31000, 32000, 33000, 34000, 35000, 36000, 37000, 38000, 39000])");
  // torch.arange(60.).reshape(2, 30) / 7
  CHECK(format_tensor(at::arange(60.0).reshape({2, 30}) / 7) ==
        "tensor([[0.0000, 0.1429, 0.2857, 0.4286, 0.5714, 0.7143, 0.8571, 1.0000, 1.1429,\n"
        "         1.2857, 1.4286, 1.5714, 1.7143, 1.8571, 2.0000, 2.1429, 2.2857, 2.4286,\n"
        "         2.5714, 2.7143, 2.8571, 3.0000, 3.1429, 3.2857, 3.4286, 3.5714, 3.7143,\n"
        "         3.8571, 4.0000, 4.1429],\n"
        "        [4.2857, 4.4286, 4.5714, 4.7143, 4.8571, 5.0000, 5.1429, 5.2857, 5.4286,\n"
        "         5.5714, 5.7143, 5.8571, 6.0000, 6.1429, 6.2857, 6.4286, 6.5714, 6.7143,\n"
        "         6.8571, 7.0000, 7.1429, 7.2857, 7.4286, 7.5714, 7.7143, 7.8571, 8.0000,\n"
        "         8.1429, 8.2857, 8.4286]])");
}

TEST_CASE("format_tensor: dtype suffixes", "[tensor_format]") {
  // torch.tensor([1.5, 2.], dtype=torch.float64)
  CHECK(format_tensor(at::tensor({1.5, 2.0}, at::kDouble)) == "tensor([1.5000, 2.0000], dtype=float64)");
  // torch.arange(3, dtype=torch.float64)
  CHECK(format_tensor(at::arange(3, at::kDouble)) == "tensor([0., 1., 2.], dtype=float64)");
  // torch.tensor([0.1, 1000.5, -3.]).half()
  CHECK(format_tensor(at::tensor({0.1, 1000.5, -3.0}, at::kFloat).to(at::kHalf)) ==
        "tensor([ 9.9976e-02,  1.0005e+03, -3.0000e+00], dtype=float16)");
  // torch.tensor([0.1, 1000.5, -3.]).bfloat16()
  CHECK(format_tensor(at::tensor({0.1, 1000.5, -3.0}, at::kFloat).to(at::kBFloat16)) ==
        "tensor([ 1.0010e-01,  1.0000e+03, -3.0000e+00], dtype=bfloat16)");
  // torch.arange(5, dtype=torch.int32)
  CHECK(format_tensor(at::arange(5, at::kInt)) == "tensor([0, 1, 2, 3, 4], dtype=int32)");
  // torch.tensor([1, 2, 250], dtype=torch.uint8)
  CHECK(format_tensor(at::tensor({1, 2, 250}, at::kByte)) == "tensor([  1,   2, 250], dtype=uint8)");
  // torch.tensor([-128, 5], dtype=torch.int8)
  CHECK(format_tensor(at::tensor({-128, 5}, at::kChar)) == "tensor([-128,    5], dtype=int8)");
  // torch.tensor([0.5, 2, -448], dtype=torch.float8_e4m3fn)
  CHECK(format_tensor(at::tensor({0.5, 2.0, -448.0}, at::kDouble).to(at::kFloat8_e4m3fn)) ==
        "tensor([   0.5000,    2.0000, -448.0000], dtype=float8_e4m3fn)");
  // torch.arange(2000.).to(torch.float8_e5m2)
  CHECK(format_tensor(at::arange(2000.0).to(at::kFloat8_e5m2)) ==
        "tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 2.0480e+03, 2.0480e+03,\n"
        "        2.0480e+03], dtype=float8_e5m2)");
  // torch.arange(8, dtype=torch.float64) / 3
  CHECK(format_tensor(at::arange(8, at::kDouble) / 3) ==
        "tensor([0.0000, 0.3333, 0.6667, 1.0000, 1.3333, 1.6667, 2.0000, 2.3333],\n"
        "       dtype=float64)");
  // torch.arange(7, dtype=torch.float64) / 3
  // dtype=float64 would fit on the first line; Python measures dtype=torch.float64 and breaks.
  CHECK(format_tensor(at::arange(7, at::kDouble) / 3) ==
        "tensor([0.0000, 0.3333, 0.6667, 1.0000, 1.3333, 1.6667, 2.0000],\n"
        "       dtype=float64)");
}

TEST_CASE("format_tensor: autograd suffixes", "[tensor_format]") {
  // Python turns a number operand into a 0-dim tensor, so leaf * 2 records MulBackward0 (mul.Tensor);
  // in C++ leaf * 2 would call mul.Scalar and record MulBackward1.
  const at::Tensor leaf = at::tensor({1.0, 2.0}, at::kFloat).set_requires_grad(true);
  // leaf
  CHECK(format_tensor(leaf) == "tensor([1., 2.], requires_grad=true)");
  // leaf * 2
  CHECK(format_tensor(leaf * at::scalar_tensor(2)) == "tensor([2., 4.], grad_fn=<MulBackward0>)");
  // (leaf * 2).sum()
  CHECK(format_tensor((leaf * at::scalar_tensor(2)).sum()) == "tensor(6., grad_fn=<SumBackward0>)");
  // leaf + 1
  CHECK(format_tensor(leaf + at::scalar_tensor(1)) == "tensor([2., 3.], grad_fn=<AddBackward0>)");
  // leaf[0]
  CHECK(format_tensor(leaf[0]) == "tensor(1., grad_fn=<SelectBackward0>)");
  // leaf.double() * 3
  CHECK(format_tensor(leaf.to(at::kDouble) * at::scalar_tensor(3)) ==
        "tensor([3., 6.], dtype=float64, grad_fn=<MulBackward0>)");
  // torch.zeros(0, requires_grad=True)
  CHECK(format_tensor(at::zeros({0}).set_requires_grad(true)) == "tensor([], requires_grad=true)");
  // (torch.arange(8, dtype=torch.float64, requires_grad=True) / 3)
  CHECK(format_tensor(at::arange(8, at::kDouble).set_requires_grad(true) / at::scalar_tensor(3)) ==
        "tensor([0.0000, 0.3333, 0.6667, 1.0000, 1.3333, 1.6667, 2.0000, 2.3333],\n"
        "       dtype=float64, grad_fn=<DivBackward0>)");
}

TEST_CASE("format_tensor: print options", "[tensor_format]") {
  // torch.tensor([1.12345, 2.5, 0.375])  with set_printoptions(precision=2)
  CHECK(format_tensor(at::tensor({1.12345, 2.5, 0.375}, at::kFloat), TensorFormatOptions{.precision = 2}) ==
        "tensor([1.12, 2.50, 0.38])");
  // torch.tensor([1e-5, 1.0])  with set_printoptions(precision=1)
  CHECK(format_tensor(at::tensor({1e-5, 1.0}, at::kFloat), TensorFormatOptions{.precision = 1}) ==
        "tensor([1.0e-05, 1.0e+00])");
  // torch.arange(10)  with set_printoptions(threshold=5, edgeitems=2)
  CHECK(format_tensor(at::arange(10), TensorFormatOptions{.threshold = 5, .edgeitems = 2}) ==
        "tensor([0, 1,  ..., 8, 9])");
  // torch.arange(20.)  with set_printoptions(linewidth=40)
  CHECK(format_tensor(at::arange(20.0), TensorFormatOptions{.linewidth = 40}) ==
        "tensor([ 0.,  1.,  2.,  3.,  4.,  5.,\n"
        "         6.,  7.,  8.,  9., 10., 11.,\n"
        "        12., 13., 14., 15., 16., 17.,\n"
        "        18., 19.])");
  // torch.arange(2000)  with set_printoptions(edgeitems=0)
  CHECK(format_tensor(at::arange(2000), TensorFormatOptions{.edgeitems = 0}) == "tensor([...], size=(2000,))");
  // torch.arange(24.).reshape(2, 3, 4)  with set_printoptions(edgeitems=0, threshold=10)
  CHECK(format_tensor(at::arange(24.0).reshape({2, 3, 4}), TensorFormatOptions{.threshold = 10, .edgeitems = 0}) ==
        "tensor([...], size=(2, 3, 4))");
  // torch.arange(64.).reshape(4, 4, 4)  with set_printoptions(edgeitems=1, threshold=10)
  CHECK(format_tensor(at::arange(64.0).reshape({4, 4, 4}), TensorFormatOptions{.threshold = 10, .edgeitems = 1}) ==
        "tensor([[[ 0.,  ...,  3.],\n"
        "         ...,\n"
        "         [12.,  ..., 15.]],\n"
        "\n"
        "        ...,\n"
        "\n"
        "        [[48.,  ..., 51.],\n"
        "         ...,\n"
        "         [60.,  ..., 63.]]])");
  // torch.tensor(5.)  with set_printoptions(threshold=0)
  CHECK(format_tensor(at::scalar_tensor(5.0, at::kFloat), TensorFormatOptions{.threshold = 0}) == "tensor(5.)");
}

TEST_CASE("format_tensor: special layouts", "[tensor_format]") {
  // torch.empty(2, 3, device='meta')
  CHECK(format_tensor(at::empty({2, 3}, at::device(at::kMeta))) == "tensor(..., device='meta', size=(2, 3))");
  // torch.empty(2, 3, device='meta', dtype=torch.int64)
  CHECK(format_tensor(at::empty({2, 3}, at::device(at::kMeta).dtype(at::kLong))) ==
        "tensor(..., device='meta', size=(2, 3), dtype=int64)");
  // torch.sparse_coo_tensor(torch.tensor([[0, 1, 1], [2, 0, 2]]), torch.tensor([3., 4., 5.]), (2, 3))
  CHECK(format_tensor(at::sparse_coo_tensor(at::tensor({0, 1, 1, 2, 0, 2}, at::kLong).reshape({2, 3}),
                                            at::tensor({3.0, 4.0, 5.0}, at::kFloat), {2, 3})) ==
        "tensor(indices=tensor([[0, 1, 1],\n"
        "                       [2, 0, 2]]),\n"
        "       values=tensor([3., 4., 5.]),\n"
        "       size=(2, 3), nnz=3, layout=torch.sparse_coo)");
  // torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0, dtype=torch.float64), (2, 3))
  CHECK(format_tensor(at::sparse_coo_tensor(at::zeros({2, 0}, at::kLong), at::zeros({0}, at::kDouble), {2, 3})) ==
        "tensor(indices=tensor([], size=(2, 0)),\n"
        "       values=tensor([], size=(0,)),\n"
        "       size=(2, 3), nnz=0, dtype=float64, layout=torch.sparse_coo)");
  // torch.tensor([[0., 1.5], [2., 0.]]).to_sparse_csr()
  CHECK(format_tensor(at::tensor({0.0, 1.5, 2.0, 0.0}, at::kFloat).reshape({2, 2}).to_sparse_csr()) ==
        "tensor(crow_indices=tensor([0, 1, 2]),\n"
        "       col_indices=tensor([1, 0]),\n"
        "       values=tensor([1.5000, 2.0000]), size=(2, 2), nnz=2,\n"
        "       layout=torch.sparse_csr)");
  // torch.tensor([[0., 1.5], [2., 0.]]).to_sparse_csc()
  CHECK(format_tensor(at::tensor({0.0, 1.5, 2.0, 0.0}, at::kFloat).reshape({2, 2}).to_sparse_csc()) ==
        "tensor(ccol_indices=tensor([0, 1, 2]),\n"
        "       row_indices=tensor([1, 0]),\n"
        "       values=tensor([2.0000, 1.5000]), size=(2, 2), nnz=2,\n"
        "       layout=torch.sparse_csc)");
  // torch.tensor([1., 2.]).to_mkldnn()
  CHECK(format_tensor(at::tensor({1.0, 2.0}, at::kFloat).to_mkldnn()) == "tensor([1., 2.], layout=torch._mkldnn)");
  // torch.quantize_per_tensor(torch.tensor([-1.0, 0.0, 1.0, 2.0]), 0.1, 10, torch.quint8)
  CHECK(format_tensor(at::quantize_per_tensor(at::tensor({-1.0, 0.0, 1.0, 2.0}, at::kFloat), 0.1, 10, at::kQUInt8)) ==
        "tensor([-1.,  0.,  1.,  2.], size=(4,), dtype=quint8,\n"
        "       quantization_scheme=torch.per_tensor_affine, scale=0.1, zero_point=10)");
  // torch.quantize_per_tensor(torch.tensor([300.0]), 2e-5, 0, torch.qint32)
  CHECK(format_tensor(at::quantize_per_tensor(at::tensor({300.0}, at::kFloat), 2e-5, 0, at::kQInt32)) ==
        "tensor([300.], size=(1,), dtype=qint32,\n"
        "       quantization_scheme=torch.per_tensor_affine, scale=2e-05, zero_point=0)");
  // torch.quantize_per_channel(torch.tensor([[-1.0, 0.0], [1.0, 2.0]]), torch.tensor([0.1, 0.01]),
  //                            torch.tensor([0, 1]), 0, torch.qint8)
  // Python breaks the line before zero_point= because it measures dtype=torch.float64.
  CHECK(format_tensor(at::quantize_per_channel(at::tensor({-1.0, 0.0, 1.0, 2.0}, at::kFloat).reshape({2, 2}),
                                               at::tensor({0.1, 0.01}, at::kFloat), at::tensor({0, 1}, at::kLong), 0,
                                               at::kQInt8)) ==
        "tensor([[-1.0000,  0.0000],\n"
        "        [ 1.0000,  1.2600]], size=(2, 2), dtype=qint8,\n"
        "       quantization_scheme=torch.per_channel_affine,\n"
        "       scale=tensor([0.1000, 0.0100], dtype=float64),\n"
        "       zero_point=tensor([0, 1]), axis=0)");
  // torch.zeros(2, 3, names=('N', 'C'))
  CHECK(format_tensor(with_names(at::zeros({2, 3}), {"N", "C"})) ==
        "tensor([[0., 0., 0.],\n"
        "        [0., 0., 0.]], names=('N', 'C'))");
  // torch.zeros(2, 3, names=('N', None))
  CHECK(format_tensor(with_names(at::zeros({2, 3}), {"N", nullptr})) ==
        "tensor([[0., 0., 0.],\n"
        "        [0., 0., 0.]], names=('N', None))");
  // torch.nested.nested_tensor([torch.arange(3.), torch.arange(2.)])
  CHECK(format_tensor(at::_nested_tensor_from_tensor_list({at::arange(3.0), at::arange(2.0)})) ==
        "nested_tensor([\n"
        "  tensor([0., 1., 2.]),\n"
        "  tensor([0., 1.])\n"
        "])");
  // torch.nested.nested_tensor([torch.arange(6, dtype=torch.int32).reshape(2, 3),
  //                             torch.arange(3, dtype=torch.int32).reshape(1, 3)])
  CHECK(format_tensor(at::_nested_tensor_from_tensor_list(
            {at::arange(6, at::kInt).reshape({2, 3}), at::arange(3, at::kInt).reshape({1, 3})})) ==
        "nested_tensor([\n"
        "  tensor([[0, 1, 2],\n"
        "          [3, 4, 5]], dtype=int32),\n"
        "  tensor([[0, 1, 2]], dtype=int32)\n"
        "])");
  // torch._neg_view(torch.tensor([1., -2.]))
  CHECK(format_tensor(at::_neg_view(at::tensor({1.0, -2.0}, at::kFloat))) == "tensor([-1.,  2.])");
}
TEST_CASE("format_tensor: undefined tensors and rejected input", "[tensor_format]") {
  CHECK(format_tensor(at::Tensor()) == "tensor(undefined)");
  CHECK_THROWS_WITH(format_tensor(at::zeros({2}, at::kComplexFloat)), "format_tensor: complex dtype not supported");
  CHECK_THROWS_AS(format_tensor(at::zeros({2}), TensorFormatOptions{.precision = -1}), std::invalid_argument);
  CHECK_THROWS_AS(format_tensor(at::zeros({2}), TensorFormatOptions{.edgeitems = -1}), std::invalid_argument);
}

TEST_CASE("format_tensor: CUDA tensors", "[tensor_format][cuda]") {
  SKIP_WITHOUT_CUDA("CUDA tensors are printed with their device");
  // torch.tensor([1., 2.], device='cuda')
  CHECK(format_tensor(at::tensor({1.0, 2.0}, at::kFloat).cuda()) == "tensor([1., 2.], device='cuda:0')");
  // torch.tensor([1., 2.], device='cuda', requires_grad=True) * 2
  CHECK(format_tensor(at::tensor({1.0, 2.0}, at::kFloat).cuda().set_requires_grad(true) * at::scalar_tensor(2)) ==
        "tensor([2., 4.], device='cuda:0', grad_fn=<MulBackward0>)");
  // torch.arange(2000, device='cuda')
  CHECK(format_tensor(at::arange(2000, at::device(at::kCUDA))) ==
        "tensor([   0,    1,    2,  ..., 1997, 1998, 1999], device='cuda:0')");
}
