// The job script of a sweep's Slurm job array and its submission.
#include "runtime/sweep/slurm_job.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <stdexcept>

#include "runtime/core/atomic_file.h"
#include "runtime/core/child_process.h"
#include "runtime/core/shell_word.h"
#include "runtime/sweep/sweep_spec.h"

extern char** environ;

namespace runner::sweep {
namespace {

using core::shell_word;

// The user's sbatch options as #SBATCH lines: an option with the words after it that are not options
// ("--partition gpu") on one line.
std::vector<std::string> option_lines(const std::vector<std::string>& options) {
  std::vector<std::string> lines;
  for (const std::string& option : options) {
    if (option.find_first_of("\n\r") != std::string::npos)
      throw SweepError(
          fmt::format("--slurm: the sbatch option '{}' holds a line break; an #SBATCH line cannot", option));
    const bool starts_option = option.size() > 1 && option[0] == '-';
    if (!starts_option && lines.empty())
      throw SweepError(fmt::format(
          "--slurm: '{}' after -- is not an sbatch option (they start with '-': -- --partition=gpu --time=4:00:00)",
          option));
    for (const char* own : {"--array", "-a"})
      if (starts_option && (option == own || option.rfind(std::string(own) + "=", 0) == 0))
        throw SweepError(fmt::format("--slurm: {} is set by --slurm N (one array task per worker)", option));
    if (starts_option)
      lines.push_back(option);
    else
      lines.back() += " " + option;
  }
  return lines;
}

// Values that go into the script: a control character (a line break above all) would end a comment or an #SBATCH
// line and start a shell command, so none is taken.
void check_script_value(const char* what, const std::string& value) {
  for (const char c : value) {
    const auto code = static_cast<unsigned char>(c);
    if (code < 0x20 || code == 0x7f)
      throw SweepError(
          fmt::format("--slurm: {} '{}' holds a control character (byte {:#04x}); the job script cannot "
                      "take it (rename it, or start the workers by hand with runner sweep --join)",
                      what, value, code));
  }
}

}  // namespace

std::string slurm_job_script_path(const SlurmJob& job) { return job.home + "/sweeps/" + job.sweep + "/slurm-job.sh"; }

std::string slurm_job_script(const SlurmJob& job) {
  check_script_value("the sweep's name", job.sweep);
  check_script_value("the sweep file's path", job.sweep_file);
  check_script_value("runner's path", job.runner);
  check_script_value("RUNNER_HOME", job.home);
  check_script_value("RUNNER_INDEX", job.index_url);
  check_script_value("the working directory", job.working_directory);
  for (const std::string& option : job.sbatch_options) check_script_value("the sbatch option", option);
  if (job.workers < 1 || job.workers > kMostSlurmWorkers)
    throw SweepError(
        fmt::format("--slurm takes 1 to {} workers (array tasks), got {}", kMostSlurmWorkers, job.workers));
  const std::string folder = job.home + "/sweeps/" + job.sweep;
  std::string script = "#!/bin/bash\n";
  script += fmt::format(
      "# The workers of sweep {}: each task of this job array runs `runner sweep --join {}` on the GPUs\n"
      "# Slurm gives it. Written by `runner sweep {} --slurm {}`; `sbatch` this file to submit it again.\n",
      job.sweep, job.sweep, job.sweep_file, job.workers);
  script += fmt::format("#SBATCH --job-name=sweep-{}\n", job.sweep);
  script += fmt::format("#SBATCH --array=0-{}\n", job.workers - 1);
  script += fmt::format("#SBATCH --output={}/slurm-%A_%a.log\n", folder);
  script += "#SBATCH --open-mode=append\n";
  script += "#SBATCH --requeue\n";
  script += "#SBATCH --signal=B:USR1@120\n";
  for (const std::string& line : option_lines(job.sbatch_options)) script += "#SBATCH " + line + "\n";
  script += "\n";
  script += fmt::format("export RUNNER_HOME={}\n", shell_word(job.home));
  if (!job.index_url.empty()) script += fmt::format("export RUNNER_INDEX={}\n", shell_word(job.index_url));
  script += fmt::format("cd {} || exit 1\n", shell_word(job.working_directory));
  script += fmt::format(
      "# USR1, 120 s before the time limit, reaches this shell only: the worker stops its trials with a\n"
      "# checkpoint and hands them back to the sweep, and the task requeues itself to go on. A preempted\n"
      "# task is requeued by Slurm (--requeue); other workers take over its trials meanwhile.\n"
      "requeue=\n"
      "trap 'requeue=1; kill -USR1 \"$worker\" 2>/dev/null' USR1\n"
      "{} sweep --join {} &\n"
      "worker=$!\n"
      "wait \"$worker\"\n"
      "status=$?\n"
      "while [ -n \"$requeue\" ] && kill -0 \"$worker\" 2>/dev/null; do wait \"$worker\"; status=$?; done\n"
      "if [ -n \"$requeue\" ] && [ \"$status\" = 0 ]; then scontrol requeue \"$SLURM_JOB_ID\"; fi\n"
      "exit \"$status\"\n",
      shell_word(job.runner), shell_word(job.sweep));
  return script;
}

std::string submit_slurm_job(const std::string& script_path, const std::string& script) {
  {
    core::AtomicFileWriter file(script_path);
    ::fchmod(file.fd(), 0600);
    file.write(script.data(), script.size(), "the job script");
    file.commit();
  }
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0)
    throw std::runtime_error(fmt::format("cannot make a pipe for sbatch: {}", std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  const std::vector<std::string> arguments = {"sbatch", "--parsable", script_path};
  std::vector<char*> argv;
  for (const std::string& argument : arguments) argv.push_back(const_cast<char*>(argument.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = ::posix_spawnp(&pid, "sbatch", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  if (spawned != 0) {
    ::close(pipe_fds[0]);
    throw std::runtime_error(fmt::format(
        "cannot run sbatch ({}): --slurm submits the workers with Slurm's sbatch, on a host of the cluster; "
        "--slurm N --dry-run prints the job script without it, and {} is written for `sbatch` by hand",
        std::strerror(spawned), script_path));
  }
  std::string output;
  char buffer[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof buffer)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    output.append(buffer, static_cast<size_t>(n));
  }
  ::close(pipe_fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error(fmt::format("sbatch {} {} (its message is above); nothing was submitted", script_path,
                                         core::how_it_ended(status)));
  // --parsable prints "JOB" or "JOB;CLUSTER".
  const std::string job = output.substr(0, output.find_first_of(";\n"));
  if (job.empty() || job.find_first_not_of("0123456789") != std::string::npos)
    throw std::runtime_error(fmt::format("sbatch --parsable printed '{}', not a job id", output));
  return job;
}

}  // namespace runner::sweep
