"""The live status line of a run, read from what the processes already publish.

Sources: the API's `/status` (step, queue) and `/metrics` (groups received,
for groups/s), and the trainer's records (`atroposlib.trainer_contract`): its
metrics rows (recent mean score) and its events (engine restarts). Reading
never raises: a process that is starting or gone just leaves a field blank.
"""

from __future__ import annotations

import re
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from atroposlib.trainer_contract import EventKind, MetricsRow, RecordTail, TrainerEvent

RATE_WINDOW_S = 10.0
GROUPS_RECEIVED = re.compile(r"^atropos_groups_received_total\s+([0-9.eE+-]+)$", re.MULTILINE)


@dataclass
class Snapshot:
    step: int | None = None
    total: int = 0
    queue: int | None = None
    recent_score: float | None = None
    groups_per_s: float | None = None
    engine_restarts: int = 0
    restarts: dict[str, int] = field(default_factory=dict)
    """Restarts after crashes, per process (the trainer's engine included)."""
    new_engine_recoveries: list[int] = field(default_factory=list)
    """Steps at which the trainer restarted its crashed engine since the last read."""

    def line(self) -> str:
        def show(value, fmt: str) -> str:
            return "-" if value is None else format(value, fmt)

        return (
            f"step {show(self.step, 'd')}/{self.total} | queue {show(self.queue, 'd')} groups | "
            f"score(last 10) {show(self.recent_score, '.3f')} | "
            f"{show(self.groups_per_s, '.1f')} groups/s | engine restarts {self.engine_restarts}"
            + (f" | crash restarts: {crashed}" if (crashed := self._crash_restarts()) else "")
        )

    def _crash_restarts(self) -> str:
        return ", ".join(f"{name} {n}" for name, n in self.restarts.items() if n)


class StatusReader:
    def __init__(
        self,
        api_url: str,
        metrics_path: Path,
        events_path: Path,
        total_steps: int,
        key: str | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=api_url, timeout=1.0, headers=headers)
        self.total = total_steps
        # (time, groups received) over the last RATE_WINDOW_S: groups arrive in bursts
        self.counts: deque[tuple[float, float]] = deque()
        self.scores: deque[float] = deque(maxlen=10)
        self.engine_restarts = 0
        self.engine_recoveries = 0
        self.metrics = RecordTail(metrics_path, MetricsRow)  # each file is read once
        self.events = RecordTail(events_path, TrainerEvent)

    def read(self, restarts: dict[str, int]) -> Snapshot:
        """`restarts`: the launcher's restarts per child; the engine's recoveries are added."""
        snap = Snapshot(total=self.total)
        try:
            status = self.http.get("/status").json()
            snap.step, snap.queue = status.get("current_step"), status.get("queue_size")
            found = GROUPS_RECEIVED.search(self.http.get("/metrics").text)
            if found:
                now = time.monotonic()
                self.counts.append((now, float(found.group(1))))
                while now - self.counts[0][0] > RATE_WINDOW_S:
                    self.counts.popleft()
                (first_t, first_n), (last_t, last_n) = self.counts[0], self.counts[-1]
                if last_t > first_t:
                    snap.groups_per_s = (last_n - first_n) / (last_t - first_t)
        except (httpx.HTTPError, ValueError):
            pass
        self.scores.extend(row.score_mean for row in self.metrics.read_new())
        for event in self.events.read_new():
            if event.kind is EventKind.ENGINE_RESTARTED:
                self.engine_restarts += 1
            elif event.kind is EventKind.ENGINE_CRASHED:
                self.engine_recoveries += 1
                snap.new_engine_recoveries.append(event.step)
        snap.engine_restarts = self.engine_restarts
        snap.restarts = dict(restarts)
        if self.engine_recoveries:
            snap.restarts["engine"] = snap.restarts.get("engine", 0) + self.engine_recoveries
        if self.scores:
            snap.recent_score = sum(self.scores) / len(self.scores)
        return snap

    def close(self) -> None:
        self.http.close()
