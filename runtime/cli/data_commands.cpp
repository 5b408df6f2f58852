// `runner data pack DIR OUT.npy --size N`: an image folder into a memory-mappable .npy; `runner data encode`:
// images into VAE latents for data.latents; `runner data fid-stats`: FID reference statistics; each with progress.
#include "runtime/cli/data_commands.h"

#include <chrono>
#include <csignal>
#include <stdexcept>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <unistd.h>

#include <fmt/format.h>

#include "runtime/cli/command_line.h"
#include "runtime/core/exit_status.h"
#include "runtime/core/interrupt.h"
#include "runtime/data/data_error.h"
#include "runtime/data/pack.h"
#include "runtime/core/terminal_text.h"
#include "runtime/eval/fid.h"
#include "runtime/latents/latent_encoding.h"

namespace runner::cli {
namespace {

// Each data command's usage line and description; `runner data --help` prints them all, a command's usage
// error and --help its own.
struct DataCommandHelp {
  const char* name;
  const char* usage;
  const char* description;
};

constexpr DataCommandHelp kPackHelp{"pack", "runner data pack DIR OUT.npy --size N [options]", R"(
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
)"};

constexpr DataCommandHelp kEncodeHelp{"encode", "runner data encode IMAGES OUT.npy --vae VAE [--size N] [options]", R"(
encode runs the images of IMAGES (a folder, resized and cropped as pack does with --size N, or an array
that pack wrote) through the encoder of VAE (a diffusers folder or safetensors file, see nn.AutoencoderKL)
and writes every posterior's mean and log-variance, float32 [images, flips, 2, C, S/f, S/f], to OUT.npy for
data.latents { path = OUT.npy }, which draws a new latent from them at every read. Beside it: OUT.json (the
source, the preprocessing, the VAE's file, sha256 and scaling factor) and the labels as pack writes them.
Interrupted or killed, the same command continues where it stopped (OUT.npy.partial until the end).

options:
  --vae PATH       the VAE (required)
  --size N         image folders: output side in pixels (required); arrays: checked against their side
  --flip           also encode each image's horizontal flip (data.latents picks one at random per read)
  --batch N        images per encoder call (default 32)
  --device D       cpu, cuda, cuda:N or auto (default auto)
  --workers N      decoding threads (default: the loader's)
)"};

constexpr DataCommandHelp kFidStatsHelp{
    "fid-stats", "runner data fid-stats IMAGES OUT.npz --weights PATH [--batch N] [--device D]", R"(
fid-stats writes the FID statistics (float64 mu [2048] and sigma [2048, 2048], as pytorch-fid's --save-stats)
of every image in the folder IMAGES, through the FID Inception network whose weights PATH holds, for
runner.eval.fid(samples, "OUT.npz", ...). PATH is pytorch-fid's pt_inception-2015-12-05-6726825d.pth
(sha256 6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2, from
https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/pt_inception-2015-12-05-6726825d.pth)
or the same tensors as safetensors; other weights give a warning, a file of that name with another sha256 an
error. Without the file, runner.eval.sliced_wasserstein measures sample quality with no download.

options:
  --weights PATH   the FID Inception weights (required)
  --batch N        images per forward pass (default 50)
  --device D       cpu, cuda, cuda:N or auto (default auto)
)"};

constexpr const DataCommandHelp* kDataCommands[] = {&kPackHelp, &kEncodeHelp, &kFidStatsHelp};

std::string data_usage(const DataCommandHelp* only = nullptr) {
  std::string text;
  for (const DataCommandHelp* command : kDataCommands)
    if (!only || command == only) text += fmt::format("{} {}\n", text.empty() ? "usage:" : "      ", command->usage);
  for (const DataCommandHelp* command : kDataCommands)
    if (!only || command == only) text += command->description;
  return text;
}

// The command named by argv[1], or null.
const DataCommandHelp* data_command(const char* name) {
  for (const DataCommandHelp* command : kDataCommands)
    if (std::strcmp(command->name, name) == 0) return command;
  return nullptr;
}

int parse_positive(const std::string& option, const char* text) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || value < 1 || value > 1 << 20)
    throw UsageError(option + " needs a positive integer, got '" + text + "'");
  return static_cast<int>(value);
}

void on_interrupt(int) { core::request_interrupt(); }

// A data command's options: flags, and options that take a value ("--size 64", "--size=64").
struct DataOptions {
  std::map<std::string, std::function<void()>> flags;
  std::map<std::string, std::function<void(const std::string& option, const char* value)>> valued;
};

template <typename Integer>
auto positive_into(Integer& target) {
  return [&target](const std::string& option, const char* value) { target = parse_positive(option, value); };
}

auto text_into(std::string& target) {
  return [&target](const std::string&, const char* value) { target = value; };
}

// Parses argv[2..] into the options' handlers and up to two positional arguments; false after printing the
// usage for -h / --help.
bool parse_command(int argc, char** argv, const DataOptions& options, std::string& first, std::string& second) {
  CommandOptions accepted;
  accepted.max_positionals = 2;
  for (const auto& [name, handler] : options.flags) accepted.flags.insert(name);
  for (const auto& [name, handler] : options.valued) accepted.values[name] = "";
  const CommandLine line = parse_command_line(argc - 1, argv + 1, accepted);
  if (line.help) {
    std::fputs(data_usage(data_command(argv[1])).c_str(), stdout);
    return false;
  }
  for (const std::string& name : line.flags) options.flags.at(name)();
  for (const auto& [name, value] : line.values) options.valued.at(name)(name, value.c_str());
  if (line.positional.size() > 0) first = line.positional[0];
  if (line.positional.size() > 1) second = line.positional[1];
  return true;
}

// A command's progress on stderr: a bar redrawn in place on a terminal, else a line per tenth of the work.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(const char* verb) : verb_(verb) {}
  void operator()(std::int64_t done, std::int64_t total) {
    const std::int64_t tenth = total > 0 ? done * 10 / total : 10;
    if (terminal_ || tenth != last_tenth_) print(done, total);
    last_tenth_ = tenth;
  }
  // Ends the line a terminal's bar is drawn on.
  void finish() const {
    if (terminal_) std::fputc('\n', stderr);
  }

 private:
  void print(std::int64_t done, std::int64_t total) const {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double rate = seconds > 0 ? done / seconds : 0;
    const int width = 30;
    const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
    const std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
    const std::string eta = rate > 0 && done < total ? fmt::format(", {:.0f}s left", (total - done) / rate) : "";
    const std::string line = fmt::format("{} [{}] {}/{} images, {:.0f}/s{}", verb_, bar, done, total, rate, eta);
    if (terminal_)
      std::fprintf(stderr, "\r%s\033[K", line.c_str());
    else
      std::fprintf(stderr, "%s\n", line.c_str());
  }

  const char* verb_;
  const bool terminal_ = ::isatty(STDERR_FILENO) != 0;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::int64_t last_tenth_ = -1;
};

int run_pack(int argc, char** argv) {
  std::string directory;
  std::string output;
  data::PackOptions options;
  options.size = 0;
  int label_flags = 0;
  const DataOptions command{{{"--labels", [&] { options.labels = data::PackLabels::yes, ++label_flags; }},
                             {"--no-labels", [&] { options.labels = data::PackLabels::no, ++label_flags; }},
                             {"--skip-bad", [&] { options.skip_bad = true; }},
                             {"--fast-decode", [&] { options.fast_decode = true; }}},
                            {{"--size", positive_into(options.size)}, {"--workers", positive_into(options.workers)}}};
  if (!parse_command(argc, argv, command, directory, output)) return core::kExitOk;
  if (directory.empty() || output.empty()) throw UsageError("pack needs DIR and OUT.npy");
  if (options.size == 0) throw UsageError("pack needs --size N");
  if (label_flags > 1) throw UsageError("give --labels or --no-labels, not both");

  ProgressPrinter progress("pack");
  options.progress = std::ref(progress);
  std::signal(SIGINT, on_interrupt);
  const data::PackResult result = data::pack_image_folder(directory, output, options);
  progress.finish();
  for (const data::SkippedSample& bad : result.skipped)
    std::fprintf(stderr, "skipped %s\n", core::terminal_text(bad.message).c_str());
  std::printf("wrote %s: %lld images, uint8 [%lld, 3, %d, %d]\n", output.c_str(), static_cast<long long>(result.images),
              static_cast<long long>(result.images), options.size, options.size);
  if (!result.skipped.empty()) std::printf("skipped %zu unreadable images\n", result.skipped.size());
  if (!result.labels_path.empty()) {
    std::printf("wrote %s and %s (%zu classes)\n", result.labels_path.c_str(), result.classes_path.c_str(),
                result.classes.size());
    std::printf("use: runner.data.npy { path = \"%s\", labels = \"%s\", classes = \"%s\" }\n", output.c_str(),
                result.labels_path.c_str(), result.classes_path.c_str());
  } else {
    std::printf("use: runner.data.npy { path = \"%s\" }\n", output.c_str());
  }
  return core::kExitOk;
}

int run_encode(int argc, char** argv) {
  std::string source;
  std::string output;
  latents::EncodeOptions options;
  const DataOptions command{{{"--flip", [&] { options.flip = true; }}},
                            {{"--vae", text_into(options.vae)},
                             {"--size", positive_into(options.size)},
                             {"--batch", positive_into(options.batch)},
                             {"--workers", positive_into(options.workers)},
                             {"--device", text_into(options.device)}}};
  if (!parse_command(argc, argv, command, source, output)) return core::kExitOk;
  if (source.empty() || output.empty()) throw UsageError("encode needs IMAGES and OUT.npy");
  if (options.vae.empty()) throw UsageError("encode needs --vae PATH");

  ProgressPrinter progress("encode");
  bool first_report = true;
  options.progress = [&](std::int64_t done, std::int64_t total) {
    if (first_report && done > 0)
      std::fprintf(stderr, "continuing: %lld of %lld images were encoded before\n", static_cast<long long>(done),
                   static_cast<long long>(total));
    first_report = false;
    progress(done, total);
  };
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  latents::EncodeResult result;
  try {
    result = latents::encode_latents(source, output, options);
  } catch (const core::Interrupted&) {
    std::fprintf(stderr, "\nrunner data: interrupted; run the same command again to continue\n");
    return core::kExitInterrupted;
  }
  progress.finish();
  std::printf("wrote %s: %lld images; %s\n", output.c_str(), static_cast<long long>(result.images),
              result.manifest_path.c_str());
  if (!result.labels_path.empty())
    std::printf("wrote %s%s%s\n", result.labels_path.c_str(), result.classes_path.empty() ? "" : " and ",
                result.classes_path.c_str());
  std::printf("use: runner.data.latents { path = \"%s\" }\n", output.c_str());
  return core::kExitOk;
}

int run_fid_stats(int argc, char** argv) {
  std::string source;
  std::string output;
  eval::FidOptions options;
  const DataOptions command{{},
                            {{"--weights", text_into(options.weights)},
                             {"--batch", positive_into(options.batch)},
                             {"--device", text_into(options.device)}}};
  if (!parse_command(argc, argv, command, source, output)) return core::kExitOk;
  if (source.empty() || output.empty()) throw UsageError("fid-stats needs IMAGES and OUT.npz");
  if (options.weights.empty()) throw UsageError("fid-stats needs --weights PATH: " + eval::fid_weights_help());

  ProgressPrinter progress("fid-stats");
  options.progress = std::ref(progress);
  std::signal(SIGINT, on_interrupt);
  eval::FidEvaluator evaluator(options);
  const eval::FidStatistics statistics = evaluator.of_folder(source);
  progress.finish();
  eval::write_fid_statistics(output, statistics);
  std::printf("wrote %s: FID statistics of %s (%lld features)\n", output.c_str(), source.c_str(),
              static_cast<long long>(statistics.mu.numel()));
  return core::kExitOk;
}

}  // namespace

int run_data_command(int argc, char** argv) {
  try {
    if (argc < 2 || std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0) {
      std::fputs(data_usage().c_str(), argc < 2 ? stderr : stdout);
      return argc < 2 ? core::kExitUsage : core::kExitOk;
    }
    if (std::strcmp(argv[1], "pack") == 0) return run_pack(argc, argv);
    if (std::strcmp(argv[1], "encode") == 0) return run_encode(argc, argv);
    if (std::strcmp(argv[1], "fid-stats") == 0) return run_fid_stats(argc, argv);
    throw UsageError(std::string("unknown data command '") + argv[1] + "'");
  } catch (const UsageError& error) {
    return print_usage_error("data", error.what());
  } catch (const data::DataError& error) {
    const bool pack = std::strcmp(argv[1], "pack") == 0;
    std::fprintf(stderr, "runner data: %s%s\n", core::terminal_text(error.what()).c_str(),
                 pack ? " (--skip-bad leaves unreadable images out)" : "");
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
