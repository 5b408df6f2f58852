// The process's launch context: environment parsing and the process-wide instance.
#include "runtime/core/launch_context.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <thread>

extern char** environ;

namespace runner::core {
namespace {

std::optional<std::string> lookup(const std::map<std::string, std::string>& env,
                                  std::initializer_list<const char*> names, std::string* which) {
  for (const char* name : names) {
    auto it = env.find(name);
    if (it != env.end() && !it->second.empty()) {
      *which = name;
      return it->second;
    }
  }
  return std::nullopt;
}

std::int64_t parse_integer(const std::string& name, const std::string& text, std::int64_t min, std::int64_t max) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size())
    throw LaunchError(fmt::format("environment variable {}='{}' is not a whole number", name, text));
  if (value < min || value > max)
    throw LaunchError(fmt::format("environment variable {}={} is out of range ({} to {})", name, value, min, max));
  return value;
}

template <class T>
void read_integer(const std::map<std::string, std::string>& env, std::initializer_list<const char*> names, T& target,
                  std::int64_t min, std::int64_t max) {
  std::string which;
  if (auto text = lookup(env, names, &which)) target = static_cast<T>(parse_integer(which, *text, min, max));
}

// "0,2,3" -> {"0", "2", "3"}; "" -> {}.
std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  for (size_t start = 0; start < text.size();) {
    const size_t comma = std::min(text.find(',', start), text.size());
    if (comma > start) items.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return items;
}

constexpr std::int64_t kSlurmPortBase = 20000;
constexpr std::int64_t kSlurmPortRange = 20000;

std::mutex context_mutex;
LaunchContext process_context;

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // "gpu[003-006,9],cpu1" -> "gpu003"; "node7,node8" -> "node7"
  const auto end = nodelist.find_first_of(",[");
  if (end == std::string::npos || nodelist[end] == ',') return nodelist.substr(0, end);
  const std::string prefix = nodelist.substr(0, end);
  const auto first_end = nodelist.find_first_of(",-]", end + 1);
  return prefix + nodelist.substr(end + 1, first_end == std::string::npos ? std::string::npos : first_end - end - 1);
}

