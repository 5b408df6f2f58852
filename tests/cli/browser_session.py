"""Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe): open a page, run
JavaScript in it, wait for a condition, take a screenshot. For the dashboard tests; needs no Python packages."""
import base64
import fcntl
import json
import os
import select
import signal
import subprocess
import tempfile
import time

import report_screenshot


class BrowserSession:
    """One headless Chromium with one page. Raises FileNotFoundError when chromium is not on PATH."""

    ANSWER_SECONDS = 60  # how long a command waits for Chromium's answer

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

        try:
            # Its own process group: close() ends the renderers and helpers with it.
            self.process = subprocess.Popen(
                [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                 "--no-default-browser-check", "--disable-extensions", "--remote-debugging-pipe",
                 f"--user-data-dir={self.profile.name}", f"--window-size={width},{height}", "about:blank"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=False,
                preexec_fn=give_pipes, start_new_session=True, env={**os.environ, "HOME": self.profile.name},
                cwd=self.profile.name)
        except BaseException:
            for descriptor in (commands_read, self.commands, self.answers, answers_write):
                os.close(descriptor)
            self.profile.cleanup()
            raise
        os.close(commands_read)
        os.close(answers_write)
        self.next_id = 0
        self.buffer = b""
        self.session = None
        try:
            target = self.send("Target.createTarget", url="about:blank")["targetId"]
            self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            self.send("Page.enable")
            self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                      mobile=False)
        except BaseException:
            self.close()
            raise

    def send(self, method, **params):
        """Sends one command (to the page once attached) and returns its result; RuntimeError on an error answer.
        Where Chromium does not answer within ANSWER_SECONDS (TimeoutError) or its pipe fails, it is ended first, so
        that later commands fail at once."""
        if self.commands is None:
            raise RuntimeError(f"{method}: chromium was ended after an earlier command failed")
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        deadline = time.monotonic() + self.ANSWER_SECONDS
        try:
            os.write(self.commands, json.dumps(message).encode() + b"\0")
            while True:
                answer = self._read_message(deadline)
                if answer.get("id") == self.next_id:
                    break
        except OSError as error:  # TimeoutError and ConnectionError too
            self.close(grace=0)
            raise type(error)(f"{method}: {error}") from error
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    def _read_message(self, deadline):
        while b"\0" not in self.buffer:
            ready, _, _ = select.select([self.answers], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError(f"chromium did not answer within {self.ANSWER_SECONDS} s")
            chunk = os.read(self.answers, 1 << 16)
            if not chunk:
                raise ConnectionError("chromium closed its DevTools pipe")
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

    def close(self, grace=10):
        """Browser.close, then SIGKILL to what is left of Chromium's process group `grace` seconds later; idempotent."""
        if self.commands is None:
            return
        try:
            os.write(self.commands, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
            self.process.wait(timeout=grace)
        except (OSError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:  # all of it has ended
            pass
        self.process.wait()
        os.close(self.commands)
        os.close(self.answers)
        self.commands = self.answers = None
        self.profile.cleanup()
