"""The trajectory API served in-process, for tests of its logic rather than its process.

`create_app` behind Starlette's `TestClient` (an `httpx.Client` over the ASGI app, with
the lifespan run, so the real SQLite store opens under `state_dir`). No socket, no
subprocess: such a test is unit tier. Tests of what only a process shows (kill -9,
uvicorn's own limits, auth over the wire, a real full disk) use `ApiProcess` instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from atroposlib.api.server import create_app
from atroposlib.api.settings import APISettings


@contextmanager
def inprocess_api(state_dir: Path, **settings: Any) -> Iterator[TestClient]:
    """A client of a fresh API on `state_dir` with `settings` (APISettings fields)."""
    app = create_app(APISettings(state_dir=str(state_dir), **settings))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client
