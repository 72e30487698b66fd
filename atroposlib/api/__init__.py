"""The trajectory API. `from atroposlib.api import app` gives the FastAPI application.

The module-level `app` is built on first access from `$ATROPOS_API_SETTINGS` (JSON of
`APISettings`, used by `run-api --reload`) or the defaults, so importing helpers such
as `atroposlib.api.utils` does not build a server.
"""

from __future__ import annotations

import os
from typing import Any

SETTINGS_ENV = "ATROPOS_API_SETTINGS"
_app = None


def __getattr__(name: str) -> Any:
    global _app
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _app is None:
        from atroposlib.api.server import create_app
        from atroposlib.api.settings import APISettings

        raw = os.environ.get(SETTINGS_ENV)
        _app = create_app(APISettings.model_validate_json(raw) if raw else APISettings())
    return _app
