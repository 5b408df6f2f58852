"""End-to-end tests of the runner command line: exit codes and the exact text users see."""
import select
import signal
import subprocess
import textwrap
import time
import unittest

from runner_process import RUNNER, TempDirTest, run


class ScriptDir(TempDirTest):
    def run_script(self, *args, **kwargs):
        return run(*args, cwd=self.dir, **kwargs)


class CommandLine(ScriptDir):
    def test_version_names_every_component(self):
        result = run("--version")
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        self.assertEqual(lines[0], "runner 0.1.0")
        self.assertEqual(lines[1], "LibTorch 2.11.0")
        self.assertRegex(result.stdout, r"CUDA 13\.\d+: (available|not available \(no device\))")
        self.assertRegex(result.stdout, r"\nLuaJIT 2\.1")
        self.assertRegex(result.stdout, r"\nSQLite 3\.\d+\.\d+")

    def test_help_exits_zero(self):
        result = run("--help")
        self.assertEqual(result.returncode, 0)
        self.assertTrue(result.stdout.startswith("usage: runner [options] SCRIPT.lua [key=value ...]"))
        for command in ("runner data pack DIR OUT.npy", "runner data encode IMAGES OUT.npy --vae VAE",
                        "runner data fid-stats IMAGES OUT.npz --weights PATH"):
            self.assertIn(command, result.stdout)

    def test_usage_errors_exit_2(self):
        for args, message in [
            ((), "runner: no script given"),
            (("--bogus",), "runner: unknown option '--bogus'"),
            (("--log-level", "loud", "-e", "x=1"),
             "runner: unknown log level 'loud' (expected trace, debug, info, warn, error or off)"),
            (("-e",), "runner: -e needs a value"),
        ]:
            result = run(*args)
            self.assertEqual(result.returncode, 2, args)
            self.assertEqual(result.stderr.splitlines()[0], message)

    def test_every_command_reports_a_usage_error_one_way(self):
        # One parser and one usage error for runner, runner sweep, runner data and the index commands:
        # "runner CMD: message", then one line pointing to the help (not the whole usage, which would push the
        # message off the screen); exit status 2.
        for args, message, help_line in [
            (("--frsh", "a.lua"), "runner: unknown option '--frsh'; did you mean '--fresh'?", "see 'runner --help'"),
            (("a.lua", "--fresh"), "runner: got '--fresh' after the script: runner's options go before it (runner "
                                   "--fresh SCRIPT.lua ...)", "see 'runner --help'"),
            (("a.lua", "--steps", "10"), "runner: expected key=value after the script, got '--steps': did you mean "
                                         "steps=10? (script arguments go after --)", "see 'runner --help'"),
            (("a.lua", "--lr=0.1"), "runner: expected key=value after the script, got '--lr=0.1': did you mean "
                                    "lr=0.1? (script arguments go after --)", "see 'runner --help'"),
            (("a.lua", "fast"), "runner: expected key=value after the script, got 'fast' (use -- before script "
                                "arguments)", "see 'runner --help'"),
            (("run", "a.lua"), "runner: 'run' is not a command: the script comes first (runner a.lua key=value ...)",
             "see 'runner --help'"),
            (("sweep", "--dry-rn", "s.lua"), "runner sweep: unknown option '--dry-rn'; did you mean '--dry-run'?",
             "see 'runner sweep --help'"),
            (("sweep", "--join"), "runner sweep: --join needs a sweep (a name or number)", "see 'runner sweep --help'"),
            (("sweep", "a.lua", "b.lua"), "runner sweep: unexpected argument 'b.lua'", "see 'runner sweep --help'"),
            (("data", "pack", "d", "o.npy", "--sizee", "8"), "runner data: unknown option '--sizee'; did you mean "
                                                             "'--size'?", "see 'runner data --help'"),
            (("data", "pack", "d", "o.npy", "--size=0"), "runner data: --size needs a positive integer, got '0'",
             "see 'runner data --help'"),
            (("data", "pack", "d", "o.npy", "x"), "runner data: unexpected argument 'x'", "see 'runner data --help'"),
            (("runs", "--jsn"), "runner runs: unknown option '--jsn'; did you mean '--json'?", "see 'runner runs --help'"),
            (("runs", "--limit"), "runner runs: --limit needs a value", "see 'runner runs --help'"),
            (("runs", "--csv=yes"), "runner runs: --csv takes no value, got '--csv=yes'", "see 'runner runs --help'"),
        ]:
            result = self.run_script(*args)
            self.assertEqual(result.returncode, 2, args)
            self.assertEqual(result.stderr.splitlines(), [message, help_line], args)
            self.assertEqual(result.stdout, "")

    def test_the_index_commands_usage_says_where_the_index_is(self):
        # RUNNER_HOME's index.db, or a PostgreSQL database through RUNNER_INDEX or --index URL: the same text for
        # --help, for a usage error, and in runner --help.
        where = ("index commands (the index is RUNNER_HOME/index.db; RUNNER_HOME defaults to ./runs; with\n"
                 "RUNNER_INDEX=postgresql://USER@HOST:PORT/DB, or --index URL given to any of these commands, it is that "
                 "PostgreSQL\ndatabase, and RUNNER_HOME holds the run folders only):\n")
        shown = self.run_script("runs", "--help")
        self.assertEqual((shown.returncode, shown.stderr), (0, ""))
        self.assertTrue(shown.stdout.startswith(where), shown.stdout[:400])
        refused = self.run_script("query", "--limit")
        self.assertEqual(refused.returncode, 2)
        self.assertEqual(refused.stderr, "runner query: --limit needs a value\nsee 'runner query --help'\n")
        self.assertIn(where, self.run_script("--help").stdout)
        # The --index it names is taken by each index command, and a URL that is not PostgreSQL's is refused.
        for command in (("runs",), ("sweeps",), ("query", "SELECT 1")):
            result = self.run_script(*command, "--index", "mysql://db/runs")
            self.assertEqual(result.returncode, 1, (command, result.stdout, result.stderr))
            self.assertEqual(result.stderr, f"runner {command[0]}: RUNNER_INDEX / --index 'mysql://db/runs' is not a "
                                            "postgresql:// URL (leave it unset for the SQLite index in RUNNER_HOME)\n")

    def test_help_among_the_options_prints_the_commands_help(self):
        for args, usage in [(("runs", "--csv", "--help"), "index commands"), (("sweep", "show", "-h"), "index commands"),
                            (("sweep", "--dry-run", "--help"), "usage: runner sweep"),
                            (("data", "encode", "--flip", "-h"), "usage: runner data encode")]:
            result = self.run_script(*args)
            self.assertEqual((result.returncode, result.stderr), (0, ""), args)
            self.assertTrue(result.stdout.startswith(usage), (args, result.stdout[:80]))

    def test_missing_script(self):
        result = self.run_script("nope.lua")
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stderr, "runner: cannot open nope.lua: No such file or directory\n")

    def test_code_string(self):
        result = run("-e", "print(torch.ones(2, 2):sum():item())")
        self.assertEqual((result.returncode, result.stdout), (0, "4\n"))


