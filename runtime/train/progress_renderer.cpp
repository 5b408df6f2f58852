// Progress lines of the training loop: rates over a sliding window, ETA, terminal redraw or plain lines.
#include "runtime/train/progress_renderer.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "runtime/core/duration_text.h"
#include "runtime/core/open_line.h"
#include "runtime/core/terminal_text.h"

namespace runner::train {
namespace {

constexpr double kRateWindowSeconds = 10.0;
constexpr size_t kRateMinSteps = 5;
constexpr size_t kRateMaxSteps = 512;

std::string format_value(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  const double magnitude = std::fabs(value);
  if (magnitude != 0 && (magnitude < 1e-3 || magnitude >= 1e5)) return fmt::format("{:.3e}", value);
  return fmt::format("{:.4f}", value);
}

}  // namespace

std::string format_eta(double seconds) { return core::duration_text(seconds); }

std::string format_memory(double bytes) {
  const double mib = bytes / (1024.0 * 1024.0);
  if (mib < 1024) return fmt::format("{:.0f} MiB", mib);
  return fmt::format("{:.1f} GiB", mib / 1024.0);
}

ProgressRenderer::ProgressRenderer(ProgressOptions options, double start_seconds, std::FILE* out)
    : options_(options), out_(out), start_(start_seconds), previous_time_(start_seconds) {}

void ProgressRenderer::observe(int64_t step, double now) {
  if (first_step_ < 0) {
    // The first step carries the start-up (allocation, autotuning, the loader's first batches): rates are
    // measured from its end.
    first_step_ = step;
    previous_step_ = step;
    previous_time_ = now;
    return;
  }
  if (step <= previous_step_) return;
  recent_.push_back({now, (now - previous_time_) / static_cast<double>(step - previous_step_)});
  previous_step_ = step;
  previous_time_ = now;
  while (recent_.size() > kRateMaxSteps ||
         (recent_.size() > kRateMinSteps && recent_.front().end < now - kRateWindowSeconds))
    recent_.pop_front();
  std::vector<double> seconds;
  seconds.reserve(recent_.size());
  for (const StepTime& t : recent_) seconds.push_back(t.seconds);
  auto middle = seconds.begin() + static_cast<std::ptrdiff_t>(seconds.size() / 2);
  std::nth_element(seconds.begin(), middle, seconds.end());
  double median = *middle;
  if (seconds.size() % 2 == 0) median = (median + *std::max_element(seconds.begin(), middle)) / 2;
  rate_ = median > 0 ? 1.0 / median : 0.0;
}

std::string ProgressRenderer::render(const ProgressSnapshot& snapshot, double now_seconds) const {
  std::string line;
  if (options_.total_steps > 0) {
    const int digits = static_cast<int>(std::to_string(options_.total_steps).size());
    line = fmt::format("step {:>{}}/{} {:3.0f}%", snapshot.step, digits, options_.total_steps,
                       100.0 * static_cast<double>(snapshot.step) / static_cast<double>(options_.total_steps));
  } else {
    line = fmt::format("step {}", snapshot.step);
  }
  for (const auto& [name, value] : snapshot.values)
    line += fmt::format("  {} {}", core::terminal_text(name, core::TextLines::escaped), format_value(value));
  if (snapshot.lr) line += fmt::format("  lr {:.2e}", *snapshot.lr);
  if (rate_ > 0) {
    line += rate_ >= 1 ? fmt::format("  {:.2f} it/s", rate_) : fmt::format("  {:.2f} s/it", 1.0 / rate_);
    if (options_.batch > 0) line += fmt::format("  {:.0f} img/s", rate_ * static_cast<double>(options_.batch));
    if (options_.total_steps > snapshot.step)
      line += "  ETA " + core::duration_text(static_cast<double>(options_.total_steps - snapshot.step) / rate_);
  }
  line += "  elapsed " + core::duration_text(now_seconds - start_);
  if (snapshot.memory_bytes) line += "  mem " + format_memory(*snapshot.memory_bytes);
  if (!options_.sharding.empty()) line += "  " + options_.sharding;
  return line;
}

void ProgressRenderer::emit(const std::string& text, bool final) {
  if (!options_.terminal) {
    std::fprintf(out_, "%s\n", text.c_str());
  } else {
    if (!core::has_open_line(out_)) drawn_width_ = 0;  // other output ended the line: start a new one
    std::string line = text;
    if (options_.width > 0 && line.size() > static_cast<size_t>(options_.width))
      line.resize(static_cast<size_t>(options_.width));
    // Pad over what the previous, longer line left on screen.
    const size_t pad = drawn_width_ > line.size() ? drawn_width_ - line.size() : 0;
    std::fprintf(out_, "\r%s%s%s", line.c_str(), std::string(pad, ' ').c_str(), final ? "\n" : "");
    drawn_width_ = final ? 0 : line.size();
    core::set_open_line(final ? nullptr : out_);
  }
  std::fflush(out_);
}

bool ProgressRenderer::tick(int64_t step, double now_seconds) {
  observe(step, now_seconds);
  const double interval = options_.terminal ? options_.redraw_seconds : options_.line_seconds;
  const bool first = last_shown_ < -1e299;
  const bool last = options_.total_steps > 0 && step >= options_.total_steps;
  return first || last || now_seconds - last_shown_ >= interval;
}

bool ProgressRenderer::update(const ProgressSnapshot& snapshot, double now_seconds) {
  if (!tick(snapshot.step, now_seconds)) return false;
  show(snapshot, now_seconds);
  return true;
}

void ProgressRenderer::show(const ProgressSnapshot& snapshot, double now_seconds) {
  last_shown_ = now_seconds;
  shown_step_ = snapshot.step;
  emit(render(snapshot, now_seconds), false);
}

void ProgressRenderer::finish(const ProgressSnapshot& snapshot, double now_seconds) {
  observe(snapshot.step, now_seconds);
  if (!options_.terminal && shown_step_ == snapshot.step) return;  // that line is already printed
  emit(render(snapshot, now_seconds), true);
}

}  // namespace runner::train
