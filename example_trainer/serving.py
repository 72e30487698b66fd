"""How the trainer keeps its engines serving the current policy: start them, push weights
into them, restart one when it dies or a push fails. `Trainer` (grpo.py) inherits this
and decides *when*; the bridge (`atroposlib.weight_sync`) does the pushing itself.

Design decisions:
- `--num-engines N` runs N engines on consecutive ports. Each version is exported
  once and pushed to all of them at once, one thread per engine, so a sync costs
  the slowest push, bounded by `--weight-sync-timeout-s`. Every engine therefore
  serves the same version after a sync, or is restarted on it before the next step.
- A push an engine did not take restarts that engine alone, on the newest weights
  it can start on (this step's export, when one was written); the others serve
  meanwhile. An export that could not be written (a full disk) restarts nothing,
  and the next due step tries again.
- Engines are started and restarted from the main thread only: an engine gets
  SIGTERM when the thread that spawned it ends (`EngineProcess.launch`). Several
  start at once (all launched, then each waited for); restarts go one engine at a
  time, so in the restart modes the others serve while one restarts.
- A push from an export on disk (`WeightBridge.pushes_from_export`) is delivered in
  the background: the trainer writes the export and goes on to its next step while
  the engines load it (each waits for its round in flight first, tens of
  milliseconds on a CPU). The push is settled, its refusals restarted from the main
  thread, before the next push, a checkpoint or a restart, so at most one is in
  flight. A push from memory (shared_vllm) waits: the next step changes that memory.
- A restarted engine is never re-exported to: it starts on the newest export or
  checkpoint, and an adapter (vLLM LoRA) or shared-memory engine gets the newest
  export or memory pushed (`WeightBridge.repush`). So a restart needs rank 0
  alone, even when FSDP shards the weights; only the export gathers them.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from atroposlib.trainer_contract import EventKind, RunRecords
from atroposlib.weight_sync.bridge import (
    ExportFailed,
    WeightBridge,
    WeightGather,
    WeightWriter,
    build_bridge,
)
from atroposlib.weight_sync.errors import WeightSyncError
from example_trainer.checkpoint import gathered_weights, write_sharded_weights
from example_trainer.config import TrainingConfig
from example_trainer.engine import Engine
from example_trainer.model import compute_dtype

logger = logging.getLogger("example_trainer")

T = TypeVar("T")


def resolve_engine_kind(config: TrainingConfig) -> str:
    """vllm or transformers: what `--inference-engine` (auto included) starts."""
    from atroposlib.inference.launcher import EngineConfig, resolve_engine

    python = config.inference_python or sys.executable
    return resolve_engine(EngineConfig(engine=config.inference_engine, python=python))


def each_engine(engines: list[Engine], work: Callable[[Engine], T]) -> list[T]:
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


class PolicyServing:
    """The engine half of `Trainer` (see the module docstring)."""

    in_flight: PushInFlight | None = None
    _delivery: ThreadPoolExecutor | None = None

    config: TrainingConfig
    records: RunRecords
    engines: list[Engine]
    bridge: WeightBridge | None
    model: Any
    tokenizer: Any
    step: int
    committed_step: int
    latest_checkpoint: str
    sharded: bool  # FSDP: each rank holds shards of the weights

    def pushes_weights(self) -> bool:
        """A hot mode's push is due after this step (the last step saves instead)."""
        config = self.config
        return (
            not config.restarts_engine
            and config.inference_engine != "none"
            and self.step % config.weight_sync_interval == 0
            and self.step < config.training_steps
        )

    def weight_gather(self) -> WeightGather | None:
        """FSDP: the whole weights on rank 0, a collective (None: they are whole already).
        Every rank calls it exactly once per push: rank 0 inside the bridge's export."""
        return (lambda: gathered_weights(self.model)) if self.sharded else None

    def weight_writer(self) -> WeightWriter | None:
        """FSDP: rank 0 writes the gathered weights (None: the bridge's default writer)."""
        if not self.sharded:
            return None
        dtype = compute_dtype(self.config)
        return lambda staging, adapter_only: write_sharded_weights(
            self.model, self.tokenizer, staging, adapter_only, dtype
        )

    def start_engines(self) -> None:
        config = self.config
        if config.inference_engine == "none":
            if not config.restarts_engine:
                logger.warning(
                    "--weight-bridge-mode %s with --inference-engine none: there is no engine "
                    "to push weights into; only checkpoints (--save-checkpoint-interval) leave "
                    "this trainer",
                    config.weight_bridge_mode,
                )
            return
        kind = resolve_engine_kind(config)
        self.bridge = bridge = build_bridge(config, kind, self.model, self.weight_gather())
        extras: tuple[list[str], dict[str, str]] = ([], {})
        served, model = None, self.latest_checkpoint
        if bridge is not None:
            extras = bridge.launch_extras()
            served = bridge.served_name(config.served_model_name or config.model_name)
            model = bridge.engine_model(model, config.model_name)
        self.engines = [
            Engine(config, self.records, extras, kind, served, index)
            for index in range(config.num_engines)
        ]
        for engine in self.engines:
            engine.launch(model, self.step)
        for engine in self.engines:
            engine.wait_started(model, self.step)

    def newest_servable(self) -> tuple[str, int]:
        """(weights, step): the newest weights an engine can start on."""
        exported = self.bridge.restart_from if self.bridge is not None else None
        if exported is not None and exported[1] > self.committed_step:
            return exported
        return self.latest_checkpoint, self.committed_step

    def ensure_engines(self) -> float:
        """Restart dead engines on the newest weights they can load; seconds spent. While
        a push is in flight it is left alone: the push finds a dead engine first."""
        if self.in_flight is not None and not self.in_flight.refusals.done():
            return 0.0
        self.settle_push()
        return sum(self._revive(engine) for engine in self.engines if not engine.alive())

    def _revive(self, engine: Engine) -> float:
        model, step = self.newest_servable()
        logger.error(
            "inference engine died (engine %d); restarting from %s\n%s",
            engine.index,
            model,
            engine.log_tail(10),
        )
        engine.event(EventKind.ENGINE_CRASHED, self.step, model=model)
        return self.restart_engine(engine, model, step, "engine died")

    def restart_engine(self, engine: Engine, model: str, step: int, reason: str) -> float:
        """Restart `engine` on `model`; seconds spent. A bridge that serves from an adapter
        or from shared memory then pushes its newest weights (`WeightBridge.repush`)."""
        if self.bridge is None:
            return engine.restart(model, step, reason)
        model = self.bridge.engine_model(model, self.config.model_name)
        spent = engine.restart(model, step, reason)
        self.bridge.engine_restarted()
        try:
            spent += self.bridge.repush(engine.url)
        except WeightSyncError as exc:  # the next due push tries again
            logger.error("weight push to engine %d after its restart failed: %s", engine.index, exc)
        return spent

    def push_weights(self) -> float:
        """Hot modes: this step's weights into every running engine; seconds spent.

        Under FSDP every rank calls this: the export gathers the shards. The other
        ranks' part ends there; rank 0 writes the export and pushes it.
        """
        started = time.perf_counter()
        bridge = self.bridge
        if bridge is None:  # not rank 0: its part is the gather (rank 0's is in the export)
            gather = self.weight_gather()
            if gather is not None:
                gather()
            return 0.0
        self.settle_push()  # the previous step's: one push in flight at most
        step = self.step
        try:
            exported = bridge.export(self.model, self.tokenizer, step, self.weight_writer())
        except ExportFailed as exc:  # every engine keeps its weights; the next step tries again
            logger.error("weight push at step %d skipped: %s", step, exc)
            self.records.event(EventKind.WEIGHT_SYNC_FAILED, step, error=str(exc)[:300])
            return 0.0

        def deliver() -> list[WeightSyncError | None]:
            return each_engine(self.engines, lambda engine: self._push_to(engine, exported, step))

        if bridge.pushes_from_export:
            if self._delivery is None:
                self._delivery = ThreadPoolExecutor(1, thread_name_prefix="weight-push")
            self.in_flight = PushInFlight(step, self._delivery.submit(deliver))
        else:
            self._settle(step, deliver())
        return time.perf_counter() - started

    def settle_push(self) -> None:
        """Wait for the push in flight, if any, then restart the engines that refused it
        (from this, the main thread)."""
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
        for engine in self.engines:
            engine.forget(self.bridge.pruned)  # deleted: nothing to fall back to

    def _push_to(self, engine: Engine, exported: Path | None, step: int) -> WeightSyncError | None:
        """One engine's push (in its own thread): the error, if it did not take it."""
        assert self.bridge is not None  # called from push_weights only
        try:
            self.bridge.push(exported, step, engine.url)
        except WeightSyncError as exc:
            return exc
        return None

    def _replace_refused(self, engine: Engine, error: WeightSyncError, step: int) -> float:
        """An engine that did not take the push of `step` restarts on the newest weights."""
        if engine.died():  # it died, and the push found out first
            return self._revive(engine)
        logger.error(
            "weight push to engine %d at step %d failed (%s); restarting it",
            engine.index,
            step,
            error,
        )
        engine.event(EventKind.WEIGHT_SYNC_FAILED, step, error=str(error)[:300])
        model, servable_step = self.newest_servable()
        return self.restart_engine(engine, model, servable_step, "weight push failed")

    def stop_engines(self) -> None:
        """The run is over: a push still in flight is let finish, its refusals ignored."""
        if self.in_flight is not None:
            with contextlib.suppress(Exception):
                self.in_flight.refusals.result()
            self.in_flight = None
        if self._delivery is not None:
            self._delivery.shutdown()
            self._delivery = None
        for engine in self.engines:
            engine.stop()
