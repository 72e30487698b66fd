"""The env's thinking settings reach the inference server's requests (upstream's ReasoningConfig).

A real HTTP server on 127.0.0.1 stands in for an OpenAI-compatible provider and records
each request body, so the test sees exactly what went over the wire.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("transformers")

from atroposlib.envs.base import APIServerConfig, BaseEnvConfig  # noqa: E402
from tests.envs.arith_env import ArithEnv  # noqa: E402

CHAT_ANSWER = {
    "id": "chat-1",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}
    ],
}


class RecordingHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - the http.server name
        length = int(self.headers.get("Content-Length") or 0)
        self.server.bodies.append(json.loads(self.rfile.read(length)))
        self._answer(CHAT_ANSWER)

    def do_GET(self) -> None:  # noqa: N802
        self._answer({})

    def _answer(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def provider() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), RecordingHandler)
    server.bodies = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(10)


def request_body(provider, tiny_model_path, **settings: Any) -> dict[str, Any]:
    config = BaseEnvConfig(tokenizer_name=str(tiny_model_path), use_wandb=False, **settings)
    host, port = provider.server_address
    servers = APIServerConfig(
        base_url=f"http://{host}:{port}/v1", model_name="m", server_type="openai"
    )
    env = ArithEnv(config, servers)
    before = len(provider.bodies)
    chat = asyncio.run(
        env.server.chat_completion(messages=[{"role": "user", "content": "2+2?"}], max_tokens=4)
    )
    assert chat.choices[0].message.content == "4"
    assert len(provider.bodies) == before + 1
    return provider.bodies[-1]


def reasoning_of(body: dict[str, Any]) -> dict[str, Any]:
    """The reasoning settings in a request, in either wire shape a server may use."""
    nested = body.get("reasoning")
    if isinstance(nested, dict):
        return {k: v for k, v in nested.items() if k != "enabled"}
    found = {}
    if "reasoning_effort" in body:
        found["effort"] = body["reasoning_effort"]
    if "max_reasoning_tokens" in body:
        found["max_tokens"] = body["max_reasoning_tokens"]
    return found


def test_reasoning_effort_reaches_the_request(provider, tiny_model_path):
    body = request_body(provider, tiny_model_path, reasoning_effort="high")
    assert reasoning_of(body) == {"effort": "high"}, body


def test_max_reasoning_tokens_alone_turns_thinking_on(provider, tiny_model_path):
    body = request_body(provider, tiny_model_path, max_reasoning_tokens=2048)
    assert reasoning_of(body) == {"max_tokens": 2048}, body


def test_no_thinking_settings_leave_the_request_alone(provider, tiny_model_path):
    body = request_body(provider, tiny_model_path)
    assert reasoning_of(body) == {} and "reasoning" not in body, body