LaunchContext launch_context_from_environment(const std::map<std::string, std::string>& env) {
  constexpr std::int64_t kMaxRanks = 1 << 20;
  LaunchContext context;
  read_integer(env, {"WORLD_SIZE", "SLURM_NTASKS"}, context.world_size, 1, kMaxRanks);
  read_integer(env, {"RANK", "SLURM_PROCID"}, context.rank, 0, kMaxRanks);
  read_integer(env, {"LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"}, context.local_world_size, 1, kMaxRanks);
  read_integer(env, {"LOCAL_RANK", "SLURM_LOCALID"}, context.local_rank, 0, kMaxRanks);
  if (context.rank >= context.world_size)
    throw LaunchError(
        fmt::format("rank {} is not below the world size {} (RANK / WORLD_SIZE)", context.rank, context.world_size));
  std::string which;
  if (auto addr = lookup(env, {"MASTER_ADDR"}, &which))
    context.master_addr = *addr;
  else if (auto nodes = lookup(env, {"SLURM_JOB_NODELIST", "SLURM_NODELIST"}, &which))
    context.master_addr = first_slurm_host(*nodes);
  read_integer(env, {"MASTER_PORT"}, context.master_port, 1, 65535);
  std::int64_t job = 0;
  if (context.master_port == 0 && lookup(env, {"SLURM_JOB_ID"}, &which)) {
    read_integer(env, {"SLURM_JOB_ID"}, job, 0, INT64_MAX);
    context.master_port = static_cast<int>(kSlurmPortBase + job % kSlurmPortRange);
  }
  std::int64_t id = 0;
  if (lookup(env, {"RUNNER_SWEEP"}, &which)) {
    read_integer(env, {"RUNNER_SWEEP"}, id, 1, INT64_MAX);
    context.sweep = id;
  }
  if (lookup(env, {"RUNNER_TRIAL"}, &which)) {
    read_integer(env, {"RUNNER_TRIAL"}, id, 0, INT64_MAX);
    context.trial = id;
  }
  if (lookup(env, {"RUNNER_TRIAL_GENERATION"}, &which)) {
    read_integer(env, {"RUNNER_TRIAL_GENERATION"}, id, 1, INT64_MAX);
    context.trial_generation = id;
  }
  if (auto pause = lookup(env, {"RUNNER_SWEEP_PAUSE"}, &which)) {
    const auto at = pause->rfind('@');
    std::int64_t step = 0;
    if (at != std::string::npos && at > 0) {
      step = parse_integer(which, pause->substr(at + 1), 1, INT64_MAX);
      context.sweep_pause = SweepPause{pause->substr(0, at), step};
    } else {
      throw LaunchError(fmt::format("{}='{}' is not METRIC@STEP", which, *pause));
    }
  }
  read_integer(env, {"RUNNER_CORES"}, context.cores, 1, 1 << 20);
  read_integer(env, {"SLURM_CPUS_ON_NODE"}, context.slurm_cpus, 1, 1 << 20);
  if (auto file = lookup(env, {"RUNNER_FAILURE_FILE"}, &which)) context.failure_file = *file;
  context.rank_variables = env.count("RANK") > 0 || env.count("WORLD_SIZE") > 0;
  if (env.count("RUNNER_HISTORY"))
    context.repl_history = env.at("RUNNER_HISTORY");  // "" keeps none
  else if (env.count("HOME"))
    context.repl_history = env.at("HOME") + "/.runner_history";
  if (auto agent = lookup(env, {"TORCHELASTIC_USE_AGENT_STORE"}, &which)) context.agent_store = *agent == "True";
  if (const auto visible = env.find("CUDA_VISIBLE_DEVICES"); visible != env.end())
    context.given_gpus = split_list(visible->second);  // "" hides every GPU
  else if (auto job_gpus = lookup(env, {"SLURM_JOB_GPUS"}, &which))
    context.given_gpus = split_list(*job_gpus);
  else if (lookup(env, {"SLURM_GPUS_ON_NODE"}, &which)) {
    int count = 0;
    read_integer(env, {"SLURM_GPUS_ON_NODE"}, count, 0, 1 << 20);
    context.given_gpus.emplace();
    for (int gpu = 0; gpu < count; ++gpu) context.given_gpus->push_back(std::to_string(gpu));
  }
  const auto array_job = lookup(env, {"SLURM_ARRAY_JOB_ID"}, &which);
  const auto array_task = lookup(env, {"SLURM_ARRAY_TASK_ID"}, &which);
  if (array_job && array_task)
    context.slurm_job = *array_job + "_" + *array_task;
  else if (auto job = lookup(env, {"SLURM_JOB_ID"}, &which))
    context.slurm_job = *job;
  if (auto index = lookup(env, {"RUNNER_INDEX"}, &which)) context.index_url = *index;
  if (auto home = lookup(env, {"RUNNER_HOME"}, &which)) {
    context.home = *home;
    while (context.home.size() > 1 && context.home.back() == '/') context.home.pop_back();
  }
  if (auto timeout = lookup(env, {"RUNNER_DIST_TIMEOUT"}, &which)) {
    char* end = nullptr;
    context.dist_timeout_seconds = std::strtod(timeout->c_str(), &end);
    if (end == timeout->c_str() || *end != '\0' || !(context.dist_timeout_seconds > 0) ||
        !std::isfinite(context.dist_timeout_seconds))
      throw LaunchError(fmt::format("RUNNER_DIST_TIMEOUT='{}' is not a number of seconds > 0", *timeout));
  }
  for (const char* name : {"RUNNER_ATTACH_IDLE_TIMEOUT", "RUNNER_INDEX_CONNECT_TIMEOUT", "RUNNER_INDEX_IDLE_TIMEOUT",
                           "RUNNER_INDEX_STATEMENT_TIMEOUT", "RUNNER_INDEX_WAIT"})
    if (auto given = lookup(env, {name}, &which)) context.seconds_settings[name] = *given;
  if (auto leases = lookup(env, {"RUNNER_HOST_LEASES"}, &which)) context.host_leases = *leases;
  return context;
}

UsableCores usable_cores(const LaunchContext& context) {
  if (context.cores > 0) return {context.cores, "RUNNER_CORES"};
  UsableCores usable{static_cast<int>(std::max(1u, std::thread::hardware_concurrency())), ""};
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (::sched_getaffinity(0, sizeof mask, &mask) == 0) {
    const int allowed = CPU_COUNT(&mask);
    if (allowed > 0 && allowed < usable.count) usable = {allowed, "its CPU affinity"};
  }
  if (context.slurm_cpus > 0 && context.slurm_cpus < usable.count) usable = {context.slurm_cpus, "SLURM_CPUS_ON_NODE"};
  return usable;
}

LaunchContext launch_context_from_environment() {
  std::map<std::string, std::string> env;
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string text = *entry;
    const auto equals = text.find('=');
    if (equals != std::string::npos) env.emplace(text.substr(0, equals), text.substr(equals + 1));
  }
  return launch_context_from_environment(env);
}

const LaunchContext& launch_context() {
  std::lock_guard<std::mutex> lock(context_mutex);
  return process_context;
}

void set_launch_context(const LaunchContext& context) {
  std::lock_guard<std::mutex> lock(context_mutex);
  process_context = context;
}

}  // namespace runner::core
