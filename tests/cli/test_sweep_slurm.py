"""Sweeps on Slurm: the job script of `runner sweep --slurm N`, its array tasks run as Slurm runs them (each task's
`runner sweep --join` finishes every trial once with the others; a worker stopped mid-trial hands its trial to
another), and a real single-node Slurm (slurmctld, slurmd and munged started by the test) when it is installed."""
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import time
import unittest

from ports import free_port
from runner_process import RUNNER
from test_sweep import CHECKPOINTING, SweepTest, holding

SWEEP = """
  script = "synthetic.lua",
  parameters = { width = { 1, 2, 3, 4 } }, fixed = { steps = 30, sleep = 0.03 },
  method = "grid", metric = "score",
"""


class SlurmSweepTest(SweepTest):
    def setUp(self):
        super().setUp()
        self.script("synthetic.lua", holding(CHECKPOINTING))
        self.sweep_file("grid.lua", SWEEP)

    def hold_trials_at(self, step):
        """grid.lua with every trial held after `step` until RUNNER_HOME/release exists (test_sweep.holding)."""
        self.sweep_file("grid.lua", SWEEP.replace("sleep = 0.03", f"sleep = 0.03, hold_at = {step}"))

    def job_script(self):
        return (self.home / "sweeps" / "grid" / "slurm-job.sh").resolve()

    def write_job_script(self, workers):
        """`runner sweep grid.lua --slurm N` where no sbatch can be found: the sweep is recorded and its job script
        written (for sbatch by hand), and the command says so and fails."""
        result = subprocess.run([RUNNER, "sweep", "grid.lua", "--slurm", str(workers)], cwd=self.dir,
                                env={**self.env, "PATH": "/nonexistent"}, capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn(f"cannot run sbatch (No such file or directory): --slurm submits the workers with Slurm's sbatch",
                      result.stderr)
        self.assertIn(f"{self.job_script()} is written for `sbatch` by hand", result.stderr)
        return self.job_script()

    def start_task(self, script, task, job=77):
        """Starts the job script as Slurm starts task `task` of array job `job` (bash, with Slurm's variables)."""
        env = {**self.env, "SLURM_ARRAY_JOB_ID": str(job), "SLURM_ARRAY_TASK_ID": str(task),
               "SLURM_JOB_ID": str(job + 1 + task), "SLURM_JOB_NODELIST": socket.gethostname(), "SLURM_NTASKS": "1",
               "SLURM_PROCID": "0"}
        return subprocess.Popen(["bash", str(script)], cwd="/", env=env, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)

    def assert_every_trial_finished_once(self):
        trials = self.trials("grid")
        self.assertEqual([(t[0], t[1], t[3]) for t in trials], [(n, "finished", 30) for n in (1, 2, 3, 4)])
        self.assertEqual(self.sql("SELECT count(*) FROM runs"), [(4,)])
        for trial in trials:
            self.assertEqual(sum(len(a) for a in self.attempts(trial[6])), 30)
        self.assertEqual(self.sql("SELECT status FROM sweeps"), [("finished",)])
        return trials


class JobScript(SlurmSweepTest):
    def test_the_dry_run_prints_the_job_script_and_records_nothing(self):
        env = {**self.env, "RUNNER_INDEX": "postgresql://sweeper@db.cluster/runs"}
        result = subprocess.run([RUNNER, "sweep", "grid.lua", "--slurm", "3", "--dry-run", "--", "--partition=gpu",
                                 "--gres=gpu:4", "--time", "12:00:00"], cwd=self.dir, env=env, capture_output=True,
                                text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        # The index server (made up here) cannot be reached from this host: the dry run says it, and goes on.
        self.assertRegex(result.stderr, r"^runner sweep: postgresql://sweeper@db\.cluster/runs: cannot connect to the "
                                        r"index server at db\.cluster:5432: .*; the dry run goes on without comparing "
                                        r"the file with a sweep stored there\n$")
        self.assertIn("sweep grid: 4 trials (grid)", result.stdout)
        home = self.home.resolve()
        script = result.stdout[result.stdout.index("#!/bin/bash"):]
        self.assertIn(f"written to {home}/sweeps/grid/slurm-job.sh", result.stdout.replace("writes it to", "written to"))
        lines = script.splitlines()
        self.assertEqual([line for line in lines if line.startswith("#SBATCH")], [
            "#SBATCH --job-name=sweep-grid",
            "#SBATCH --array=0-2",
            f"#SBATCH --output={home}/sweeps/grid/slurm-%A_%a.log",
            "#SBATCH --open-mode=append",
            "#SBATCH --requeue",
            "#SBATCH --signal=B:USR1@120",
            "#SBATCH --partition=gpu",
            "#SBATCH --gres=gpu:4",
            "#SBATCH --time 12:00:00",
        ])
        self.assertIn(f"export RUNNER_HOME={home}", lines)
        self.assertIn("export RUNNER_INDEX=postgresql://sweeper@db.cluster/runs", lines)
        self.assertIn(f"cd {self.dir} || exit 1", lines)
        self.assertIn(f"{os.path.realpath(RUNNER)} sweep --join grid &", lines)
        self.assertIn('if [ -n "$requeue" ] && [ "$status" = 0 ]; then scontrol requeue "$SLURM_JOB_ID"; fi', lines)
        self.assertFalse(self.home.exists())  # a dry run records nothing
        # Without RUNNER_INDEX the script sets none.
        plain = self.runner("sweep", "grid.lua", "--slurm", "1", "--dry-run", check=0)
        self.assertIn("#SBATCH --array=0-0", plain.stdout)
        self.assertNotIn("RUNNER_INDEX", plain.stdout)

    def test_a_worker_counts_the_cores_of_its_allocation_not_the_nodes(self):
        if (os.cpu_count() or 1) < 2 or len(os.sched_getaffinity(0)) < 2:
            self.skipTest("this test runs on 1 core: an allocation of fewer cannot be told apart")
        self.sweep_file("two.lua", SWEEP + "  slots = 2,")
        cpu = {**self.env, "CUDA_VISIBLE_DEVICES": ""}  # CPU slots, also on a GPU host
        for extra, prefix, source in [({"SLURM_CPUS_ON_NODE": "1"}, [], "SLURM_CPUS_ON_NODE"),
                                      ({}, ["taskset", "-c", "0"], "its CPU affinity")]:
            result = subprocess.run([*prefix, RUNNER, "sweep", "--dry-run", "two.lua"], cwd=self.dir,
                                    env={**cpu, **extra}, capture_output=True, text=True, timeout=120)
            self.assertEqual((result.returncode, result.stderr),
                             (2, f"runner sweep: two.lua:6: slots = 2 runs 2 processes at once on the CPU, more than "
                                 f"the 1 core this worker may use ({source})\n"), source)
        # An allocation of 2 holds the 2 slots.
        result = subprocess.run([RUNNER, "sweep", "--dry-run", "two.lua"], cwd=self.dir,
                                env={**cpu, "SLURM_CPUS_ON_NODE": "2"}, capture_output=True, text=True, timeout=120)
        self.assertEqual((result.returncode, result.stderr), (0, ""))

    def test_wrong_slurm_command_lines_are_usage_errors(self):
        cases = [
            (["--slurm", "0"], "--slurm needs a number of workers, 1 or more; got '0'"),
            (["--slurm", "two"], "--slurm needs a number of workers, 1 or more; got 'two'"),
            (["--", "--partition=gpu"], "the options after -- are sbatch's: give them with --slurm N"),
            (["--slurm", "2", "--", "--array=0-9"], "--slurm: --array=0-9 is set by --slurm N (one array task per"),
            (["--slurm", "2", "--", "gpu"], "--slurm: 'gpu' after -- is not an sbatch option"),
        ]
        for arguments, message in cases:
            result = self.runner("sweep", "grid.lua", *arguments, "--dry-run", check=2)
            self.assertIn(message, result.stderr)
        result = self.runner("sweep", "--join", "grid", "--slurm", "2", check=2)
        self.assertIn("--slurm needs a sweep file", result.stderr)

    def test_array_tasks_of_the_job_script_run_every_trial_once_and_show_lists_them(self):
        self.hold_trials_at(3)  # both workers are there while show lists them
        script = self.write_job_script(2)
        self.assertEqual(self.job_script().stat().st_mode & 0o777, 0o600)
        self.assertEqual(self.sql("SELECT name, status FROM sweeps"), [("grid", "running")])
        tasks = [self.start_task(script, task) for task in (0, 1)]
        try:
            self.wait_for_steps(2, 3)
            deadline = time.time() + 60
            while time.time() < deadline and len(self.sql("SELECT worker FROM sweep_workers")) < 2:
                time.sleep(0.2)
            shown = self.runner("sweep", "show", "grid", check=0).stdout
            (self.home / "release").touch()
            host = socket.gethostname()
            self.assertIn(f"workers (2 on 1 host):", shown)
            rows = [line.split() for line in shown[shown.index("workers ("):].splitlines()[3:]]
            self.assertEqual(sorted((r[0], r[2]) for r in rows), [(host, "77_0"), (host, "77_1")], shown)
            pids = self.sql("SELECT pid FROM sweep_workers ORDER BY slurm_job")
            self.assertEqual(sorted(int(r[1]) for r in rows), sorted(p[0] for p in pids))
            outputs = [task.communicate(timeout=180)[0] for task in tasks]
        finally:
            (self.home / "release").touch()  # a held trial whose worker is killed stops, after its step
            for task in tasks:
                if task.poll() is None:
                    os.killpg(task.pid, signal.SIGKILL)
        for task, output in zip(tasks, outputs):
            self.assertEqual(task.returncode, 0, output)
        self.assert_every_trial_finished_once()
        started = sum(output.count(" started (new)") for output in outputs)
        self.assertEqual(started, 4)
        self.assertTrue(all(" started (new)" in output for output in outputs), outputs)
        self.assertEqual(self.sql("SELECT count(*) FROM sweep_workers"), [(0,)])

    def test_a_preempted_worker_checkpoints_its_trial_and_another_continues_it(self):
        self.hold_trials_at(8)  # the preemption comes at step 8, past the checkpoint of step 5
        script = self.write_job_script(2)
        tasks = [self.start_task(script, task) for task in (0, 1)]
        try:
            deadline = time.time() + 120
            while not (running := self.sql("SELECT t.trial, w.pid FROM trials t JOIN sweep_workers w ON t.worker = "
                                           "? || ':' || w.pid WHERE w.slurm_job = '77_0' AND t.status = 'running'",
                                           socket.gethostname())):
                self.assertLess(time.time(), deadline, "worker 77_0 started no trial")
                time.sleep(0.2)
            (stopped_trial, pid), = running
            self.wait_for_trial_step(stopped_trial, 8)
            trial_pid = self.sql("SELECT a.pid FROM attempts a JOIN runs r USING (run) WHERE r.trial = ? "
                                 "ORDER BY a.attempt DESC LIMIT 1", stopped_trial)[0][0]
            # Slurm's preemption: SIGTERM to every process of the task, so the trial gets it from Slurm and again
            # from its worker, and still stops once, with a checkpoint.
            for process in (trial_pid, pid, tasks[0].pid):
                os.kill(process, signal.SIGTERM)
            (self.home / "release").touch()
            first = tasks[0].communicate(timeout=120)[0]
            self.assertEqual(tasks[0].returncode, -signal.SIGTERM, first)  # the task's shell
            self.assertIn("stopping the running trials with a checkpoint", first)
            self.assertRegex(first, r"worker stopped: .*; 1 other worker of sweep grid goes on with it")
            second = tasks[1].communicate(timeout=180)[0]
            self.assertEqual(tasks[1].returncode, 0, second)
        finally:
            (self.home / "release").touch()  # a held trial whose worker is killed stops, after its step
            for task in tasks:
                if task.poll() is None:
                    os.killpg(task.pid, signal.SIGKILL)
        self.assertIn(f"trial {stopped_trial} started (continued from step 8)", second)
        trials = self.assert_every_trial_finished_once()
        run_id = [t[6] for t in trials if t[0] == stopped_trial][0]
        # Continued from the checkpoint its SIGTERM saved (attempts() asserts that no step ran twice).
        self.assertEqual(len(self.attempts(run_id)), 2)
        self.assertIn("stopping after this step and a checkpoint", (self.home / "sweeps" / "grid" /
                                                                     f"trial-{stopped_trial:04d}.log").read_text())


def slurm_missing():
    """Why a single-node Slurm cannot be started here, or None."""
    for program in ("slurmctld", "slurmd", "munged", "mungekey", "sbatch", "squeue"):
        if not shutil.which(program, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"):
            return f"{program} is not installed (Debian slurm-wlm and munge; scripts/setup installs them)"
    if os.geteuid() != 0:
        return "slurmd starts jobs as root"
    return None


def processes_naming(text):
    """The processes but this one whose command line or environment contains `text` (not zombies: they have
    neither)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline, open(f"/proc/{entry}/environ", "rb") as environ:
                if text.encode() in cmdline.read() + b"\0" + environ.read():
                    pids.append(int(entry))
        except OSError:  # ended meanwhile
            pass
    return pids


@unittest.skipIf(slurm_missing(), f"no single-node Slurm: {slurm_missing()}")
class RealSlurm(SlurmSweepTest):
    """`runner sweep --slurm 2` submitted with sbatch to a Slurm cluster of this host, started for the test."""

    def setUp(self):
        super().setUp()
        self.cluster = self.dir / "slurm"
        for folder in ("state", "spool", "munge"):
            (self.cluster / folder).mkdir(parents=True)
        (self.cluster / "munge").chmod(0o700)
        sbin = "/usr/sbin:/sbin:" + os.environ.get("PATH", "")
        self.cluster_env = {**os.environ, "PATH": sbin}
        try:
            self.start_cluster(sbin)
        except BaseException:  # tearDown does not run after a failed setUp: what started goes now
            self.stop_cluster()
            raise

    def start_cluster(self, sbin):
        """munged, slurmctld and slurmd of this host, with their files in self.cluster."""
        subprocess.run(["mungekey", "-c", "-k", str(self.cluster / "munge/munge.key")], check=True, env=self.cluster_env)
        munge = self.cluster / "munge"
        subprocess.run(["munged", f"--socket={munge}/socket", f"--key-file={munge}/munge.key",
                        f"--pid-file={munge}/pid", f"--log-file={munge}/log", f"--seed-file={munge}/seed", "--force"],
                       check=True, env=self.cluster_env)
        self.host = socket.gethostname().split(".")[0]
        cores = os.cpu_count()
        (self.cluster / "slurm.conf").write_text(f"""
ClusterName=runnertest
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge}/socket
CredType=cred/munge
StateSaveLocation={self.cluster}/state
SlurmdSpoolDir={self.cluster}/spool
SlurmctldPidFile={self.cluster}/slurmctld.pid
SlurmdPidFile={self.cluster}/slurmd.pid
SlurmctldLogFile={self.cluster}/slurmctld.log
SlurmdLogFile={self.cluster}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait=10
MinJobAge=300
NodeName={self.host} NodeAddr=127.0.0.1 CPUs={cores} State=UNKNOWN
PartitionName=test Nodes={self.host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")
        self.cluster_env["SLURM_CONF"] = str(self.cluster / "slurm.conf")
        self.env = {**self.env, "SLURM_CONF": str(self.cluster / "slurm.conf"), "PATH": sbin}
        subprocess.run(["slurmctld", "-c", "-i"], check=True, env=self.cluster_env)
        subprocess.run(["slurmd", "-c", "-N", self.host], check=True, env=self.cluster_env)
        deadline = time.time() + 30
        while time.time() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=self.cluster_env)
            if state.stdout.strip() == "idle":
                break
            time.sleep(0.5)
        else:
            self.fail(f"the test's Slurm did not come up: {state.stdout} {state.stderr}\n" + self.logs())

    def logs(self):
        return "\n".join(f"== {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
                         for log in sorted(self.cluster.glob("*.log")))

    def stop_cluster(self):
        """Cancels the jobs and waits for their end, then ends every process that names the cluster's folder (the
        daemons, and whatever a job left): SIGTERM, then SIGKILL to those still there after 10 s."""
        if self.cluster_env.get("SLURM_CONF") == str(self.cluster / "slurm.conf"):  # not another cluster's jobs
            subprocess.run(["scancel", "--user", "root"], env=self.cluster_env, capture_output=True)
            deadline = time.time() + 30
            while time.time() < deadline:
                queue = subprocess.run(["squeue", "-h"], env=self.cluster_env, capture_output=True, text=True)
                if queue.returncode != 0 or not queue.stdout.strip():
                    break
                time.sleep(0.5)
        for signal_number, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 0)):
            for pid in processes_naming(str(self.cluster)):
                try:
                    os.kill(pid, signal_number)
                except ProcessLookupError:
                    pass
            deadline = time.time() + grace
            while time.time() < deadline and processes_naming(str(self.cluster)):
                time.sleep(0.1)

    def tearDown(self):
        self.stop_cluster()
        super().tearDown()

    def test_sbatch_runs_the_workers_as_a_job_array(self):
        result = self.runner("sweep", "grid.lua", "--slurm", "2", "--", "--time=10:00", check=0)
        job = re.search(r"sweep grid: submitted Slurm job (\d+), 2 workers \(array tasks 0-1\)", result.stdout)
        self.assertIsNotNone(job, result.stdout + result.stderr)
        job = job.group(1)
        deadline = time.time() + 240
        seen = set()  # the workers' Slurm jobs, as `runner sweep show` lists them
        while time.time() < deadline and self.sql("SELECT status FROM sweeps") != [("finished",)]:
            seen |= {row[0] for row in self.sql("SELECT slurm_job FROM sweep_workers")}
            time.sleep(0.2)
        self.assertEqual(seen, {f"{job}_0", f"{job}_1"})
        while time.time() < deadline:  # the tasks' ends
            queue = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True, env=self.cluster_env)
            if not queue.stdout.strip():
                break
            time.sleep(0.5)
        logs = "".join(path.read_text() for path in sorted((self.home / "sweeps" / "grid").glob("slurm-*.log")))
        self.assertEqual(self.sql("SELECT status FROM sweeps"), [("finished",)], logs + self.logs())
        self.assert_every_trial_finished_once()
        for task in (0, 1):
            self.assertTrue((self.home / "sweeps" / "grid" / f"slurm-{job}_{task}.log").exists(), logs)
        self.assertEqual(logs.count(" started (new)"), 4, logs)
        self.assertIn("`sbatch` this file to submit it again", self.job_script().read_text())


if __name__ == "__main__":
    unittest.main()
