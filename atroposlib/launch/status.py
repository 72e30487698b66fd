"""The live status line of a run, read from what the processes already publish.

Sources: the API's `/status` (step, queue) and `/metrics` (groups received,
for groups/s), and the trainer's records (`atroposlib.trainer_contract`): its
metrics rows (recent mean score) and its events (engine restarts). Reading
never raises: a process that is starting or gone just leaves a field blank.

The line fits the console's width (80 columns on a plain terminal): where every field
does not fit, the least useful go first (`Snapshot.line`). The ETA is the steps left at
the pace since the step first moved (`StepClock`), so a run's start-up is no part of it.
"""

from __future__ import annotations

import re
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from atroposlib.trainer_contract import EventKind, MetricsRow, RecordTail, TrainerEvent
from atroposlib.utils.metrics import RecentRate

RATE_WINDOW_S = 10.0
STATUS_WIDTH = 80
SEPARATOR = " | "
CRASHES_EACH_MAX = 30  # "api 1, arith_env 1, engine 1"; a longer list shows its total
GROUPS_RECEIVED = re.compile(r"^atropos_groups_received_total\s+([0-9.eE+-]+)$", re.MULTILINE)


def duration(seconds: float) -> str:
    """45s, 3m05s, 2h07m: short enough for the status line."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


@dataclass
class StepClock:
    """Seconds left to `total` steps at the pace since the step first moved.

    Timed from the first change it sees, not from the run's start, so the start-up
    (an engine loading, a resume) does not slow the estimate; a step that goes back
    (an API that lost its state) starts the timing over.
    """

    since: tuple[float, int] | None = None
    last_step: int | None = None

    def eta_s(self, step: int | None, total: int, now: float) -> float | None:
        if step is None:
            return None
        previous, self.last_step = self.last_step, step
        if previous is not None and step < previous:
            self.since = None
        if step >= total:
            return 0.0
        if self.since is None:
            if previous is not None and step > previous:
                self.since = (now, step)
            return None
        started, first = self.since
        if step == first or now <= started:
            return None
        return (total - step) * (now - started) / (step - first)


@dataclass
class Snapshot:
    step: int | None = None
    total: int = 0
    queue: int | None = None
    recent_score: float | None = None
    groups_per_s: float | None = None
    eta_s: float | None = None
    engine_restarts: int = 0
    restarts: dict[str, int] = field(default_factory=dict)
    """Restarts after crashes, per process (the trainer's engine included)."""
    new_engine_recoveries: list[int] = field(default_factory=list)
    """Steps at which the trainer restarted its crashed engine since the last read."""

    def line(self, width: int = STATUS_WIDTH) -> str:
        """The fields that fit in `width` columns, in their order; where not all fit,
        the engine restarts go first, then the rate, the queue, the crash restarts."""

        def show(value, fmt: str) -> str:
            return "-" if value is None else format(value, fmt)

        crashed = {name: n for name, n in self.restarts.items() if n}
        each = ", ".join(f"{name} {n}" for name, n in crashed.items())
        crashes = (
            f"crash restarts: {each}"
            if len(each) <= CRASHES_EACH_MAX
            else f"crash restarts {sum(crashed.values())}"
        )
        # (field, how long it stays as the line shrinks: higher stays longer)
        fields = [
            (f"step {show(self.step, 'd')}/{self.total}", 7),
            (f"ETA {'--' if self.eta_s is None else duration(self.eta_s)}", 6),
            (f"score {show(self.recent_score, '.3f')}", 5),
            (f"queue {show(self.queue, 'd')}", 3),
            (f"{show(self.groups_per_s, '.1f')} groups/s", 2),
            (f"engine restarts {self.engine_restarts}", 1),
        ]
        if crashed:
            fields.append((crashes, 4))
        while len(fields) > 1 and len(SEPARATOR.join(text for text, _ in fields)) > width:
            fields.remove(min(fields, key=lambda f: f[1]))
        return SEPARATOR.join(text for text, _ in fields)[:width]


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
        # groups received over the last RATE_WINDOW_S: groups arrive in bursts
        self.received = RecentRate(RATE_WINDOW_S)
        self.scores: deque[float] = deque(maxlen=10)
        self.clock = StepClock()
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
                snap.groups_per_s = self.received.add(time.monotonic(), float(found.group(1)))
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
        snap.eta_s = self.clock.eta_s(snap.step, self.total, time.monotonic())
        return snap

    def close(self) -> None:
        self.http.close()