class Print(ScriptDir):
    def test_a_table_prints_as_the_repl_shows_it_not_as_its_address(self):
        self.script("p.lua", 'print({1, 2, a = "x"}, "s", 3, nil, setmetatable({}, {__tostring = function() '
                             'return "T" end}), {})\nprint()\n')
        result = self.run_script("p.lua")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, '{ 1, 2, a = "x" }\ts\t3\tnil\tT\t{}\n\n')


class Errors(ScriptDir):
    def test_syntax_error_names_file_and_line(self):
        name = self.script("bad.lua", """
            local x = 1
            local y = 2
            local z = = 3
        """)
        result = self.run_script(name)
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr, "bad.lua:3: unexpected symbol near '='\n")

    def test_runtime_error_has_user_traceback(self):
        name = self.script("fail.lua", """
            local function inner()
              error("boom")
            end
            inner()
        """)
        result = self.run_script(name)
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr,
                         "fail.lua:2: boom\nstack traceback:\n\tfail.lua:2: in function 'inner'\n\tfail.lua:4: in main chunk\n")

    def test_bad_argument_to_a_binding(self):
        name = self.script("arg.lua", """
            local t = torch.ones(2)
            local u = torch.zeros("three")
        """)
        result = self.run_script(name)
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr.splitlines()[0], "arg.lua:2: bad argument #1 to 'zeros' (table expected, got string)")

    def test_libtorch_error_is_reported_at_the_script_line(self):
        name = self.script("shape.lua", """
            local a = torch.zeros(2, 3)

            local b = a:matmul(torch.zeros(2, 3))
        """)
        result = self.run_script(name)
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr.splitlines()[0], "shape.lua:3: mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3)")

    def test_error_in_a_required_module_names_that_module(self):
        self.script("helper.lua", """
            return { go = function() return torch.zeros(2) + torch.zeros(3) end }
        """)
        name = self.script("main.lua", """
            local helper = require("helper")
            helper.go()
        """)
        result = self.run_script(name)
        self.assertEqual(result.returncode, 1)
        first = result.stderr.splitlines()[0]
        self.assertTrue(first.startswith("./helper.lua:1: The size of tensor a (2) must match the size of tensor b (3)"), first)
        self.assertIn("main.lua:2: in main chunk", result.stderr)


