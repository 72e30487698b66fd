"""A vLLM-style `/v1/completions` server that answers with scripted token ids.

The tiny model's samples are noise, so a test that needs the model to *write*
something (a hermes tool call) drives this server instead: real HTTP, the
request shape vLLM receives (token-id prompts, `return_tokens_as_token_ids`), and
answers carrying `token_id:N` tokens with logprobs, as vLLM returns them. Each
request takes the next scripted reply per choice; every request body, and the key it
carried, is recorded.
"""

from __future__ import annotations

import threading
from typing import Any

from tests.support.json_http import JsonHandler, LocalHttpServer

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


class _ScriptHandler(JsonHandler):
    def do_POST(self) -> None:
        server: TokenScriptServer = self.owner
        body = self.read_json()
        with server.lock:
            server.requests.append(body)
            server.authorizations.append(self.headers.get("Authorization"))
            n = body.get("n") or 1
            if not self.path.endswith("/completions") or len(server.replies) < n:
                self._answer(400, {"error": {"message": "no scripted reply left"}})
                return
            taken, server.replies[:n] = server.replies[:n], []
        self._answer(200, completion_body(taken))

    def do_GET(self) -> None:
        self._answer(200 if self.path == "/health" else 404, {})


class TokenScriptServer(LocalHttpServer):
    """`replies`: (completion token ids, finish reason) pairs, consumed one per choice."""

    def __init__(self, replies: list[tuple[list[int], str]]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.authorizations: list[str | None] = []
        """Each request's Authorization header (None: sent without one)."""
        self.lock = threading.Lock()
        super().__init__(_ScriptHandler)
