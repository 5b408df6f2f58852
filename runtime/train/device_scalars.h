// Numbers the host decides once per step (learning rates, EMA weights), mirrored on the device with one copy.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>

#include <cstddef>
#include <optional>
#include <vector>

namespace runner::train {

// float32 values for kernels that read them on the device instead of taking them in their launch (the
// capturable optimizer's learning rates, the EMA's update weights). write() puts them into a small host tensor
// (pinned on CUDA) and copies it to one device tensor with a single non_blocking copy on the current stream.
// The device tensor keeps its storage, so the views of element() stay valid and a CUDA graph that reads them
// reads each step's values. Before the host tensor is overwritten, write() waits for the previous copy if it is
// still pending (an event recorded after it; a step later it practically never is). While the current stream is
// being captured into a CUDA graph, write() neither waits nor records: the captured copy reads the host tensor
// when the graph replays, so a caller writes before each replay, once the previous replay's copy has run. On
// the CPU the host and the device tensor are one plain tensor.
//
// Example:
//   DeviceScalars scalars(2, device);
//   scalars.write({lr, 1 - decay});
//   optimizer.set_lr(0, lr, scalars.element(0));
class DeviceScalars {
 public:
  DeviceScalars() = default;  // holds nothing
  DeviceScalars(std::size_t count, c10::Device device);

  bool defined() const { return values_.defined(); }
  std::size_t size() const { return elements_.size(); }
  // Writes `values` (size() of them, else std::invalid_argument), rounded to float32, and starts the copy.
  void write(const std::vector<double>& values);
  const at::Tensor& values() const { return values_; }                                // float32 [size()] on the device
  const at::Tensor& element(std::size_t index) const { return elements_.at(index); }  // 0-dim view of values()

 private:
  at::Tensor host_, values_;
  std::vector<at::Tensor> elements_;
  std::optional<c10::Event> copied_;  // recorded after the latest copy (off the CPU)
};

}  // namespace runner::train
