"""Issue 60, item 3: an answer of the index server lost in the network loses no metric value and fails no run, whatever
the statement timeout. A proxy withholds the server's answer to the metric writer's heartbeat and keeps both ends of
the connection open, so the server keeps that session, and the locks of its transaction, until its idle timeout (60 s)
would end it; the writer gives the session up after the statement timeout and 10 s more, and the next session ends
it. With `summary`, the script's own transaction waits for those locks past the statement timeout meanwhile, and runs
again once the session is ended."""
import subprocess
import time
import unittest

import postgres_server
from lossy_proxy import LossyProxy
from runner_process import RUNNER, RunnerHomeTest

# 3 keys at each of 20 steps; at step 10 the script waits until RUNNER_HOME/release exists, which the test makes once
# the writer's answer is withheld, so that the values after it are logged while the writer waits for that answer.
SCRIPT = """
local cfg = config { steps = 20, summary = 0 }
local run = runner.start(cfg, { system_metrics = false })
for step in run:steps(cfg.steps) do
  run:log { loss = 1 / step, lr = 0.01, score = step }
  if step == cfg.steps / 2 then
    local since = runner.clock()
    while true do
      local released = io.open(os.getenv("RUNNER_HOME") .. "/release")
      if released then released:close() break end
      if runner.clock() - since > 120 then error("not released within 120 s") end
      os.execute("sleep 0.1")
    end
    if cfg.summary == 1 then run:set_summary { half = step } end
  end
end
"""

WRITER_HEARTBEAT = "UPDATE runs SET heartbeat_at"
ENDED_BY_RUNNER = "terminating connection due to administrator command"


@unittest.skipIf(postgres_server.missing(), f"no PostgreSQL server: {postgres_server.missing()}")
class LostAnswersOnPostgres(RunnerHomeTest):
    def setUp(self):
        super().setUp()
        self.server = postgres_server.shared_server()
        self.script("lost.lua", SCRIPT)

    def start(self, statement_timeout, summary):
        """A run of lost.lua through a proxy of its own that withholds the writer's first heartbeat's answer."""
        database = self.server.new_database().rsplit("/", 1)[1]
        proxy = LossyProxy(self.server.port, withhold=[WRITER_HEARTBEAT])
        self.addCleanup(proxy.close)
        home = self.dir / f"home-{statement_timeout}-{summary}"
        env = {**self.env, "RUNNER_HOME": str(home), "RUNNER_INDEX_STATEMENT_TIMEOUT": str(statement_timeout),
               "RUNNER_INDEX": f"postgresql://runner@127.0.0.1:{proxy.port}/{database}"}
        process = subprocess.Popen([RUNNER, "lost.lua", f"summary={summary}"], cwd=self.dir, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: process.poll() is None and process.kill())
        return {"timeout": statement_timeout, "summary": summary, "database": database, "proxy": proxy,
                "home": home, "process": process, "released": False}

    def sql(self, database, query):
        return [line.split("|") for line in self.server.sql(query, database).splitlines() if line]

    def test_an_answer_lost_in_the_network_loses_no_value_whatever_the_statement_timeout(self):
        # The runs wait side by side: the longest, 30 s of statement timeout, gives the session up after 40 s.
        runs = [self.start(timeout, summary) for timeout in (5, 15, 30) for summary in (0, 1)]
        deadline = time.time() + 240
        while time.time() < deadline and any(run["process"].poll() is None for run in runs):
            for run in runs:
                if not run["released"] and run["proxy"].withheld_event.is_set():
                    run["home"].mkdir(parents=True, exist_ok=True)
                    (run["home"] / "release").touch()
                    run["released"] = True
            time.sleep(0.1)
        for run in runs:
            with self.subTest(statement_timeout=run["timeout"], summary=run["summary"]):
                if run["process"].poll() is None:
                    run["process"].kill()
                stdout, stderr = run["process"].communicate()
                self.assertEqual(run["proxy"].withheld, [WRITER_HEARTBEAT])
                self.assertEqual(run["process"].returncode, 0, stderr)
                self.assertEqual(self.sql(run["database"], "SELECT status, error, summary FROM runs"),
                                 [["finished", "", '{"half":10}' if run["summary"] else "{}"]])
                self.assertEqual(self.sql(run["database"], "SELECT key, count(*), sum(step) FROM metrics "
                                                           "GROUP BY key ORDER BY key"),
                                 [["loss", "20", "210"], ["lr", "20", "210"], ["score", "20", "210"]])
                # runner ended the session it gave up (the idle timeout would have, 60 s after the answer was lost).
                wait_until = time.time() + 10
                while not run["proxy"].farewells and time.time() < wait_until:
                    time.sleep(0.1)
                self.assertEqual(len(run["proxy"].farewells), 1)
                self.assertIn(ENDED_BY_RUNNER, run["proxy"].farewells[0])


if __name__ == "__main__":
    unittest.main()
