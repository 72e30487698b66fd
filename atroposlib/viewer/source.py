"""Where the viewer's groups come from: one `/batch` call per request, outcome in words.

Every way a pull can fail (API down, token missing, registration refused, nothing queued
yet) becomes a `Pulled` with a sentence for the page, never an exception in the UI. The
viewer registers lazily, on the first pull, so the page starts even while the API is
still down. It never calls `/reset_data`: looking at a run must not wipe it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atroposlib.datagen.pull import BatchPuller, PullError

KEY_HINT = "set ATROPOS_API_KEY to the key run-api was started with, then restart the viewer"
WAITING = "No batch yet"


@dataclass
class Pulled:
    """One pull: the groups, or None with `kind` ("error"/"waiting") and a message."""

    groups: list[Any] | None
    kind: str
    message: str


def explain(error: PullError, api_url: str) -> str:
    """The page's sentence for a failed call to the API."""
    if error.status is None:
        return f"Cannot reach the trajectory API at {api_url}: is run-api running? ({error})"
    if error.status in (401, 403):
        return f"The API at {api_url} wants a token: {KEY_HINT}. ({error})"
    if error.status == 409:
        return (
            f"The API at {api_url} refused this viewer as the run's trainer: {error}. "
            "view-run registers as a trainer; point it at a run-api of its own."
        )
    return f"The API at {api_url} refused the request: {error}"


class GroupSource:
    """Pulls batches for the page through a `BatchPuller`."""

    def __init__(
        self,
        api_url: str,
        batch_size: int,
        max_token_len: int,
        api_key: str | None = None,
    ) -> None:
        self.api_url = api_url
        self.batch_size = batch_size
        self._puller = BatchPuller(
            api_url, batch_size, max_token_len, api_key=api_key, tool="atropos-view-run", retry_s=0
        )
        self._registered = False
        self.batches = 0  # served to this page so far

    def pull(self) -> Pulled:
        """Register if not yet done, then take one batch off the API's queue."""
        try:
            if not self._registered:
                self._puller.register()
                self._registered = True
            batch = self._puller.next_batch()
        except PullError as error:
            return Pulled(None, "error", explain(error, self.api_url))
        if not batch:
            return Pulled(None, "waiting", self._waiting_message())
        self.batches += 1
        return Pulled(list(batch), "ok", "")

    def _waiting_message(self) -> str:
        """What the page waits for: the environments, which start once a trainer (this
        page, on its first press) asks for a batch, with the API's count when it has one."""
        needed = f"a batch needs {self.batch_size} sequences"
        first = "the first batch (they start once the run's trainer, this page, asks for one)"
        which = "the next batch" if self.batches else first
        producing = f"{WAITING}: the environments are still producing {which}."
        try:
            status = self._puller.status()
        except PullError:
            status = {}
        queued = status.get("queued_sequences")
        if queued is None:
            return f"{producing} ({needed}) Press again in a moment."
        groups = status.get("queue_size", 0)
        held = f"The API holds {groups} group(s), {queued} sequence(s)"
        if status.get("batch_blocked"):
            return f"{WAITING}: {held} but cannot form a batch: {status.get('blocked_reason')}"
        hint = (
            " (if the count stays at 0, check that an environment is serving with "
            f"--env.rollout_server_url {self.api_url})"
            if queued == 0
            else ""
        )
        return f"{producing} {held}; {needed}. Press again in a moment{hint}."

    def close(self) -> None:
        self._puller.close()
