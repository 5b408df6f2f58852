"""Runs a benchmark's runner side: a Lua script under bench/ that prints one `RESULT {json}` line."""

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent


def run_runner_script(runner, script, overrides, env=None):
    """Runs `runner bench/<script> key=value...` from the repository root and returns its RESULT object; exits
    with runner's output when it fails or prints no RESULT line. `env` adds environment variables."""
    command = [str(runner), str(BENCH_DIR / script), *[f"{key}={value}" for key, value in overrides.items()]]
    done = subprocess.run(command, cwd=REPO_ROOT, env=dict(os.environ, **(env or {})), capture_output=True, text=True)
    where = " ".join(f"{k}={v}" for k, v in (env or {}).items())
    if done.returncode != 0:
        sys.exit(f"runner failed (exit status {done.returncode}): {where} {' '.join(command)}\n"
                 f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    sys.exit(f"runner printed no RESULT line: {' '.join(command)}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")


def find_runner(path_text):
    """The runner binary named by --runner (relative paths from the repository root); exits when it is missing."""
    runner = Path(path_text)
    if not runner.is_absolute():
        runner = REPO_ROOT / runner
    if not runner.is_file():
        sys.exit(f"no runner binary at {runner} (build it with scripts/build, or pass --runner)")
    return runner
