"""Stand-ins for inference servers: a scripted OpenAI-compatible one, and client configs."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from atroposlib.envs.server_handling.server_baseline import APIServerConfig

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


class ScriptedServer:
    """Answers each request with the next status of `script` (then 200), tracking concurrency."""

    def __init__(self, script: list[int], delay_s: float = 0.0) -> None:
        self.script = list(script)
        self.delay_s = delay_s
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server API
                self.rfile.read(int(self.headers.get("content-length", 0)))
                with lock:
                    outer.requests += 1
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                    status = outer.script.pop(0) if outer.script else 200
                time.sleep(outer.delay_s)
                body = json.dumps(
                    CHAT if status == 200 else {"error": {"message": f"status {status}"}}
                )
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())
                with lock:
                    outer.in_flight -= 1

            def do_GET(self):  # noqa: N802 - http.server API
                # like a hosted API: a model list, but no /health route
                found = self.path.rstrip("/").endswith("/models")
                body = json.dumps({"object": "list", "data": []} if found else {})
                self.send_response(200 if found else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
