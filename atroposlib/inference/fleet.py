"""`EngineFleet`: the engines one trainer keeps serving its current policy, for any
trainer. It starts them, delivers each new version into them through a weight bridge
(`atroposlib.weight_sync`), and restarts one when it dies or refuses a push; the
trainer decides only *when* (which step pushes, which checkpoints).

Design decisions:
- N engines run on consecutive ports. Each version is exported once and pushed to
  all of them at once, one thread per engine, so a sync costs the slowest push,
  bounded by the bridge's timeout. Every engine therefore serves the same version
  after a sync, or is restarted on it before the next step.
- A push an engine did not take restarts that engine alone, on the newest weights
  it can start on (this step's export, when one was written); the others serve
  meanwhile. An export that could not be written (a full disk) restarts nothing,
  and the next due step tries again.
- Engines are started and restarted from the caller's thread only: an engine gets
  SIGTERM when the thread that spawned it ends (`EngineProcess.launch`). Several
  start at once (all launched, then each waited for); restarts go one engine at a
  time, so in the restart modes the others serve while one restarts.
- A push from an export on disk (`WeightBridge.pushes_from_export`) is delivered in
  the background: the trainer goes on to its next step while the engines load it.
  It is settled, its refusals restarted from the caller's thread, before the next
  push, a checkpoint or a restart, so at most one is in flight. A push from memory
  (shared_vllm) waits: the next step changes that memory.
- A restarted engine is never re-exported to: it starts on the newest export or
  checkpoint, and an adapter (vLLM LoRA) or shared-memory engine gets the newest
  export or memory pushed (`WeightBridge.repush`). So a restart needs one process
  alone, even when FSDP shards the weights; only the export gathers them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from atroposlib.inference.supervised import SupervisedEngine
from atroposlib.trainer_contract import EventKind, RunRecords
from atroposlib.weight_sync.bridge import WeightBridge
from atroposlib.weight_sync.errors import WeightSyncError

logger = logging.getLogger("atroposlib.inference")

T = TypeVar("T")


def each_engine(engines: list[SupervisedEngine], work: Callable[[SupervisedEngine], T]) -> list[T]:
    """`work` on every engine at once, one thread each: for HTTP calls, whose waits then
    overlap. Never to start a process (see the module docstring). Raises the first
    engine's exception, after all finish."""
    if len(engines) == 1:
        return [work(engines[0])]
    with ThreadPoolExecutor(len(engines), thread_name_prefix="engine") as pool:
        return list(pool.map(work, engines))


@dataclass
class PushInFlight:
    """A push delivered in the background: its step, and per engine its refusal."""

    step: int
    refusals: Future[list[WeightSyncError | None]]


