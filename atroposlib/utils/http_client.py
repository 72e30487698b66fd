"""One process-wide `httpx.Client` for short calls that are made again and again.

`httpx.get()` builds and drops a client per call, and building one (its SSL context,
even for plain http) costs about 50 ms of CPU: a health poll every 0.2 s spent a
quarter of a core on that alone, and a weight push per step paid it each time. The
client is thread-safe and keeps loopback connections alive between calls.
"""

from __future__ import annotations

import functools

import httpx


@functools.cache
def shared_http_client() -> httpx.Client:
    return httpx.Client()
