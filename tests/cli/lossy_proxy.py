"""A TCP proxy between runner and a PostgreSQL server that loses answers, as a network that fails at that moment does.

A transaction whose statements contain one of the given markers has its COMMIT forwarded and executed, then the
connection is cut before the answer reaches the client (once per marker); `cuts` lists the markers whose commit was
cut, in order. A statement that contains one of the `withhold` markers is forwarded and executed, and its answer (and
all the server says after it) never reaches the client, while both ends of the connection stay open: the server
keeps the session, and the locks of its open transaction, until something ends it, even once the client has closed its
end. `withheld` lists those markers, in order (`withheld_event` is set at the first); `farewells` what the server said
last on each such connection before it closed it (the ErrorResponse that ended the session, as text)."""
import socket
import struct
import threading

SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST = 80877103, 80877104, 80877102


class LossyProxy:
    def __init__(self, server_port, markers=(), withhold=()):
        self.server_port = server_port
        self.markers = list(markers)
        self.cuts = []
        self.to_withhold = list(withhold)
        self.withheld = []
        self.withheld_event = threading.Event()
        self.farewells = []
        self.lock = threading.Lock()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.closed = False
        threading.Thread(target=self.accept, daemon=True).start()

    def close(self):
        self.closed = True
        self.listener.close()

    def accept(self):
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.server_port))
            Connection(self, client, server)

    def marker_to_cut(self, transaction):
        """The first marker in the transaction's text that was not cut yet (taken), or None."""
        with self.lock:
            for marker in self.markers:
                if marker in transaction and marker not in self.cuts:
                    self.cuts.append(marker)
                    return marker
        return None

    def marker_to_withhold(self, statement):
        """The first `withhold` marker in the statement's text that was not withheld yet (taken), or None."""
        with self.lock:
            for marker in self.to_withhold:
                if marker in statement and marker not in self.withheld:
                    self.withheld.append(marker)
                    self.withheld_event.set()
                    return marker
        return None


def read_exactly(sock, count):
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


class Connection:
    def __init__(self, proxy, client, server):
        self.proxy, self.client, self.server = proxy, client, server
        self.swallow = threading.Event()  # the server's next answer is the cut commit's: not forwarded
        self.answered = threading.Event()
        self.withholding = threading.Event()  # nothing the server says reaches the client any more
        threading.Thread(target=self.from_client, daemon=True).start()
        threading.Thread(target=self.from_server, daemon=True).start()

    def shut(self):
        for sock in (self.client, self.server):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def from_server(self):
        said = b""
        try:
            while True:
                data = self.server.recv(65536)
                if not data:
                    break
                if self.swallow.is_set():
                    self.answered.set()
                    return
                if self.withholding.is_set():
                    said = data
                    continue
                self.client.sendall(data)
        except OSError:
            pass
        if self.withholding.is_set():
            with self.proxy.lock:
                self.proxy.farewells.append(said.decode(errors="replace"))
        self.shut()

    def from_client(self):
        try:
            while True:  # the startup phase: messages without a type byte
                length = read_exactly(self.client, 4)
                body = read_exactly(self.client, struct.unpack("!I", length)[0] - 4)
                self.server.sendall(length + body)
                if struct.unpack("!I", body[:4])[0] not in (SSL_REQUEST, GSSENC_REQUEST):
                    break
            transaction = ""
            while True:
                kind = read_exactly(self.client, 1)
                length = read_exactly(self.client, 4)
                body = read_exactly(self.client, struct.unpack("!I", length)[0] - 4)
                text = ""
                if kind == b"Q":
                    text = body.rstrip(b"\0").decode(errors="replace")
                elif kind == b"P":  # Parse: the statement's name, then its text
                    text = body.split(b"\0")[1].decode(errors="replace")
                if text.startswith("BEGIN"):
                    transaction = text
                elif text:
                    transaction += "\n" + text
                if kind == b"Q" and text == "COMMIT" and self.proxy.marker_to_cut(transaction):
                    self.swallow.set()
                    self.server.sendall(kind + length + body)
                    self.answered.wait(30)  # the server committed and answered: the answer is lost
                    break
                if text and self.proxy.marker_to_withhold(text):
                    self.withholding.set()
                self.server.sendall(kind + length + body)
        except (OSError, EOFError):
            pass
        if self.withholding.is_set():
            self.client.close()  # the server's end stays open: from_server closes it when the server ends the session
            return
        self.shut()
