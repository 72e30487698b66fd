"""The ManagedServer proxy served inside an environment's own event loop.

For an environment that hosts its proxy instead of needing an `atropos-proxy` process
beside it (`environments/agent_mod_arithmetic.py`). The proxy always has a key here,
made at start, that never leaves the process (PRX-1 of the security review): this
process reaches its sessions by call (`IN_PROCESS_PROXIES`), its agents by their
sessions' own keys, and another local process or a web page reaches nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Iterator
from typing import Any

from atroposlib.envs.server_handling.proxy_client import IN_PROCESS_PROXIES
from atroposlib.envs.server_handling.proxy_sessions import SessionLimits, SessionTable
from atroposlib.utils.listen import KEEP_ALIVE_S

logger = logging.getLogger("atroposlib.proxy")

REAPER_INTERVAL_S = 5.0
"""Longest time between two sweeps for idle sessions (shorter with a short timeout)."""


async def reap_idle_sessions(sessions: SessionTable) -> None:
    """Drop idle sessions every few seconds (also done on every create and lookup)."""
    while True:
        await asyncio.sleep(min(REAPER_INTERVAL_S, sessions.limits.idle_timeout_s / 4))
        if expired := sessions.expire():
            logger.info("dropped %d idle sessions", len(expired))


async def serve_in_process(
    server_manager: Any,
    tokenizer: Any,
    model_name: str = "unknown",
    limits: SessionLimits | None = None,
) -> tuple[str, asyncio.Task]:
    """The proxy served on this event loop, on a free loopback port: its URL, and the
    task that serves it (cancel it to stop). For an environment that hosts its own
    proxy instead of needing an `atropos-proxy` process beside it. SIGINT and SIGTERM
    stay with the caller's handlers.

    Its key is made here and never leaves the process: this process reaches its own
    sessions by call (`IN_PROCESS_PROXIES`), its agents by their sessions' keys, and
    another local process, or a web page, reaches nothing (PRX-1 of the review)."""
    import uvicorn

    from atroposlib.utils.ports import free_port
    from atroposlib.utils.waiting import poll_until_async

    class LeavesSignalsAlone(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    port = free_port()
    from atroposlib.envs.server_handling.managed_server_proxy import create_app

    app = create_app(server_manager, tokenizer, model_name, limits, secrets.token_urlsafe(32))
    # no lifespan: the caller's loop ends by cancelling this task, which a lifespan
    # reports as a traceback; the idle-session reaper runs as a task of its own
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_config=None,
        log_level="warning",  # its "Uvicorn running on ..." is noise in an env's console
        access_log=False,
        lifespan="off",
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    server = LeavesSignalsAlone(config)
    loop = asyncio.get_running_loop()
    task = loop.create_task(server.serve())
    reaper = loop.create_task(reap_idle_sessions(app.state.proxy.sessions))
    task.add_done_callback(lambda _: reaper.cancel())
    await poll_until_async(lambda: server.started or task.done(), 30, "the proxy did not start")
    if task.done():
        task.result()  # raises what stopped it
        raise RuntimeError("the in-process proxy stopped before it started")
    url = f"http://127.0.0.1:{port}"
    # this process's own sessions skip the HTTP round trip (proxy_client's docstring)
    IN_PROCESS_PROXIES[url] = app.state.proxy
    task.add_done_callback(lambda _: IN_PROCESS_PROXIES.pop(url, None))
    return url, task
