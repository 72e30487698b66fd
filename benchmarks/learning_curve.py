"""A run's score against wall time, read the same way for every system compared.

- first10 / last10: the mean score over the first and the last 10 steps.
- to_target_s: seconds from the start of training until the mean score of the
  last `WINDOW` steps first reaches `TARGET`. A window, not one step: a step of 64
  samples scores within about +-0.12 of its mean by chance, so one lucky step
  would decide it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

TARGET = 0.5
WINDOW = 10


def seconds_to(seconds: list[float], scores: list[float], target: float = TARGET) -> float | None:
    """When the trailing `WINDOW`-step mean first reached `target` (None: never)."""
    for end in range(WINDOW, len(scores) + 1):
        if statistics.mean(scores[end - WINDOW : end]) >= target:
            return seconds[end - 1]
    return None


@dataclass
class Curve:
    seconds: list[float] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)

    def add(self, second: float, score: float) -> None:
        self.seconds.append(second)
        self.scores.append(score)

    def summary(self) -> dict:
        return {
            "seconds": self.seconds,
            "scores": self.scores,
            "first10": statistics.mean(self.scores[:WINDOW]),
            "last10": statistics.mean(self.scores[-WINDOW:]),
            "to_target_s": seconds_to(self.seconds, self.scores),
        }
