"""A vLLM look-alike whose completions come from a Python policy, token ids included.

Library environments sample through `ManagedServer`, which needs a server that returns
token ids (`server_type: vllm`); the tiny model's samples are noise, so an env whose
score depends on what the model writes (a tool call, a game move, a boxed answer)
cannot be checked deterministically against it. This server answers vLLM's
`/v1/completions` the way vLLM does (`token_id:N` tokens with logprobs): it decodes the
prompt ids with the real tokenizer, asks `policy(prompt_text, n)` for n reply texts,
and encodes them back. Policies read the rendered ChatML prompt; `last_turn` pulls
out the latest user or tool turn. Every request is recorded.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.json_http import JsonHandler, LocalHttpServer
from tests.support.token_script_server import completion_body

TextPolicy = Callable[[str, int], list[str]]
TURN = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", re.DOTALL)


def turns(prompt: str) -> list[tuple[str, str]]:
    """(role, text) of each complete ChatML turn of a rendered prompt."""
    return [(role, text) for role, text in TURN.findall(prompt)]


def last_turn(prompt: str, roles: tuple[str, ...] = ("user", "tool")) -> str:
    """The text of the latest turn whose role is in `roles` ('' when none)."""
    found = [text for role, text in turns(prompt) if role in roles]
    return found[-1] if found else ""


class _Handler(JsonHandler):
    def do_POST(self) -> None:
        server: ScriptedModel = self.owner
        body = self.read_json()
        with server.lock:
            server.requests.append(body)
        if not self.path.rstrip("/").endswith("/completions"):
            return self._answer(404, {"error": {"message": f"no route {self.path}"}})
        prompt = body.get("prompt")
        text = prompt if isinstance(prompt, str) else server.tokenizer.decode(prompt)
        n = int(body.get("n") or 1)
        try:
            replies = server.policy(text, n)
        except Exception as exc:  # a policy bug shows up as a 500 the env logs
            return self._answer(500, {"error": {"message": repr(exc)}})
        limit = int(body.get("max_tokens") or 1 << 30)
        encoded = []
        for reply in replies:
            ids = server.tokenizer.encode(reply, add_special_tokens=False)
            if len(ids) < limit:
                encoded.append((ids + [server.tokenizer.eos_token_id], "stop"))
            else:
                encoded.append((ids[:limit], "length"))
        self._answer(200, completion_body(encoded))

    def do_GET(self) -> None:
        path = self.path.rstrip("/")
        if path.endswith("/models"):
            return self._answer(200, {"object": "list", "data": [{"id": "tiny"}]})
        self._answer(200 if path.endswith("/health") else 404, {})


class ScriptedModel(LocalHttpServer):
    """Serves `policy` as a vLLM server on 127.0.0.1; `url` ends in /v1."""

    def __init__(self, policy: TextPolicy, tokenizer_path: Path | str) -> None:
        from transformers import AutoTokenizer

        self.policy = policy
        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path))
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        super().__init__(_Handler, path="/v1")

    def flags(self) -> list[str]:
        """The `--openai.*` flags that point an env at this server."""
        return [
            *("--openai.base_url", self.url, "--openai.model_name", "tiny"),
            *("--openai.server_type", "vllm", "--openai.api_key", "x"),
            *("--openai.timeout", "60"),
        ]


def scripted_model_fixture(policy: TextPolicy) -> Any:
    """A pytest fixture serving `policy` with the tiny tokenizer; bind it to a name."""

    @pytest.fixture
    def serve(tiny_model_path: Path) -> Iterator[ScriptedModel]:
        with ScriptedModel(policy, tiny_model_path) as server:
            yield server

    return serve
