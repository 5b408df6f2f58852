# Benchmark: sustained metric rows/s into runner's run index (SQLite, and PostgreSQL where it is installed) and the
# per-`run:log` cost, against Python sqlite3.
"""Metric rows per second into the run index (`runner.start`, `run:log`, `run:flush`) and the cost of one
`log` call as the training loop sees it, runner against a careful Python tracker on Python's sqlite3, and runner
on a PostgreSQL index.

    ~/.cache/runner/venv/bin/python bench/index_metrics.py [--steps 100000] [--keys 10] [--rounds 3]
        [--tensor-steps N] [--sample-every 1] [--work-us 0] [--batch-rows 50000] [--flush-interval 1]
        [--mlflow-rows 100000] [--runner build/runner] [--only runner|python] [--no-tensor] [--no-postgresql]
        [--keep] [--output FILE]

Every measurement writes steps x keys rows (default 100,000 x 10 = 1M) for one run into a fresh database in
a temporary directory. The value of key i (1-based) at a step is i + step * 1e-6, logged as one table/dict per
step with the names a training loop logs (loss, lr, grad_norm, ...).

- runner: `RUNNER_HOME=<tmp> build/runner bench/index_metrics.lua steps=... keys=...` (its RESULT line): a Lua
  loop builds the table and calls run:log(values, step); a background writer thread commits the queued rows,
  one transaction per batch (every second, or at 50,000 queued rows), INSERT OR REPLACE into `metrics`
  (WITHOUT ROWID, primary key (run, key, step)), an upsert of `metric_latest` per key, and the heartbeat.
  `runner (1-element tensors)` logs one-element CPU tensors, torch.tensor(value), made while building the
  table (--tensor-steps calls, default --steps / 4: making the tensors is the slow part of that loop).
- runner (PostgreSQL): the same as `runner`, with RUNNER_INDEX set to a fresh database on a throwaway server that
  the benchmark starts on a free local port (tests/cli/postgres_server.py: initdb in a temporary folder, fsync
  off, as the tests run it) and stops at the end. The writer's batches are multi-row INSERT ... ON CONFLICT
  statements of 1000 rows under row locks. Measured when PostgreSQL's server programs are installed (Debian
  postgresql; scripts/setup installs it), unless --no-postgresql; otherwise the table says why it is missing.
- python: the same rows through Python's sqlite3 into a database with runner's own schema (the CREATE
  statements are read from a runner-made index, with a copy of its `runs` row, so the foreign key is checked
  on both sides) and the same PRAGMAs (journal_mode=WAL, synchronous=NORMAL, foreign_keys=ON). log() appends
  one (run, key, step, value, time) tuple per value to a list; at --batch-rows rows it flushes in the calling
  thread: BEGIN IMMEDIATE, executemany INSERT OR REPLACE, the same metric_latest upsert and heartbeat
  update, COMMIT. That flush is part of the log call that triggers it, as it would be in a training loop.
- mlflow (when importable): MlflowClient(tracking_uri="sqlite:///...").log_batch with Metric objects,
  1000 per call (its API limit), --mlflow-rows rows (fewer than the others: it is much slower); reported
  beside the ratio, not in it.

Timed, every side: sustained rows/s = rows / (end of the last commit - start of the first log call). The log
call cost: each call is timed on its own (a clock reading before and after; the cost of one reading, about
0.06 us in Lua and 0.08 us in Python, is in every figure and is reported), or with --sample-every N about one
call in N, at random gaps (regular ones would fall in step with the 50,000-row batches); mean, p50, p99,
p99.9 and max, in microseconds per call (of --keys values), the five slowest calls with their steps, and the
time spent inside log calls. The loop runs flat out unless --work-us adds a busy-wait per step (the training
step's compute), which shows the log cost at a training loop's pace, with the writer keeping up.
Afterwards every database is checked with sqlite3 (psql for PostgreSQL): exactly steps x keys rows for the run,
--keys distinct keys, steps 1..steps, no NULL value and the expected sum of values; metric_latest holds the
last step of each key. A measurement that fails the check stops the benchmark.

Rounds alternate the order of the sides; medians are reported. The last line is `ratio X.XX`: runner's
sustained rows/s (numbers) over the Python peer's. Target: runner >= 200,000 rows/s.
"""

import argparse
import json
import math
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
from runner_side import find_runner, run_runner_script  # noqa: E402
from bench_record import machine_info, runner_version, write_record  # noqa: E402

