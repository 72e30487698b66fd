"""The env's thinking settings reach the inference server's requests in upstream's wire shape.

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

from atroposlib.envs.base import APIServerConfig, BaseEnvConfig
from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.server_baseline import ReasoningConfig
from tests.support.arith_env import ArithEnv

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
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.server.bodies.append(json.loads(self.rfile.read(length)))
        self._answer(CHAT_ANSWER)

    def do_GET(self) -> None:
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


def request_body(provider, tiny_model_path, call: str = "chat", **settings: Any) -> dict[str, Any]:
    config = BaseEnvConfig(tokenizer_name=str(tiny_model_path), use_wandb=False, **settings)
    host, port = provider.server_address
    servers = APIServerConfig(
        base_url=f"http://{host}:{port}/v1", model_name="m", server_type="openai"
    )
    env = ArithEnv(config, servers)
    before = len(provider.bodies)
    messages = [{"role": "user", "content": "2+2?"}]
    if call == "skip":
        asyncio.run(
            env.server.chat_completion(messages=messages, max_tokens=4, skip_reasoning=True)
        )
    else:
        chat = asyncio.run(env.server.chat_completion(messages=messages, max_tokens=4))
        assert chat.choices[0].message.content == "4"
    assert len(provider.bodies) == before + 1
    return provider.bodies[-1]


def test_reasoning_effort_reaches_the_request(provider, tiny_model_path):
    body = request_body(provider, tiny_model_path, reasoning_effort="high")
    assert body["reasoning"] == {"enabled": True, "effort": "high"}, body
    assert "reasoning_effort" not in body and body["max_tokens"] == 4


def test_max_reasoning_tokens_alone_turns_thinking_on(provider, tiny_model_path):
    body = request_body(provider, tiny_model_path, max_reasoning_tokens=2048)
    assert body["reasoning"] == {"enabled": True, "max_tokens": 2048}, body


def test_thinking_mode_alone_enables_reasoning(provider, tiny_model_path):
    body = request_body(provider, tiny_model_path, thinking_mode=True)
    assert body["reasoning"] == {"enabled": True}, body


def test_skip_reasoning_sends_the_call_without_it(provider, tiny_model_path):
    body = request_body(provider, tiny_model_path, "skip", reasoning_effort="low")
    assert "reasoning" not in body and "skip_reasoning" not in body, body


def test_no_thinking_settings_leave_the_request_alone(provider, tiny_model_path):
    body = request_body(provider, tiny_model_path)
    assert "reasoning" not in body and "reasoning_effort" not in body, body


@pytest.mark.parametrize("base_url", [None, "", "https://api.openai.com/v1"])
def test_official_openai_gets_reasoning_effort_and_max_completion_tokens(base_url, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    config = APIServerConfig(base_url=base_url, model_name="o4-mini", api_key="sk-test")
    server = OpenAIServer(config, ReasoningConfig(effort="low"))
    sent = server._inject_reasoning_kwargs({"messages": [], "max_tokens": 64, "temperature": 0.2})
    assert sent == {
        "messages": [],
        "max_completion_tokens": 64,
        "temperature": 1.0,
        "extra_body": {"reasoning_effort": "low"},
    }


def test_reasoning_config_is_upstreams():
    assert ReasoningConfig(max_tokens=5000).enabled and not ReasoningConfig().enabled
    assert ReasoningConfig().build_extra_body("http://x/v1") is None
    assert ReasoningConfig(enabled=True).build_extra_body("https://api.openai.com/v1") == {
        "reasoning_effort": "medium"
    }
    both = ReasoningConfig(effort="minimal", max_tokens=9000)
    assert both.build_extra_body("http://x") == {
        "reasoning": {"enabled": True, "effort": "minimal"}
    }
    assert both.build_extra_body("http://x", use_max_tokens=True) == {
        "reasoning": {
            "enabled": True,
            "max_tokens": ReasoningConfig.EFFORT_TO_MAX_TOKENS["minimal"],
        }
    }
    with pytest.raises(ValueError, match="reasoning_effort"):
        ReasoningConfig(effort="extreme")
    env = BaseEnvConfig(
        use_wandb=False, thinking_mode=True, max_reasoning_tokens=4096, custom_thinking_prompt="p"
    )
    assert ReasoningConfig.from_env_config(env) == ReasoningConfig(
        enabled=True, effort=None, max_tokens=4096, custom_prompt="p"
    )
    assert not ReasoningConfig.from_env_config(object()).enabled
