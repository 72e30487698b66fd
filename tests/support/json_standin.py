"""A real HTTP server on 127.0.0.1 whose POST routes answer with functions of the JSON body.

Stands in for backends this machine cannot run (vLLM, SGLang, TRL's vLLM server) in
their documented wire shapes; every request body is recorded for the test to inspect.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.support.json_http import JsonHandler, LocalHttpServer

Route = Callable[[dict[str, Any]], Any]


class _RouteHandler(JsonHandler):
    def do_POST(self) -> None:
        server: JsonStandIn = self.owner
        body = self.read_json()
        server.requests.append((self.path, body))
        route = server.routes.get(self.path)
        if route is None:
            self._answer(404, {"error": "no route"})
        else:
            self._answer(200, route(body))

    def do_GET(self) -> None:
        self._answer(200 if self.path == "/health" else 404, {})


class JsonStandIn(LocalHttpServer):
    """Answers a POST to a path in `routes` with `routes[path](body)`; `requests` records them."""

    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes = routes
        self.requests: list[tuple[str, dict[str, Any]]] = []
        super().__init__(_RouteHandler)
