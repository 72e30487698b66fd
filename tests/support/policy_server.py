"""An OpenAI-compatible chat server whose replies come from a Python policy.

The tiny model's samples are noise, so an environment whose scoring depends on what
the model *says* (a hermes tool call, a game move) cannot be tested against it
deterministically. This server stands in for the model over real HTTP: each
`/v1/chat/completions` request is answered by `policy(messages, n)`, which returns
the n reply texts. Every request is recorded, so a test can check what the env sent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Policy = Callable[[list[dict[str, Any]], int], list[str]]


def chat_body(model: str, texts: list[str]) -> dict[str, Any]:
    """A chat.completion answer with one choice per text."""
    return {
        "id": "chatcmpl-policy",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
            for i, text in enumerate(texts)
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


class PolicyChatServer:
    """Serves `policy` on 127.0.0.1 (port chosen at run time); `url` ends in /v1."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.requests: list[dict[str, Any]] = []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                with lock:
                    outer.requests.append(body)
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    return self._answer(404, {"error": {"message": f"no route {self.path}"}})
                try:
                    texts = outer.policy(body["messages"], int(body.get("n") or 1))
                except Exception as exc:  # a policy bug shows up as a 500 the env logs
                    return self._answer(500, {"error": {"message": repr(exc)}})
                self._answer(200, chat_body(body.get("model", "policy"), texts))

            def do_GET(self):  # noqa: N802 - http.server API
                path = self.path.rstrip("/")
                if path.endswith("/models"):
                    return self._answer(200, {"object": "list", "data": [{"id": "policy"}]})
                if path.endswith("/health"):
                    return self._answer(200, {})
                self._answer(404, {})

            def _answer(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
