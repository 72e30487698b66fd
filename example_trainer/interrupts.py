"""SIGINT and SIGTERM stop the trainer between steps, never inside one.

A step runs `optimizer.step()`, publishes the weights, moves the scheduler, and only
then counts itself and writes its records. An interrupt inside that window used to
raise at once, and the final checkpoint was labelled with the previous step while it
held this step's weights and optimizer state: on resume the API served this step's
batch again, and it was trained twice (the review's RUN-2). The launcher's own stop
sends exactly that SIGINT. SIGTERM, which a scheduler sends before preempting a job,
had no handler at all, so no final checkpoint was written.

Inside a step the signal is remembered and raised as KeyboardInterrupt when the step
has finished; outside one (waiting for a batch, say) it is raised at once, because
the state is then consistent.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

logger = logging.getLogger("atroposlib.trainer")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StepInterrupts:
    """Holds SIGINT and SIGTERM back while a step runs (`with guard.step(): ...`)."""

    def __init__(self) -> None:
        self.inside = False
        self.pending: int | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        """Takes over SIGINT and SIGTERM (main thread only; elsewhere it does nothing)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for number in STOP_SIGNALS:
            self._previous[number] = signal.signal(number, self._on_signal)

    def uninstall(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _on_signal(self, number: int, frame: FrameType | None) -> None:
        if not self.inside:
            raise KeyboardInterrupt
        if self.pending is None:
            logger.info("%s received: stopping when this step ends", signal.Signals(number).name)
        self.pending = number

    @contextmanager
    def step(self) -> Iterator[None]:
        """A step that an interrupt cannot cut in two; the interrupt is raised after it."""
        self.inside = True
        try:
            yield
        finally:
            self.inside = False
        if self.pending is not None:
            raise KeyboardInterrupt
