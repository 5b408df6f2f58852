"""Runs a benchmark's runner side: a Lua script under bench/ that prints one `RESULT {json}` line."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent


class SideFailed(RuntimeError):
    """A measured process exited with an error or printed no RESULT line. The message is `reason` (what failed and
    how), the command, then the tail of its output (stdout, then stderr), also in `output`."""

    def __init__(self, reason, command_text, output):
        super().__init__(f"{reason}: {command_text}\n{output}")
        self.reason = reason
        self.output = output


def exit_status_text(status):
    """'exit status N', or for a signal (negative, as subprocess gives it) 'killed by SIGNAME'."""
    if status >= 0:
        return f"exit status {status}"
    try:
        name = signal.Signals(-status).name
    except ValueError:
        name = f"signal {-status}"
    return f"killed by {name}" + (" (the kernel's out-of-memory killer sends it)" if name == "SIGKILL" else "")


def run_result_command(command, env=None, what="runner"):
    """Runs a command that prints `RESULT {json}` from the repository root and returns its RESULT object; raises
    SideFailed with `what`, the command and its output's tail when it fails or prints no RESULT line. `env` adds
    environment variables."""
    done = subprocess.run(command, cwd=REPO_ROOT, env=dict(os.environ, **(env or {})), capture_output=True, text=True,
                          errors="replace")
    where = " ".join(f"{k}={v}" for k, v in (env or {}).items())
    shown = f"{where} {' '.join(str(part) for part in command)}".strip()
    output = f"{done.stdout[-3000:]}{done.stderr[-3000:]}"
    if done.returncode != 0:
        raise SideFailed(f"{what} failed ({exit_status_text(done.returncode)})", shown, output)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise SideFailed(f"{what} printed no RESULT line", shown, output)


def run_runner_script(runner, script, overrides, env=None, exit_on_failure=True):
    """Runs `runner bench/<script> key=value...` from the repository root and returns its RESULT object. When it
    fails or prints no RESULT line: exits with runner's output, or with exit_on_failure=False raises SideFailed.
    `env` adds environment variables."""
    command = [str(runner), str(BENCH_DIR / script), *[f"{key}={value}" for key, value in overrides.items()]]
    try:
        return run_result_command(command, env)
    except SideFailed as error:
        if not exit_on_failure:
            raise
        sys.exit(str(error))


def find_runner(path_text):
    """The runner binary named by --runner (relative paths from the repository root); exits when it is missing."""
    runner = Path(path_text)
    if not runner.is_absolute():
        runner = REPO_ROOT / runner
    if not runner.is_file():
        sys.exit(f"no runner binary at {runner} (build it with scripts/build, or pass --runner)")
    return runner
