"""Client behaviour against a scripted OpenAI-compatible HTTP server on 127.0.0.1."""

from __future__ import annotations

import asyncio

import openai
import pytest

from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.utils.ports import free_port
from tests.support.inference_servers import ScriptedServer

pytestmark = pytest.mark.integration


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


def test_a_server_going_down_is_one_short_console_line(caplog):
    """The launcher prints an env's warnings as `NAME | WARNING LOGGER: MESSAGE`; with the
    whole URL the "down" line wrapped past 80 columns when an engine restart outlasted a
    probe (the fresh-clone run of 2637dc6)."""
    server = client(f"http://127.0.0.1:{free_port()}/v1")  # nothing listens there
    server.server_healthy = True
    with caplog.at_level("INFO", logger="atroposlib.inference"):
        assert asyncio.run(server.probe()) is False
    down = [r for r in caplog.records if r.levelname == "WARNING"]
    assert [r.getMessage() for r in down] == [f"inference server {server.address} down"]
    console = f"arith_env | WARNING {down[0].name}: {down[0].getMessage()}"
    assert len(console) <= 80, console
