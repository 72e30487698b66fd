"""The scaffold every stand-in HTTP server of the tests shares, kept in one place.

Each stand-in (a scripted model, a vLLM look-alike, a lossy proxy...) differs only
in how it answers a request; binding to a free port on 127.0.0.1, serving from a
daemon thread, quiet logging, JSON answers and shutting down are the same for all.
A handler reaches the object that owns its server as `self.owner`, so handlers
can be plain classes at module level instead of closures.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

Server = TypeVar("Server", bound="LocalHttpServer")


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that keeps the access log off stderr."""

    @property
    def owner(self) -> Any:
        """The `LocalHttpServer` (subclass) this request came to."""
        return self.server.owner  # type: ignore[attr-defined]

    def log_message(self, *args: object) -> None:
        pass


class JsonHandler(QuietHandler):
    """A quiet handler whose requests and answers are JSON."""

    def read_json(self) -> Any:
        """The request body, parsed. A client that hung up before the whole body came (an
        env stopped mid-request) is a ConnectionError, which the server ignores."""
        length = int(self.headers.get("content-length", 0))
        body = self.rfile.read(length)
        if len(body) < length:
            raise ConnectionAbortedError(f"the client sent {len(body)} of {length} bytes")
        return json.loads(body)

    def _answer(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _OwnedServer(ThreadingHTTPServer):
    def __init__(self, owner: LocalHttpServer, handler: type[QuietHandler]) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up before its answer (an env stopped mid-request) is no
        error of the stand-in's; anything else is printed, as socketserver does. In-process
        runs capture this process's stderr, and a printed traceback fails them."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class LocalHttpServer:
    """Serves `handler` on 127.0.0.1 (port chosen at run time) from the moment it is made.

    `url` is the server's root plus `path` (e.g. "/v1"). A subclass sets the state
    its handler reads before calling `super().__init__`. Use `close()` or `with`.
    """

    def __init__(self, handler: type[QuietHandler], path: str = "") -> None:
        self.httpd = _OwnedServer(self, handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop serving and free the port."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)

    def __enter__(self: Server) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