class ErrorPositions(ScriptDir):
    def test_a_long_script_path_is_shown_whole_and_relative_to_the_working_directory(self):
        folder = self.dir / "users" / "me" / "projects" / "diffusion" / "experiments" / "mistakes"
        folder.mkdir(parents=True)
        relative = "users/me/projects/diffusion/experiments/mistakes"
        (folder / "runtime_error.lua").write_text("local x = 1\nerror('boom')\n")
        (folder / "binding_error.lua").write_text("local x = torch.zeros(2, 3)\nlocal y = x:narrow(5, 1, 1)\n")
        (folder / "syntax_error.lua").write_text("local x = 1\nlocal = 2\n")
        for name, text in (("runtime_error.lua", ":2: boom"), ("binding_error.lua", ":2: "),
                           ("syntax_error.lua", ":2: '<name>' expected near '='")):
            for given in (str(folder / name), f"{relative}/{name}"):
                result = self.run_script(given)
                self.assertEqual(result.returncode, 1, result.stderr)
                self.assertTrue(result.stderr.startswith(f"{relative}/{name}{text}"), result.stderr)
                self.assertNotIn("...", result.stderr.splitlines()[0])
        # A traceback names the files whole, too.
        result = self.run_script(f"{relative}/runtime_error.lua")
        self.assertIn(f"\n\t{relative}/runtime_error.lua:2: in main chunk", result.stderr)


