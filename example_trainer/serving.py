"""The trainer's engines: which engines it runs and when a new version reaches them.

The policy any trainer needs (start N engines, deliver each version, restart one
that dies or refuses a push, fall back to older weights) is the library's
`atroposlib.inference.fleet.EngineFleet`. This part decides what is the trainer's
own: the engines' settings from `--inference-engine` and its section, which steps
push (`--weight-sync-interval`), and how the weights are exported, gathered from
FSDP's shards when the ranks hold them sharded. Under FSDP every rank calls `push`
(the gather is a collective); rank 0 alone runs the engines.
"""

from __future__ import annotations

import logging
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from atroposlib.inference.engines import EngineKind, resolve_kind
from atroposlib.inference.fleet import EngineFleet
from atroposlib.inference.launcher import EngineConfig
from atroposlib.inference.supervised import SupervisedEngine
from atroposlib.trainer_contract import EventKind, RunRecords, write_engine_recipe
from atroposlib.weight_sync.bridge import (
    BridgeSettings,
    ExportFailed,
    WeightBridge,
    WeightGather,
    WeightWriter,
    build_bridge,
)
from example_trainer.checkpoint import gathered_weights, write_sharded_weights
from example_trainer.config import TrainingConfig
from example_trainer.model import compute_dtype

logger = logging.getLogger("example_trainer")


def engine_log_name(index: int) -> str:
    return "engine.log" if index == 0 else f"engine-{index}.log"


def bridge_settings(config: TrainingConfig) -> BridgeSettings:
    """What the weight bridge reads of the trainer's sections."""
    return BridgeSettings(
        weight_bridge_mode=config.weight_sync.weight_bridge_mode,
        model_name=config.model.model_name,
        served_model_name=config.engine.served_model_name,
        save_path=config.checkpoint.save_path,
        engine_port=config.engine.engine_port,
        weight_sync_timeout_s=config.weight_sync.weight_sync_timeout_s,
        lora_r=config.lora.lora_r,
    )


def engine_config(
    config: TrainingConfig,
    kind: EngineKind,
    index: int,
    extras: tuple[list[str], dict[str, str]] = ([], {}),
    served_name: str | None = None,
) -> EngineConfig:
    """Engine `index` of `--num-engines` (port `--engine-port` + index) as the trainer
    runs it. `extras`: flags and environment the weight bridge needs; `served_name`:
    the name it serves, when not the policy's own (an adapter's base)."""
    args, env = kind.placement(config.engine.device_of(index))
    if config.parallel.num_threads:
        args += kind.thread_flags(config.parallel.num_threads)
    if config.loss.vllm_importance_sampling_correction:  # the behaviour policy's logprobs
        args += ["--logprobs-mode", "processed_logprobs"]
    return EngineConfig(
        engine=kind.name,
        served_model_name=served_name or config.engine.served_model_name or config.model.model_name,
        port=config.engine.engine_port + index,
        python=config.engine.inference_python or sys.executable,
        max_model_len=config.engine.max_model_len or config.batching.seq_len,
        dtype=config.model.dtype,
        gpu_memory_utilization=config.engine.gpu_memory_utilization,
        extra_args=shlex.split(config.engine.engine_args) + args + extras[0],
        env={**env, **extras[1]},
        log_path=str(Path(config.checkpoint.save_path) / engine_log_name(index)),
    )


class PolicyServing:
    """The trainer's part that keeps its engines on the current policy."""

    def __init__(
        self, config: TrainingConfig, records: RunRecords, model: Any, tokenizer: Any, sharded: bool
    ) -> None:
        self.config, self.records = config, records
        self.model, self.tokenizer, self.sharded = model, tokenizer, sharded
        self.fleet: EngineFleet | None = None  # rank 0, once started
        self.bridge: WeightBridge | None = None

    @property
    def engines(self) -> list[SupervisedEngine]:
        return self.fleet.engines if self.fleet is not None else []

    def start(self, model: str, step: int) -> None:
        """Rank 0: the bridge and the engines, on `model` (the weights of `step`)."""
        config = self.config
        if config.engine.inference_engine == "none":
            if not config.weight_sync.restarts_engine:
                logger.warning(
                    "--weight-bridge-mode %s with --inference-engine none: there is no engine "
                    "to push weights into; only checkpoints (--save-checkpoint-interval) leave "
                    "this trainer",
                    config.weight_sync.weight_bridge_mode,
                )
            return
        Path(config.checkpoint.save_path).mkdir(parents=True, exist_ok=True)  # engine logs
        python = config.engine.inference_python or sys.executable
        kind = resolve_kind(config.engine.inference_engine, python)
        route = kind.weight_route()
        self.bridge = build_bridge(
            bridge_settings(config), kind.name, route, self.model, self.weight_gather()
        )
        extras: tuple[list[str], dict[str, str]] = ([], {})
        served = None
        if self.bridge is not None:
            extras = self.bridge.launch_extras()
            served = self.bridge.served_name(
                config.engine.served_model_name or config.model.model_name
            )
        engines = [
            SupervisedEngine(
                engine_config(config, kind, index, extras, served), self.records, index
            )
            for index in range(config.engine.num_engines)
        ]
        # how to serve the policy again, without the bridge's flags (launch/final_eval.py)
        write_engine_recipe(
            config.checkpoint.save_path, engine_config(config, kind, 0).model_dump()
        )
        self.fleet = EngineFleet(engines, self.bridge, self.records, config.model.model_name)
        self.fleet.start(model, step)

    def pushes_at(self, step: int) -> bool:
        """A hot mode's push is due after `step` (the last step saves instead)."""
        config = self.config
        return (
            not config.weight_sync.restarts_engine
            and config.engine.inference_engine != "none"
            and step % config.weight_sync.weight_sync_interval == 0
            and step < config.optim.training_steps
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

    def push(self, step: int) -> float:
        """Hot modes: the weights of `step` into every running engine; seconds spent.

        Under FSDP every rank calls this: the export gathers the shards. The other
        ranks' part ends there; rank 0 writes the export and pushes it.
        """
        started = time.perf_counter()
        if self.bridge is None or self.fleet is None:  # not rank 0: its part is the gather
            gather = self.weight_gather()
            if gather is not None:
                gather()
            return 0.0
        self.fleet.settle()  # its refusals restart before this export replaces them
        try:
            exported = self.bridge.export(self.model, self.tokenizer, step, self.weight_writer())
        except ExportFailed as exc:  # every engine keeps its weights; the next step tries again
            logger.error("weight push at step %d skipped: %s", step, exc)
            self.records.event(EventKind.WEIGHT_SYNC_FAILED, step, error=str(exc)[:300])
            return 0.0
        self.fleet.deliver(exported, step)
        return time.perf_counter() - started

    def ensure(self, step: int) -> float:
        return self.fleet.ensure(step) if self.fleet is not None else 0.0

    def settle(self) -> None:
        if self.fleet is not None:
            self.fleet.settle()

    def committed(self, path: str, step: int) -> None:
        if self.fleet is not None:
            self.fleet.committed(path, step)

    def restart_all(self, path: str, step: int) -> float:
        """The restart modes: every engine on the new checkpoint; seconds spent."""
        return self.fleet.restart_all(path, step, "new weights") if self.fleet is not None else 0.0

    def stop(self) -> None:
        if self.fleet is not None:
            self.fleet.stop()
        elif self.bridge is not None:
            self.bridge.close()