sys.path.insert(0, str(REPO_ROOT / "tests" / "cli"))
import postgres_server  # noqa: E402  (the tests' throwaway PostgreSQL server)

TARGET_ROWS_PER_S = 200_000
COMMON_NAMES = ["loss", "lr", "grad_norm", "loss_ema", "param_norm", "update_ratio", "step_time", "images_per_s",
                "data_wait", "gpu_memory"]  # the same list as bench/index_metrics.lua


def metric_names(keys):
    return [COMMON_NAMES[i] if i < len(COMMON_NAMES) else f"metric_{i + 1}" for i in range(keys)]


def expected_sum(steps, keys):
    """Sum over keys i = 1..keys and steps s = 1..steps of i + s * 1e-6."""
    return steps * keys * (keys + 1) / 2 + keys * 1e-6 * steps * (steps + 1) / 2


def latency_stats(samples_s):
    """Mean and nearest-rank percentiles of per-call durations (seconds), in microseconds."""
    ordered = sorted(samples_s)
    count = len(ordered)
    if count == 0:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "p999": 0.0, "max": 0.0, "samples": 0}

    def rank(p):
        return 1e6 * ordered[max(0, min(count - 1, math.ceil(p / 100 * count) - 1))]

    return {"mean": 1e6 * sum(ordered) / count, "p50": rank(50), "p90": rank(90), "p99": rank(99),
            "p999": rank(99.9), "max": 1e6 * ordered[-1], "samples": count}


# Verification ---------------------------------------------------------------------------------------

METRICS_FOUND = ("SELECT count(*), count(DISTINCT key), min(step), max(step), count(value), sum(value) "
                 "FROM metrics WHERE run = {run}")
LATEST_FOUND = "SELECT count(*), min(step), max(step) FROM metric_latest WHERE run = {run}"


def verify(db_path, run_key, steps, keys, tolerance):
    """Checks the metrics of one run in an SQLite index; `run_key` is the run's integer key.
    Returns a dict of what was found plus "ok" and "problems"."""
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        found = db.execute(METRICS_FOUND.format(run="?"), (run_key,)).fetchone()
        latest = db.execute(LATEST_FOUND.format(run="?"), (run_key,)).fetchone()
    finally:
        db.close()
    return judge(found, latest, steps, keys, tolerance)


def psql_row(server, database, query):
    """One row of a query through psql, as ints and floats (None for NULL)."""
    text = server.sql(query, database).strip()
    values = []
    for item in text.split("|"):
        if item == "":
            values.append(None)
            continue
        try:
            values.append(int(item))
        except ValueError:
            values.append(float(item))
    return tuple(values)


def verify_postgresql(server, database, run_key, steps, keys, tolerance):
    """verify() on a PostgreSQL index, through psql."""
    found = psql_row(server, database, METRICS_FOUND.format(run=int(run_key)))
    latest = psql_row(server, database, LATEST_FOUND.format(run=int(run_key)))
    return judge(found, latest, steps, keys, tolerance)


def judge(found, latest, steps, keys, tolerance):
    rows, distinct, first, last, non_null, total = found
    want = expected_sum(steps, keys)
    problems = []
    if rows != steps * keys:
        problems.append(f"{rows} rows, expected {steps * keys}")
    if distinct != keys:
        problems.append(f"{distinct} keys, expected {keys}")
    if (first, last) != (1, steps):
        problems.append(f"steps {first}..{last}, expected 1..{steps}")
    if non_null != rows:
        problems.append(f"{rows - non_null} NULL values")
    if total is None or abs(total - want) > tolerance * want:
        problems.append(f"sum of values {total}, expected {want}")
    if tuple(latest) != (keys, steps, steps):
        problems.append(f"metric_latest holds {latest[0]} keys at steps {latest[1]}..{latest[2]}, "
                        f"expected {keys} at {steps}")
    return {"ok": not problems, "rows": rows, "expected_rows": steps * keys, "keys": distinct,
            "sum": total, "expected_sum": want, "problems": problems}


# runner -----------------------------------------------------------------------------------------------

def run_runner(runner, home, settings, mode, steps, index_url=None):
    env = {"RUNNER_HOME": str(home)}
    if index_url:
        env["RUNNER_INDEX"] = index_url
    return run_runner_script(runner, "index_metrics.lua",
                             {"steps": steps, "keys": settings["keys"], "mode": mode,
                              "sample_every": settings["sample_every"], "flush_interval": settings["flush_interval"],
                              "work_us": settings["work_us"]},
                             env=env)


