"""What the API's routes and error handlers share: settings, the run state, its metrics.

The state opens at start-up (the app's lifespan), not when the app is built, so building
an app opens no store. Routes reach the state through `ApiService.state`, which says
plainly when the app has not started.
"""

from __future__ import annotations

import logging

from atroposlib.api.long_poll import Arrivals
from atroposlib.api.metrics import ApiMetrics
from atroposlib.api.settings import APISettings
from atroposlib.api.state import RunState
from atroposlib.api.store import open_store

logger = logging.getLogger("atroposlib.api")


class ApiService:
    """One API's settings, run state and metrics, and the events long polls wait on:
    `arrivals` (a post accepted) and `departures` (a batch served)."""

    def __init__(self, settings: APISettings) -> None:
        self.settings = settings
        self.arrivals = Arrivals()
        self.departures = Arrivals()
        self._state: RunState | None = None
        self.metrics: ApiMetrics | None = None

    @property
    def state(self) -> RunState:
        assert self._state is not None, "the API has not started"
        return self._state

    def start(self) -> None:
        store = open_store(self.settings.state_dir, self.settings.ephemeral)
        self._state = RunState(
            store,
            max_queued_sequences=self.settings.max_queued_sequences,
            idempotency_ttl_s=self.settings.idempotency_ttl_s,
            env_timeout_s=self.settings.env_timeout_s,
        )
        self.metrics = ApiMetrics(self._state)
        where = "memory (ephemeral)" if store.kind == "memory" else self.settings.state_dir
        logger.info("trajectory API store: %s", where)

    def stop(self) -> None:
        if self._state is not None:
            self._state.store.close()

    def reject(self, reason: str) -> None:
        """Count a refused request under `rejected_<reason>` (in /status and /metrics)."""
        self.state.counters[f"rejected_{reason}"] += 1

    def observe(self, path: str, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.latency.labels(path).observe(seconds)