class Config(ScriptDir):
    SCRIPT = """
        local cfg = config { lr = 0.1, steps = 10, name = "base", amp = true, mults = {1, 2} }
        print(cfg.lr, cfg.steps, cfg.name, cfg.amp, table.concat(cfg.mults, "/"))
    """

    def test_defaults_and_overrides_typed_by_default(self):
        name = self.script("cfg.lua", self.SCRIPT)
        result = self.run_script(name)
        self.assertEqual(result.stdout, "0.1\t10\tbase\ttrue\t1/2\n")
        result = self.run_script(name, "lr=0.5", "steps=3", "amp=false", "name=run7", "mults=1,2,4")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "0.5\t3\trun7\tfalse\t1/2/4\n")
        self.assertRegex(result.stderr, r"\[info\] config: amp=false\* lr=0\.5\* mults=\{1,2,4\}\* name=run7\* steps=3\*  \(\* overridden\)")

    def test_unknown_key_lists_the_known_ones(self):
        name = self.script("cfg.lua", self.SCRIPT)
        result = self.run_script(name, "lrr=0.5")
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stderr, "cfg.lua:1: unknown config key 'lrr' (known keys: amp, lr, mults, name, steps); "
                                        "did you mean 'lr'?\n")
        result = self.run_script(name, "stpes=5")
        self.assertIn("unknown config key 'stpes' (known keys: amp, lr, mults, name, steps); did you mean 'steps'?\n",
                      result.stderr)
        result = self.run_script(name, "batch=5")
        self.assertEqual(result.stderr, "cfg.lua:1: unknown config key 'batch' (known keys: amp, lr, mults, name, steps)\n")
        result = self.run_script(name, "lr=0.5", "lr=0.7")
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stderr, "cfg.lua:1: config key 'lr' is given twice\n")

    def test_bad_value_names_the_key_and_type(self):
        name = self.script("cfg.lua", self.SCRIPT)
        result = self.run_script(name, "lr=fast")
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stderr, "cfg.lua:1: bad value 'fast' for config key 'lr': expected a number (default 0.1)\n")
        result = self.run_script(name, "amp=maybe")
        self.assertEqual(result.stderr, "cfg.lua:1: bad value 'maybe' for config key 'amp': expected true or false (default true)\n")

    def test_integer_defaults_take_whole_numbers(self):
        name = self.script("ints.lua", """
            local cfg = config {
              steps = 600,      -- an integer literal: whole numbers only
              clip = 1.0,       -- a float literal: any number
              scale = 2e3,
              offset = -3,
            }
            print(cfg.steps, cfg.clip, cfg.scale, cfg.offset)
        """)
        result = self.run_script(name, "steps=2.5")
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stderr, "ints.lua:1: bad value '2.5' for config key 'steps': expected a whole number "
                                        "(default 600)\n")
        self.assertIn("for config key 'offset': expected a whole number", self.run_script(name, "offset=0.5").stderr)
        result = self.run_script("--log-level", "warn", name, "steps=1e3", "clip=0.5", "scale=2.5", "offset=-7")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "1000\t0.5\t2.5\t-7\n")

    def test_reading_an_undeclared_key_is_an_error(self):
        name = self.script("cfg.lua", """
            local cfg = config { lr = 0.1 }
            print(cfg.batch)
        """)
        result = self.run_script("--log-level", "warn", name)
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr.splitlines()[0], "cfg.lua:2: config has no key 'batch' (known keys: lr)")

    def test_assigning_to_the_config_is_checked_as_key_value_is(self):
        name = self.script("assign.lua", """
            local cfg = config({ every = 100, lr = 0.1, amp = true, mults = { 1, 2 } }, { every = { min = 1 } })
            local function try(f) local ok, e = pcall(f); print(ok and "ok" or e) end
            try(function() cfg.evrey = 10 end)
            try(function() cfg.every = 'x' end)
            try(function() cfg.every = 0 end)
            try(function() cfg.every = -5 end)
            try(function() cfg.every = 2.5 end)
            try(function() cfg.lr = 0 / 0 end)
            try(function() cfg.lr = 1 / 0 end)
            try(function() cfg.amp = 1 end)
            try(function() cfg.mults = { 1, "a" } end)
            cfg.every, cfg.lr, cfg.mults = 7, 0.5, { 4 }
            local keys = {}
            for key in pairs(cfg) do keys[#keys + 1] = key end
            table.sort(keys)
            print(cfg.every, cfg.lr, cfg.mults[1], table.concat(keys, ","))
        """)
        result = self.run_script("--log-level", "warn", name)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.splitlines(), [
            "assign.lua:3: config has no key 'evrey' (known keys: amp, every, lr, mults); did you mean 'every'?",
            "assign.lua:4: bad value 'x' for config key 'every': expected a whole number >= 1 (default 100)",
            "assign.lua:5: bad value 0 for config key 'every': expected a whole number >= 1 (default 100)",
            "assign.lua:6: bad value -5 for config key 'every': expected a whole number >= 1 (default 100)",
            "assign.lua:7: bad value 2.5 for config key 'every': expected a whole number >= 1 (default 100)",
            "assign.lua:8: bad value nan for config key 'lr': expected a number (default 0.1)",
            "assign.lua:9: bad value inf for config key 'lr': expected a number (default 0.1)",
            "assign.lua:10: bad value 1 for config key 'amp': expected true or false (default true)",
            "assign.lua:11: bad value {1,a} for config key 'mults': expected a comma-separated list of numbers "
            "(default {1,2})",
            "7\t0.5\t4\tamp,every,lr,mults",
        ])
        # The limits hold on the command line too, and nan or inf are not numbers a key takes.
        result = self.run_script(name, "every=0")
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stderr, "assign.lua:1: bad value '0' for config key 'every': expected a whole number "
                                        ">= 1 (default 100)\n")
        self.assertEqual(self.run_script(name, "lr=nan").returncode, 2)
        bad = self.script("limits.lua", "local cfg = config({ lr = 0.1, name = 'a' }, { name = { min = 1 } })")
        result = self.run_script(bad)
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr.splitlines()[0],
                         "limits.lua:1: config limits: 'name' is not a declared number (or list of numbers)")

    def test_overrides_need_a_config(self):
        name = self.script("plain.lua", "print('ran')\n")
        result = self.run_script(name, "lr=1")
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stderr, "overrides given (lr=1) but the script declares no config { ... } to apply them to\n")
        result = self.run_script(name, "positional")
        self.assertEqual(result.returncode, 2)
        self.assertIn("expected key=value after the script, got 'positional'", result.stderr)

    def test_script_arguments_after_double_dash(self):
        name = self.script("args.lua", "print(arg[0], arg[1], arg[2])\n")
        result = self.run_script(name, "--", "a", "b=c")
        self.assertEqual(result.stdout, "args.lua\ta\tb=c\n")

    def test_log_level_hides_the_config_line(self):
        name = self.script("cfg.lua", self.SCRIPT)
        result = self.run_script("--log-level", "warn", name)
        self.assertEqual(result.stderr, "")


