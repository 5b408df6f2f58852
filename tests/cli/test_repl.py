"""The REPL as a user meets it: after `runner -i`, on a (pseudo-)terminal, stopped by signals, and help."""
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
        # LuaJIT compiles the loop after a few dozen iterations: it says when it is well past them.
        terminal.type(b"n = 0 while true do n = n + 1 if n == 100000 then io.write('looping\\n') end end\n")
        self.assertTrue(terminal.read_until(b"looping\r\n"), terminal.seen)
        terminal.type(b"\x03")  # the terminal's Ctrl-C: SIGINT to the REPL
        self.assertTrue(terminal.read_until(b"interrupted\r\n> ", seconds=60), terminal.seen)  # only a hang waits 60 s
        terminal.type(b"=n > 1000\n")
        self.assertTrue(terminal.read_until(b"true\r\n> "), terminal.seen)
        terminal.type(b"os.exit(3)\n")
        self.assertEqual(terminal.wait(60), 3)

    def test_sigterm_stops_the_chunk_and_ends_the_repl(self):
        for loop in ("while true do end", "while true do local t = torch.ones(1) end"):
            with self.subTest(loop=loop):
                process = subprocess.Popen([RUNNER, "repl"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True, cwd=self.dir)
                self.addCleanup(process.kill)
                # The chunk says on stderr that it runs: the signal comes once runner is in it, however long runner
                # took to start.
                process.stdin.write("io.stderr:write('running\\n') " + loop + "\nprint('after')\n")
                process.stdin.flush()
                ready, _, _ = select.select([process.stderr], [], [], 60)
                self.assertTrue(ready, "the REPL did not run the chunk within 60 s")
                self.assertEqual(process.stderr.readline(), "running\n")
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
        terminal.type(b"io.write('looping\\n') while true do end\n")
        self.assertTrue(terminal.read_until(b"looping\r\n"), terminal.seen)
        os.close(terminal.fd)
        terminal.fd = None
        self.assertEqual(terminal.wait(10), 128 + signal.SIGHUP)
        terminal = self.terminal()
        os.close(terminal.fd)
        terminal.fd = None
        self.assertEqual(terminal.wait(10), -signal.SIGHUP)

    def test_tab_offers_only_the_methods_the_object_has(self):
        terminal = self.terminal()
        terminal.type(b"m = nn.Linear(2, 1)\n")
        self.assertTrue(terminal.read_until(b"> "), terminal.seen)
        start = len(terminal.seen)
        terminal.type(b"m:\t\t")
        self.assertTrue(terminal.read_until(b"\x1b[K> m:"), terminal.seen)  # the listing, then the line again
        listing = terminal.seen[start:]
        self.assertIn(b"m:forward", listing)
        for absent in (b"m:encode", b"m:decode", b"m:set_checkpointing", b"m:info"):
            self.assertNotIn(absent, listing)
        # A Lua-defined module completes its class's methods; a value that is not a name completes nothing.
        terminal.type(b"\x15M = nn.Module('M') function M:hello() print('hello ' .. 'there') end x = M()\n")
        self.assertTrue(terminal.read_until(b"> "), terminal.seen)
        terminal.type(b"x:hel\t")
        self.assertTrue(terminal.read_until(b"lo"), terminal.seen)  # completed to x:hello
        terminal.type(b"()\n")
        self.assertTrue(terminal.read_until(b"hello there\r\n"), terminal.seen)
        terminal.type(b"\x15('s'):\t\t")
        self.assertFalse(terminal.read_until(b":assert", seconds=2), terminal.seen)


class Help(TempDirTest):
    def repl(self, session):
        result = run("repl", stdin=session, cwd=self.dir)
        self.assertEqual((result.returncode, result.stderr), (0, ""))
        return result.stdout

    def test_help_of_a_function_prints_its_stub_with_its_options_table(self):
        out = self.repl("help(torch.randn)\n")
        self.assertRegex(out, r"^torch\.randn\(\.\.\.\)\n  Standard normal\.\n  @return Tensor\n"
                              r"  -- stdlib/meta/torch\.lua:\d+\n$")
        out = self.repl("help(nn.DiT)\n")
        self.assertTrue(out.startswith("nn.DiT(options)\n  DiT (Peebles & Xie 2023) by size name"), out)
        self.assertIn("\n  @param options DiTOptions\n", out)
        self.assertIn("\nDiTOptions\n  size? string ", out)
        # a description continued on `---   ` lines in the stub reads as one line
        self.assertIn("as runner's CUDA kernels (runtime/kernels), every block's adaLN projection in one GEMM; the same "
                      "parameters,", out)

    def test_help_of_a_name_finds_the_function_its_options_and_the_class(self):
        out = self.repl('help "trainer"\n')
        self.assertTrue(out.startswith("runner.trainer(options)\n  @param options TrainerOptions\n"), out)
        self.assertIn("\nTrainerOptions\n  model Module ", out)
        self.assertIn("\nTrainer\n", out)
        self.assertIn("\n  methods: step, ", out)

    def test_help_of_an_object_lists_the_methods_it_has(self):
        out = self.repl("help(nn.Linear(2, 2))\nhelp(nn.DiT { depth = 1, hidden = 32, heads = 2, image = 8 })\n")
        linear, dit = out.split("\nDenoiser: Module\n")
        self.assertTrue(linear.startswith("Module\n"), linear)
        self.assertNotIn("set_checkpointing", linear)
        self.assertIn("  methods: set_checkpointing, info\n  Module methods: forward, ", dit)

    def test_help_says_when_nothing_is_documented(self):
        out = self.repl('help "nosuch"\nhelp(function() end)\nhelp(print)\nhelp(nosuch)\n')
        self.assertEqual(out.splitlines(), [
            'help: nothing documented is named "nosuch" or contains it',
            "help: a function defined at stdin:1, not one of runner's: nothing is documented for it",
            "help: print is Lua's own (the Lua 5.1 reference manual documents it), not runner's",
            'help: the value is nil (a misspelt name?); help "name" searches the documented names',
        ])

    def test_a_shape_prints_as_sizes(self):
        out = self.repl("t = torch.zeros(2, 3)\nprint(t.shape, t:size(), torch.ones(4).shape)\n=t.shape[2], #t.shape\n")
        self.assertEqual(out, "[2, 3]\t[2, 3]\t[4]\n3\t2\n")


if __name__ == "__main__":
    unittest.main()
