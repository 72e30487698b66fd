"""A real HTTP server on 127.0.0.1 whose POST routes answer with functions of the JSON body.

Stands in for backends this machine cannot run (vLLM, SGLang, TRL's vLLM server) in
their documented wire shapes; every request body is recorded for the test to inspect.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Route = Callable[[dict[str, Any]], Any]


class JsonStandIn:
    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes = routes
        self.requests: list[tuple[str, dict[str, Any]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                outer.requests.append((self.path, body))
                route = outer.routes.get(self.path)
                self._answer(404, {"error": "no route"}) if route is None else self._answer(
                    200, route(body)
                )

            def do_GET(self):  # noqa: N802 - http.server API
                self._answer(200 if self.path == "/health" else 404, {})

            def _answer(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)
