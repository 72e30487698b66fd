"""The env side of an engine restart: the trainer stops the inference server and starts it
again from a new checkpoint, which takes minutes for a big model. Requests made meanwhile
wait for it, as long as upstream's would (no limit), and the wait is logged.

The restarted engine is the session's CPU inference server behind a `PortRelay` on a port
of its own: stopped, the port refuses and cuts connections; started again, it first holds
them unanswered, as an engine that has bound its port and is loading, then serves."""

from __future__ import annotations

import asyncio
import logging
import time

import openai
import pytest

from atroposlib.envs.server_handling.server_baseline import OUTAGE_LOGGER
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.launch.console import console_text
from atroposlib.utils.logging import MESSAGE_WIDTH, TEXT_FORMAT, TIME_FORMAT
from atroposlib.utils.ports import free_port
from tests.support.inference_servers import QUESTION, ScriptedServer, server_config
from tests.support.relay import PortRelay
from tests.support.waiting import wait_until_async

LOGGER = "atroposlib.inference"


def messages(caplog, level: int, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.levelno == level and text in r.getMessage()
    ]


def test_requests_wait_for_an_engine_restarted_on_the_same_port(inference_server, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    engine = PortRelay(inference_server.url)
    manager = ServerManager([server_config(engine.url)], health_interval_s=0.2)
    manager.wait_log_interval_s = 0.5

    async def scenario():
        before = await manager.chat_completion(messages=QUESTION, max_tokens=2)
        engine.stop()
        pending = asyncio.create_task(manager.chat_completion(messages=QUESTION, max_tokens=2))
        await wait_until_async(
            lambda: messages(caplog, logging.WARNING, "waiting"),
            30,
            "no WARNING when requests start waiting for the engine",
        )
        await wait_until_async(
            lambda: len(messages(caplog, logging.INFO, "still waiting")) >= 2,
            30,
            "no periodic notes while waiting",
        )
        assert not pending.done(), "the request gave up instead of waiting"
        engine.start(loading=True)
        await wait_until_async(lambda: engine.held(), 30, "nothing reached the loading engine")
        assert not pending.done(), "the request went on before the engine served"
        engine.ready()
        after = await asyncio.wait_for(pending, 60)
        return before, after

    try:
        before, after = asyncio.run(scenario())
    finally:
        engine.stop()
    assert before.choices and after.choices
    assert len(messages(caplog, logging.WARNING, "waiting")) == 1, "one warning per outage"
    assert messages(caplog, logging.INFO, "resum"), "no INFO when requests resume"


def test_no_limit_on_the_wait_by_default_like_upstream():
    manager = ServerManager([server_config("http://127.0.0.1:9")])
    assert manager.unavailable_timeout_s is None


@pytest.mark.integration
def test_an_explicit_limit_gives_up_with_an_error_logged(caplog):
    """A server that never answered: an engine still starting, so no WARNING for it
    (a resumed run's first minute) until the limit gives up with an ERROR."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    dead = server_config(f"http://127.0.0.1:{free_port()}")
    manager = ServerManager([dead], health_interval_s=0.1, unavailable_timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(openai.APIConnectionError):
        asyncio.run(asyncio.wait_for(manager.chat_completion(messages=QUESTION), 30))
    assert time.monotonic() - started >= 0.5
    assert [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]
    # the outage's console lines, as the launcher shows them, fit beside its prefix
    address = dead.base_url.removeprefix("http://").removesuffix("/v1")
    assert f"inference server {address} unreachable" in messages(caplog, logging.DEBUG, "")
    assert messages(caplog, logging.INFO, "unreachable") == []
    assert messages(caplog, logging.WARNING, "") == []
    assert messages(caplog, logging.INFO, "waiting") == [
        "waiting for the inference server to start"
    ]
    shown = [
        console_text(logging.Formatter(TEXT_FORMAT, TIME_FORMAT).format(r))
        for r in caplog.records
        if r.name == LOGGER and logging.INFO <= r.levelno < logging.ERROR
    ]
    assert shown and all(len(line) <= MESSAGE_WIDTH for line in shown), shown


@pytest.mark.integration
def test_servers_without_health_checks_are_retried_not_waited_for():
    """health_check=False (upstream: always assumed healthy): three tries, then the error."""
    dead = server_config(f"http://127.0.0.1:{free_port()}", health_check=False)
    manager = ServerManager([dead])
    manager.servers[0].backoff_s = 0.01
    with pytest.raises(openai.APIConnectionError):
        asyncio.run(asyncio.wait_for(manager.chat_completion(messages=QUESTION), 30))
    assert manager.servers[0].attempts_failed == 3


@pytest.mark.integration
def test_a_server_without_a_health_route_is_probed_through_its_model_list():
    """Hosted OpenAI-compatible APIs have no /health; waiting on one must still end."""
    hosted = ScriptedServer([])
    try:
        manager = ServerManager([server_config(hosted.url.removesuffix("/v1"))])
        assert asyncio.run(manager.servers[0].probe()) is True
    finally:
        hosted.close()


@pytest.mark.integration
def test_waiting_on_a_server_at_the_sdks_default_url_names_that_url(caplog, monkeypatch):
    """base_url None means the OpenAI SDK's default; the outage log once joined the None
    and raised TypeError instead of waiting."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    caplog.set_level(logging.DEBUG, logger=OUTAGE_LOGGER)
    dead = f"http://127.0.0.1:{free_port()}/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", dead)
    sdk_default = server_config("unused", base_url=None)
    manager = ServerManager([sdk_default], health_interval_s=0.1, unavailable_timeout_s=0.3)
    assert asyncio.run(asyncio.wait_for(manager._wait_out_outage(), 30)) is False
    # the console's WARNING is short; the log file's DEBUG line names the servers
    (detail,) = [r.getMessage() for r in caplog.records if r.name == OUTAGE_LOGGER]
    assert f"no inference server reachable ({dead}); requests are waiting" in detail
