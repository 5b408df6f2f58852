"""`runner serve` end to end: the dashboard over an index with runs and a sweep, loaded in headless Chromium
(curves, grids, compare, sweep charts, live updates without reload), and its access rules: loopback only by
default, the printed token (or --no-token on loopback), nothing that writes, and clients that send or read slowly
or hold many connections cannot stall the others."""
import http.client
import json
import os
import re
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import postgres_server
import report_screenshot
import test_sweep
from ports import free_port
from runner_process import RUNNER, home_env, write_script

# late_at > 0: the run holds before step late_at, where late_metric starts, until the file page-open exists, and
# before the next step until the file seen exists.
# A trainer steps too, for runner's own time/* metrics (logged at step 25 and the last); the run's sys/* metrics come
# every `system_metrics` seconds.
TRAINING_SCRIPT = """
local cfg = config { steps = 30, lr = 0.01, sleep = 0.0, late_at = 0, system_metrics = 10.0 }
local run = runner.start(cfg, { system_metrics = cfg.system_metrics })
local model = nn.Linear(2, 1)
local train = runner.trainer { model = model, optimizer = { "sgd", lr = 0.001 }, steps = cfg.steps, progress = false }
for step in run:steps(cfg.steps) do
  if step == cfg.late_at then
    while not io.open("page-open") do os.execute("sleep 0.05") end
  end
  if cfg.late_at > 0 and step == cfg.late_at + 1 then
    while not io.open("seen") do os.execute("sleep 0.05") end
  end
  train:step(function() return model(torch.ones(2, 2)):pow(2):mean() end)
  local values = { loss = 1 / step * cfg.lr * 100, lr = cfg.lr }
  if step % 10 == 0 then values.val_loss, values.weights = 1.1 * values.loss, torch.linspace(-1, 1, 100) * step end
  if cfg.late_at > 0 and step >= cfg.late_at then values.late_metric = step end
  run:log(values)
  if run:every(10) then run:images("samples", torch.linspace(-1, 1, 2 * 3 * 4 * 4):reshape(2, 3, 4, 4) * step / 30) end
  if cfg.sleep > 0 then
    local t = runner.clock()
    while runner.clock() - t < cfg.sleep do end
  end
end
"""

# A run that fails after logging a few steps.
BROKEN_SCRIPT = """
local run = runner.start(config { steps = 5 })
for step in run:steps(5) do
  run:log { loss = 1 / step }
  if step == 3 then error("broken on purpose at step " .. step) end
end
"""

# A sweep that does not prune: no ASHA rungs.
PLAIN_SWEEP = """
return runner.sweep {
  script = "synthetic.lua", name = "plain",
  parameters = { mode = { "plain", "fancy" } },
  fixed = { steps = 3 }, method = "grid", metric = "score",
}
"""

SWEEP = """
return runner.sweep {
  script = "synthetic.lua", name = "lrs",
  parameters = { lr = runner.sweep.log_uniform(1e-4, 1), mode = { "plain", "fancy" } },
  fixed = { steps = 9 }, method = "random", trials = 6, seed = 3, metric = "score",
  prune = { "asha", min_steps = 3, reduction = 3 },
}
"""