def measure_runner(runner, home, settings, mode):
    steps = settings["steps"] if mode == "number" else settings["tensor_steps"]
    result = run_runner(runner, home, settings, mode, steps)
    db_path = Path(home) / "index.db"
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        found = db.execute("SELECT run, status FROM runs WHERE id = ?", (result["run_id"],)).fetchone()
    finally:
        db.close()
    if found is None:
        sys.exit(f"runner: run {result['run_id']} is not in {db_path}")
    # Tensors are float32: each value is rounded to 24 bits.
    result["verified"] = verify(db_path, found[0], steps, settings["keys"], 1e-6 if mode == "number" else 1e-5)
    return checked_status(result, found[1])


def checked_status(result, status):
    result["verified"]["status"] = status
    if status != "finished":
        result["verified"]["ok"] = False
        result["verified"]["problems"].append(f"run status {status}")
    return result


def measure_runner_postgresql(runner, home, settings, server):
    """The numbers variant with the index in a fresh database of the benchmark's PostgreSQL server."""
    url = server.new_database()
    database = url.rsplit("/", 1)[1]
    result = run_runner(runner, home, settings, "number", settings["steps"], index_url=url)
    result["index"] = "postgresql"
    run_id = result["run_id"]
    if not all(c.isalnum() for c in run_id):
        sys.exit(f"runner printed an unexpected run id {run_id!r}")
    found = server.sql(f"SELECT run, status FROM runs WHERE id = '{run_id}'", database).strip()
    if not found:
        sys.exit(f"runner (PostgreSQL): run {run_id} is not in {url}")
    run_key, status = found.split("|")
    result["verified"] = verify_postgresql(server, database, int(run_key), settings["steps"], settings["keys"], 1e-6)
    server.sql(f"DROP DATABASE {database}")
    return checked_status(result, status)


def make_template(runner, directory, settings):
    """A runner-made index with one tiny run: the schema and the `runs` row the Python peer copies."""
    home = Path(directory) / "template"
    settings = dict(settings, keys=1, sample_every=1)
    result = run_runner(runner, home, settings, "number", 1)
    return home / "index.db", result["run_id"]


# Python peer -----------------------------------------------------------------------------------------

class SqliteTracker:
    """What a careful Python tracker does: rows buffered in a list, flushed in the caller's thread in one
    immediate transaction per `batch_rows` rows, with executemany on prepared (cached) statements."""

    INSERT = "INSERT OR REPLACE INTO metrics (run, key, step, value, time) VALUES (?, ?, ?, ?, ?)"
    LATEST = ("INSERT INTO metric_latest (run, key, step, value, time) VALUES (?, ?, ?, ?, ?) "
              "ON CONFLICT (run, key) DO UPDATE SET step = excluded.step, value = excluded.value, "
              "time = excluded.time WHERE excluded.step >= metric_latest.step")
    HEARTBEAT = "UPDATE runs SET heartbeat_at = ?, step = max(step, ?) WHERE run = ?"

    def __init__(self, path, run, batch_rows):
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        if self.db.execute("PRAGMA journal_mode = WAL").fetchone()[0] != "wal":
            raise RuntimeError(f"{path}: cannot switch to WAL mode")
        self.db.execute("PRAGMA synchronous = NORMAL")
        self.db.execute("PRAGMA foreign_keys = ON")
        self.run = run
        self.batch_rows = batch_rows
        self.rows = []
        self.step = 0

    def log(self, values, step):
        now = time.time()
        rows, run = self.rows, self.run
        for key, value in values.items():
            rows.append((run, key, step, value, now))
        self.step = step
        if len(rows) >= self.batch_rows:
            self.flush()

    def flush(self):
        if not self.rows:
            return
        rows, self.rows = self.rows, []
        newest = {}
        for row in rows:
            current = newest.get(row[1])
            if current is None or current[2] <= row[2]:
                newest[row[1]] = row
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany(self.INSERT, rows)
            db.executemany(self.LATEST, newest.values())
            db.execute(self.HEARTBEAT, (time.time(), self.step, self.run))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def close(self):
        self.flush()
        self.db.close()


