"""A vLLM-style `/v1/completions` server that answers with scripted token ids.

The tiny model's samples are noise, so a test that needs the model to *write*
something (a hermes tool call) drives this server instead: real HTTP, the
request shape vLLM receives (token-id prompts, `return_tokens_as_token_ids`), and
answers carrying `token_id:N` tokens with logprobs, as vLLM returns them. Each
request takes the next scripted reply per choice; every request body is recorded.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LOGPROB = -0.25  # every scripted token's logprob


def completion_body(replies: list[tuple[list[int], str]]) -> dict[str, Any]:
    """A text_completion answer whose choices carry ids as vLLM's `token_id:N` strings."""
    return {
        "id": "cmpl-scripted",
        "object": "text_completion",
        "created": 0,
        "model": "scripted",
        "choices": [
            {
                "index": i,
                "text": "",
                "finish_reason": finish,
                "logprobs": {
                    "tokens": [f"token_id:{t}" for t in ids],
                    "token_logprobs": [LOGPROB] * len(ids),
                    "top_logprobs": None,
                    "text_offset": [0] * len(ids),
                },
            }
            for i, (ids, finish) in enumerate(replies)
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


class TokenScriptServer:
    """`replies`: (completion token ids, finish reason) pairs, consumed one per choice."""

    def __init__(self, replies: list[tuple[list[int], str]]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                with lock:
                    outer.requests.append(body)
                    n = body.get("n") or 1
                    if not self.path.endswith("/completions") or len(outer.replies) < n:
                        self._answer(400, {"error": {"message": "no scripted reply left"}})
                        return
                    taken, outer.replies[:n] = outer.replies[:n], []
                self._answer(200, completion_body(taken))

            def do_GET(self):  # noqa: N802 - http.server API
                self._answer(200 if self.path == "/health" else 404, {})

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
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
