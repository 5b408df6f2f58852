// The training progress line: its text, rates and ETA, plain periodic lines and terminal redraws.
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#include "runtime/train/progress_renderer.h"
#include "runtime/core/open_line.h"

using namespace runner::train;

namespace {

// Everything written to a temporary FILE*.
std::string written(std::FILE* file) {
  std::fflush(file);
  std::rewind(file);
  std::string text;
  char buffer[4096];
  size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof buffer, file)) > 0) text.append(buffer, got);
  return text;
}

ProgressSnapshot at_step(int64_t step) { return {step, {{"loss", 0.5}}, 1e-3, 1.5 * 1024 * 1024 * 1024}; }

}  // namespace

TEST_CASE("plain progress lines come at the first step, periodically and at the end", "[progress]") {
  std::FILE* file = std::tmpfile();
  ProgressOptions options;
  options.total_steps = 100;
  options.batch = 64;
  options.line_seconds = 3.0;
  ProgressRenderer display(options, 0.0, file);
  // 0.125 s per step (exact in binary): 8 it/s.
  for (int64_t step = 1; step <= 100; ++step) display.update(at_step(step), 0.125 * static_cast<double>(step));
  display.finish(at_step(100), 12.5);
  const std::string text = written(file);
  std::fclose(file);
  CHECK(text ==
        "step   1/100   1%  loss 0.5000  lr 1.00e-03  elapsed 0s  mem 1.5 GiB\n"
        "step  25/100  25%  loss 0.5000  lr 1.00e-03  8.00 it/s  512 img/s  ETA 9s  elapsed 3s  mem 1.5 GiB\n"
        "step  49/100  49%  loss 0.5000  lr 1.00e-03  8.00 it/s  512 img/s  ETA 6s  elapsed 6s  mem 1.5 GiB\n"
        "step  73/100  73%  loss 0.5000  lr 1.00e-03  8.00 it/s  512 img/s  ETA 3s  elapsed 9s  mem 1.5 GiB\n"
        "step  97/100  97%  loss 0.5000  lr 1.00e-03  8.00 it/s  512 img/s  ETA 0s  elapsed 12s  mem 1.5 GiB\n"
        "step 100/100 100%  loss 0.5000  lr 1.00e-03  8.00 it/s  512 img/s  elapsed 13s  mem 1.5 GiB\n");
}

TEST_CASE("the rate follows the recent past and a resumed run counts from its first step", "[progress]") {
  ProgressOptions options;
  options.total_steps = 1000;
  ProgressRenderer display(options, 100.0, std::tmpfile());
  display.update(at_step(501), 130.5);  // resumed at step 500: the first step carries 30 s of start-up
  CHECK(display.steps_per_second() == 0.0);
  display.update(at_step(502), 131.0);
  CHECK(display.steps_per_second() == Approx(2.0));
  for (int64_t step = 503; step <= 530; ++step)
    display.update(at_step(step), 130.5 + 0.5 * static_cast<double>(step - 501));
  CHECK(display.steps_per_second() == Approx(2.0));
  // Once the window holds mostly slower steps, they show.
  for (int64_t step = 531; step <= 540; ++step)
    display.update(at_step(step), 145.0 + 2.0 * static_cast<double>(step - 530));
  CHECK(display.steps_per_second() == Approx(10.0 / 20.0).epsilon(0.2));
  CHECK_THAT(display.render(at_step(540), 165.0), Catch::Matchers::Contains("s/it"));
}

TEST_CASE("a step that also sampled or evaluated does not slow the rate", "[progress]") {
  ProgressOptions options;
  options.total_steps = 100;
  ProgressRenderer display(options, 0.0, std::tmpfile());
  double now = 0;
  for (int64_t step = 1; step <= 40; ++step) {
    now += step == 1 ? 5.0 : (step == 21 ? 0.25 + 30.0 : 0.25);  // step 21 follows 30 s of sampling
    display.update(at_step(step), now);
    if (step >= 3) CHECK(display.steps_per_second() == Approx(4.0));
  }
  CHECK_THAT(display.render(at_step(40), now),
             Catch::Matchers::Contains("4.00 it/s") && Catch::Matchers::Contains("ETA 15s"));
}

