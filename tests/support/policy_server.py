"""An OpenAI-compatible chat server whose replies come from a Python policy.

The tiny model's samples are noise, so an environment whose scoring depends on what
the model *says* (a hermes tool call, a game move) cannot be tested against it
deterministically. This server stands in for the model over real HTTP: each
`/v1/chat/completions` request is answered by `policy(messages, n)`, which returns
the n reply texts. Every request is recorded, so a test can check what the env sent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.json_http import JsonHandler, LocalHttpServer

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


class _PolicyHandler(JsonHandler):
    def do_POST(self) -> None:
        server: PolicyChatServer = self.owner
        body = self.read_json()
        with server.lock:
            server.requests.append(body)
        if not self.path.rstrip("/").endswith("/chat/completions"):
            return self._answer(404, {"error": {"message": f"no route {self.path}"}})
        try:
            texts = server.policy(body["messages"], int(body.get("n") or 1))
        except Exception as exc:  # a policy bug shows up as a 500 the env logs
            return self._answer(500, {"error": {"message": repr(exc)}})
        self._answer(200, chat_body(body.get("model", "policy"), texts))

    def do_GET(self) -> None:
        path = self.path.rstrip("/")
        if path.endswith("/models"):
            return self._answer(200, {"object": "list", "data": [{"id": "policy"}]})
        if path.endswith("/health"):
            return self._answer(200, {})
        self._answer(404, {})


class PolicyChatServer(LocalHttpServer):
    """Serves `policy` on 127.0.0.1 (port chosen at run time); `url` ends in /v1."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        super().__init__(_PolicyHandler, path="/v1")


def policy_fixture(policy: Policy) -> Any:
    """A pytest fixture serving `policy` for one test; bind it to the fixture's name."""

    @pytest.fixture
    def serve() -> Iterator[PolicyChatServer]:
        with PolicyChatServer(policy) as server:
            yield server

    return serve
