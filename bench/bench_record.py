# The record every benchmark writes: the machine, the versions, the JSON results file and the headline `ratio` line.
"""Shared by the benchmark scripts in bench/, so every results file has the same frame:

    {"benchmark", "date", "machine", "versions", <the benchmark's own fields>, "ratio_geomean"}

written to bench/results/<benchmark>-<YYYYMMDD-HHMMSS>-<hostname>.json unless --output names a file,
followed on stdout by `results: PATH` and, when both sides were measured, the last line `ratio X.XX`.
"""

import datetime
import json
import os
import platform
import socket
import subprocess
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine_info():
    """Host name, CPU model, core counts (all and usable by this process), RAM in GiB, OS and Python version.
    A benchmark may add its own entries (a GPU) after these."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"hostname": socket.gethostname(), "cpu": cpu, "cores": os.cpu_count(), "usable_cores": usable,
            "ram_gib": ram_gib, "os": platform.platform(), "python": platform.python_version()}


def runner_version(runner):
    """What `runner --version` prints (stdout and stderr), stripped."""
    done = subprocess.run([str(runner), "--version"], capture_output=True, text=True)
    return (done.stdout + done.stderr).strip()


def build_info(runner):
    """The checkout's commit and whether it has uncommitted changes, and the runner binary's modification time: the
    version string does not tell builds of a checkout apart."""
    info = {"runner_binary_mtime": datetime.datetime.fromtimestamp(Path(runner).stat().st_mtime).isoformat(
        timespec="seconds")}
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=Path(__file__).resolve().parent.parent,
                               capture_output=True, text=True)
        if head.returncode == 0:
            info["commit"] = head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
    except OSError:
        pass
    return info


def write_record(benchmark, machine, versions, fields, ratio_geomean, output=None):
    """Writes the results JSON: benchmark, date, machine, versions, then `fields` in their order, then
    ratio_geomean. `output` (a path, or None for bench/results/<benchmark>-<date>-<hostname>.json) is
    where it goes. Prints `results: PATH`, then `ratio X.XX` when ratio_geomean is not None. Returns the path."""
    now = datetime.datetime.now()
    record = {"benchmark": benchmark, "date": now.isoformat(timespec="seconds"), "machine": machine,
              "versions": versions, **fields, "ratio_geomean": ratio_geomean}
    if output:
        output = Path(output)
    else:
        output = RESULTS_DIR / f"{benchmark}-{now:%Y%m%d-%H%M%S}-{machine['hostname']}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"results: {output}")
    if ratio_geomean is not None:
        print(f"ratio {ratio_geomean:.2f}")
    return output
