"""Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe): open a page, run
JavaScript in it, wait for a condition, take a screenshot. For the dashboard tests; needs no Python packages."""
import base64
import fcntl
import json
import os
import subprocess
import tempfile
import time

import report_screenshot


class BrowserSession:
    """One headless Chromium with one page. Raises FileNotFoundError when chromium is not on PATH."""

    def __init__(self, width=1280, height=900):
        binary = report_screenshot.chromium_binary()
        if binary is None:
            raise FileNotFoundError("chromium is not on PATH (apt-get install chromium)")
        self.profile = tempfile.TemporaryDirectory(prefix="runner-chromium-")
        # Chromium reads commands from fd 3 and writes answers to fd 4, each message ending in a NUL byte.
        commands_read, self.commands = os.pipe()
        self.answers, answers_write = os.pipe()

        def give_pipes():
            # Copied above 4 first: a pipe's own descriptor may be 3 or 4 (and dup2 onto itself keeps close-on-exec).
            read_copy = fcntl.fcntl(commands_read, fcntl.F_DUPFD, 5)
            write_copy = fcntl.fcntl(answers_write, fcntl.F_DUPFD, 5)
            os.dup2(read_copy, 3)
            os.dup2(write_copy, 4)

        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--remote-debugging-pipe",
             f"--user-data-dir={self.profile.name}", f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=False,
            preexec_fn=give_pipes, env={**os.environ, "HOME": self.profile.name}, cwd=self.profile.name)
        os.close(commands_read)
        os.close(answers_write)
        self.next_id = 0
        self.buffer = b""
        self.session = None
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.send("Page.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def send(self, method, **params):
        """Sends one command (to the page once attached) and returns its result; RuntimeError on an error answer."""
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        os.write(self.commands, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._read_message()
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})

    def _read_message(self):
        while b"\0" not in self.buffer:
            chunk = os.read(self.answers, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def goto(self, url):
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'")

    def evaluate(self, expression):
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression, timeout=20):
        """Evaluates expression every 0.1 s until its value is truthy in Python (a DOM node comes back as {}: test
        it with !!); returns the value, or raises TimeoutError after timeout s."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"after {timeout} s still false: {expression}")
            time.sleep(0.1)

    def screenshot(self, path):
        data = self.send("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as file:
            file.write(base64.b64decode(data))
        return str(path)

    def close(self):
        try:
            os.write(self.commands, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
            self.process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        os.close(self.commands)
        os.close(self.answers)
        self.profile.cleanup()
