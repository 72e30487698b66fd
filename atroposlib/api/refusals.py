"""What `RunState` raises to refuse a request; `errors.py` maps each to an HTTP answer."""

from __future__ import annotations

from typing import Any


class InvalidGroups(Exception):
    """The posted data breaks a rule; `errors` are in FastAPI's 422 format."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(f"{len(errors)} validation error(s)")
        self.errors = errors


class QueueFull(Exception):
    """Accepting the post would exceed --max-queued-sequences."""


class UnknownEnv(Exception):
    pass


class RunConflict(Exception):
    """A trainer registered that is not the run this state belongs to; says what to do."""


class StepConflict(Exception):
    """A trainer asked `/batch` for a step the API cannot serve; the message says why."""


class StoreWriteError(OSError):
    """The store could not commit (disk full, read-only, I/O error); nothing changed.

    An `OSError`, so callers that guard store writes with `except OSError` still do.
    """
