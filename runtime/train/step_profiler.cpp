// Kineto profiling of training steps: start/stop, the trace file and the self-time table.
#include "runtime/train/step_profiler.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fmt/format.h>
#include <map>
#include <stdexcept>
#include <unordered_map>

#include "runtime/core/open_line.h"
#include "runtime/train/trainer.h"

namespace runner::train {
namespace {

namespace kineto = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

std::int64_t parse_step(const std::string& text, std::string_view part) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(part.data(), part.data() + part.size(), value);
  if (part.empty() || error != std::errc() || end != part.data() + part.size() || value < 1)
    throw std::invalid_argument(
        fmt::format("profile: '{}' is not a step range: expected A:B or A, steps from 1", text));
  return value;
}

std::set<ActivityType> activities(bool cuda) {
  std::set<ActivityType> kinds{ActivityType::CPU};
  if (cuda) kinds.insert(ActivityType::CUDA);
  return kinds;
}

ProfilerConfig config() {
  return ProfilerConfig(ProfilerState::KINETO, /*report_input_shapes=*/true, /*profile_memory=*/true);
}

bool cuda_profiled = false;  // what the running profiler records

std::vector<OperatorTime> ranked(std::unordered_map<std::string, OperatorTime>& by_name) {
  std::vector<OperatorTime> list;
  list.reserve(by_name.size());
  for (auto& [name, time] : by_name) list.push_back(std::move(time));
  std::sort(list.begin(), list.end(), [](const OperatorTime& a, const OperatorTime& b) {
    return a.self_ms != b.self_ms ? a.self_ms > b.self_ms : a.name < b.name;
  });
  return list;
}

}  // namespace

StepRange parse_step_range(const std::string& text) {
  const std::size_t colon = text.find(':');
  const std::string_view whole(text);
  StepRange range;
  range.first = parse_step(text, whole.substr(0, colon));
  range.last = colon == std::string::npos ? range.first : parse_step(text, whole.substr(colon + 1));
  if (range.last < range.first)
    throw std::invalid_argument(fmt::format("profile: '{}' ends before it starts: expected A:B with A <= B", text));
  return range;
}

void start_profiler(bool cuda) {
  if (torch::profiler::impl::profilerEnabled()) throw std::runtime_error("profile: a profiler is already running");
  kineto::prepareProfiler(config(), activities(cuda));
  kineto::enableProfiler(config(), activities(cuda));
  cuda_profiled = cuda;
}

ProfileSummary stop_profiler(const std::string& trace_path) {
  std::unique_ptr<kineto::ProfilerResult> result = kineto::disableProfiler();
  ProfileSummary summary;
  summary.trace_path = trace_path;
  summary.cuda = cuda_profiled;
  result->save(trace_path);

  // CPU operators nest (an op calls others): per thread, in start order, each event's time is taken out of
  // its innermost enclosing event's self time.
  std::map<std::uint64_t, std::vector<const kineto::KinetoEvent*>> by_thread;
  std::unordered_map<std::string, OperatorTime> cpu, kernels;
  for (const kineto::KinetoEvent& event : result->events()) {
    if (event.deviceType() == c10::DeviceType::CPU) {
      if (event.isAsync()) continue;
      by_thread[event.startThreadId()].push_back(&event);
    } else if (event.deviceType() == c10::DeviceType::CUDA) {
      OperatorTime& time = kernels[event.name()];
      time.name = event.name();
      time.self_ms += static_cast<double>(event.durationNs()) / 1e6;
      time.total_ms = time.self_ms;
      ++time.calls;
      summary.kernel_ms += static_cast<double>(event.durationNs()) / 1e6;
    }
  }
  for (auto& [thread, events] : by_thread) {
    std::sort(events.begin(), events.end(), [](const kineto::KinetoEvent* a, const kineto::KinetoEvent* b) {
      return a->startNs() != b->startNs() ? a->startNs() < b->startNs() : a->endNs() > b->endNs();
    });
    std::vector<std::pair<const kineto::KinetoEvent*, double>> open;  // enclosing events and their self time
    auto close = [&](std::size_t keep) {
      while (open.size() > keep) {
        const auto& [event, self_ms] = open.back();
        OperatorTime& time = cpu[event->name()];
        time.name = event->name();
        time.self_ms += self_ms;
        time.total_ms += static_cast<double>(event->durationNs()) / 1e6;
        ++time.calls;
        summary.cpu_self_ms += self_ms;
        open.pop_back();
      }
    };
    for (const kineto::KinetoEvent* event : events) {
      std::size_t keep = open.size();
      while (keep > 0 && open[keep - 1].first->endNs() <= event->startNs()) --keep;
      close(keep);
      const double duration_ms = static_cast<double>(event->durationNs()) / 1e6;
      if (!open.empty()) open.back().second -= duration_ms;
      open.emplace_back(event, duration_ms);
    }
    close(0);
  }
  summary.cpu = ranked(cpu);
  summary.kernels = ranked(kernels);
  return summary;
}

