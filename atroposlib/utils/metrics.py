"""Summary statistics of a list of measurements, written into a wandb-style metrics dict.

The dict is updated in place (and returned) so that callers can collect several
series into the one dict they log. The values are numpy scalars, as upstream's
(wandb takes them); `plain_numbers` turns them into Python numbers where a dict is
printed or written as JSON, so a log reads `0.5`, not `np.float64(0.5)`.
`RecentRate` is a running count's rate over a recent window, not since the start.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["RecentRate", "get_std_min_max_avg", "plain_numbers"]


def plain_numbers(value: Any) -> Any:
    """`value` with numpy scalars and arrays, at any depth of dicts, lists and tuples,
    as Python numbers and lists (tuples become lists, as JSON writes them)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {key: plain_numbers(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain_numbers(item) for item in value]
    return value


def get_std_min_max_avg(name: str, data: Sequence[float] | np.ndarray, metrics_dict: dict) -> dict:
    """Add ``{name}_mean``, ``{name}_std`` (population), ``{name}_max`` and ``{name}_min``.

    Returns ``metrics_dict``; raises ValueError on empty ``data``.
    """
    values = np.asarray(data)
    if values.size == 0:
        raise ValueError(f"get_std_min_max_avg: no data for metric {name!r}")
    metrics_dict[f"{name}_mean"] = np.mean(values)
    metrics_dict[f"{name}_std"] = np.std(values)
    metrics_dict[f"{name}_max"] = np.max(values)
    metrics_dict[f"{name}_min"] = np.min(values)
    return metrics_dict


class RecentRate:
    """How fast a running count grew over about the last `window_s` seconds.

    A rate since the start keeps a slow start (a wait for the trainer) in it for the
    whole run; this one forgets it once it is a window behind. Samples older than the
    window are dropped but for the newest of them, the anchor, so samples further
    apart than the window (a slow step) still give a rate. A count or clock that goes
    back (a service that restarted without its state) starts the samples over. Until
    the samples span `min_span_s` there is no rate: a burst at the start (a backlog of
    rollouts finishing together) is no pace.
    """

    def __init__(self, window_s: float, min_span_s: float = 0.0) -> None:
        self.window_s = window_s
        self.min_span_s = min_span_s
        self.samples: deque[tuple[float, float]] = deque()

    def add(self, now: float, count: float) -> float | None:
        """Record `count` at `now` (seconds); the rate per second since the anchor, or
        None until the samples span `min_span_s` (and two are apart in time)."""
        if self.samples and (now < self.samples[-1][0] or count < self.samples[-1][1]):
            self.samples.clear()
        self.samples.append((now, count))
        while len(self.samples) > 1 and now - self.samples[1][0] >= self.window_s:
            self.samples.popleft()
        (first_t, first_n), (last_t, last_n) = self.samples[0], self.samples[-1]
        span = last_t - first_t
        return (last_n - first_n) / span if span > 0 and span >= self.min_span_s else None
