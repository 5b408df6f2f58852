"""A PostgreSQL server of the tests' own: initdb in a temporary folder, started on a free local port (as the
unprivileged user nobody when the tests run as root), a fresh database per test, and stopped at the end."""
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time

BIN = pathlib.Path(os.environ.get("RUNNER_POSTGRES_BIN", "/usr/lib/postgresql/15/bin"))


def available():
    """Whether PostgreSQL's server programs are installed (scripts/setup installs Debian's postgresql)."""
    return (BIN / "initdb").exists() and (BIN / "postgres").exists()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        self.command(str(BIN / "initdb"), "-D", str(self.data), "-U", "runner", "--auth=trust", "-E", "UTF8",
                     "--no-sync")

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
        deadline = time.time() + 30
        while time.time() < deadline:
            ready = subprocess.run([str(BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"])
            if ready.returncode == 0:
                return self
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"the test PostgreSQL server did not start: {(self.folder).as_posix()}")

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
        os.killpg(self.process.pid, signal.SIGKILL)
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
    """One server for a whole test module (started on first use, stopped at exit)."""
    global _shared
    if _shared is None:
        import atexit
        _shared = PostgresServer().start()
        atexit.register(_shared.stop)
    return _shared


# For ctest: `postgres_server.py start DIR` starts a server that outlives this command and writes its URL (of the
# database `postgres`) to DIR/url, or, where PostgreSQL is not installed or does not start, the reason to
# DIR/unavailable (and still exits 0, so that the tests that use it can say why they skip); `stop DIR` stops it.
# The Catch2 tests find DIR in RUNNER_TEST_POSTGRES (tests/CMakeLists.txt).

def start_for_ctest(state):
    import json
    state.mkdir(parents=True, exist_ok=True)
    for name in ("url", "unavailable", "server.json"):
        (state / name).unlink(missing_ok=True)
    if not available():
        (state / "unavailable").write_text(f"PostgreSQL's server programs are not in {BIN} (Debian postgresql, which "
                                           f"scripts/setup installs; RUNNER_POSTGRES_BIN names another folder)\n")
        return
    try:
        server = PostgresServer()
        server.start()
    except (OSError, RuntimeError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or ""
        (state / "unavailable").write_text(f"the test PostgreSQL server did not start: {error} {detail}".strip() + "\n")
        return
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
    import sys
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop"):
        sys.exit("usage: postgres_server.py start|stop DIR")
    (start_for_ctest if sys.argv[1] == "start" else stop_for_ctest)(pathlib.Path(sys.argv[2]))
