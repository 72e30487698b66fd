"""How the trainer keeps its engine serving the current policy: start it, push weights
into it, restart it when it dies or a push fails. `Trainer` (grpo.py) inherits this and
decides *when*; the bridge (`atroposlib.weight_sync`) does the pushing itself.

A push the engine did not take restarts the engine on the newest weights it can start
on; an export that could not be written (a full disk) restarts nothing, and the next
due step tries again.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from atroposlib.trainer_contract import EventKind, RunRecords
from atroposlib.weight_sync.bridge import ExportFailed, WeightBridge, build_bridge
from atroposlib.weight_sync.errors import WeightSyncError
from example_trainer.config import TrainingConfig
from example_trainer.engine import Engine

logger = logging.getLogger("example_trainer")


def resolve_engine_kind(config: TrainingConfig) -> str:
    """vllm or transformers: what `--inference-engine` (auto included) starts."""
    from atroposlib.inference.launcher import EngineConfig, resolve_engine

    python = config.inference_python or sys.executable
    return resolve_engine(EngineConfig(engine=config.inference_engine, python=python))


class PolicyServing:
    """The engine half of `Trainer` (see the module docstring)."""

    config: TrainingConfig
    records: RunRecords
    engine: Engine | None
    bridge: WeightBridge | None
    model: Any
    tokenizer: Any
    step: int
    committed_step: int
    latest_checkpoint: str

    def start_engine(self) -> None:
        if self.config.inference_engine == "none":
            if not self.config.restarts_engine:
                logger.warning(
                    "--weight-bridge-mode %s with --inference-engine none: there is no engine "
                    "to push weights into; only checkpoints (--save-checkpoint-interval) leave "
                    "this trainer",
                    self.config.weight_bridge_mode,
                )
            return
        kind = resolve_engine_kind(self.config)
        self.bridge = bridge = build_bridge(self.config, kind, self.model)
        if bridge is None:
            self.engine = Engine(self.config, self.records, kind=kind)
            self.engine.start(self.latest_checkpoint, self.step)
            return
        served = bridge.served_name(self.config.served_model_name or self.config.model_name)
        self.engine = Engine(self.config, self.records, bridge.launch_extras(), kind, served)
        self.engine.start(
            bridge.engine_model(self.latest_checkpoint, self.config.model_name), self.step
        )
        if bridge.push_at_start:
            bridge.sync(self.model, self.tokenizer, self.step)

    def newest_servable(self) -> tuple[str, int]:
        """(weights, step): the newest weights an engine can start on."""
        exported = self.bridge.restart_from if self.bridge is not None else None
        if exported is not None and exported[1] > self.committed_step:
            return exported
        return self.latest_checkpoint, self.committed_step

    def ensure_engine(self) -> float:
        """Restart a dead engine on the newest weights it can load; returns seconds spent."""
        if self.engine is None or self.engine.alive():
            return 0.0
        model, step = self.newest_servable()
        logger.error(
            "inference engine died; restarting from %s\n%s", model, self.engine.log_tail(10)
        )
        self.records.event(EventKind.ENGINE_CRASHED, self.step, model=model)
        return self.restart_engine(model, step, "engine died")

    def restart_engine(self, model: str, step: int, reason: str) -> float:
        """Restart on `model`; a hot mode then pushes the current weights if those are older
        (or always, when the engine serves a base under the pushed adapter)."""
        assert self.engine is not None  # its callers restart an engine that was started
        if self.bridge is None:
            return self.engine.restart(model, step, reason)
        model = self.bridge.engine_model(model, self.config.model_name)
        spent = self.engine.restart(model, step, reason)
        self.bridge.engine_restarted()
        if step < self.step or self.bridge.push_at_start:
            try:
                spent += self.bridge.sync(self.model, self.tokenizer, self.step)
            except WeightSyncError as exc:  # the next due push tries again
                logger.error("weight push after the restart failed: %s", exc)
        return spent

    def push_weights(self) -> float:
        """Hot modes: this step's weights into the running engine; seconds spent.

        A push the engine did not take restarts the engine on the newest weights it can
        start on (this step's export, when one was written). An export that could not be
        written (a full disk) restarts nothing: the engine keeps its weights, and the next
        step tries again.
        """
        bridge, engine = self.bridge, self.engine
        # called only with a bridge, and start_engine starts an engine beside every bridge
        assert bridge is not None and engine is not None
        try:
            spent = bridge.sync(self.model, self.tokenizer, self.step)
            engine.forget(bridge.pruned)  # deleted: nothing to fall back to
            return spent
        except ExportFailed as exc:  # a restart would fail to export the same way
            logger.error("weight push at step %d skipped: %s", self.step, exc)
            self.records.event(EventKind.WEIGHT_SYNC_FAILED, self.step, error=str(exc)[:300])
            return 0.0
        except WeightSyncError as exc:
            if not engine.alive():  # it died, and the push found out first
                return self.ensure_engine()
            logger.error(
                "weight push at step %d failed (%s); restarting the engine", self.step, exc
            )
            self.records.event(EventKind.WEIGHT_SYNC_FAILED, self.step, error=str(exc)[:300])
            model, step = self.newest_servable()
            return self.restart_engine(model, step, "weight push failed")
