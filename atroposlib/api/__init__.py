"""The trajectory API. `from atroposlib.api import app` gives the FastAPI application.

The application itself is defined once, lazily, in `atroposlib.api.server` (so that
`uvicorn atroposlib.api.server:app`, upstream's documented target, works too); this
package only forwards to it, so importing helpers such as `atroposlib.api.utils`
builds no server.
"""

from __future__ import annotations

from typing import Any

from atroposlib.api.settings import SETTINGS_ENV

__all__ = ["SETTINGS_ENV", "app"]


def __getattr__(name: str) -> Any:
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from atroposlib.api import server

    return server.app
