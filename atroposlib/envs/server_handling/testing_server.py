"""The earlier name of the `testing=True` server, kept for code that imports it.

`ServerHarness` (server_harness.py, upstream's name and API) is the server
`ServerManager(testing=True)` uses; `TestingServer` is the same class.
"""

from __future__ import annotations

from atroposlib.envs.server_handling.server_harness import (
    CANNED_TEXT,
    CANNED_TOKENS,
    ServerHarness,
)

TestingServer = ServerHarness

__all__ = ["CANNED_TEXT", "CANNED_TOKENS", "ServerHarness", "TestingServer"]