TEST_CASE("a terminal line is redrawn in place, padded over a longer one, and ended at the finish", "[progress]") {
  std::FILE* file = std::tmpfile();
  ProgressOptions options;
  options.terminal = true;
  options.redraw_seconds = 0.0;
  ProgressRenderer display(options, 0.0, file);
  display.update({1, {{"loss", 123.25}}, std::nullopt, std::nullopt}, 1.0);
  display.update({2, {{"loss", 1.5}}, std::nullopt, std::nullopt}, 2.0);
  display.finish({2, {}, std::nullopt, std::nullopt}, 2.0);
  const std::string text = written(file);
  std::fclose(file);
  CHECK(text ==
        "\rstep 1  loss 123.2500  elapsed 1s"
        "\rstep 2  loss 1.5000  1.00 it/s  elapsed 2s"
        "\rstep 2  1.00 it/s  elapsed 2s" +
            std::string(13, ' ') + "\n");
}

TEST_CASE("other output ends an open progress line first, and the next line starts afresh", "[progress]") {
  std::FILE* file = std::tmpfile();
  ProgressOptions options;
  options.terminal = true;
  options.redraw_seconds = 0.0;
  ProgressRenderer display(options, 0.0, file);
  display.update({1, {{"loss", 2.0}}, std::nullopt, std::nullopt}, 1.0);
  CHECK(runner::core::has_open_line(file));
  runner::core::end_open_line();  // what a log line or print does first
  CHECK_FALSE(runner::core::has_open_line(file));
  std::fputs("[info] checkpoint saved\n", file);
  display.update({2, {{"loss", 1.0}}, std::nullopt, std::nullopt}, 2.0);
  display.finish({2, {}, std::nullopt, std::nullopt}, 2.0);
  CHECK_FALSE(runner::core::has_open_line(file));
  const std::string text = written(file);
  std::fclose(file);
  CHECK(text ==
        "\rstep 1  loss 2.0000  elapsed 1s\n[info] checkpoint saved\n"
        "\rstep 2  loss 1.0000  1.00 it/s  elapsed 2s"
        "\rstep 2  1.00 it/s  elapsed 2s" +
            std::string(13, ' ') + "\n");
}

TEST_CASE("values, durations and memory are formatted for reading", "[progress]") {
  CHECK(format_eta(59.4) == "59s");
  CHECK(format_eta(192) == "3m 12s");
  CHECK(format_eta(7500) == "2h 05m");
  CHECK(format_eta(3 * 86400 + 4 * 3600 + 100) == "3d 4h");
  CHECK(format_memory(812.0 * 1024 * 1024) == "812 MiB");
  CHECK(format_memory(12.34 * 1024 * 1024 * 1024) == "12.3 GiB");
  ProgressRenderer display({}, 0.0, std::tmpfile());
  CHECK(display.render({7, {{"loss", 2.5e-5}, {"grad_norm", std::nan("")}}, std::nullopt, std::nullopt}, 0.0) ==
        "step 7  loss 2.500e-05  grad_norm nan  elapsed 0s");
}

TEST_CASE("a sharded run's line ends with its mode and model state per rank", "[progress]") {
  ProgressOptions options;
  options.total_steps = 10;
  options.sharding = "shard gradients (ZeRO-2), model state 52.1 MB per rank";
  ProgressRenderer display(options, 0.0, std::tmpfile());
  CHECK(display.render(at_step(1), 1.0) ==
        "step  1/10  10%  loss 0.5000  lr 1.00e-03  elapsed 1s  mem 1.5 GiB  shard gradients (ZeRO-2), model state "
        "52.1 MB per rank");
}