class EngineFleet:
    """The trainer's engines and the bridge that feeds them; see the module docstring."""

    def __init__(
        self,
        engines: list[SupervisedEngine],
        bridge: WeightBridge | None,
        records: RunRecords,
        base_model: str,
    ) -> None:
        """`base_model`: what an engine that serves adapters starts from (its base)."""
        self.engines = engines
        self.bridge = bridge
        self.records = records
        self.base_model = base_model
        self.checkpoint: tuple[str, int] = (base_model, 0)
        """The newest checkpoint (model, step): what a restart loads unless an export
        is newer."""
        self.in_flight: PushInFlight | None = None
        self._delivery: ThreadPoolExecutor | None = None

    def _engine_model(self, model: str) -> str:
        return model if self.bridge is None else self.bridge.engine_model(model, self.base_model)

    # -------------------------------------------------------------- lifecycle
    def start(self, model: str, step: int) -> None:
        """Start every engine on `model` (the weights of `step`), all at once."""
        self.checkpoint = (model, step)
        model = self._engine_model(model)
        for engine in self.engines:
            engine.launch(model, step)
        for engine in self.engines:
            engine.wait_started(model, step)

    def committed(self, model: str, step: int) -> None:
        """A checkpoint was written: what a restart loads from now on."""
        self.checkpoint = (model, step)

    def forget(self, removed: list[str]) -> None:
        """Checkpoints or exports that were deleted: nothing to fall back to."""
        for engine in self.engines:
            engine.forget(removed)

    @property
    def serving(self) -> list[str | None]:
        return [engine.serving for engine in self.engines]

    def stop(self) -> None:
        """The run is over: a push still in flight is let finish, its refusals ignored."""
        if self.in_flight is not None:
            with contextlib.suppress(Exception):
                self.in_flight.refusals.result()
            self.in_flight = None
        if self._delivery is not None:
            self._delivery.shutdown()
            self._delivery = None
        if self.bridge is not None:
            self.bridge.close()
        for engine in self.engines:
            engine.stop()

    # -------------------------------------------------------------- restarts
    def newest_servable(self) -> tuple[str, int]:
        """(weights, step): the newest weights an engine can start on."""
        exported = self.bridge.restart_from if self.bridge is not None else None
        if exported is not None and exported[1] > self.checkpoint[1]:
            return exported
        return self.checkpoint

    def ensure(self, step: int) -> float:
        """Restart dead engines on the newest weights they can load; seconds spent. While
        a push is in flight it is left alone: the push finds a dead engine first."""
        if self.in_flight is not None and not self.in_flight.refusals.done():
            return 0.0
        self.settle()
        return sum(self._revive(engine, step) for engine in self.engines if not engine.alive())

    def restart_all(self, model: str, step: int, reason: str) -> float:
        """Every engine on `model`, one after another, so the others serve meanwhile."""
        return sum(self.restart(engine, model, step, reason) for engine in self.engines)

    def restart(self, engine: SupervisedEngine, model: str, step: int, reason: str) -> float:
        """Restart `engine` on `model`; seconds spent. A bridge that serves from an adapter
        or from shared memory then pushes its newest weights (`WeightBridge.repush`)."""
        if self.bridge is None:
            return engine.restart(model, step, reason)
        spent = engine.restart(self._engine_model(model), step, reason)
        self.bridge.engine_restarted()
        try:
            spent += self.bridge.repush(engine.url)
        except WeightSyncError as exc:  # the next due push tries again
            logger.error("weight push to engine %d after its restart failed: %s", engine.index, exc)
        return spent

    def _revive(self, engine: SupervisedEngine, step: int) -> float:
        model, servable_step = self.newest_servable()
        logger.error(
            "inference engine died (engine %d); restarting from %s\n%s",
            engine.index,
            model,
            engine.log_tail(10),
        )
        engine.event(EventKind.ENGINE_CRASHED, step, model=model)
        return self.restart(engine, model, servable_step, "engine died")

    # -------------------------------------------------------------- pushes
    def deliver(self, exported: Path | None, step: int) -> None:
        """Push the export of `step` (None: the bridge pushes from memory) into every
        engine: in the background when it is on disk, else now."""
        self.settle()  # the previous step's: one push in flight at most
        bridge = self.bridge
        assert bridge is not None  # only a hot mode delivers

        def push_all() -> list[WeightSyncError | None]:
            return each_engine(self.engines, lambda engine: self._push_to(engine, exported, step))

        if bridge.pushes_from_export:
            if self._delivery is None:
                self._delivery = ThreadPoolExecutor(1, thread_name_prefix="weight-push")
            self.in_flight = PushInFlight(step, self._delivery.submit(push_all))
        else:
            self._settle(step, push_all())

    def settle(self) -> None:
        """Wait for the push in flight, if any, then restart the engines that refused it
        (from the caller's thread)."""
        if self.in_flight is None:
            return
        pushed, self.in_flight = self.in_flight, None
        self._settle(pushed.step, pushed.refusals.result())

    def _settle(self, step: int, refusals: list[WeightSyncError | None]) -> None:
        assert self.bridge is not None  # only a bridge pushes
        for engine, error in zip(self.engines, refusals, strict=True):
            if error is not None:
                self._replace_refused(engine, error, step)
        self.bridge.pushed()
        self.forget([str(path) for path in self.bridge.pruned])

    def _push_to(
        self, engine: SupervisedEngine, exported: Path | None, step: int
    ) -> WeightSyncError | None:
        """One engine's push (in its own thread): the error, if it did not take it."""
        assert self.bridge is not None  # called from deliver only
        try:
            self.bridge.push(exported, step, engine.url)
        except WeightSyncError as exc:
            return exc
        return None

    def _replace_refused(
        self, engine: SupervisedEngine, error: WeightSyncError, step: int
    ) -> float:
        """An engine that did not take the push of `step` restarts on the newest weights."""
        if engine.died():  # it died, and the push found out first
            return self._revive(engine, step)
        logger.error(
            "weight push to engine %d at step %d failed (%s); restarting it",
            engine.index,
            step,
            error,
        )
        engine.event(EventKind.WEIGHT_SYNC_FAILED, step, error=str(error)[:300])
        model, servable_step = self.newest_servable()
        return self.restart(engine, model, servable_step, "weight push failed")