class Exit(ScriptDir):
    def test_os_exit_flushes_output_and_runs_finalizers(self):
        name = self.script("exit.lua", """
            local marker = newproxy(true)
            getmetatable(marker).__gc = function()
              local f = io.open("finalized.txt", "w"); f:write("yes"); f:close()
            end
            io.write("partial line without newline")
            os.exit(3)
            print("not reached")
        """)
        result = self.run_script(name)
        self.assertEqual(result.returncode, 3)
        self.assertEqual(result.stdout, "partial line without newline")
        self.assertEqual((self.dir / "finalized.txt").read_text(), "yes")

    def test_os_exit_boolean(self):
        self.assertEqual(run("-e", "os.exit(false)").returncode, 1)
        self.assertEqual(run("-e", "os.exit(true)").returncode, 0)


class Interrupt(ScriptDir):
    def interrupt(self, args, stdin_text=None, after=None):
        process = subprocess.Popen([RUNNER, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, cwd=self.dir)
        if stdin_text:
            process.stdin.write(stdin_text)
            process.stdin.flush()
        time.sleep(2)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(input=after, timeout=60)
        return process.returncode, out, err

    def test_ctrl_c_stops_a_loop_of_tensor_calls(self):
        code, _, err = self.interrupt(["-e", "while true do local t = torch.zeros(4) + 1 end"])
        self.assertEqual(code, 130)
        self.assertEqual(err, "interrupted\n")

    def test_ctrl_c_stops_an_interpreted_lua_loop(self):
        code, _, err = self.interrupt(["-e", "jit.off() local n = 0 while true do n = n + 1 end"])
        self.assertEqual(code, 130)
        self.assertEqual(err, "interrupted\n")

    def test_second_ctrl_c_ends_a_jit_compiled_loop(self):
        # Compiled traces run no hooks: the first Ctrl-C cannot stop them, the second ends the process.
        process = subprocess.Popen([RUNNER, "-e", "local n = 0 while true do n = n + 1 end"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(2)
        process.send_signal(signal.SIGINT)
        time.sleep(1)
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
        self.assertEqual(process.returncode, -signal.SIGINT)

    def test_ctrl_c_in_the_repl_keeps_the_repl(self):
        code, out, err = self.interrupt(["repl"], "while true do local t = torch.ones(1) end\n", "print('alive')\n")
        self.assertEqual(code, 0)
        self.assertIn("interrupted", err)
        self.assertEqual(out, "alive\n")


class Repl(ScriptDir):
    def test_piped_input_prints_expressions_and_survives_errors(self):
        session = textwrap.dedent("""
            x = 2
            =x * 3
            x + 1, "two"
            function f()
              return torch.arange(3)
            end
            f()
            error("bad")
            {a = 1, b = {2, 3}}
            nn.Linear(2, 1)
            print("after")
        """).lstrip()
        result = run("repl", stdin=session)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.splitlines(), [
            "6", '3\t"two"', "tensor([0, 1, 2])", "{ a = 1, b = { 2, 3 } }",
            "Linear(in_features=2, out_features=1, bias=true)", "after",
        ])
        self.assertEqual(result.stderr.splitlines()[0], "stdin:1: bad")

    def test_syntax_errors_are_reported_and_the_session_goes_on(self):
        result = run("repl", stdin="x = = 1\nprint('ok')\n")
        self.assertEqual(result.stdout, "ok\n")
        self.assertEqual(result.stderr, "stdin:1: unexpected symbol near '='\n")

    def test_interactive_after_a_script_sees_its_globals(self):
        name = self.script("setup.lua", "answer = 41\n")
        result = self.run_script("-i", name, stdin="=answer + 1\n")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "42\n")

    def test_interactive_after_a_script_sees_its_top_level_locals(self):
        name = self.script("locals.lua", """
            local model = { width = 32 }
            local steps = 10
            do local hidden = 1 end
            local steps = steps * 2
        """)
        result = self.run_script("-i", name, stdin="=model.width, steps, hidden\n")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "32\t20\tnil\n")
        # After an error, as they were at the error.
        name = self.script("failing.lua", """
            local model = { width = 64 }
            error("boom")
            local later = 1
        """)
        result = self.run_script("-i", name, stdin="=model.width, later\n")
        self.assertEqual(result.stdout, "64\tnil\n")
        self.assertIn("failing.lua:2: boom", result.stderr)

    def test_an_error_in_a_one_line_expression_is_at_line_1(self):
        result = run("repl", stdin="=nosuch.field\n=1 -- a comment\n")
        self.assertEqual(result.stdout, "1\n")
        self.assertTrue(result.stderr.startswith("stdin:1: attempt to index global 'nosuch' (a nil value)"), result.stderr)

    def test_history_keeps_the_line_as_typed(self):
        # On a terminal (a pseudo-terminal here), with the history in RUNNER_HISTORY.
        import os
        import pty
        history = self.dir / "history"
        pid, fd = pty.fork()
        if pid == 0:
            os.environ["RUNNER_HISTORY"] = str(history)
            os.execv(RUNNER, [RUNNER, "repl"])
        seen = b""

        def read_until(token):
            nonlocal seen
            deadline = time.time() + 60
            while token not in seen and time.time() < deadline:
                ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.time()))
                if not ready:
                    break
                try:
                    seen += os.read(fd, 4096)
                except OSError:
                    break
            return token in seen

        try:
            self.assertTrue(read_until(b"> "), seen)
            os.write(fd, b"=math.max(2,3)\n")
            # The next prompt first: the line editor flushes input typed before it takes the terminal.
            self.assertTrue(read_until(b"3\r\n> "), seen)
            # ^U ^D (kill the line, then end of input) every second until the REPL ends: a ^D typed before the
            # line editor has set up the terminal for the next line (the prompt can show before that) is
            # either discarded or kept as a literal character, after which a lone ^D only rings the bell.
            deadline = time.time() + 60
            next_eof = 0.0
            while time.time() < deadline:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                if time.time() >= next_eof:
                    try:
                        os.write(fd, b"\x15\x04")
                    except OSError:
                        pass
                    next_eof = time.time() + 1.0
                time.sleep(0.05)
            else:
                self.fail(f"the REPL did not end on ^D; it printed {seen!r}")
        finally:
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            os.close(fd)
        self.assertEqual(status, 0)
        self.assertIn("=math.max(2,3)", history.read_text().splitlines())

    def test_os_exit_in_the_repl(self):
        result = run("repl", stdin="os.exit(4)\nprint('no')\n")
        self.assertEqual(result.returncode, 4)
        self.assertEqual(result.stdout, "")


