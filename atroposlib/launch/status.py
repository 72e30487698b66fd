"""The live status line of a run, read from what the processes already publish.

Sources: the API's `/status` (step, queue) and `/metrics` (groups received,
for groups/s), and the trainer's metrics jsonl (recent mean score). Reading
never raises: a process that is starting or gone just leaves a field blank.
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import httpx

RATE_WINDOW_S = 10.0
GROUPS_RECEIVED = re.compile(r"^atropos_groups_received_total\s+([0-9.eE+-]+)$", re.MULTILINE)


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written
    return rows


@dataclass
class Snapshot:
    step: int | None = None
    total: int = 0
    queue: int | None = None
    recent_score: float | None = None
    groups_per_s: float | None = None
    engine_restarts: int = 0
    env_restarts: int = 0

    def line(self) -> str:
        def show(value, fmt: str) -> str:
            return "-" if value is None else format(value, fmt)

        return (
            f"step {show(self.step, 'd')}/{self.total} | queue {show(self.queue, 'd')} groups | "
            f"score(last 10) {show(self.recent_score, '.3f')} | "
            f"{show(self.groups_per_s, '.1f')} groups/s | engine restarts {self.engine_restarts}"
            + (f" | env restarts {self.env_restarts}" if self.env_restarts else "")
        )


class StatusReader:
    def __init__(self, api_url: str, metrics_path: Path, total_steps: int) -> None:
        self.http = httpx.Client(base_url=api_url, timeout=1.0)
        self.metrics_path = metrics_path
        self.total = total_steps
        # (time, groups received) over the last RATE_WINDOW_S: groups arrive in bursts
        self.counts: deque[tuple[float, float]] = deque()
        self.scores: deque[float] = deque(maxlen=10)
        self.metrics_offset = 0  # the metrics file is read once, a line at a time

    def read(self, engine_restarts: int, env_restarts: int) -> Snapshot:
        snap = Snapshot(total=self.total, engine_restarts=engine_restarts)
        snap.env_restarts = env_restarts
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
        self._read_new_scores()
        if self.scores:
            snap.recent_score = sum(self.scores) / len(self.scores)
        return snap

    def _read_new_scores(self) -> None:
        if not self.metrics_path.exists():
            return
        with open(self.metrics_path, "rb") as metrics:
            metrics.seek(self.metrics_offset)
            for line in metrics:
                if not line.endswith(b"\n"):
                    break  # being written; read it next time
                self.metrics_offset += len(line)
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if "score_mean" in row:
                    self.scores.append(row["score_mean"])

    def close(self) -> None:
        self.http.close()