def make_peer_database(path, template, template_run_id):
    """A new database with the template's schema (same CREATE statements, same user_version) and a copy
    of its run row. Returns the run's integer key."""
    source = sqlite3.connect(f"file:{template}?mode=ro", uri=True)
    try:
        statements = [sql for (sql,) in source.execute(
            "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid")]
        version = source.execute("PRAGMA user_version").fetchone()[0]
        columns = [row[1] for row in source.execute("PRAGMA table_info(runs)")]
        run_row = source.execute("SELECT * FROM runs WHERE id = ?", (template_run_id,)).fetchone()
    finally:
        source.close()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("BEGIN")
    for sql in statements:
        db.execute(sql)
    db.execute(f"PRAGMA user_version = {int(version)}")
    row = dict(zip(columns, run_row))
    row.update(status="running", step=0, ended_at=None)
    db.execute(f"INSERT INTO runs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
               [row[c] for c in columns])
    db.execute("COMMIT")
    db.close()
    return row["run"]


def logging_loop(log, flush, settings, steps):
    """The training loop of the Python sides, as bench/index_metrics.lua's: optionally --work-us of busy-wait,
    a dict of `keys` values per step, log(values, step), each call (or about every sample_every-th, at random
    gaps) timed on its own; then flush(). Returns the measurement."""
    names = metric_names(settings["keys"])
    indices = list(range(1, settings["keys"] + 1))
    stride = settings["sample_every"]
    gaps = random.Random(1)

    def gap():
        return 1 if stride == 1 else gaps.randint(1, 2 * stride - 1)

    work_s = settings["work_us"] * 1e-6
    clock = time.perf_counter
    samples, sample_steps = [], []
    next_sample = gap()
    start = clock()
    for step in range(1, steps + 1):
        if work_s > 0:
            until = clock() + work_s
            while clock() < until:
                pass
        values = {name: i + step * 1e-6 for name, i in zip(names, indices)}
        if step == next_sample:
            t0 = clock()
            log(values, step)
            samples.append(clock() - t0)
            sample_steps.append(step)
            next_sample = step + gap()
        else:
            log(values, step)
    logged = clock()
    flush()
    flushed = clock()
    rows = steps * settings["keys"]
    stats = latency_stats(samples)
    slowest = sorted(range(len(samples)), key=samples.__getitem__, reverse=True)[:5]
    return {"rows_per_s": rows / (flushed - start), "rows": rows, "steps": steps, "keys": settings["keys"],
            "seconds": flushed - start, "log_loop_s": logged - start, "flush_wait_s": flushed - logged,
            "log_loop_rows_per_s": rows / (logged - start), "log_s_estimate": stats["mean"] * 1e-6 * steps,
            "log_us": stats, "slowest": [{"step": sample_steps[i], "us": 1e6 * samples[i]} for i in slowest],
            "log_us_per_row_mean": stats["mean"] / settings["keys"], "sample_every": stride,
            "work_us": settings["work_us"]}


def clock_overhead(clock=time.perf_counter, n=20000):
    start = clock()
    for _ in range(n):
        clock()
    return (clock() - start) / n * 1e6


def measure_python(directory, template, template_run_id, settings):
    path = Path(directory) / "peer.db"
    run = make_peer_database(path, template, template_run_id)
    tracker = SqliteTracker(str(path), run, settings["batch_rows"])
    result = logging_loop(tracker.log, tracker.flush, settings, settings["steps"])
    tracker.close()
    result["clock_overhead_us"] = clock_overhead()
    result["batch_rows"] = settings["batch_rows"]
    result["verified"] = verify(path, run, settings["steps"], settings["keys"], 1e-6)
    return result


# MLflow ----------------------------------------------------------------------------------------------

def mlflow_available():
    """(True, version) or (False, why)."""
    try:
        import mlflow
    except Exception as error:  # ImportError, or a broken installation
        return False, f"mlflow is not importable in {sys.executable} ({type(error).__name__}: {error})"
    return True, mlflow.__version__