std::string format_profile(const ProfileSummary& summary, std::size_t rows) {
  auto table = [rows](const std::vector<OperatorTime>& list, double total, const char* title, bool nested) {
    std::string text = fmt::format("{:<48} {:>11} {:>7} {:>11} {:>7}\n", title, "self ms", "self %",
                                   nested ? "total ms" : "", "calls");
    for (std::size_t i = 0; i < std::min(rows, list.size()); ++i) {
      const OperatorTime& op = list[i];
      std::string name = op.name;
      if (name.size() > 48) name.replace(45, std::string::npos, "...");
      text += fmt::format("{:<48} {:>11.3f} {:>6.1f}% {:>11} {:>7}\n", name, op.self_ms,
                          total > 0 ? 100 * op.self_ms / total : 0.0,
                          nested ? fmt::format("{:.3f}", op.total_ms) : std::string(), op.calls);
    }
    return text;
  };
  std::string text = table(summary.cpu, summary.cpu_self_ms, "CPU operator", true);
  text += fmt::format("CPU self time in all operators: {:.3f} ms\n", summary.cpu_self_ms);
  if (summary.cuda) {
    text += table(summary.kernels, summary.kernel_ms, "CUDA kernel", false);
    text += fmt::format("CUDA kernel time: {:.3f} ms\n", summary.kernel_ms);
  }
  return text;
}

ProfiledSteps::ProfiledSteps(StepRange range, c10::Device device, int rank, int world_size,
                             std::function<ProfileOutput()> output)
    : range_(range), device_(device), rank_(rank), world_size_(world_size), output_(std::move(output)) {}

void ProfiledSteps::before_step(const StepStart& start) {
  if (start.step != range_.first || running_) return;
  start_profiler(device_.is_cuda());
  running_ = true;
}

void ProfiledSteps::after_step(const StepResult& result) {
  if (!running_ || result.step != range_.last) return;
  running_ = false;
  if (device_.is_cuda()) at::detail::getCUDAHooks().deviceSynchronize(device_.has_index() ? device_.index() : 0);
  const ProfileOutput output = output_ ? output_() : ProfileOutput{};
  const std::string name = fmt::format("profile-steps-{}-{}{}.json", range_.first, range_.last,
                                       world_size_ > 1 ? fmt::format("-rank{}", rank_) : std::string());
  const std::string path = output.directory.empty() ? name : output.directory + "/" + name;
  const ProfileSummary summary = stop_profiler(path);
  if (output.record) output.record(name, range_.last);
  if (rank_ != 0) return;
  core::end_open_line();
  std::printf("profile of steps %lld-%lld: %s\n%s\n", static_cast<long long>(range_.first),
              static_cast<long long>(range_.last), path.c_str(), format_profile(summary, 15).c_str());
  std::fflush(stdout);
}

}  // namespace runner::train