class SafetensorsInterop(ScriptDir):
    def test_python_reads_what_runner_writes(self):
        import torch
        from safetensors.torch import load_file
        result = self.run_script("-e", """
            torch.save({
              weight = torch.arange(12):reshape(3, 4):float() / 2,
              ids = torch.arange(5),
              half = torch.ones(2, 2, {dtype = "float16"}),
              bf = torch.full({3}, 1.5, {dtype = "bfloat16"}),
              mask = torch.tensor({true, false}),
              transposed = torch.arange(6):reshape(2, 3):t(),
            }, "out.safetensors", {note = "from runner"})
        """)
        self.assertEqual(result.returncode, 0, result.stderr)
        tensors = load_file(str(self.dir / "out.safetensors"))
        self.assertTrue(torch.equal(tensors["weight"], torch.arange(12).reshape(3, 4).float() / 2))
        self.assertEqual(tensors["ids"].dtype, torch.int64)
        self.assertEqual(tensors["half"].dtype, torch.float16)
        self.assertTrue(torch.equal(tensors["bf"], torch.full((3,), 1.5, dtype=torch.bfloat16)))
        self.assertEqual(tensors["mask"].tolist(), [True, False])
        self.assertTrue(torch.equal(tensors["transposed"], torch.arange(6).reshape(2, 3).t()))
        from safetensors import safe_open
        with safe_open(str(self.dir / "out.safetensors"), "pt") as f:
            self.assertEqual(f.metadata(), {"note": "from runner"})


if __name__ == "__main__":
    unittest.main()
