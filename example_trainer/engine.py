"""The trainer's inference engine: started on the base model, restarted from checkpoints.

A restart that fails is tried again (`RESTART_ATTEMPTS` in all); when every try
fails, the engine goes back to the last checkpoint it served healthily, so the
environments keep sampling (from a slightly older policy, which the importance
ratio accounts for) and the next restart interval tries the new weights again.
Only when that fallback fails too does the run stop with `EngineError`; the
checkpoint is saved by then, so `--resume` continues from it. Every start,
restart and failed attempt is a `RunRecords` event.
"""

from __future__ import annotations

import logging
import shlex
import sys
import time
from pathlib import Path

from atroposlib.trainer_contract import EventKind, RunRecords
from atroposlib.utils.waiting import WaitTimeout, poll_until
from atroposlib.weight_sync.disk_routes import WEIGHT_VERSION_ENVIRONMENT
from example_trainer.config import TrainingConfig

logger = logging.getLogger("example_trainer")

RESTART_ATTEMPTS = 2
EXIT_GRACE_S = 5.0


def engine_log_name(index: int) -> str:
    return "engine.log" if index == 0 else f"engine-{index}.log"


def engine_placement(kind: str, device: str) -> tuple[list[str], dict[str, str]]:
    """Flags and environment that put an engine on `device` (--engine-device): the CPU
    engine takes --device; vLLM sees only that GPU (CUDA_VISIBLE_DEVICES)."""
    if device == "auto":
        return [], {}
    if kind == "transformers":
        return ["--device", device], {}
    if device.startswith("cuda:"):
        return [], {"CUDA_VISIBLE_DEVICES": device.removeprefix("cuda:")}
    return [], {}


class Engine:
    """One engine subprocess and the checkpoints it served; see the module docstring."""

    def __init__(
        self,
        config: TrainingConfig,
        records: RunRecords,
        extras: tuple[list[str], dict[str, str]] = ([], {}),
        kind: str | None = None,
        served_name: str | None = None,
        index: int = 0,
    ) -> None:
        """`extras`: flags and environment a hot weight bridge needs the engine to have;
        `kind`: vllm or transformers, when already resolved from `--inference-engine`;
        `served_name`: the name the engine serves, when not the policy's own;
        `index`: which of `--num-engines` this is (its port is `--vllm-port` + index)."""
        from atroposlib.inference.launcher import EngineConfig, EngineProcess

        kind = kind or config.inference_engine
        args, env = engine_placement(kind, config.engine_device_of(index))
        if config.num_threads and kind == "transformers":
            args += ["--num-threads", str(config.num_threads)]
        if config.vllm_importance_sampling_correction:  # the behaviour policy's logprobs
            args += ["--logprobs-mode", "processed_logprobs"]
        self.index = index
        self.process = EngineProcess(
            EngineConfig(
                engine=kind,
                served_model_name=served_name or config.served_model_name or config.model_name,
                port=config.vllm_port + index,
                python=config.inference_python or sys.executable,
                max_model_len=config.max_model_len or config.seq_len,
                dtype=config.dtype,
                gpu_memory_utilization=config.vllm_gpu_memory_utilization,
                extra_args=shlex.split(config.engine_args) + args + extras[0],
                env={**env, **extras[1]},
                log_path=str(Path(config.save_path) / engine_log_name(index)),
            )
        )
        Path(config.save_path).mkdir(parents=True, exist_ok=True)
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

    def forget(self, models: list[Path]) -> None:
        """Checkpoints that were deleted: no longer something to fall back to."""
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
        alive but does not answer /health gets `EXIT_GRACE_S` to finish exiting."""
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
        from atroposlib.inference.launcher import EngineError

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
