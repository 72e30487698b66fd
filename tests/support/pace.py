"""Deadlines from a run's own pace, for tests that kill, stop or outlast a training run.

A fixed deadline is either too short on a busy machine (the restart-mode fault run hit
its 300 s once other tests ran beside it) or so long that a hung run wastes the suite's
time. `Pace` instead measures the run while it runs, from the trainer's metrics rows
(`time` is when each step ended):
- `startup_s`: from the launch to its first step (every process started, one step);
- `step_s`: how long one step takes (the slower of the median interval between
  consecutive steps and the mean of the last few, so a run that slows down is seen);
- `restart_s`: how long a restart takes, up to the first step after it (the longest
  one seen since a `killed()`, and never less than `startup_s`).

A wait for `steps` more steps and `restarts` restarts is then allowed `SLACK` times what
those cost at the measured pace, so it passes on a machine that runs several times
slower than when the pace was measured, and fails, saying how far the run got, when it
stalls. The one fixed allowance is for the first step: before it nothing is measured.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

FIRST_STEP_S = 600.0
"""A launch gets this long for its first step (about 30 s on a quiet 2-core machine):
nothing about the run is measured before it."""
SLACK = 5.0
"""How many times slower than measured a run may go before a wait fails: other tests
starting beside it, or a CPU hog, on a 2-core machine."""
RECENT = 5  # the last intervals whose mean can raise `step_s` above the median


class Pace:
    """The pace of the trainer that writes `metrics_path`, measured from `started`."""

    def __init__(self, metrics_path: Path, started: float | None = None) -> None:
        self.metrics_path = metrics_path
        self.started = time.time() if started is None else started
        self.kills: list[float] = []
        self.rows: list[tuple[int, float]] = []  # (step, time) of every complete row
        self._read_as: tuple[int, int] | None = None

    def killed(self) -> None:
        """A process of the run was just killed or stopped: a restart follows."""
        self.kills.append(time.time())

    def read(self) -> None:
        try:
            stat = self.metrics_path.stat()
        except FileNotFoundError:
            return
        if (stat.st_size, stat.st_mtime_ns) == self._read_as:
            return  # unchanged since the last poll: waits poll often
        self._read_as = (stat.st_size, stat.st_mtime_ns)
        rows = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line, still being written
            if row.get("time") is not None:
                rows.append((row["step"], float(row["time"])))
        self.rows = rows

    @property
    def step(self) -> int:
        """The step of the newest row: where the trainer running now is."""
        return self.rows[-1][0] if self.rows else 0

    @property
    def startup_s(self) -> float | None:
        return self.rows[0][1] - self.started if self.rows else None

    def _intervals(self) -> list[float]:
        """Seconds a step took, between rows of one trainer (no kill between them)."""
        found = []
        for (step0, t0), (step1, t1) in zip(self.rows, self.rows[1:], strict=False):
            if step1 > step0 and not any(t0 <= k < t1 for k in self.kills):
                found.append((t1 - t0) / (step1 - step0))
        return found

    @property
    def step_s(self) -> float | None:
        intervals = self._intervals()
        if not intervals:
            return self.startup_s  # no step measured alone yet: as long as the start
        return max(statistics.median(intervals), statistics.fmean(intervals[-RECENT:]))

    @property
    def restart_s(self) -> float | None:
        if self.startup_s is None:
            return None
        seen = [
            next(t for _, t in self.rows if t > kill) - kill
            for kill in self.kills
            if any(t > kill for _, t in self.rows)
        ]
        return max([self.startup_s, *seen])

    def allowance(self, steps: int = 0, restarts: int = 0, plus_s: float = 0.0) -> float:
        """Seconds allowed for `steps` steps and `restarts` restarts at the pace measured,
        and `plus_s` (a wait the test itself sets, such as a client's timeout)."""
        self.read()
        if self.startup_s is None:
            return FIRST_STEP_S + plus_s
        assert self.step_s is not None and self.restart_s is not None
        paced = SLACK * (restarts * self.restart_s + steps * self.step_s)
        return max(self.startup_s, paced) + plus_s

    def describe(self) -> str:
        if self.startup_s is None:
            return f"no step in {time.time() - self.started:.0f} s since the launch"
        return (
            f"newest step {self.step} ({len(self.rows)} rows, {len(self.kills)} kills); "
            f"the run's pace: first step {self.startup_s:.1f} s after the launch, "
            f"{self.step_s:.2f} s a step, restarts up to {self.restart_s:.1f} s"
        )

    def wait(
        self,
        predicate: Callable[[], T],
        what: str,
        steps: int = 0,
        restarts: int = 0,
        poll_s: float = 0.05,
        plus_s: float = 0.0,
    ) -> T:
        """Poll `predicate` until truthy; fail once `allowance(steps, restarts)` (measured
        afresh at each poll, so the first step's measure applies at once) has passed."""
        begun = time.time()
        while True:
            value = predicate()
            if value:
                return value
            allowed = self.allowance(steps, restarts, plus_s)
            if time.time() - begun > allowed:
                value = predicate()  # once more at the deadline
                if value:
                    return value
                raise AssertionError(
                    f"{what}: waited {time.time() - begun:.0f} s, allowed {allowed:.0f} s "
                    f"for {steps} steps and {restarts} restarts; {self.describe()}"
                )
            time.sleep(poll_s)


class CountPace(Pace):
    """The pace of a count the test reads itself (groups received, say): each unit is a
    step, timed when a poll first sees it."""

    def __init__(self, count: Callable[[], int]) -> None:
        super().__init__(Path("/nonexistent"))
        self.count = count

    def read(self) -> None:
        now, seen = time.time(), self.count()
        if seen > (self.rows[-1][0] if self.rows else 0):
            self.rows.append((seen, now))
