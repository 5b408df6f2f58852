"""A PostgreSQL server of the tests' own: initdb in a temporary folder, started on a free local port (as the
unprivileged user nobody when the tests run as root), a fresh database per test, and stopped at the end."""
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from ports import free_port

BIN = pathlib.Path(os.environ.get("RUNNER_POSTGRES_BIN", "/usr/lib/postgresql/15/bin"))


def missing():
    """Why PostgreSQL's server programs cannot be found here, or None where they are installed."""
    if (BIN / "initdb").exists() and (BIN / "postgres").exists():
        return None
    return (f"PostgreSQL's server programs are not in {BIN} (Debian postgresql, which scripts/setup installs; "
            "RUNNER_POSTGRES_BIN names another folder)")


def available():
    """Whether PostgreSQL's server programs are installed (scripts/setup installs Debian's postgresql)."""
    return missing() is None


class PostgresServer:
    """start(), then url(database) for runner's RUNNER_INDEX; kill() (SIGKILL) and start() again keep the data."""

    def __init__(self):
        self.folder = pathlib.Path(tempfile.mkdtemp(prefix="runner-pg-"))
        self.data = self.folder / "data"
        self.port = free_port()
        self.process = None
        self.databases = 0
        self.as_root = os.geteuid() == 0
        if self.as_root:
            os.chmod(self.folder, 0o755)
            shutil.chown(self.folder, "nobody", "nogroup")
        try:
            self.command(str(BIN / "initdb"), "-D", str(self.data), "-U", "runner", "--auth=trust", "-E", "UTF8",
                         "--no-sync")
        except subprocess.CalledProcessError as error:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise RuntimeError(f"initdb of the test PostgreSQL server failed: {error.stderr}") from error

    def command(self, *args, **options):
        prefix = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] if self.as_root else []
        return subprocess.run([*prefix, *args], check=True, capture_output=True, text=True, cwd=self.folder,
                              **options)

    def start(self):
        prefix = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] if self.as_root else []
        self.log = open(self.folder / f"server-{time.time():.0f}.log", "w")
        self.process = subprocess.Popen(
            [*prefix, str(BIN / "postgres"), "-D", str(self.data), "-p", str(self.port), "-k", str(self.folder),
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=200"],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=self.folder, start_new_session=True)
        try:
            why_not = self.why_not_ready(seconds=30)
        except BaseException:
            self.kill()
            raise
        if why_not is None:
            return self
        # The postmaster and whatever it started go; its log says why it did not come up.
        self.kill()
        log = pathlib.Path(self.log.name).read_text(errors="replace")
        raise RuntimeError(f"the test PostgreSQL server did not start: it {why_not}; its log:\n{log}")

    def why_not_ready(self, seconds):
        """None once the server answers within `seconds`, else why not."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            ready = subprocess.run([str(BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"])
            if ready.returncode == 0:
                return None
            if self.process.poll() is not None:
                return f"exited with status {self.process.returncode}"
            time.sleep(0.1)
        return f"did not answer within {seconds} s"

    def sql(self, statement, database="postgres"):
        """Runs SQL through psql; returns its output (unaligned, tuples only)."""
        return subprocess.run([str(BIN / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "runner", "-d",
                               database, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", statement],
                              check=True, capture_output=True, text=True).stdout

    def new_database(self):
        """A fresh, empty database; returns its URL."""
        self.databases += 1
        name = f"test_{os.getpid()}_{self.databases}"
        self.sql(f"CREATE DATABASE {name}")
        return self.url(name)

    def url(self, database):
        return f"postgresql://runner@127.0.0.1:{self.port}/{database}"

    def kill(self):
        """SIGKILL to the postmaster and its backends, as a crash; start() recovers the data."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:  # the postmaster ended and its backends with it
            pass
        self.process.wait()
        self.log.close()
        # A killed postmaster leaves its pid file and shared memory; the backends are gone with the group.
        time.sleep(0.2)

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


_shared = None


def shared_server():
    """One server for a whole test module (started on first use, stopped at exit). Where it did not start, every
    call raises that error, without trying again."""
    global _shared
    if _shared is None:
        import atexit
        try:
            server = PostgresServer()
            atexit.register(server.stop)
            _shared = server.start()
        except (OSError, RuntimeError) as error:
            _shared = RuntimeError(str(error))
    if isinstance(_shared, Exception):
        raise _shared
    return _shared


# For ctest: `postgres_server.py start DIR` starts a server that outlives this command and writes its URL (of the
# database `postgres`) to DIR/url; where PostgreSQL is not installed it writes the reason to DIR/unavailable and
# still exits 0 (the tests that use it say why they skip), and where it is installed but the server does not start
# it fails, saying why, with nothing left running. `stop DIR` stops the server. The Catch2 tests find DIR in
# RUNNER_TEST_POSTGRES (tests/CMakeLists.txt).

def start_for_ctest(state):
    import json
    state.mkdir(parents=True, exist_ok=True)
    for name in ("url", "unavailable", "server.json"):
        (state / name).unlink(missing_ok=True)
    if not available():
        (state / "unavailable").write_text(missing() + "\n")
        return
    server = None
    try:
        server = PostgresServer()
        server.start()
    except (OSError, RuntimeError) as error:
        if server:
            server.stop()
        sys.exit(str(error))
    (state / "server.json").write_text(json.dumps({"pid": server.process.pid, "folder": str(server.folder)}))
    (state / "url").write_text(server.url("postgres") + "\n")


def stop_for_ctest(state):
    import json
    recorded = state / "server.json"
    if recorded.exists():
        server = json.loads(recorded.read_text())
        try:
            os.kill(server["pid"], signal.SIGINT)  # fast shutdown
            deadline = time.time() + 30
            while time.time() < deadline:
                os.kill(server["pid"], 0)
                time.sleep(0.1)
            os.killpg(server["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(server["folder"], ignore_errors=True)
    for name in ("url", "unavailable", "server.json"):
        (state / name).unlink(missing_ok=True)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop"):
        sys.exit("usage: postgres_server.py start|stop DIR")
    (start_for_ctest if sys.argv[1] == "start" else stop_for_ctest)(pathlib.Path(sys.argv[2]))
