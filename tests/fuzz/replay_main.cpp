// Replays files through a fuzz target's LLVMFuzzerTestOneInput without libFuzzer (the ordinary test build).
//   fuzz_replay_<target> [--timeout SECONDS] PATH...   (files, or folders read recursively; a missing folder is empty)
// Fails naming the input when the target crashes, aborts, throws anything but the parser's own error (the
// target catches that one), or runs past the timeout. Built with AddressSanitizer and UBSan where the compiler
// has them, so that an out-of-bounds read fails here as it does under libFuzzer.
#include <cxxabi.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <typeinfo>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
extern "C" void __sanitizer_set_death_callback(void (*callback)()) __attribute__((weak));

namespace {

// The input being replayed, for the signal handlers and the sanitizers' death callback.
char current_input[4096] = "(before the first input)";
int timeout_seconds = 10;

void write_text(const char* text) {
  const std::size_t length = std::strlen(text);
  for (std::size_t done = 0; done < length;) {
    const ssize_t n = ::write(STDERR_FILENO, text + done, length - done);
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

void report_input(const char* what) {
  write_text("\nfuzz replay: FAILED on ");
  write_text(current_input);
  write_text(": ");
  write_text(what);
  write_text("\n");
}

void on_sanitizer_death() { report_input("sanitizer report above"); }

void on_fatal_signal(int signal_number) {
  report_input(signal_number == SIGALRM   ? "still running at the timeout (a hang)"
               : signal_number == SIGABRT ? "aborted (the target's check or an assertion failed)"
                                          : strsignal(signal_number));
  if (signal_number == SIGALRM) ::_exit(1);
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

void install_handlers() {
  for (const int signal_number : {SIGABRT, SIGALRM, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) {
    struct sigaction existing {};
    sigaction(signal_number, nullptr, &existing);
    if (existing.sa_handler != SIG_DFL) continue;  // the sanitizer's own handler reports, then calls back
    struct sigaction action {};
    action.sa_handler = on_fatal_signal;
    sigemptyset(&action.sa_mask);
    sigaction(signal_number, &action, nullptr);
  }
  if (__sanitizer_set_death_callback != nullptr) __sanitizer_set_death_callback(on_sanitizer_death);
}

// Files under `path` in sorted order (hidden names skipped); a missing path has none. POSIX calls rather than
// std::filesystem, whose symbols LibTorch also exports (docs/architecture.md, Build).
void collect(const std::string& path, std::vector<std::string>& inputs) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0) return;
  if (S_ISREG(status.st_mode)) {
    inputs.push_back(path);
    return;
  }
  if (!S_ISDIR(status.st_mode)) return;
  std::vector<std::string> names;
  if (DIR* directory = ::opendir(path.c_str())) {
    while (const dirent* entry = ::readdir(directory)) {
      if (entry->d_name[0] != '.') names.emplace_back(entry->d_name);
    }
    ::closedir(directory);
  }
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) collect(path + "/" + name, inputs);
}

bool read_file(const std::string& path, std::vector<std::uint8_t>& bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

std::string type_name(const std::type_info& type) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string name = status == 0 ? demangled : type.name();
  std::free(demangled);
  return name;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--timeout" && i + 1 < argc) {
      timeout_seconds = std::max(1, std::atoi(argv[++i]));
    } else {
      paths.push_back(arg);
    }
  }
  if (paths.empty()) {
    std::fprintf(stderr, "usage: %s [--timeout SECONDS] PATH...\n", argv[0]);
    return 2;
  }
  std::vector<std::string> inputs;
  for (const std::string& path : paths) collect(path, inputs);
  if (inputs.empty()) {
    std::fprintf(stderr, "fuzz replay: no inputs under the paths given\n");
    return 1;
  }

  install_handlers();
  int failures = 0;
  std::vector<std::uint8_t> bytes;
  for (const std::string& input : inputs) {
    std::snprintf(current_input, sizeof current_input, "%s", input.c_str());
    if (!read_file(input, bytes)) {
      std::fprintf(stderr, "fuzz replay: cannot read %s\n", input.c_str());
      return 1;
    }
    // A buffer of exactly the input's size, as libFuzzer passes it, so that reading past its end is caught.
    const std::unique_ptr<std::uint8_t[]> data(new std::uint8_t[bytes.size()]);
    std::copy(bytes.begin(), bytes.end(), data.get());
    ::alarm(static_cast<unsigned>(timeout_seconds));
    try {
      LLVMFuzzerTestOneInput(data.get(), bytes.size());
    } catch (const std::exception& error) {
      std::fprintf(stderr, "fuzz replay: FAILED on %s: threw %s: %s\n", input.c_str(), type_name(typeid(error)).c_str(),
                   error.what());
      ++failures;
    } catch (...) {
      std::fprintf(stderr, "fuzz replay: FAILED on %s: threw a non-standard exception\n", input.c_str());
      ++failures;
    }
    ::alarm(0);
  }
  std::snprintf(current_input, sizeof current_input, "the inputs as a whole (a leak report at exit names none)");
  if (failures > 0) {
    std::fprintf(stderr, "fuzz replay: %d of %zu inputs failed\n", failures, inputs.size());
    return 1;
  }
  std::printf("fuzz replay: %zu inputs, each parsed or refused with the parser's error\n", inputs.size());
  return 0;
}
