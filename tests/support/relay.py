"""A TCP relay on a fixed 127.0.0.1 port in front of a running server, which a test stops
and starts again as an engine that is restarted on the same port.

What a client sees of an engine restart is its port: while the engine is stopped,
connections are refused and the open ones are cut; while the new one loads its model, it
has already bound the port (atropos-inference-server binds before it loads), so
connections are accepted and then get no answer until it serves. The relay shows the
same, in front of a server that keeps running (the session's `inference_server`), so a
test of the client's side pays for no engine start (about 8 s of CPU each). The engine's
own side of a restart is tests/inference/test_launcher.py's.
"""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlsplit

from atroposlib.utils.ports import free_port


class PortRelay:
    """Forwards every connection to `target` (a URL's host and port) while it serves."""

    def __init__(self, target: str, port: int | None = None, start: bool = True) -> None:
        split = urlsplit(target)
        self._target = (split.hostname or "127.0.0.1", split.port or 80)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._serving = False
        self._held: list[socket.socket] = []
        self._open: set[socket.socket] = set()
        if start:
            self.start()

    def start(self, loading: bool = False) -> PortRelay:
        """Listen on the port again; `loading`: hold each connection unanswered until
        `ready()`, as an engine that has bound its port but not loaded its model yet."""
        listener = socket.create_server(("127.0.0.1", self.port))  # SO_REUSEADDR
        with self._lock:
            self._listener, self._serving = listener, not loading
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def held(self) -> int:
        """Connections accepted while loading, still waiting for an answer."""
        with self._lock:
            return len(self._held)

    def ready(self) -> None:
        """Loaded: serve the connections held so far, and every new one."""
        with self._lock:
            self._serving = True
            held, self._held = self._held, []
        for client in held:
            self._forward(client)

    def stop(self) -> None:
        """Stopped: the port refuses connections, and every open one is cut."""
        with self._lock:
            listener, self._listener = self._listener, None
            cut, self._open, self._held = list(self._open), set(), []
        if listener is not None:
            _close(listener)  # shutdown() wakes the accept() blocked on it
        for connection in cut:
            _close(connection)

    def close(self) -> None:
        self.stop()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # stopped
                return
            with self._lock:
                if self._listener is not listener:
                    _close(client)
                    return
                self._open.add(client)
                serving = self._serving
                if not serving:
                    self._held.append(client)
            if serving:
                self._forward(client)

    def _forward(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self._target, timeout=10)
        except OSError:
            _close(client)
            return
        upstream.settimeout(None)
        with self._lock:
            self._open.add(upstream)
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy one direction until either side ends, then end both (as a cut connection)."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        _close(source)
        _close(sink)


def _close(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    connection.close()
