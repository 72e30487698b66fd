"""Stand-ins for inference servers: a scripted OpenAI-compatible one, and client configs."""

from __future__ import annotations

import threading
import time

from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from tests.support.json_http import JsonHandler, LocalHttpServer

QUESTION = [
    {"role": "system", "content": "Answer with one digit."},
    {"role": "user", "content": "What is 2 + 5 mod 10?"},
]


def server_config(url: str, **overrides) -> APIServerConfig:
    values = dict(base_url=f"{url}/v1", model_name="tiny", server_type="vllm", timeout=60)
    return APIServerConfig(**{**values, **overrides})


CHAT = {
    "id": "x",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
}


class _StatusScriptHandler(JsonHandler):
    def do_POST(self) -> None:
        server: ScriptedServer = self.owner
        self.rfile.read(int(self.headers.get("content-length", 0)))
        with server.lock:
            server.requests += 1
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
            status = server.script.pop(0) if server.script else 200
        time.sleep(server.delay_s)  # the scripted latency, so requests overlap
        self._answer(status, CHAT if status == 200 else {"error": {"message": f"status {status}"}})
        with server.lock:
            server.in_flight -= 1

    def do_GET(self) -> None:
        # like a hosted API: a model list, but no /health route
        found = self.path.rstrip("/").endswith("/models")
        self._answer(200 if found else 404, {"object": "list", "data": []} if found else {})


class ScriptedServer(LocalHttpServer):
    """Answers each request with the next status of `script` (then 200), tracking concurrency."""

    def __init__(self, script: list[int], delay_s: float = 0.0) -> None:
        self.script = list(script)
        self.delay_s = delay_s
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        super().__init__(_StatusScriptHandler, path="/v1")