def measure_mlflow(directory, settings):
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    steps = settings["mlflow_steps"]
    path = Path(directory) / "mlflow.db"
    client = MlflowClient(tracking_uri=f"sqlite:///{path}")
    experiment = client.create_experiment("index-metrics-bench")
    run_id = client.create_run(experiment).info.run_id
    buffer = []

    def log(values, step):
        now = int(time.time() * 1000)
        for key, value in values.items():
            buffer.append(Metric(key, value, now, step))
        if len(buffer) >= 1000:
            flush()

    def flush():
        while buffer:
            client.log_batch(run_id, metrics=buffer[:1000])
            del buffer[:1000]

    result = logging_loop(log, flush, settings, steps)
    client.set_terminated(run_id)
    result["clock_overhead_us"] = clock_overhead()
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows, distinct, total = db.execute(
            "SELECT count(*), count(DISTINCT key), sum(value) FROM metrics WHERE run_uuid = ?", (run_id,)).fetchone()
    finally:
        db.close()
    want = expected_sum(steps, settings["keys"])
    problems = []
    if rows != steps * settings["keys"]:
        problems.append(f"{rows} rows, expected {steps * settings['keys']}")
    if distinct != settings["keys"]:
        problems.append(f"{distinct} keys, expected {settings['keys']}")
    if total is None or abs(total - want) > 1e-6 * want:
        problems.append(f"sum of values {total}, expected {want}")
    result["verified"] = {"ok": not problems, "rows": rows, "expected_rows": steps * settings["keys"],
                          "keys": distinct, "sum": total, "expected_sum": want, "problems": problems}
    return result


# Report ----------------------------------------------------------------------------------------------

LABELS = {"runner": "runner (numbers)", "runner_tensor": "runner (1-element tensors)",
          "runner_postgresql": "runner (numbers, PostgreSQL)", "python": "python sqlite3 peer",
          "mlflow": "mlflow sqlite store"}


def format_int(value):
    return "-" if value is None else f"{value:,.0f}"


