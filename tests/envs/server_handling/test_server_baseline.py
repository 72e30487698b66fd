"""Client behaviour against a scripted OpenAI-compatible HTTP server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest

from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.server_baseline import APIServerConfig

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


@pytest.fixture
def scripted():
    servers: list[ScriptedServer] = []

    def make(script: list[int], delay_s: float = 0.0) -> ScriptedServer:
        servers.append(ScriptedServer(script, delay_s))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def client(url: str, **overrides) -> OpenAIServer:
    server = OpenAIServer(APIServerConfig(base_url=url, model_name="m", timeout=10, **overrides))
    server.backoff_s = 0.01
    return server


def test_retries_5xx_then_succeeds(scripted):
    fake = scripted([503, 500])
    answer = asyncio.run(
        client(fake.url).chat_completion(messages=[{"role": "user", "content": "hi"}])
    )
    assert answer.choices[0].message.content == "ok" and fake.requests == 3


def test_gives_up_after_max_attempts_and_never_retries_4xx(scripted):
    failing = scripted([503, 503, 503, 503])
    with pytest.raises(openai.InternalServerError):
        asyncio.run(client(failing.url).chat_completion(messages=[]))
    assert failing.requests == 3
    bad = scripted([400])
    with pytest.raises(openai.BadRequestError):
        asyncio.run(client(bad.url).chat_completion(messages=[]))
    assert bad.requests == 1


def test_train_and_eval_have_separate_limits(scripted):
    fake = scripted([], delay_s=0.2)
    server = client(fake.url, num_max_requests_at_once=3, num_requests_for_eval=1)

    async def burst(split: str) -> int:
        fake.max_in_flight = 0
        await asyncio.gather(*(server.chat_completion(messages=[], split=split) for _ in range(4)))
        return fake.max_in_flight

    async def both() -> tuple[int, int]:
        return await burst("eval"), await burst("train")

    assert asyncio.run(both()) == (1, 3)


def test_servers_that_ignore_n_get_n_requests(scripted):
    fake = scripted([])
    answer = asyncio.run(
        client(fake.url, n_kwarg_is_ignored=True).chat_completion(messages=[], n=3)
    )
    assert fake.requests == 3 and [c.index for c in answer.choices] == [0, 1, 2]