def start_serve(home, *args, env=None):
    """Starts `runner serve --port 0 ARGS` (ARGS may give the port) over home (with env added to its
    environment); returns (process, url) once it listens."""
    port = [] if "--port" in args else ["--port", "0"]
    process = subprocess.Popen([RUNNER, "serve", *port, *args], env={**home_env(home), **(env or {})},
                               stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    match = re.match(r"runner serve: (http://\S+)", line)
    if not match:
        process.kill()
        process.wait()
        raise AssertionError(f"runner serve printed {line!r}, stderr {process.stderr.read()}")
    return process, match.group(1)


def split_token(url):
    """(http://HOST:PORT/, token) of a printed URL; the token is None when there is none."""
    base, _, query = url.partition("?")
    return base, urllib.parse.parse_qs(query).get("token", [None])[0]


def stop_serve(process):
    """SIGTERM, and SIGKILL if it has not ended 30 s later."""
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    finally:
        process.stdout.close()
        process.stderr.close()


def get(url, method="GET", headers=None, token=None):
    """(status, headers, body) of one request; with the token as ?token= when one is given."""
    if token is not None:
        url += ("&" if "?" in url else "?") + "token=" + token
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def other_address():
    """This machine's address on a non-loopback interface, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # no packet is sent; it picks the outgoing interface
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


class Dashboard(unittest.TestCase):
    """One index with two finished runs and a sweep, and one `runner serve` over it, for all tests."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = Path(cls.tmp.name)
        cls.home = cls.dir / "home"
        env = {**home_env(cls.home), "OMP_NUM_THREADS": "1"}
        write_script(cls.dir, "train.lua", TRAINING_SCRIPT)
        write_script(cls.dir, "synthetic.lua", test_sweep.SYNTHETIC)
        write_script(cls.dir, "sweep.lua", SWEEP)
        write_script(cls.dir, "plain_sweep.lua", PLAIN_SWEEP)
        write_script(cls.dir, "broken.lua", BROKEN_SCRIPT)
        for command in (["train.lua"], ["train.lua", "lr=0.05"], ["sweep", "sweep.lua"], ["sweep", "plain_sweep.lua"]):
            subprocess.run([RUNNER, *command], cwd=cls.dir, env=env, check=True, capture_output=True, timeout=300)
        failed = subprocess.run([RUNNER, "broken.lua"], cwd=cls.dir, env=env, capture_output=True, timeout=300)
        assert failed.returncode == 1, failed.stderr
        cls.server, cls.printed_url = start_serve(cls.home)
        cls.url, cls.token = split_token(cls.printed_url)
        cls.port = int(cls.url.rsplit(":", 1)[1].strip("/"))
        cls.browser = None

    @classmethod
    def tearDownClass(cls):
        try:
            stop_serve(cls.server)
        finally:
            if cls.browser:
                cls.browser.close()
            cls.tmp.cleanup()

    def sql(self, query, *parameters):
        with sqlite3.connect(self.home / "index.db") as db:
            return db.execute(query, parameters).fetchall()

    def runner_output(self, *args):
        """The standard output of `runner ARGS...` over the test's index."""
        return subprocess.run([RUNNER, *args], env=home_env(self.home), check=True, capture_output=True, text=True,
                              timeout=120).stdout

    def fetch(self, path, **options):
        """get() of url + path with the server's token."""
        return get(self.url + path, token=self.token, **options)

    def page(self, path):
        """The browser, showing url + path."""
        if report_screenshot.chromium_binary() is None:
            if os.environ.get("RUNNER_NO_BROWSER"):  # scripts/gpu-check: the GPU host has no browser
                self.skipTest("RUNNER_NO_BROWSER is set: the dashboard's pages are not checked on this host")
            self.fail("chromium is not installed (scripts/setup installs it); the dashboard cannot be checked")
        import browser_session

        if Dashboard.browser is None:
            Dashboard.browser = browser_session.BrowserSession()
            Dashboard.browser.goto(self.printed_url)  # the token's cookie, for the pages and their requests
        self.browser.goto(self.url.rstrip("/") + path)
        return self.browser

    # ---- pages in the browser ---------------------------------------------------------------------

    def test_runs_table_filters_and_sorts_by_a_metric(self):
        browser = self.page("/")
        runs = self.sql("SELECT count(*) FROM runs")[0][0]  # 2 runs and 6 trials (and the live test's run)
        browser.wait_for(f"document.querySelectorAll('tbody tr').length === {runs}")
        headers = browser.evaluate("[...document.querySelectorAll('thead th')].map((th) => th.textContent)")
        for column in ("name", "status", "sweep", "world size", "loss", "score"):
            self.assertIn(column, headers)
        # The metrics' columns: the scripts' own (loss first, then by name), then runner's timings (time/*), then the
        # system metrics (sys/*) of runs that lasted a sampling interval.
        keys = [key for (key,) in self.sql("SELECT DISTINCT key FROM metrics")]
        timings = sorted(key for key in keys if key.startswith("time/"))
        self.assertIn("time/forward_backward_ms", timings)
        system = sorted(key for key in keys if key.startswith("sys/"))
        ours = sorted(key for key in keys if key not in timings and key not in system and key != "loss")
        self.assertIn("val_loss", ours)  # after time/ by name
        # Before them, the config keys that differ between the runs shown (a key some runs lack included).
        configs = [json.loads(config) for (config,) in self.sql("SELECT config FROM runs")]
        differing = sorted(key for key in set().union(*configs)
                           if len({json.dumps(config.get(key)) for config in configs}) > 1)
        self.assertIn("lr", differing)
        self.assertIn("mode", differing)  # the sweep's trials have it, the other runs not
        self.assertEqual(headers[headers.index("duration") + 1:],
                         [*(f"config.{key}" for key in differing), "loss", *ours, *timings, *system])
        loss = headers.index("loss")
        browser.evaluate(f"document.querySelectorAll('thead th')[{loss}].click()")
        names = browser.evaluate("[...document.querySelectorAll('tbody tr td:nth-child(2)')].map((td) => td.textContent)")
        ours = [name for name in names if name in ("train-1", "train-2")]
        self.assertEqual(ours, ["train-1", "train-2"])  # 1/30 * lr * 100: lr 0.01 before lr 0.05
        with_loss = {name for (name,) in self.sql("SELECT DISTINCT r.name FROM runs r JOIN metrics m USING (run) "
                                                  "WHERE m.key = 'loss'")}
        self.assertEqual(set(names[:len(with_loss)]), with_loss, names)  # trials: no loss, last
        browser.evaluate(f"document.querySelectorAll('thead th')[{loss}].click()")  # descending
        names = browser.evaluate("[...document.querySelectorAll('tbody tr td:nth-child(2)')].map((td) => td.textContent)")
        self.assertEqual([name for name in names if name in ("train-1", "train-2")], ["train-2", "train-1"])
        browser.evaluate("const box = document.querySelector('input[type=search]'); box.value = 'train-2';"
                         "box.dispatchEvent(new Event('input'))")
        self.assertEqual(browser.evaluate("document.querySelectorAll('tbody tr').length"), 1)

    def test_runs_table_has_the_differing_config_keys_as_columns_to_sort_and_filter_by(self):
        browser = self.page("/")
        runs = self.sql("SELECT count(*) FROM runs")[0][0]
        browser.wait_for(f"document.querySelectorAll('tbody tr').length === {runs}")
        headers = browser.evaluate("[...document.querySelectorAll('thead th')].map((th) => th.textContent)")
        column = headers.index("config.lr")
        names = "[...document.querySelectorAll('tbody tr td:nth-child(2)')].map((td) => td.textContent)"
        cells = f"[...document.querySelectorAll('tbody tr td:nth-child({column + 1})')].map((td) => td.textContent)"
        browser.evaluate(f"document.querySelectorAll('thead th')[{column}].click()")
        by_lr = [(json.loads(config).get("lr"), name) for (name, config) in self.sql("SELECT name, config FROM runs")]
        with_lr = sorted((lr, name) for lr, name in by_lr if lr is not None)
        shown = browser.evaluate(names)
        self.assertEqual(set(shown[:len(with_lr)]), {name for lr, name in with_lr})
        self.assertEqual(set(shown[len(with_lr):]), {name for lr, name in by_lr if lr is None})  # broken-1: last
        self.assertEqual(browser.evaluate(cells)[:len(with_lr)], [f"{lr:.6g}" for lr, name in with_lr])
        # The filter is `runner runs --where`'s expression over the config, metrics, tags, status and name; the table
        # then shows the keys that differ between the runs left: train-1 and train-2 differ in lr alone.
        where = "document.querySelector('input.where')"
        browser.evaluate(f"{where}.value = \"steps = 30 and name != 'nosuch' and lr >= 0.01\";"
                         f"{where}.dispatchEvent(new Event('change'))")
        browser.wait_for(f"document.querySelectorAll('tbody tr').length === 2", timeout=30)
        self.assertEqual(sorted(browser.evaluate(names)), ["train-1", "train-2"])
        headers = browser.evaluate("[...document.querySelectorAll('thead th')].map((th) => th.textContent)")
        self.assertEqual([header for header in headers if header.startswith("config.")], ["config.lr"])
        # The sort by config.lr holds.
        self.assertEqual(browser.evaluate(names), ["train-1", "train-2"])
        # A bad expression is the CLI's error, shown under the filter.
        browser.evaluate(f"{where}.value = 'steps >'; {where}.dispatchEvent(new Event('change'))")
        error = browser.wait_for("(() => { const p = document.querySelector('.where-error');"
                                 " return !p.hidden && p.textContent; })()", timeout=30)
        cli = subprocess.run([RUNNER, "runs", "--where", "steps >"], env=home_env(self.home), capture_output=True,
                             text=True, timeout=60)
        self.assertEqual(error, cli.stderr.splitlines()[0].removeprefix("runner runs: "))
        self.assertEqual(error, "--where 'steps >': expected a number or a quoted text after 'steps >', found the end "
                                "at column 8")

    def test_tags_and_notes_show_in_the_runs_table_and_on_the_run_page_and_the_filter_matches_tags(self):
        env = {**home_env(self.home), "OMP_NUM_THREADS": "1"}
        for command in (["tag", "train-2", "baseline", "lr-high"], ["note", "train-2", "diverges <late>"]):
            subprocess.run([RUNNER, *command], env=env, check=True, capture_output=True, timeout=120)
        browser = self.page("/")
        row = ("[...document.querySelectorAll('tbody tr')].find((tr) => tr.querySelector('td:nth-child(2)')"
               "?.textContent === 'train-2')")
        tags = browser.wait_for(f"[...({row})?.querySelectorAll('.tag') ?? []].map((t) => t.textContent).join(' ')",
                                timeout=60)
        self.assertEqual(tags, "baseline lr-high")
        self.assertEqual(browser.evaluate(f"({row}).querySelector('.run-note').textContent"), "diverges <late>")
        browser.evaluate("const box = document.querySelector('input[type=search]'); box.value = 'lr-HIGH';"
                         "box.dispatchEvent(new Event('input'))")
        names = browser.evaluate("[...document.querySelectorAll('tbody tr td:nth-child(2)')].map((td) => td.textContent)")
        self.assertEqual(names, ["train-2"])
        browser = self.page("/run/train-2")
        tags = browser.wait_for("[...document.querySelectorAll('h1 + p .tag')].map((t) => t.textContent).join(' ')",
                                timeout=60)
        self.assertEqual(tags, "baseline lr-high")
        self.assertEqual(browser.evaluate("document.querySelector('p.run-note').textContent"), "diverges <late>")

    def test_run_page_draws_the_reports_curves_with_hover_and_the_grids_by_step(self):
        browser = self.page("/run/train-1")
        browser.wait_for("document.querySelectorAll('figure.chart svg polyline').length >= 2")
        browser.wait_for("document.querySelector('.grid-slider img')?.naturalWidth > 0")
        # The chart is the report's SVG: the same polyline as `runner report` draws for this run.
        report = self.dir / "report.html"
        subprocess.run([RUNNER, "report", "train-1", "-o", str(report), "--metrics", "loss"], env=home_env(self.home),
                       check=True, capture_output=True)
        report_points = re.search(r'<polyline [^>]*points="([^"]+)"', report.read_text()).group(1)
        page_points = browser.evaluate(
            "[...document.querySelectorAll('figure.chart svg')].find((svg) => svg.getAttribute('aria-label') === 'loss')"
            ".querySelector('polyline').getAttribute('points')")
        self.assertEqual(page_points, report_points)
        # Hover: the value at the step under the mouse.
        browser.evaluate("""(() => {
            const svg = [...document.querySelectorAll('figure.chart svg')].find((s) => s.getAttribute('aria-label') === 'loss');
            const frame = svg.querySelector('rect.plot-frame').getBoundingClientRect();
            svg.dispatchEvent(new MouseEvent('mousemove', { bubbles: true, clientX: frame.right - 1, clientY: frame.top + 20 }));
        })()""")
        self.assertEqual(browser.evaluate("document.getElementById('hover').hidden"), False)
        # Smoothing is on from the start: the hover shows the smoothed value, the debiased moving average (weight
        # 0.6) of 1/step up to step 30.
        self.assertEqual(browser.evaluate("document.querySelector('.controls input[type=range]').value"), "0.6")
        average = weight = 0
        for step in range(1, 31):
            average, weight = average * 0.6 + 0.4 * (1 / step), weight * 0.6 + 0.4
        self.assertIn(f"train-1: {average / weight:.6g}", browser.evaluate("document.getElementById('hover').textContent"))
        # The slider goes through the grids by step; each image is one the index lists.
        grids = browser.evaluate("""(() => {
            const input = document.querySelector('.grid-slider input');
            const seen = [];
            for (const value of [0, 1, 2]) {
              input.value = value; input.dispatchEvent(new Event('input'));
              seen.push(document.querySelector('.grid-slider img').getAttribute('src'));
            }
            return seen;
        })()""")
        self.assertEqual([re.search(r"samples-(\d+)\.png", g).group(1) for g in grids], ["0000010", "0000020", "0000030"])
        browser.evaluate("document.querySelector('figure.chart').scrollIntoView()")
        png = browser.screenshot(self.dir / "run.png")
        self.assertGreater(report_screenshot.count_colour(png, "#1f77b4", tolerance=40), 300)
        # Log scale and smoothing redraw the chart through the server.
        browser.evaluate("const s = document.querySelector('.controls select.y-scale'); s.value = 'log';"
                         "s.dispatchEvent(new Event('change'))")
        browser.wait_for("document.querySelector('figure.chart svg text.scale')?.textContent === 'log'")

    def test_zoom_requests_the_chart_for_the_chosen_steps(self):
        browser = self.page("/run/train-1")
        browser.wait_for("!!document.querySelector('figure.chart')?.querySelector('rect.plot-frame')")
        browser.evaluate("""(() => {
            const figure = document.querySelector('figure.chart');
            const frame = figure.querySelector('rect.plot-frame').getBoundingClientRect();
            const at = (f) => ({ bubbles: true, clientX: frame.left + f * frame.width, clientY: frame.top + 30 });
            figure.dispatchEvent(new MouseEvent('mousedown', at(0.5)));
            figure.dispatchEvent(new MouseEvent('mousemove', at(0.8)));
            window.dispatchEvent(new MouseEvent('mouseup', at(0.8)));
        })()""")
        steps = browser.wait_for("(() => { const g = document.querySelector('figure.chart g.series');"
                                 " const r = document.querySelector('figure.chart rect.plot-frame');"
                                 " return g && r.dataset.x !== '1 30' && g.dataset.steps; })()")
        steps = [int(s) for s in steps.split()]
        self.assertGreaterEqual(min(steps), 14)
        self.assertLessEqual(max(steps), 26)

    def test_curves_can_take_wall_clock_or_relative_time_as_x(self):
        browser = self.page("/run/train-1")
        loss = "document.querySelector('figure.chart svg[aria-label=\"loss\"]')"
        browser.wait_for(f"!!{loss}?.querySelector('g.series')")
        (started,) = self.sql("SELECT started_at FROM runs WHERE name = 'train-1'")[0]
        times = [time for (time,) in self.sql("SELECT m.time FROM metrics m JOIN runs r USING (run) "
                                              "WHERE r.name = 'train-1' AND m.key = 'loss' ORDER BY m.step")]
        for axis, title, expected in (("relative", "time since the start", [t - started for t in times]),
                                      ("time", "time", times)):
            browser.evaluate(f"(() => {{ const x = document.querySelector('select.x-axis'); x.value = '{axis}';"
                             "x.dispatchEvent(new Event('change')); })()")
            browser.wait_for(f"[...{loss}.querySelectorAll('text')].some((t) => t.textContent === '{title}')")
            drawn = [float(x) for x in browser.evaluate(f"{loss}.querySelector('g.series').dataset.steps").split()]
            self.assertEqual(len(drawn), len(expected))
            for x, want in zip(drawn, expected):
                self.assertAlmostEqual(x, want, places=3)
            first, last = map(float, browser.evaluate(f"{loss}.querySelector('rect.plot-frame').dataset.x").split())
            self.assertLessEqual(first, min(expected))
            self.assertGreaterEqual(last, max(expected))
        # The hover names the time under the mouse instead of the step.
        browser.evaluate(f"""(() => {{
            const frame = {loss}.querySelector('rect.plot-frame').getBoundingClientRect();
            {loss}.dispatchEvent(new MouseEvent('mousemove', {{ bubbles: true, clientX: frame.right - 1, clientY: frame.top + 20 }}));
        }})()""")
        self.assertNotIn("step", browser.evaluate("document.querySelector('#hover .step').textContent"))
        status, _, body = self.fetch("chart/metric.svg?run=train-1&key=loss&x=epoch")
        self.assertEqual((status, body.decode().strip()), (400, "parameter 'x': expected step, time or relative, got 'epoch'"))

    def test_compare_overlays_the_runs_and_marks_config_differences(self):
        browser = self.page("/compare?run=train-1&run=train-2")
        browser.wait_for("document.querySelectorAll('figure.chart').length >= 2 && "
                         "document.querySelectorAll('figure.chart g.series').length >= 4")
        colours = browser.evaluate("[...document.querySelector('figure.chart svg').querySelectorAll('g.series')]"
                                   ".map((g) => g.dataset.colour)")
        self.assertEqual(colours, ["#1f77b4", "#ff7f0e"])
        differing = browser.evaluate("[...document.querySelectorAll('tr.differs th')].map((th) => th.textContent)")
        self.assertEqual(differing, ["lr"])
        png = browser.screenshot(self.dir / "compare.png")
        self.assertGreater(report_screenshot.count_colour(png, "#ff7f0e", tolerance=40), 300)

    def test_compare_shows_the_runs_sample_grids_of_one_step_side_by_side(self):
        browser = self.page("/compare?run=train-1&run=train-2&run=broken-1")
        block = "document.querySelector('.grid-compare[data-name=\"samples\"]')"
        cells = (f"[...{block}.querySelectorAll('figure.grid-cell')].map((f) => [f.querySelector('.grid-run').textContent,"
                 " f.querySelector('img')?.getAttribute('src') ?? f.querySelector('.note').textContent])")
        browser.wait_for(f"{block}?.querySelectorAll('figure.grid-cell img').length === 2")

        def shown():
            return [(run, re.sub(r"^/image\?run=(\w+)&path=images%2F", "", src)) for run, src in browser.evaluate(cells)]

        ids = dict(self.sql("SELECT name, id FROM runs WHERE name IN ('train-1', 'train-2')"))
        self.assertEqual(shown(), [("train-1", "samples-0000030.png"), ("train-2", "samples-0000030.png"),
                                   ("broken-1", "no grid at step 30")])
        self.assertEqual([src.split("&")[0] for _, src in browser.evaluate(cells)[:2]],
                         [f"/image?run={ids['train-1']}", f"/image?run={ids['train-2']}"])
        browser.evaluate(f"(() => {{ const input = {block}.querySelector('input'); input.value = 0;"
                         " input.dispatchEvent(new Event('input')); })()")
        self.assertEqual(shown()[:2], [("train-1", "samples-0000010.png"), ("train-2", "samples-0000010.png")])
        browser.wait_for(f"[...{block}.querySelectorAll('img')].every((img) => img.naturalWidth > 0)")

    def test_a_tensor_logged_is_a_histogram_on_the_run_page_with_a_slider_through_its_steps(self):
        rows = self.sql("SELECT h.step, h.low, h.high, h.counts FROM histograms h JOIN runs r USING (run) "
                        "WHERE r.name = 'train-1' AND h.key = 'weights' ORDER BY h.step")
        self.assertEqual([(step, low, high) for step, low, high, _ in rows], [(10, -10, 10), (20, -20, 20), (30, -30, 30)])
        self.assertTrue(all(sum(json.loads(counts)) == 100 and len(json.loads(counts)) == 64 for *_, counts in rows))
        self.assertFalse(self.sql("SELECT 1 FROM metrics WHERE key = 'weights'"))
        shown = self.runner_output("show", "train-1")
        self.assertRegex(shown, r"\nhistograms\n  histogram +steps +first +last\n  -+ +-+ +-+ +-+\n  weights +3 +10 +30\n")
        browser = self.page("/run/train-1")
        svg = "document.querySelector('.histogram-slider[data-key=\"weights\"] svg')"
        browser.wait_for(f"{svg}?.getAttribute('aria-label') === 'weights at step 30'")
        counts = f"[...{svg}.querySelectorAll('rect.bin')].map((r) => Number(r.dataset.count))"
        self.assertEqual(browser.evaluate(counts), json.loads(rows[2][3]))
        browser.evaluate("(() => { const input = document.querySelector('.histogram-slider input'); input.value = 0;"
                         " input.dispatchEvent(new Event('input')); })()")
        browser.wait_for(f"{svg}?.getAttribute('aria-label') === 'weights at step 10'")
        self.assertEqual(browser.evaluate(counts), json.loads(rows[0][3]))
        status, _, body = self.fetch("chart/histogram.svg?run=train-1&key=weights&step=11")
        self.assertEqual((status, body.decode().strip()), (404, "run train-1 has no histogram 'weights' at step 11"))

    def test_sweep_page_shows_trials_importance_parallel_coordinates_and_rungs(self):
        browser = self.page("/sweeps")
        browser.wait_for("[...document.querySelectorAll('tbody tr a')].some((a) => a.textContent === 'lrs')")
        browser = self.page("/sweep/lrs")
        browser.wait_for("document.querySelectorAll('figure.chart svg').length === 6")
        labels = browser.evaluate("[...document.querySelectorAll('figure.chart svg')].map((s) => s.getAttribute('aria-label'))")
        self.assertEqual(labels, ["score by lr", "score by mode", "parameter importance", "parameters and score",
                                  "ASHA rungs: score", "score of every trial"])
        self.assertIn("squared Spearman rank correlation", browser.evaluate("document.body.textContent"))
        trials = self.sql("SELECT count(*) FROM trials t JOIN sweeps s USING (sweep) WHERE s.name = 'lrs'")[0][0]
        self.assertEqual(browser.evaluate("document.querySelectorAll('tbody tr').length"), trials)
        parallel = browser.evaluate("document.querySelectorAll('svg[aria-label=\"parameters and score\"] polyline').length")
        self.assertEqual(parallel, trials)
        rung_results = self.sql("SELECT count(*) FROM trial_rungs")[0][0]
        self.assertGreater(rung_results, 0)
        self.assertEqual(browser.evaluate("document.querySelectorAll('svg[aria-label=\"ASHA rungs: score\"] circle').length"),
                         rung_results)
        bars = browser.evaluate("document.querySelectorAll('svg[aria-label=\"parameter importance\"] rect').length")
        self.assertEqual(bars, 2)

    def test_a_sweep_without_asha_has_no_rungs_chart(self):
        browser = self.page("/sweep/plain")
        browser.wait_for("document.querySelectorAll('#page tbody tr').length === 2 && "
                         "document.querySelectorAll('figure.chart svg').length === 4")
        labels = browser.evaluate("[...document.querySelectorAll('figure.chart svg')].map((s) => s.getAttribute('aria-label'))")
        self.assertEqual(labels, ["score by mode", "parameter importance", "parameters and score", "score of every trial"])
        self.assertNotIn("ASHA", browser.evaluate("document.getElementById('page').textContent"))
        status, _, body = self.fetch("chart/sweep.svg?sweep=plain&chart=rungs")
        self.assertEqual((status, body.decode().strip()),
                         (404, "sweep plain has no ASHA rung results: it does not prune with ASHA"))

    def test_a_failed_runs_error_is_shown_above_its_charts(self):
        browser = self.page("/run/broken-1")
        browser.wait_for("!!document.querySelector('.run-error pre') && !!document.querySelector('figure.chart svg')")
        self.assertIn("broken on purpose at step 3", browser.evaluate("document.querySelector('.run-error pre').textContent"))
        self.assertTrue(browser.evaluate(
            "!!(document.querySelector('.run-error').compareDocumentPosition(document.querySelector('figure.chart')) "
            "& Node.DOCUMENT_POSITION_FOLLOWING)"), "the error is below a chart")

    def test_a_change_made_through_runner_attach_is_listed_on_the_run_page_and_marked_on_its_charts(self):
        # A script of its own, so that its run (attached-1) leaves the names of train.lua's runs as they are.
        write_script(self.dir, "attached.lua", TRAINING_SCRIPT)
        name = "attached-1"
        job = subprocess.Popen([RUNNER, str(self.dir / "attached.lua"), "steps=400", "sleep=0.02"], cwd=self.dir,
                               env={**home_env(self.home), "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            socket_path = self.home / name / "attach" / "socket"
            while not socket_path.exists():
                self.assertLess(time.monotonic(), deadline, "the job opened no attach socket")
                time.sleep(0.1)
            # runner attach's protocol: a header line "KIND LENGTH" and the text; the job answers between two steps.
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.connect(str(socket_path))
                client.settimeout(60)
                chunk = b"train:set_lr(0.02)"
                client.sendall(b"eval %d\n%s" % (len(chunk), chunk))
                received = b""
                while b"done 0\n" not in received:
                    data = client.recv(4096)
                    self.assertTrue(data, received)
                    received += data
                client.sendall(b"detach 0\n")
            (step,) = self.sql("SELECT i.step FROM interventions i JOIN runs r USING (run) WHERE r.name = ?", name)[0]
            browser = self.page(f"/run/{name}")
            browser.wait_for("document.querySelectorAll('.interventions tbody tr').length === 1", timeout=60)
            cells = browser.evaluate("[...document.querySelectorAll('.interventions tbody td')].map((td) => td.textContent)")
            self.assertEqual((cells[0], cells[2], cells[3]), (str(step), "train:set_lr(0.02)", "train:set_lr(0.02)"))
            # The charts whose steps reach it mark it at its step (loss and lr from step 1), with what changed as the
            # mark's title.
            browser.wait_for("['loss', 'lr'].every((key) => document.querySelector(`figure.chart svg[aria-label=\"${key}\"] "
                             "line.intervention-mark`))", timeout=60)
            marks = browser.evaluate("[...document.querySelectorAll('line.intervention-mark')].map((l) => "
                                     "[l.dataset.step, l.querySelector('title').textContent])")
            self.assertTrue(all(mark == [str(step), f"step {step}: train:set_lr(0.02)\ntrain:set_lr(0.02)"]
                                for mark in marks), marks)
            self.assertEqual(job.wait(timeout=300), 0, job.stderr.read())
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
            job.stderr.close()

    def test_a_metric_logged_by_a_running_job_appears_on_the_open_page_without_reload(self):
        # The job holds before step 25 until the page is up: the clock starts with the browser there.
        job = subprocess.Popen([RUNNER, str(self.dir / "train.lua"), "steps=60", "sleep=0.1", "late_at=25",
                                "system_metrics=0.2"],
                               cwd=self.dir, env={**home_env(self.home), "OMP_NUM_THREADS": "1"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not self.sql("SELECT id FROM runs WHERE name = 'train-3'"):
                self.assertLess(time.monotonic(), deadline, "the job did not start")
                time.sleep(0.1)
            browser = self.page("/run/train-3")
            browser.evaluate("window.loadedOnce = true")
            browser.wait_for("!!document.querySelector('figure.chart g.series')")
            first_steps = browser.evaluate("document.querySelector('figure.chart g.series').dataset.steps.split(' ').length")
            (self.dir / "page-open").touch()
            # The job holds after logging late_metric at step 25 until the page has shown it: the page shows it
            # while the run goes on, however slowly the machine runs (only a hang reaches the deadline).
            browser.wait_for("[...document.querySelectorAll('.metric-picks label')].some((l) => l.textContent.includes('late_metric'))",
                             timeout=120)
            self.assertIsNone(job.poll(), "the job was still holding at step 25 when the page showed late_metric")
            self.assertEqual(self.sql("SELECT max(m.step) FROM metrics m JOIN runs r USING (run) "
                                      "WHERE r.name = 'train-3' AND m.key = 'late_metric'")[0][0], 25)
            (self.dir / "seen").touch()
            self.assertTrue(browser.evaluate("window.loadedOnce === true"), "the page was reloaded")
            # The new metric gets its own chart among the script's metrics (loss first, then by name).
            browser.wait_for("!!document.querySelector('#page > .metric-sections svg[aria-label=\"late_metric\"]')", timeout=60)
            charted = browser.evaluate("[...document.querySelectorAll('#page > .metric-sections svg')].map((s) => s.getAttribute('aria-label'))")
            self.assertEqual(charted, ["loss", *sorted(key for key in charted if key != "loss")])
            self.assertIn("lr", charted)
            # runner's timings (logged from step 25 too) and the system metrics (sampled while the job held) come
            # after them, each in a group that stays collapsed, its charts not drawn, until it is opened.
            timings = 'details.metric-group[data-prefix="time/"]'
            system = 'details.metric-group[data-prefix="sys/"]'
            picks = "[...document.querySelectorAll('{} label')].map((l) => l.textContent.trim())"
            browser.wait_for(f"{picks.format(timings)}.includes('time/forward_backward_ms')", timeout=60)
            browser.wait_for(f"{picks.format(system)}.includes('sys/cpu_percent')", timeout=60)
            self.assertTrue(all(key.startswith("time/") for key in browser.evaluate(picks.format(timings))))
            self.assertTrue(all(key.startswith("sys/") for key in browser.evaluate(picks.format(system))))
            self.assertIn("sys/rss_mib", browser.evaluate(picks.format(system)))
            self.assertEqual(browser.evaluate("[...document.querySelectorAll('details.metric-group')].map((d) => d.open)"),
                             [False, False])
            self.assertEqual(browser.evaluate("document.querySelectorAll('details.metric-group figure').length"), 0)
            self.assertFalse(any(key.startswith(("time/", "sys/")) for key in charted))
            browser.evaluate(f"document.querySelector('{timings} summary').click()")
            browser.wait_for(f"!!document.querySelector('{timings} svg[aria-label=\"time/forward_backward_ms\"]')")
            self.assertEqual(browser.evaluate(f"document.querySelectorAll('{system} figure').length"), 0)
            browser.evaluate(f"document.querySelector('{system} summary').click()")
            browser.wait_for(f"!!document.querySelector('{system} svg[aria-label=\"sys/cpu_percent\"]')")
            browser.wait_for(f"document.querySelector('figure.chart g.series').dataset.steps.split(' ').length > {first_steps}")
            browser.wait_for("document.querySelector('h1 .status')?.textContent === 'finished'", timeout=60)
            self.assertTrue(browser.evaluate("window.loadedOnce === true"))
        finally:
            (self.dir / "page-open").touch()
            (self.dir / "seen").touch()
            try:
                job.wait(timeout=120)
            except subprocess.TimeoutExpired:
                job.kill()
                job.wait()
                raise
            finally:
                job.stderr.close()

    # ---- access and read-only -----------------------------------------------------------------------

    def test_requests_that_would_write_are_refused(self):
        before = self.sql("SELECT count(*), max(heartbeat_at) FROM runs")
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            status, headers, body = self.fetch("api/runs", method=method)
            self.assertEqual(status, 405, method)
            self.assertEqual(headers["Allow"], "GET, HEAD")
            self.assertIn(b"read-only", body)
        self.assertEqual(self.fetch("api/query?sql=DELETE+FROM+runs")[0], 404)
        self.assertEqual(self.fetch("image?run=train-1&path=../../index.db")[0], 404)
        self.assertEqual(self.fetch("image?run=train-1&path=images/samples-0000010.png")[0], 200)
        self.assertEqual(self.sql("SELECT count(*), max(heartbeat_at) FROM runs"), before)

    def test_a_long_note_or_bytes_that_are_not_utf8_keep_every_answer_valid_and_the_list_light(self):
        # As an index written by an older runner can hold: a 10 MB note with a byte that is not UTF-8, and such a
        # byte in an error.
        before = self.sql("SELECT name, note, error FROM runs WHERE name IN ('train-1', 'broken-1')")
        note = b"\xff" + b"n" * 10_000_000

        def restore():
            with sqlite3.connect(self.home / "index.db") as db:
                for name, old_note, old_error in before:
                    db.execute("UPDATE runs SET note = ?, error = ? WHERE name = ?", (old_note, old_error, name))
        self.addCleanup(restore)
        with sqlite3.connect(self.home / "index.db") as db:
            db.execute("UPDATE runs SET note = CAST(? AS TEXT) WHERE name = 'train-1'", (note,))
            db.execute("UPDATE runs SET error = CAST(? AS TEXT) WHERE name = 'broken-1'", (b"caf\xe9",))
        status, _, body = self.fetch("api/runs")
        self.assertEqual(status, 200, body[:200])
        self.assertLess(len(body), 1_000_000)
        runs = {run["name"]: run for run in json.loads(body)["runs"]}
        self.assertEqual(runs["train-1"]["note"], "\ufffd" + "n" * 197 + "\u2026")
        status, _, body = self.fetch("api/run?run=broken-1")
        self.assertEqual(status, 200, body[:200])
        self.assertEqual(json.loads(body)["run"]["error"], "caf\ufffd")
        status, _, body = self.fetch("api/run?run=train-1")
        self.assertEqual(status, 200, body[:200])
        self.assertEqual(len(json.loads(body)["run"]["note"]), 10_000_001)  # the run's page has it whole

    def test_images_are_served_only_from_regular_files_inside_the_run_folder(self):
        # A hostile index (a shared PostgreSQL one) or run folder: an artifact row with `..` in its path, and an
        # image that is a symlink to a file outside the run folder.
        secret = self.dir / "secret.txt"
        secret.write_text("SECRET")
        (run_dir,) = self.sql("SELECT dir FROM runs WHERE name = 'train-1'")[0]
        link = self.home / run_dir / "images" / "evil.png"
        link.symlink_to(secret)
        # And a folder of the run, which is no file to serve.
        escapes = [os.path.relpath(secret, self.home / run_dir), "images/evil.png", str(secret), "images"]
        try:
            with sqlite3.connect(self.home / "index.db") as db:
                for path in escapes:
                    db.execute("INSERT INTO artifacts (run, step, kind, name, path, bytes, created_at) "
                               "SELECT run, step, kind, 'evil', ?, bytes, created_at FROM artifacts "
                               "WHERE path = 'images/samples-0000010.png'", (path,))
            for path in escapes:
                status, _, body = self.fetch("image?run=train-1&path=" + urllib.parse.quote(path))
                self.assertEqual(status, 404, path)
                self.assertNotIn(b"SECRET", body, path)
            self.assertEqual(self.fetch("image?run=train-1&path=images/samples-0000010.png")[0], 200)
        finally:
            with sqlite3.connect(self.home / "index.db") as db:
                db.execute("DELETE FROM artifacts WHERE name = 'evil'")
            link.unlink()

    def test_no_image_is_served_from_a_run_whose_own_folder_lies_outside_runner_home(self):
        # A hostile index row (a shared PostgreSQL index, a copied folder) gives a run the folder `..`, the folder
        # above RUNNER_HOME, and an image path that is a regular file inside that folder.
        secret = self.dir / "secret.png"
        secret.write_text("SECRET")
        (run_dir,) = self.sql("SELECT dir FROM runs WHERE name = 'train-1'")[0]
        try:
            with sqlite3.connect(self.home / "index.db") as db:
                db.execute("UPDATE runs SET dir = '..' WHERE name = 'train-1'")
                db.execute("INSERT INTO artifacts (run, step, kind, name, path, bytes, created_at) "
                           "SELECT run, step, kind, 'evil', 'secret.png', bytes, created_at FROM artifacts "
                           "WHERE path = 'images/samples-0000010.png'")
            status, _, body = self.fetch("image?run=train-1&path=secret.png")
            self.assertEqual(status, 404)
            self.assertNotIn(b"SECRET", body)
            self.assertIn(b"run train-1's folder is not inside RUNNER_HOME", body)
        finally:
            with sqlite3.connect(self.home / "index.db") as db:
                db.execute("UPDATE runs SET dir = ? WHERE name = 'train-1'", (run_dir,))
                db.execute("DELETE FROM artifacts WHERE name = 'evil'")
        self.assertEqual(self.fetch("image?run=train-1&path=images/samples-0000010.png")[0], 200)

    def test_pages_poll_with_a_version_and_a_request_from_another_host_name_is_refused(self):
        status, _, body = self.fetch("api/runs")
        version = json.loads(body)["version"]
        status, _, body = self.fetch(f"api/runs?since={version}")
        self.assertEqual(json.loads(body), {"version": version, "unchanged": True})
        status, _, body = self.fetch("api/runs", headers={"Host": "attacker.example:80"})
        self.assertEqual(status, 403)

    def test_nothing_answers_on_other_interfaces(self):
        address = other_address()
        if address is None:
            self.skipTest("this machine has no non-loopback IPv4 address")
        port = self.port
        with socket.socket() as client:
            client.settimeout(5)
            with self.assertRaises(ConnectionRefusedError):
                client.connect((address, port))

    def test_a_second_server_on_the_same_port_fails(self):
        port = free_port()  # given to both servers
        first, url = start_serve(self.home, "--port", str(port))
        try:
            second = subprocess.Popen([RUNNER, "serve", "--port", str(port)], env=home_env(self.home),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                out, err = second.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                second.kill()
                second.communicate()
                self.fail(f"a second runner serve started on port {port}")
            self.assertEqual(second.returncode, 1, out + err)
            self.assertIn(f"cannot listen on 127.0.0.1:{port}: the port is in use", err)
            self.assertIn("--port 0 picks a free port", err)
            base, token = split_token(url)
            self.assertEqual(get(base + "api/runs", token=token)[0], 200)  # the first one still answers
        finally:
            stop_serve(first)

    def test_another_address_needs_the_printed_token(self):
        server, url = start_serve(self.home, "--host", "0.0.0.0")
        try:
            # The URL names this machine (a browser cannot open 0.0.0.0), then one line per address.
            match = re.match(r"http://([^:/]+):(\d+)/\?token=([0-9a-f]{32})$", url)
            self.assertIsNotNone(match, url)
            name, port, token = match.groups()
            self.assertEqual(name, socket.gethostname())
            lines = []
            while not lines or "the index in" not in lines[-1]:
                lines.append(server.stdout.readline())
                self.assertTrue(lines[-1], f"runner serve ended its banner early: {lines}")
            self.assertNotIn("0.0.0.0:", "".join(lines))
            address = other_address()
            if address:
                self.assertIn(f"runner serve: or http://{address}:{port}/?token={token}\n", lines)
            base = f"http://127.0.0.1:{port}/"
            status, _, body = get(base + "api/runs")
            self.assertEqual(status, 403)
            self.assertIn(b"token", body)
            self.assertEqual(get(base + "api/runs?token=" + "0" * 32)[0], 403)
            status, headers, _ = get(base + "?token=" + token)
            self.assertEqual(status, 200)
            cookie = headers["Set-Cookie"].split(";")[0]
            self.assertEqual(cookie, f"runner_token_{port}={token}")
            self.assertEqual(get(base + "api/runs", headers={"Cookie": cookie})[0], 200)
            self.assertEqual(get(base + "api/runs", method="POST", headers={"Cookie": cookie})[0], 405)
            if address:
                self.assertEqual(get(f"http://{address}:{port}/api/runs?token={token}")[0], 200)
        finally:
            stop_serve(server)

    def test_loopback_needs_the_printed_token_too(self):
        self.assertRegex(self.printed_url, r"^http://127\.0\.0\.1:\d+/\?token=[0-9a-f]{32}$")
        status, _, body = get(self.url + "api/runs")
        self.assertEqual(status, 403)
        self.assertEqual(body.decode(), "runner serve: requests need the token that `runner serve` printed at its "
                                        "start: open the URL it printed (...?token=...), or start it with "
                                        "--no-token (loopback only)\n")
        self.assertEqual(get(self.url + "api/runs", token="0" * 32)[0], 403)
        self.assertEqual(get(self.url, token="")[0], 403)
        status, headers, _ = get(self.printed_url)
        self.assertEqual(status, 200)
        cookie = headers["Set-Cookie"].split(";")[0]
        self.assertEqual(cookie, f"runner_token_{self.port}={self.token}")
        self.assertEqual(get(self.url + "api/runs", headers={"Cookie": cookie})[0], 200)
        self.assertEqual(get(self.url + "api/runs", headers={"Cookie": f"runner_token_1={self.token}"})[0], 403)

    def test_no_token_serves_without_one_on_loopback_only(self):
        server, url = start_serve(self.home, "--no-token")
        try:
            self.assertRegex(url, r"^http://127\.0\.0\.1:\d+/$")
            self.assertEqual(server.stdout.readline(),
                             "runner serve: --no-token: every user of this machine can read the dashboard\n")
            status, _, body = get(url + "api/runs")
            self.assertEqual(status, 200)
            self.assertIn("version", json.loads(body))
            self.assertEqual(get(url + "api/runs", headers={"Host": "attacker.example:80"})[0], 403)
        finally:
            stop_serve(server)
        result = subprocess.run([RUNNER, "serve", "--port", "0", "--host", "0.0.0.0", "--no-token"],
                                env=home_env(self.home), capture_output=True, text=True, timeout=30)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("runner serve: --no-token is for a loopback --host only: on 0.0.0.0 every machine that "
                      "reaches this one could read the index", result.stderr)

    def connect_from(self, address, receive_buffer=None):
        """A socket to the server from this loopback address (127.0.0.0/8 is all this machine's)."""
        client = socket.socket()
        if receive_buffer:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        client.settimeout(10)
        client.bind((address, 0))
        client.connect(("127.0.0.1", self.port))
        return client

    def test_clients_that_send_or_read_slowly_do_not_stall_others(self):
        # 16 connections from 127.0.0.2 that send a header a byte a second, without the token; 16 from 127.0.0.3
        # that ask for the page's script (26 KB) 400 times at once and never read (10 MB, more than the sockets
        # buffer). Each address may hold 8 connections (the rest are refused), and 8 held ones of each leave
        # workers for a client on 127.0.0.1.
        header = b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slowly: " + b"x" * 100
        script = f"GET /assets/dashboard.js?token={self.token} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
        drippers = [self.connect_from("127.0.0.2") for _ in range(16)]
        silent = [self.connect_from("127.0.0.3", receive_buffer=4096) for _ in range(16)]
        stop = threading.Event()

        def drip():
            for byte in range(len(header)):
                for client in drippers:
                    try:
                        client.send(header[byte:byte + 1])
                    except OSError:  # closed by the server: past the cap, or past the request's deadline
                        pass
                if stop.wait(1):
                    return

        dripping = threading.Thread(target=drip)
        try:
            dripping.start()
            for client in silent:
                try:
                    client.sendall(script * 400)
                except OSError:
                    pass
            for attempt in range(12):
                status, _, body = self.fetch("api/runs")  # each within urllib's 10 s timeout, else an error
                self.assertEqual(status, 200, attempt)
                self.assertIn("runs", json.loads(body))
                time.sleep(1)  # the requests are spread over the slow clients' deadlines (10 s and 20 s)
        finally:
            stop.set()
            dripping.join()
            for client in drippers + silent:
                client.close()

    def test_one_client_address_holds_at_most_8_connections(self):
        held = []
        try:
            for _ in range(8):
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10,
                                                        source_address=("127.0.0.4", 0))
                connection.request("GET", f"/api/runs?token={self.token}")
                response = connection.getresponse()
                response.read()
                self.assertEqual(response.status, 200)
                connection.sock.sendall(b"GET")  # the next request begun: held for the request's 10 s
                held.append(connection)
            with self.connect_from("127.0.0.4") as extra:
                answer = b""
                while chunk := extra.recv(4096):
                    answer += chunk
            self.assertTrue(answer.startswith(b"HTTP/1.1 429 Too Many Requests\r\n"), answer)
            self.assertTrue(answer.endswith(b"\r\n\r\nrunner serve: 8 connections from 127.0.0.4 are open already, "
                                            b"the most one address may hold; close one and try again\n"), answer)
            self.assertEqual(self.fetch("api/runs")[0], 200)  # another address is served
        finally:
            for connection in held:
                connection.close()

    @unittest.skipIf(postgres_server.missing(), f"no PostgreSQL server: {postgres_server.missing()}")
    def test_on_a_postgresql_index_the_banner_names_its_url_without_the_password(self):
        server = postgres_server.shared_server()
        url = server.new_database().replace("postgresql://runner@", "postgresql://runner:secret@")
        home = self.dir / "postgres-home"
        env = {**home_env(home), "RUNNER_INDEX": url}
        subprocess.run([RUNNER, "train.lua", "steps=2"], cwd=self.dir, env=env, check=True, capture_output=True,
                       timeout=300)
        process, _ = start_serve(home, env={"RUNNER_INDEX": url})
        try:
            lines = []
            while not lines or "read-only" not in lines[-1]:
                lines.append(process.stdout.readline())
                self.assertTrue(lines[-1], f"runner serve ended its banner early: {lines}")
            shown = url.replace(":secret@", ":***@")
            self.assertEqual(lines[-1], f"runner serve: the index at {shown} (run folders in {home}), read-only; "
                                        "Ctrl-C stops\n")
            self.assertNotIn("secret", "".join(lines))
        finally:
            stop_serve(process)

    def test_usage_errors(self):
        for args, message in ((["--port", "x"], "--port 'x': expected a non-negative integer"),
                              (["--port", "70000"], "--port '70000': expected 0 (any free port) to 65535"),
                              (["extra"], "unexpected argument 'extra'")):
            result = subprocess.run([RUNNER, "serve", *args], env=home_env(self.home), capture_output=True, text=True,
                                    timeout=30)
            self.assertEqual(result.returncode, 2, result.stderr)
            self.assertIn(f"runner serve: {message}", result.stderr)
        result = subprocess.run([RUNNER, "serve", "--port", "0"], env=home_env(self.dir / "nowhere"),
                                capture_output=True, text=True, timeout=30)
        self.assertEqual(result.returncode, 1)
        self.assertIn("runner serve:", result.stderr)


class GroupsFloorsAndLinks(unittest.TestCase):
    """Four runs of two learning rates and two seeds (test_index's GROUPED_SCRIPT: a loss, grad_norm, eval/fid,
    late/x and swd with the summary's swd_floor) and one `runner serve` over them: the runs grouped, a floor's line,
    headings by prefix, a chart's own smoothing, colours by run, the page's state in its URL."""

    @classmethod
    def setUpClass(cls):
        import test_index

        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = Path(cls.tmp.name)
        cls.home = cls.dir / "home"
        env = {**home_env(cls.home), "OMP_NUM_THREADS": "1"}
        write_script(cls.dir, "groups.lua", test_index.GROUPED_SCRIPT)
        for overrides in (("lr=0.01", "seed=0"), ("lr=0.01", "seed=1"), ("lr=0.04", "seed=0"), ("lr=0.04", "seed=1")):
            subprocess.run([RUNNER, "groups.lua", *overrides], cwd=cls.dir, env=env, check=True, capture_output=True,
                           timeout=300)
        cls.server, cls.printed_url = start_serve(cls.home)
        cls.url, cls.token = split_token(cls.printed_url)
        cls.browser = None

    @classmethod
    def tearDownClass(cls):
        try:
            stop_serve(cls.server)
        finally:
            if cls.browser:
                cls.browser.close()
            cls.tmp.cleanup()

    def page(self, path):
        if report_screenshot.chromium_binary() is None:
            if os.environ.get("RUNNER_NO_BROWSER"):
                self.skipTest("RUNNER_NO_BROWSER is set: the dashboard's pages are not checked on this host")
            self.fail("chromium is not installed (scripts/setup installs it); the dashboard cannot be checked")
        import browser_session

        if GroupsFloorsAndLinks.browser is None:
            GroupsFloorsAndLinks.browser = browser_session.BrowserSession()
            GroupsFloorsAndLinks.browser.goto(self.printed_url)
        self.browser.goto(self.url.rstrip("/") + path)
        return self.browser

    def ids(self):
        with sqlite3.connect(self.home / "index.db") as db:
            return dict(db.execute("SELECT name, id FROM runs").fetchall())

    ROWS = "[...document.querySelectorAll('tbody tr')].map((tr) => [...tr.children].map((td) => td.textContent))"
    NAMES = "[...document.querySelectorAll('tbody tr td:nth-child(2)')].map((td) => td.textContent)"

    def test_the_runs_table_groups_the_runs_by_config_but_seed_with_each_metrics_mean_and_std(self):
        browser = self.page("/")
        browser.wait_for("document.querySelectorAll('tbody tr').length === 4")
        browser.evaluate("document.querySelector('input.group-runs').click()")
        browser.wait_for("document.querySelector('thead th')?.textContent === 'group'")
        self.assertEqual(browser.evaluate("[...document.querySelectorAll('thead th')].map((th) => th.textContent)"),
                         ["group", "config.lr", "runs", "loss", "eval/fid", "late/x", "grad_norm", "swd"])
        # Each metric's latest values (step 40): loss (1 + seed) * lr * 100 / 40, swd 0.0125 + 0.1 * seed.
        self.assertEqual(browser.evaluate(self.ROWS), [
            ["lr=0.04", "0.04", "2", "0.15 \u00b1 0.0707107", "2.5 \u00b1 0", "40 \u00b1 0", "1.025 \u00b1 0",
             "0.0625 \u00b1 0.0707107"],
            ["lr=0.01", "0.01", "2", "0.0375 \u00b1 0.0176777", "2.5 \u00b1 0", "40 \u00b1 0", "1.025 \u00b1 0",
             "0.0625 \u00b1 0.0707107"]])
        cli = subprocess.run([RUNNER, "runs", "--group", "--metrics", "loss"], env=home_env(self.home), check=True,
                             capture_output=True, text=True, timeout=60).stdout
        self.assertRegex(cli, r"\n0\.04 +2 +0\.15 \u00b1 0\.0707107 \(2\)\n0\.01 +2 +0\.0375 \u00b1 0\.0176777 \(2\)\n")
        # Sorted by a metric's mean; the toggle is in the URL, so a reload shows the groups again.
        browser.evaluate("[...document.querySelectorAll('thead th')].find((th) => th.textContent === 'loss').click()")
        self.assertEqual([row[0] for row in browser.evaluate(self.ROWS)], ["lr=0.01", "lr=0.04"])
        search = browser.evaluate("location.search")
        self.assertEqual(urllib.parse.parse_qs(search[1:]), {"sort": ["loss"], "group": ["1"]})
        browser = self.page(f"/{search}")
        browser.wait_for("document.querySelector('thead th')?.textContent === 'group' && "
                         "document.querySelectorAll('tbody tr').length === 2")
        self.assertEqual([row[0] for row in browser.evaluate(self.ROWS)], ["lr=0.01", "lr=0.04"])
        browser.evaluate("document.querySelector('input.group-runs').click()")
        browser.wait_for("document.querySelectorAll('tbody tr').length === 4")
        self.assertNotIn("group", browser.evaluate("location.search"))

    def test_filters_sort_and_selections_are_kept_in_the_url_and_restored_by_a_reload(self):
        browser = self.page("/")
        browser.wait_for("document.querySelectorAll('tbody tr').length === 4")
        browser.evaluate("const box = document.querySelector('input[type=search]'); box.value = 'groups-';"
                         "box.dispatchEvent(new Event('input'))")
        for _ in range(2):  # descending
            browser.evaluate("[...document.querySelectorAll('thead th')].find((th) => th.textContent === 'loss').click()")
        for name in ("groups-1", "groups-3"):
            browser.evaluate("[...document.querySelectorAll('tbody tr')].find((tr) => tr.children[1].textContent === "
                             f"'{name}').querySelector('input[type=checkbox]').click()")
        browser.evaluate("const w = document.querySelector('input.where'); w.value = 'lr < 0.05';"
                         "w.dispatchEvent(new Event('change'))")
        ids = self.ids()
        search = browser.evaluate("location.search")
        self.assertEqual(urllib.parse.parse_qs(search[1:]), {"q": ["groups-"], "where": ["lr < 0.05"], "sort": ["loss"],
                                                              "desc": ["1"], "select": [ids["groups-1"], ids["groups-3"]]})
        browser = self.page(f"/{search}")
        browser.wait_for("document.querySelectorAll('tbody tr').length === 4")
        self.assertEqual(browser.evaluate(self.NAMES), ["groups-4", "groups-3", "groups-2", "groups-1"])
        self.assertEqual(browser.evaluate("document.querySelector('th.sorted-desc').textContent"), "loss")
        self.assertEqual(browser.evaluate("document.querySelector('input[type=search]').value"), "groups-")
        self.assertEqual(browser.evaluate("document.querySelector('input.where').value"), "lr < 0.05")
        self.assertEqual(browser.evaluate("[...document.querySelectorAll('tbody tr')].filter((tr) => "
                                          "tr.querySelector('input[type=checkbox]').checked).map((tr) => "
                                          "tr.children[1].textContent)"), ["groups-3", "groups-1"])
        self.assertEqual(browser.evaluate("[...document.querySelectorAll('.controls button')].map((b) => b.textContent)"),
                         ["compare selected (2)"])

    def test_a_run_has_one_colour_on_every_page(self):
        colours = {"groups-1": "#1f77b4", "groups-2": "#ff7f0e", "groups-3": "#2ca02c", "groups-4": "#d62728"}
        browser = self.page("/")
        browser.wait_for("document.querySelectorAll('tbody tr').length === 4")
        shown = browser.evaluate("Object.fromEntries([...document.querySelectorAll('tbody tr')].map((tr) => "
                                 "[tr.children[1].textContent, tr.querySelector('.swatch').getAttribute('style')]))")
        self.assertEqual(shown, {name: f"background:{colour}" for name, colour in colours.items()})
        browser = self.page("/compare?run=groups-3&run=groups-1")
        loss = "document.querySelector('figure.chart svg[aria-label=\"loss\"]')"
        browser.wait_for(f"{loss}?.querySelectorAll('g.series').length === 2")
        self.assertEqual(browser.evaluate(f"[...{loss}.querySelectorAll('g.series')].map((g) => g.dataset.colour)"),
                         [colours["groups-3"], colours["groups-1"]])
        browser = self.page("/run/groups-2")
        browser.wait_for(f"!!{loss}?.querySelector('g.series')")
        self.assertEqual(browser.evaluate(f"{loss}.querySelector('g.series').dataset.colour"), colours["groups-2"])
        self.assertEqual(browser.evaluate("document.querySelector('h1 .swatch').getAttribute('style')"),
                         f"background:{colours['groups-2']}")
        self.runner_report("groups-3", "groups-1")
        report = (self.dir / "report.html").read_text()
        chart = report[report.index('aria-label="loss"'):]
        self.assertEqual(re.findall(r'<polyline fill="none" stroke="([^"]+)"', chart[:chart.index("</svg>")]),
                         [colours["groups-3"], colours["groups-1"]])

    def runner_report(self, *runs):
        subprocess.run([RUNNER, "report", *runs, "-o", str(self.dir / "report.html")], env=home_env(self.home),
                       check=True, capture_output=True, timeout=120)

    def test_compare_groups_the_runs_into_mean_lines_over_bands_and_a_chart_has_its_own_smoothing(self):
        browser = self.page("/compare?run=groups-2&run=groups-1&run=groups-3&run=groups-4")
        chart = lambda key: f"document.querySelector('figure.chart svg[aria-label=\"{key}\"]')"
        browser.wait_for(f"{chart('loss')}?.querySelectorAll('g.series').length === 4")
        # The grids' slider opens at the last step every run has a grid of: the seed-1 runs stop at step 30.
        block = "document.querySelector('.grid-compare[data-name=\"samples\"]')"
        browser.wait_for(f"{block}?.querySelectorAll('figure.grid-cell img').length === 4")
        self.assertEqual(browser.evaluate(f"{block}.querySelector('span').textContent"), " step 30 (3 of 4)")
        browser.evaluate("document.querySelector('input.group-runs').click()")
        browser.wait_for(f"{chart('loss')}?.querySelectorAll('g.series').length === 2")
        self.assertEqual(browser.evaluate(f"[...{chart('loss')}.querySelectorAll('g.series')].map((g) => g.dataset.label)"),
                         ["lr=0.01 (2 runs)", "lr=0.04 (2 runs)"])
        self.assertEqual(browser.evaluate(f"{chart('loss')}.querySelectorAll('polygon.band').length"), 2)
        self.assertEqual(browser.evaluate(f"{chart('loss')}.querySelector('text.legend-note').textContent"),
                         "each group: the mean of its runs, over a band from their lowest to their highest value")
        self.assertEqual(urllib.parse.parse_qs(browser.evaluate("location.search")[1:])["group"], ["1"])
        # The loss chart without smoothing: its line is the mean itself, (1 + 2) / 2 / step for lr 0.01; grad_norm's
        # stays smoothed as the page is.
        values = lambda key: f"{chart(key)}.querySelector('g.series').dataset.values.split(' ').map(Number)"
        smoothed_grad_norm = browser.evaluate(values("grad_norm"))
        browser.evaluate(f"(() => {{ const s = {chart('loss')}.closest('figure').querySelector('select.chart-smoothing');"
                         " s.value = '0'; s.dispatchEvent(new Event('change')); })()")
        browser.wait_for(f"{values('loss')}.at(-1) === 0.0375")
        self.assertEqual([round(v, 6) for v in browser.evaluate(values("loss"))], [round(1.5 / s, 6) for s in range(1, 41)])
        self.assertEqual(browser.evaluate(values("grad_norm")), smoothed_grad_norm)
        self.assertNotAlmostEqual(smoothed_grad_norm[-1], 1.025, places=4)
        self.assertEqual(browser.evaluate("document.querySelector('.controls input[type=range]').value"), "0.6")
        browser = self.page("/compare?run=groups-2&run=groups-1&group=1")
        browser.wait_for(f"{chart('loss')}?.querySelectorAll('polygon.band').length === 1")

    def test_a_run_pages_scale_smoothing_and_hidden_charts_are_kept_in_the_url(self):
        browser = self.page("/run/groups-1")
        browser.wait_for("document.querySelectorAll('.metric-section svg.chart').length === 5")
        browser.evaluate("const s = document.querySelector('select.y-scale'); s.value = 'log';"
                         "s.dispatchEvent(new Event('change'))")
        browser.evaluate("[...document.querySelectorAll('.metric-picks label')].find((l) => l.textContent.trim() === "
                         "'grad_norm').querySelector('input').click()")
        search = browser.evaluate("location.search")
        self.assertEqual(urllib.parse.parse_qs(search[1:]), {"x": ["step"], "scale": ["log"], "smoothing": ["0.6"],
                                                              "hide": ["grad_norm"]})
        browser = self.page(f"/run/groups-1{search}")
        browser.wait_for("document.querySelectorAll('.metric-section svg.chart').length === 4")
        self.assertEqual(browser.evaluate("document.querySelector('select.y-scale').value"), "log")
        self.assertNotIn("grad_norm", browser.evaluate("[...document.querySelectorAll('svg.chart')].map((s) => "
                                                       "s.getAttribute('aria-label'))"))
        self.assertEqual(browser.evaluate("[...document.querySelectorAll('.metric-picks label')].filter((l) => "
                                          "!l.querySelector('input').checked).map((l) => l.textContent.trim())"),
                         ["grad_norm"])

    def test_a_metrics_floor_is_a_dashed_line_and_each_prefix_heads_its_charts_on_the_run_page(self):
        browser = self.page("/run/groups-1")
        browser.wait_for("document.querySelectorAll('.metric-section svg.chart').length === 5")
        floor = browser.evaluate("[...document.querySelectorAll('svg[aria-label=\"swd\"] g.reference-line')].map((g) =>"
                                 " [g.querySelector('line').getAttribute('stroke-dasharray'), g.textContent])")
        self.assertEqual(floor, [["6 4", "swd_floor 0.02"]])
        sections = browser.evaluate("[...document.querySelectorAll('.metric-section')].map((s) => "
                                    "[s.querySelector('h3')?.textContent ?? '', [...s.querySelectorAll('svg.chart')]"
                                    ".map((svg) => svg.getAttribute('aria-label'))])")
        self.assertEqual(sections, [["", ["loss"]], ["eval/", ["eval/fid"]], ["late/", ["late/x"]],
                                    ["other metrics", ["grad_norm", "swd"]]])


if __name__ == "__main__":
    unittest.main()
