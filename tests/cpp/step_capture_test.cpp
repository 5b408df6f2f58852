// On a CUDA device: a whole diffusion training step captured in a throwaway CUDA graph, so that anything in
// the step that waits for the device or reads a value back fails loudly.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <cmath>

#include "tests/cpp/cuda_graph_capture.h"
#include "tests/cpp/cuda_skip.h"
#include "tests/cpp/small_diffusion_trainer.h"

#if RUNNER_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace {

using namespace runner;

}  // namespace

TEST_CASE("a diffusion step on CUDA captures in a CUDA graph: nothing in it waits for the device", "[train][cuda]") {
  SKIP_WITHOUT_CUDA("capturing a training step in a CUDA graph");
#if RUNNER_WITH_CUDA
  const c10::Device cuda(c10::kCUDA, 0);
  testing::SmallDiffusionTrainer setup(cuda, train::GraphMode::off, /*accumulate=*/2, {}, /*amp=*/"auto");
  train::Trainer& trainer = *setup.trainer;
  const train::StepBatch batch = testing::batch(cuda, 0);

  // Warm-up steps on a side stream (allocator pools, cuBLAS handles, optimizer state), as torch.cuda.graphs asks.
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  {
    c10::cuda::CUDAStreamGuard guard(side);
    for (int i = 0; i < 3; ++i) trainer.step(batch);
  }
  side.synchronize();
  const float before = trainer.step(batch).loss.item<float>();
  CHECK(std::isfinite(before));

  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    testing::capture_into(graph, [&] { trainer.step(batch); });
  }
  graph.replay();
  side.synchronize();
  CHECK(std::isfinite(trainer.step(batch).loss.item<float>()));
#else
  FAIL(
      "a CUDA device is present but this test was compiled without RUNNER_WITH_CUDA (tests/CMakeLists.txt sets it "
      "where LibTorch has CUDA): the capture is not checked");
#endif
}
