"""The REPL as a user meets it: after `runner -i`, on a (pseudo-)terminal, stopped by signals."""
import os
import pty
import select
import signal
import subprocess
import time
import unittest

from runner_process import RUNNER, TempDirTest, run


class Terminal:
    """`runner ARGS...` on a pseudo-terminal: what it printed so far, typing, and waiting for its end."""

    def __init__(self, args, cwd):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            try:
                os.chdir(cwd)
                os.environ["RUNNER_HISTORY"] = os.path.join(cwd, "history")
                os.execv(RUNNER, [RUNNER, *args])
            finally:
                os._exit(127)
        self.seen = b""

    def read_until(self, token, seconds=60):
        """Reads until `token` appears after what was read before; returns whether it did within `seconds`."""
        start = len(self.seen)
        deadline = time.time() + seconds
        while token not in self.seen[start:] and time.time() < deadline:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.time()))
            if not ready:
                break
            try:
                self.seen += os.read(self.fd, 4096)
            except OSError:
                break
        return token in self.seen[start:]

    def type(self, text):
        os.write(self.fd, text)

    def wait(self, seconds):
        """The exit status once the process ends within `seconds`, else None."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        return None

    def close(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Repl(TempDirTest):
    def terminal(self, *args):
        terminal = Terminal(args or ["repl"], str(self.dir))
        self.addCleanup(terminal.close)
        self.assertTrue(terminal.read_until(b"> "), terminal.seen)
        return terminal

    def test_next_after_an_iter_loop_gives_the_following_batch(self):
        # The loop's end stopped the prefetching; the next batch must still come, not wait forever.
        name = self.script("train.lua", """
            local ds = runner.data.shapes { size = 8, count = 64 }
            local loader = runner.data.loader(ds, { batch = 4, workers = 1, shuffle = false })
            for batch in loader:iter { from = 0, to = 3 } do end
        """)
        try:
            result = run("-i", name, cwd=self.dir, stdin="b = loader:next()\n=b.step, b.index:tolist()\n",
                         timeout=60)
        except subprocess.TimeoutExpired:
            self.fail("loader:next() after the iter loop hung")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "4\t{ 12, 13, 14, 15 }\n")

    def test_ctrl_c_stops_a_compiled_lua_loop_and_the_prompt_comes_back(self):
        terminal = self.terminal()
        terminal.type(b"n = 0 while true do n = n + 1 end\n")
        time.sleep(1)  # LuaJIT compiles the loop after a few dozen iterations
        terminal.type(b"\x03")  # the terminal's Ctrl-C: SIGINT to the REPL
        self.assertTrue(terminal.read_until(b"interrupted\r\n> ", seconds=1), terminal.seen)
        terminal.type(b"=n > 1000\n")
        self.assertTrue(terminal.read_until(b"true\r\n> "), terminal.seen)
        terminal.type(b"os.exit(3)\n")
        self.assertEqual(terminal.wait(60), 3)

    def test_sigterm_stops_the_chunk_and_ends_the_repl(self):
        for chunk in ("while true do end", "while true do local t = torch.ones(1) end"):
            with self.subTest(chunk=chunk):
                process = subprocess.Popen([RUNNER, "repl"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True, cwd=self.dir)
                self.addCleanup(process.kill)
                process.stdin.write(chunk + "\nprint('after')\n")
                process.stdin.flush()
                time.sleep(1)
                process.send_signal(signal.SIGTERM)
                try:
                    out, err = process.communicate(timeout=10)
                except subprocess.TimeoutExpired:
                    self.fail("the REPL did not end on SIGTERM")
                self.assertEqual(process.returncode, 143)
                self.assertEqual(err, "interrupted by signal 15 (Terminated)\n")
                self.assertEqual(out, "")

    def test_a_closed_terminal_ends_the_repl(self):
        # Closing the terminal hangs up the session: at the prompt and in a running loop alike, the REPL ends.
        terminal = self.terminal()
        terminal.type(b"while true do end\n")
        time.sleep(1)
        os.close(terminal.fd)
        terminal.fd = None
        self.assertEqual(terminal.wait(10), 128 + signal.SIGHUP)
        terminal = self.terminal()
        os.close(terminal.fd)
        terminal.fd = None
        self.assertEqual(terminal.wait(10), -signal.SIGHUP)


if __name__ == "__main__":
    unittest.main()
