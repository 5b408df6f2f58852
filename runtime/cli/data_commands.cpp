// `runner data pack DIR OUT.npy --size N`: an image folder into a memory-mappable .npy, with progress.
#include "runtime/cli/data_commands.h"

#include <chrono>
#include <csignal>
#include <stdexcept>
#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>

#include <fmt/format.h>

#include "runtime/core/exit_status.h"
#include "runtime/core/interrupt.h"
#include "runtime/data/data_error.h"
#include "runtime/data/pack.h"
#include "runtime/core/terminal_text.h"

namespace runner::cli {
namespace {

constexpr const char* kDataUsage = R"(usage: runner data pack DIR OUT.npy --size N [options]

Decodes every JPEG and PNG under DIR, resizes the shorter side to N (antialiased), center-crops N x N,
and writes a uint8 array [images, 3, N, N] to OUT.npy for data.npy { path = OUT.npy } (memory-mapped).
With class subfolders it also writes OUT.labels.npy (int64 class ids) and OUT.classes.json.

options:
  --size N         output side in pixels (required)
  --workers N      decoding threads (default: all cores)
  --labels         label by first-level subfolder (default when DIR has subfolders and no loose images)
  --no-labels      no labels
  --skip-bad       leave out unreadable images (listed at the end) instead of stopping at the first
  --fast-decode    let JPEG decoding downscale in the DCT domain (faster, slightly different pixels)
)";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int parse_positive(const std::string& option, const char* text) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || value < 1 || value > 1 << 20)
    throw UsageError(option + " needs a positive integer, got '" + text + "'");
  return static_cast<int>(value);
}

void on_interrupt(int) { core::request_interrupt(); }

void print_progress(std::int64_t done, std::int64_t total, double seconds, bool terminal) {
  const double rate = seconds > 0 ? done / seconds : 0;
  const int width = 30;
  const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
  const std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
  const std::string eta = rate > 0 && done < total ? fmt::format(", {:.0f}s left", (total - done) / rate) : "";
  const std::string line = fmt::format("pack [{}] {}/{} images, {:.0f}/s{}", bar, done, total, rate, eta);
  if (terminal) std::fprintf(stderr, "\r%s\033[K", line.c_str());
  else std::fprintf(stderr, "%s\n", line.c_str());
}

int run_pack(int argc, char** argv) {
  std::string directory;
  std::string output;
  data::PackOptions options;
  options.size = 0;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) throw UsageError(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--size") options.size = parse_positive(arg, value());
    else if (arg == "--workers") options.workers = parse_positive(arg, value());
    else if (arg == "--labels") options.labels = data::PackLabels::yes;
    else if (arg == "--no-labels") options.labels = data::PackLabels::no;
    else if (arg == "--skip-bad") options.skip_bad = true;
    else if (arg == "--fast-decode") options.fast_decode = true;
    else if (arg == "-h" || arg == "--help") {
      std::fputs(kDataUsage, stdout);
      return core::kExitOk;
    } else if (!arg.empty() && arg[0] == '-') throw UsageError("unknown option '" + arg + "'");
    else if (directory.empty()) directory = arg;
    else if (output.empty()) output = arg;
    else throw UsageError("unexpected argument '" + arg + "'");
  }
  if (directory.empty() || output.empty()) throw UsageError("pack needs DIR and OUT.npy");
  if (options.size == 0) throw UsageError("pack needs --size N");

  const bool terminal = ::isatty(STDERR_FILENO) != 0;
  const auto start = std::chrono::steady_clock::now();
  std::int64_t last_tenth = -1;
  options.progress = [&](std::int64_t done, std::int64_t total) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::int64_t tenth = total > 0 ? done * 10 / total : 10;
    if (terminal || tenth != last_tenth) print_progress(done, total, seconds, terminal);
    last_tenth = tenth;
  };
  std::signal(SIGINT, on_interrupt);
  const data::PackResult result = data::pack_image_folder(directory, output, options);
  if (terminal) std::fputc('\n', stderr);
  for (const data::SkippedSample& bad : result.skipped) std::fprintf(stderr, "skipped %s\n", core::terminal_text(bad.message).c_str());
  std::printf("wrote %s: %lld images, uint8 [%lld, 3, %d, %d]\n", output.c_str(), static_cast<long long>(result.images),
              static_cast<long long>(result.images), options.size, options.size);
  if (!result.skipped.empty()) std::printf("skipped %zu unreadable images\n", result.skipped.size());
  if (!result.labels_path.empty()) {
    std::printf("wrote %s and %s (%zu classes)\n", result.labels_path.c_str(), result.classes_path.c_str(), result.classes.size());
    std::printf("use: runner.data.npy { path = \"%s\", labels = \"%s\", classes = \"%s\" }\n", output.c_str(),
                result.labels_path.c_str(), result.classes_path.c_str());
  } else {
    std::printf("use: runner.data.npy { path = \"%s\" }\n", output.c_str());
  }
  return core::kExitOk;
}

}  // namespace

int run_data_command(int argc, char** argv) {
  try {
    if (argc < 2 || std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0) {
      std::fputs(kDataUsage, argc < 2 ? stderr : stdout);
      return argc < 2 ? core::kExitUsage : core::kExitOk;
    }
    if (std::strcmp(argv[1], "pack") == 0) return run_pack(argc, argv);
    throw UsageError(std::string("unknown data command '") + argv[1] + "'");
  } catch (const UsageError& error) {
    std::fprintf(stderr, "runner data: %s\n\n%s", core::terminal_text(error.what()).c_str(), kDataUsage);
    return core::kExitUsage;
  } catch (const data::DataError& error) {
    std::fprintf(stderr, "runner data: %s (--skip-bad leaves unreadable images out)\n",
                 core::terminal_text(error.what()).c_str());
    return core::kExitError;
  } catch (const core::Interrupted&) {
    std::fprintf(stderr, "\nrunner data: interrupted; nothing was written\n");
    return core::kExitInterrupted;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "runner data: %s\n", core::terminal_text(error.what()).c_str());
    return core::kExitError;
  }
}

}  // namespace runner::cli
