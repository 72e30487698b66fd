"""One process-wide `httpx.Client` (and one `httpx.AsyncClient` per event loop) for
short calls that are made again and again.

`httpx.get()` builds and drops a client per call, and building one (its SSL context,
even for plain http) costs about 50 ms of CPU: a health poll every 0.2 s spent a
quarter of a core on that alone, and a weight push per step paid it each time. The
client is thread-safe and keeps loopback connections alive between calls.
"""

from __future__ import annotations

import asyncio
import functools
import weakref

import httpx

_ASYNC_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
    weakref.WeakKeyDictionary()
)


@functools.cache
def shared_http_client() -> httpx.Client:
    return httpx.Client()


def shared_async_http_client() -> httpx.AsyncClient:
    """The running event loop's own AsyncClient (an AsyncClient belongs to one loop):
    a proxy session's three calls per rollout built three clients, 0.15 s of CPU."""
    loop = asyncio.get_running_loop()
    client = _ASYNC_CLIENTS.get(loop)
    if client is None or client.is_closed:
        client = _ASYNC_CLIENTS[loop] = httpx.AsyncClient()
    return client
