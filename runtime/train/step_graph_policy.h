// Whether a trainer's step runs as a CUDA graph (runner.trainer's `graph`): the one decision, made per step, and the
// graphs it keeps, one per batch signature, warmed up, captured, then replayed. The trainer carries the decision
// out; capture and replay themselves are cuda_graph_recorder.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "runtime/train/objective.h"
#include "runtime/train/cuda_graph_recorder.h"

namespace runner::train {

// Whether steps run as CUDA graphs: off (false); on (true: a step that cannot be captured is an error that says
// why); automatic ("auto": such a step runs eagerly and the reason is logged once; off the GPU every step does).
enum class GraphMode { off, on, automatic };
// "true", "false" (a config key declared graph = "auto" takes graph=true from the command line as the string "true")
// or "auto"; std::invalid_argument naming the choices otherwise.
GraphMode parse_graph_mode(const std::string& name);

// What graph capture has done so far (train:graphs()).
struct GraphStatus {
  std::int64_t captured = 0;                // captures made (one per batch signature, again after a restore)
  std::int64_t replayed = 0;                // steps replayed from a graph
  std::optional<std::string> eager_reason;  // why steps run eagerly under GraphMode::automatic; nullopt if none did
};

class StepGraphPolicy {
 public:
  // Eager steps of a batch signature before its graph is captured.
  static constexpr std::int64_t kWarmupSteps = 2;
  // The batch signatures a trainer keeps graphs for; steps of further ones run eagerly.
  static constexpr std::size_t kMaxGraphs = 8;

  // The graph of one batch signature, with the buffers its batch is copied into.
  struct Graph {
    std::size_t id = 0;
    std::int64_t warmups = 0;
    bool recorded = false;  // captured: later steps replay it
    StepBatch inputs;       // on the device: what the graph reads
    at::Tensor report;      // float32 [2 + micro-batches + norms]: loss, grad norm, micro-batch losses, gradient norms
    std::int64_t micro = 0;
  };

  enum class Run {
    eager,    // as any step
    warmup,   // eagerly, on the graphs' side stream (graph: the signature's)
    capture,  // captured into `graph`, then replayed
    replay,   // `graph` replayed
  };
  struct Decision {
    Run run = Run::eager;
    Graph* graph = nullptr;
  };

  // `device_blocker`: what stops graphs whatever the objective (not a CUDA device, data parallel, an optimizer
  // that cannot be captured), or nullopt. Throws std::invalid_argument with GraphMode::on and a blocker.
  StepGraphPolicy(GraphMode mode, c10::Device device, std::optional<std::string> device_blocker);
  ~StepGraphPolicy();
  StepGraphPolicy(const StepGraphPolicy&) = delete;
  StepGraphPolicy& operator=(const StepGraphPolicy&) = delete;

  // How the next step runs: `objective` is nullptr for a step of a loss function; `signature` names the prepared
  // batch's tensors and how the EMAs update (steps of one signature share a graph). A step inside a capture the
  // caller makes (`stream_capturing`) runs as it is called. With GraphMode::on a step that cannot be a graph
  // throws std::invalid_argument saying why; with automatic the reason is logged once and the step runs eagerly.
  Decision decide(const Objective* objective, const std::string& signature, bool stream_capturing);
  // A capture of `graph` failed: it is forgotten (the next step of its signature warms up again).
  void forget(const Graph& graph);
  void count_capture() { ++status_.captured; }
  void count_replay() { ++status_.replayed; }
  // Drops every graph (a restore's new optimizer state, a new objective).
  void clear();

  GraphMode mode() const { return mode_; }
  const GraphStatus& status() const { return status_; }
  CudaGraphRecorder& recorder() { return *recorder_; }

 private:
  void note_eager(const std::string& reason);

  GraphMode mode_;
  c10::Device device_;
  std::unique_ptr<CudaGraphRecorder> recorder_;  // when nothing stops graphs on this device
  std::map<std::string, Graph> by_signature_;
  std::size_t next_id_ = 0;
  GraphStatus status_;
};

// The signature of a prepared batch: its tensors' names, dtypes and shapes.
std::string batch_signature(const StepBatch& batch);

}  // namespace runner::train
