"""What a loop that retries for ever says while the other side does not answer.

Neither silent (a wait looks like a hang) nor one line per try (the log fills with
the same line): the first failure is logged at once, then again after 10 s, 30 s,
1, 2 and 5 minutes, and every 10 minutes after that, each time with how long it has
lasted and how many tries failed; the first success after a logged failure says how
long the outage was. One `RetryNotes` per call site (a URL and a path), so a call
that keeps working does not hide the outage of another.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

NOTE_AFTER_S = (0.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Seconds into an outage at which it is logged; then every `NOTE_EVERY_S`."""
NOTE_EVERY_S = 600.0


def _span(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


class RetryNotes:
    """Logs the failures of one retried call at a slowing pace, and its recovery."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.what = what  # e.g. "POST /scored_data to the trajectory API at http://..."
        self.clock = clock
        self.failures = 0
        self._since: float | None = None
        self._next_note = 0

    def failed(self, why: str, advice: str) -> None:
        """One try failed because of `why`; `advice` says what to check (both one line)."""
        now = self.clock()
        if self._since is None:
            self._since, self._next_note = now, 0
        self.failures += 1
        lasted = now - self._since
        if lasted < self._note_at(self._next_note):
            return
        while lasted >= self._note_at(self._next_note + 1):
            self._next_note += 1  # a long wait between tries skips the notes it spans
        self._next_note += 1
        if self.failures == 1:
            self.logger.warning("%s failed (%s); %s. Retrying", self.what, why, advice)
        else:
            self.logger.warning(
                "%s still fails after %s and %d tries (%s); %s. Retrying",
                self.what,
                _span(lasted),
                self.failures,
                why,
                advice,
            )

    def answered(self) -> None:
        """The call went through: an outage that was logged ends with one line."""
        if self._since is not None and self._next_note > 0:
            self.logger.info(
                "%s answered after %s and %d failed tries",
                self.what,
                _span(self.clock() - self._since),
                self.failures,
            )
        self.failures, self._since, self._next_note = 0, None, 0

    @staticmethod
    def _note_at(index: int) -> float:
        if index < len(NOTE_AFTER_S):
            return NOTE_AFTER_S[index]
        return NOTE_AFTER_S[-1] + NOTE_EVERY_S * (index - len(NOTE_AFTER_S) + 1)
