"""`SupervisedEngine`: one engine process under a restart and fallback policy.

A restart that fails is tried again (`RESTART_ATTEMPTS` in all); when every try
fails, the engine goes back to the last weights it served healthily, so the
environments keep sampling (from a slightly older policy, which the importance
ratio accounts for) and the next restart tries the new weights again. Only when
that fallback fails too does it raise `EngineError`; a trainer has saved its
checkpoint by then, so a resume continues from it. Every start, restart and failed
attempt is a `RunRecords` event, with the engine's index.
"""

from __future__ import annotations

import logging
import time

from atroposlib.inference.launcher import EngineConfig, EngineError, EngineProcess
from atroposlib.trainer_contract import EventKind, RunRecords
from atroposlib.utils.waiting import WaitTimeout, poll_until
from atroposlib.weight_sync.disk_routes import WEIGHT_VERSION_ENVIRONMENT

logger = logging.getLogger("atroposlib.inference")

RESTART_ATTEMPTS = 2
EXIT_GRACE_S = 5.0


class SupervisedEngine:
    """One engine subprocess and the weights it served; see the module docstring."""

    def __init__(self, config: EngineConfig, records: RunRecords, index: int = 0) -> None:
        """`index`: which engine of a fleet this is (its events carry it)."""
        self.index = index
        self.process = EngineProcess(config)
        self.records = records
        self.served: list[tuple[str, int]] = []
        """(model, the step its weights are) for each that came up healthy, oldest first."""

    @property
    def url(self) -> str:
        return self.process.url

    def event(self, kind: EventKind, step: int, **detail: object) -> None:
        self.records.event(kind, step, engine=self.index, **detail)

    @property
    def serving(self) -> str | None:
        """The model the engine last came up healthy on."""
        return self.served[-1][0] if self.served else None

    def _served(self, model: str, step: int) -> None:
        self.served = [(m, s) for m, s in self.served if m != model] + [(model, step)]

    def forget(self, models: list[str]) -> None:
        """Weights that were deleted: no longer something to fall back to."""
        gone = {str(m) for m in models}
        self.served = [(m, s) for m, s in self.served if m not in gone]

    def _label(self, step: int) -> None:
        """The CPU engine labels what it samples with the step its weights come from."""
        self.process.config.env[WEIGHT_VERSION_ENVIRONMENT] = str(step)

    def start(self, model: str, step: int) -> None:
        self.launch(model, step)
        self.wait_started(model, step)

    def launch(self, model: str, step: int) -> None:
        """Start the process without waiting (see `EngineProcess.launch`)."""
        self._label(step)
        self.process.launch(model)

    def wait_started(self, model: str, step: int) -> None:
        self.process.wait_healthy()
        self._served(model, step)
        self.event(EventKind.ENGINE_STARTED, step, model=model)

    def alive(self) -> bool:
        return self.process.alive()

    def died(self) -> bool:
        """Whether a push that just failed met a dead engine. A process killed mid-push
        closes its sockets a moment before it can be reaped, so one that still looks
        alive but does not answer its health check gets `EXIT_GRACE_S` to finish exiting."""
        if not self.alive():
            return True
        if self.process.healthy():
            return False  # it answers: it refused the push
        try:
            poll_until(lambda: not self.alive(), EXIT_GRACE_S, "engine exit", interval_s=0.05)
        except WaitTimeout:
            return False  # alive and silent: restarted as a failed push
        return True

    def log_tail(self, lines: int = 30) -> str:
        return self.process.log_tail(lines)

    def restart(self, model: str, step: int, reason: str) -> float:
        """Restart on `model`, retrying, else on the last healthy other model; seconds spent.

        Raises `EngineError` when neither comes up.
        """
        started = time.perf_counter()
        self._label(step)
        for attempt in range(1, RESTART_ATTEMPTS + 1):
            try:
                self.process.restart(model)
            except EngineError as exc:
                self._failed(model, step, reason, attempt, exc)
                continue
            self._served(model, step)
            spent = time.perf_counter() - started
            self.event(EventKind.ENGINE_RESTARTED, step, reason=reason, model=model, seconds=spent)
            return spent
        fallback, fallback_step = next(
            ((m, s) for m, s in reversed(self.served) if m != model), (None, step)
        )
        if fallback is None:
            raise EngineError(f"the engine did not come up on {model} in {RESTART_ATTEMPTS} tries")
        logger.error(
            "engine %d did not come up on %s; falling back to %s", self.index, model, fallback
        )
        # the old weights keep their own label: staleness counts from them (VER-1)
        self._label(fallback_step)
        try:
            self.process.restart(fallback)
        except EngineError as exc:
            self._failed(fallback, step, f"fallback: {reason}", 1, exc)
            raise EngineError(
                f"the engine did not come up on {model} in {RESTART_ATTEMPTS} tries, "
                f"nor on the previous checkpoint {fallback}"
            ) from exc
        self._served(fallback, fallback_step)
        self.event(
            EventKind.ENGINE_RESTARTED,
            step,
            reason=f"fallback: {reason}",
            model=fallback,
            weights_step=fallback_step,
        )
        return time.perf_counter() - started

    def _failed(self, model: str, step: int, reason: str, attempt: int, exc: Exception) -> None:
        logger.warning(
            "engine %d restart on %s failed (try %d): %s", self.index, model, attempt, exc
        )
        self.event(
            EventKind.ENGINE_RESTART_FAILED,
            step,
            reason=reason,
            model=model,
            attempt=attempt,
            error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
        )

    def stop(self) -> None:
        self.process.stop()
