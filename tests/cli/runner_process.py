"""Shared by the CLI tests: the runner binary, running it as a subprocess, and per-test script directories."""
import os
import pathlib
import subprocess
import tempfile
import textwrap
import unittest

RUNNER = os.environ.get("RUNNER_BIN", str(pathlib.Path(__file__).resolve().parents[2] / "build" / "runner"))


def run(*args, stdin=None, cwd=None, env=None, timeout=120, preexec_fn=None):
    """Runs `runner ARGS...` to completion with text stdin/stdout/stderr; returns the CompletedProcess."""
    return subprocess.run([RUNNER, *args], input=stdin, capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout, preexec_fn=preexec_fn)


def home_env(home):
    """This process's environment with RUNNER_HOME set to home, and the host leases of sweep workers beside it (the
    workers of one test share the host's cores; those of tests that run at once do not see each other)."""
    return {**os.environ, "RUNNER_HOME": str(home), "RUNNER_HOST_LEASES": str(pathlib.Path(home).parent / "host-leases")}


def write_script(directory, name, text):
    """Writes text, dedented and without its leading newlines, to directory/name; returns name."""
    (pathlib.Path(directory) / name).write_text(textwrap.dedent(text).lstrip("\n"))
    return name


class TempDirTest(unittest.TestCase):
    """A fresh temporary directory per test, as self.dir, where script() writes Lua scripts."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = pathlib.Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def script(self, name, text):
        return write_script(self.dir, name, text)


class RunnerHomeTest(TempDirTest):
    """A TempDirTest whose runs go to self.home (self.dir / "home"), with runner() running the binary there."""

    def setUp(self):
        super().setUp()
        self.home = self.dir / "home"
        self.env = home_env(self.home)

    def runner(self, *args, check=None, timeout=180, preexec_fn=None):
        """Runs `runner ARGS...` in self.dir with self.env; asserts the exit status when check is not None."""
        result = run(*args, cwd=self.dir, env=self.env, timeout=timeout, preexec_fn=preexec_fn)
        if check is not None:
            self.assertEqual(result.returncode, check, f"runner {' '.join(args)}\n{result.stdout}\n{result.stderr}")
        return result