def main():
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--steps", type=int, default=100_000, help="log calls per measurement (default 100000)")
    parser.add_argument("--keys", type=int, default=10, help="values per log call (default 10)")
    parser.add_argument("--tensor-steps", type=int,
                        help="log calls of the tensor variant (default --steps / 4: torch.tensor() per value is "
                             "the slow part of that loop)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds alternating the sides; medians reported")
    parser.add_argument("--sample-every", type=int, default=1,
                        help="time every log call (1, the default), or about every Nth at random gaps")
    parser.add_argument("--work-us", type=float, default=0.0,
                        help="busy-wait per step before logging, standing for a training step (default 0: flat out)")
    parser.add_argument("--batch-rows", type=int, default=50_000,
                        help="rows per transaction of the Python peer (default 50000, runner's flush_rows)")
    parser.add_argument("--flush-interval", type=float, default=1.0, help="runner's writer timer, s (default 1)")
    parser.add_argument("--mlflow-rows", type=int, default=100_000,
                        help="rows of the MLflow measurement, when mlflow is importable (default 100000)")
    parser.add_argument("--no-tensor", action="store_true", help="skip the tensor variant")
    parser.add_argument("--no-postgresql", action="store_true",
                        help="skip the PostgreSQL index (measured by default where PostgreSQL is installed)")
    parser.add_argument("--runner", default="build/runner", help="the runner binary (default $RUNNER_BIN or "
                                                                 "build/runner, relative to the checkout)")
    parser.add_argument("--only", choices=("runner", "python"), help="measure one side only (no ratio)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary databases (their path is printed)")
    parser.add_argument("--output", help="results JSON (default bench/results/index_metrics-<date>-<host>.json)")
    args = parser.parse_args()
    if args.steps < 1 or args.keys < 1 or args.rounds < 1 or args.sample_every < 1 or args.batch_rows < 1:
        parser.error("--steps, --keys, --rounds, --sample-every and --batch-rows must be >= 1")
    if args.work_us < 0 or args.flush_interval <= 0:
        parser.error("--work-us must be >= 0, --flush-interval > 0")
    if args.runner == "build/runner" and os.environ.get("RUNNER_BIN"):
        args.runner = os.environ["RUNNER_BIN"]
    runner = find_runner(args.runner)  # needed by both sides: the peer's schema comes from a runner-made index
    tensor_steps = args.tensor_steps or max(1, args.steps // 4)
    mlflow_ok, mlflow_note = mlflow_available()
    if args.no_postgresql or args.only == "python":
        postgresql_ok, postgresql_note = False, "not asked for"
    elif postgres_server.available():
        postgresql_ok, postgresql_note = True, f"server programs in {postgres_server.BIN}"
    else:
        postgresql_ok, postgresql_note = False, (f"no PostgreSQL server programs in {postgres_server.BIN} (Debian "
                                                 f"postgresql; or set RUNNER_POSTGRES_BIN)")
    settings = {"steps": args.steps, "keys": args.keys, "tensor_steps": tensor_steps,
                "sample_every": args.sample_every, "batch_rows": args.batch_rows,
                "flush_interval": args.flush_interval, "work_us": args.work_us,
                "mlflow_steps": max(1, args.mlflow_rows // args.keys)}

    sides = []
    if args.only != "python":
        sides += ["runner"] + ([] if args.no_tensor else ["runner_tensor"])
        sides += ["runner_postgresql"] if postgresql_ok else []
    if args.only != "runner":
        sides += ["python"] + (["mlflow"] if mlflow_ok else [])
    print(f"{args.steps:,} log calls x {args.keys} keys = {args.steps * args.keys:,} rows per measurement "
          f"(tensor variant {tensor_steps:,} calls); {args.rounds} rounds; "
          f"{'every call' if args.sample_every == 1 else f'about 1 call in {args.sample_every}'} timed"
          f"{f'; {args.work_us:g} us of busy-wait per step' if args.work_us else ''}",
          flush=True)
    if not mlflow_ok:
        print(f"mlflow: skipped: {mlflow_note}", flush=True)
    if not postgresql_ok and args.only != "python":
        print(f"PostgreSQL: skipped: {postgresql_note}", flush=True)

    load_before = os.getloadavg()
    scratch = Path(tempfile.mkdtemp(prefix="index-metrics-"))
    results = {side: [] for side in sides}
    server = None
    try:
        if postgresql_ok:
            server = postgres_server.PostgresServer().start()
            postgresql_note = f"{postgresql_note}; " + server.sql("SELECT version()").strip()
        template, template_run = make_template(runner, scratch, settings)
        for round_index in range(args.rounds):
            order = sides if round_index % 2 == 0 else sides[::-1]
            for side in order:
                directory = scratch / f"{side}-{round_index + 1}"
                directory.mkdir()
                if side == "runner":
                    result = measure_runner(runner, directory, settings, "number")
                elif side == "runner_tensor":
                    result = measure_runner(runner, directory, settings, "tensor")
                elif side == "runner_postgresql":
                    result = measure_runner_postgresql(runner, directory, settings, server)
                elif side == "python":
                    result = measure_python(directory, template, template_run, settings)
                else:
                    result = measure_mlflow(directory, settings)
                results[side].append(result)
                check = result["verified"]
                print(f"  round {round_index + 1}/{args.rounds}  {LABELS[side]:29s} {result['rows_per_s']:>11,.0f} "
                      f"rows/s  ({result['rows']:,} rows in {result['seconds']:.2f} s, flush wait "
                      f"{result['flush_wait_s']:.2f} s; log {result['log_us']['mean']:.2f} us/call mean, "
                      f"p99 {result['log_us']['p99']:.2f})  "
                      f"{'verified' if check['ok'] else 'INVALID: ' + '; '.join(check['problems'])}", flush=True)
                if not check["ok"]:
                    sys.exit(f"{LABELS[side]}: the index does not hold what was logged "
                             f"({'; '.join(check['problems'])}); databases kept in {scratch}")
                if not args.keep:
                    shutil.rmtree(directory)
    finally:
        if server:
            server.stop()  # its data folder too, --keep or not
        if args.keep:
            print(f"databases kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    summary = {}
    for side in sides:
        runs = results[side]
        rates = [r["rows_per_s"] for r in runs]
        summary[side] = {
            "label": LABELS[side], "rows_per_measurement": runs[0]["rows"],
            "rows_per_s": statistics.median(rates),
            "spread_pct": 100 * (max(rates) - min(rates)) / statistics.median(rates) if len(rates) > 1 else 0.0,
            "log_loop_rows_per_s": statistics.median(r["log_loop_rows_per_s"] for r in runs),
            "log_loop_s": statistics.median(r["log_loop_s"] for r in runs),
            "log_s_estimate": statistics.median(r["log_s_estimate"] for r in runs),
            "flush_wait_s": statistics.median(r["flush_wait_s"] for r in runs),
            **{f"log_us_{k}": statistics.median(r["log_us"][k] for r in runs) for k in ("mean", "p50", "p99", "p999", "max")},
            "log_us_per_row_mean": statistics.median(r["log_us_per_row_mean"] for r in runs),
            "clock_overhead_us": statistics.median(r["clock_overhead_us"] for r in runs),
            "rows_verified": all(r["verified"]["ok"] for r in runs),
        }
    ratio = None
    if "runner" in summary and "python" in summary:
        ratio = summary["runner"]["rows_per_s"] / summary["python"]["rows_per_s"]
    log_ratio = None
    if "runner" in summary and "python" in summary:
        log_ratio = summary["python"]["log_us_mean"] / summary["runner"]["log_us_mean"]

    print()
    print(f"{'side':<29} {'rows':>9} {'rows/s':>9} {'vs py':>5} {'spread':>6} {'loop s':>6} {'in log':>6} "
          f"{'flush':>6} {'log us/call':>11} {'p50':>6} {'p99':>6} {'p99.9':>8} {'max':>8} {'us/row':>6}  verified")
    for side in sides:
        row = summary[side]
        versus = "-" if "python" not in summary else f"{row['rows_per_s'] / summary['python']['rows_per_s']:.2f}"
        print(f"{row['label']:<29} {format_int(row['rows_per_measurement']):>9} {format_int(row['rows_per_s']):>9} "
              f"{versus:>5} {row['spread_pct']:>5.0f}% {row['log_loop_s']:>6.2f} {row['log_s_estimate']:>6.2f} "
              f"{row['flush_wait_s']:>6.2f} {row['log_us_mean']:>11.2f} {row['log_us_p50']:>6.2f} "
              f"{row['log_us_p99']:>6.2f} {row['log_us_p999']:>8.1f} {row['log_us_max']:>8.0f} "
              f"{row['log_us_per_row_mean']:>6.3f}  {'yes' if row['rows_verified'] else 'NO'}")
    if not mlflow_ok and args.only != "runner":
        print(f"{LABELS['mlflow']:<29} skipped: {mlflow_note}")
    if not postgresql_ok and args.only != "python":
        print(f"{LABELS['runner_postgresql']:<29} skipped: {postgresql_note}")
    overheads = ", ".join(f"{side} {summary[side]['clock_overhead_us']:.3f} us" for side in sides)
    print(f"medians over rounds; spread = (max - min) / median of rows/s. loop s: first log to last log returned "
          f"(building the values + log calls); in log: time inside log calls; flush: wait for the final commit. "
          f"A log call carries {args.keys} values; each timed call includes one clock reading ({overheads})")
    if log_ratio is not None:
        print(f"mean log call: python peer / runner = {log_ratio:.2f}")
    if "runner" in summary:
        rate = summary["runner"]["rows_per_s"]
        met = "met" if rate >= TARGET_ROWS_PER_S else "NOT met"
        print(f"target {TARGET_ROWS_PER_S:,} rows/s sustained: {met} (runner {rate:,.0f} rows/s)")

    versions = {"runner": runner_version(runner), "python_sqlite": sqlite3.sqlite_version,
                "mlflow": mlflow_note if mlflow_ok else None,
                "postgresql": postgresql_note if postgresql_ok else None}
    fields = {
        "settings": {**settings, "rounds": args.rounds, "sides": sides, "runner": str(runner),
                     "target_rows_per_s": TARGET_ROWS_PER_S,
                     "values": "key i (1-based) at step s: i + s * 1e-6; names loss, lr, grad_norm, ... "
                               "(metric_N beyond 10); tensor variant: torch.tensor(value), float32",
                     "timed": "sustained rows/s = rows / (end of the final flush - start of the first log call); "
                              "log call cost: every sample_every-th call timed alone, one clock reading included",
                     "python_peer": "Python sqlite3, runner's schema and PRAGMAs (WAL, synchronous=NORMAL, "
                                    "foreign_keys=ON), rows appended to a list, flushed in the caller's thread "
                                    "every batch_rows rows: BEGIN IMMEDIATE, executemany INSERT OR REPLACE, "
                                    "metric_latest upsert, heartbeat, COMMIT",
                     "postgresql": "runner (numbers) with RUNNER_INDEX on a throwaway local server "
                                   "(tests/cli/postgres_server.py: initdb, fsync=off), a fresh database per "
                                   "measurement"},
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "mlflow": {"measured": mlflow_ok, "note": mlflow_note},
        "postgresql": {"measured": postgresql_ok, "note": postgresql_note},
        "rounds": results,
        "medians": summary,
        "target_met": None if "runner" not in summary else summary["runner"]["rows_per_s"] >= TARGET_ROWS_PER_S,
        "log_call_ratio_python_over_runner": log_ratio,
    }
    write_record("index_metrics", machine_info(), versions, fields, ratio, args.output)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
