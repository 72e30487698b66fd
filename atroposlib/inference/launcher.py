"""Start, health-check, restart and stop an inference engine subprocess.

Used by the trainer's engine fleet (restart from each checkpoint) and the launcher.
The engine is any registered kind (`atroposlib.inference.engines`: vLLM's OpenAI
server, our `atropos-inference-server`), which builds its own command.

Orphans are prevented by `atroposlib.utils.processes` (own session, SIGTERM
when the parent dies, group stop with SIGKILL escalation), and `EngineProcess`
is a context manager, so Ctrl-C in the parent stops it on the way out.
"""

from __future__ import annotations

import logging
import os
import secrets
import shlex
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel, Field, field_validator

from atroposlib.inference.engines import EngineKind, EngineName, engine_kind, resolve_kind
from atroposlib.utils.exposure import engine_args_problem
from atroposlib.utils.logging import MESSAGE_WIDTH, shorten
from atroposlib.utils.ports import port_in_use
from atroposlib.utils.processes import log_tail, spawn, stop_group
from atroposlib.utils.waiting import WaitTimeout, answers_200, poll_until

PORT_FREE_TIMEOUT_S = 30.0

logger = logging.getLogger("atroposlib.inference")
COMMAND_LOGGER = "atroposlib.inference.command"
command_logger = logging.getLogger(COMMAND_LOGGER)
"""An engine's whole command, at DEBUG: some 280 characters, on every (re)start."""


DEFAULT_SERVED_NAME = "default"


class EngineError(RuntimeError):
    """The engine failed to start or died; the message quotes its last log lines."""


class EngineConfig(BaseModel):
    engine: EngineName = Field(
        "auto",
        description="A registered engine kind (cpu, vllm; transformers is cpu), or auto: "
        "vllm when CUDA and vllm are available to the engine's python, else cpu.",
    )
    served_model_name: str = Field(DEFAULT_SERVED_NAME, description="Name clients send as 'model'.")
    host: str = Field("127.0.0.1", description="Address the engine binds.")
    port: int = Field(9001, ge=1, le=65535, description="Port the engine listens on.")
    python: str = Field(sys.executable, description="Python executable that runs the engine.")
    max_model_len: int | None = Field(None, description="Longest prompt + completion.")
    dtype: str | None = Field(None, description="Weights dtype passed to the engine.")
    gpu_memory_utilization: float | None = Field(None, description="vLLM's GPU memory share.")
    extra_args: list[str] = Field(default_factory=list, description="More engine flags.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
    health_timeout_s: float = Field(600.0, description="How long to wait for /health.")
    stop_grace_s: float = Field(10.0, description="SIGTERM to SIGKILL delay when stopping.")
    log_path: str | None = Field(None, description="Engine log file (default: a temp file).")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @field_validator("extra_args")
    @classmethod
    def _loopback_and_no_key_in_argv(cls, args: list[str]) -> list[str]:
        problem = engine_args_problem(args)
        if problem:
            raise ValueError(problem)
        return args


def resolve_engine(config: EngineConfig) -> EngineKind:
    return resolve_kind(config.engine, config.python)


def engine_command(config: EngineConfig, kind: EngineKind | str, model_path: str) -> list[str]:
    """The command that serves `model_path` with the engine `kind` (or its name)."""
    return (engine_kind(kind) if isinstance(kind, str) else kind).command(config, model_path)


def with_fresh_seed(command: list[str]) -> list[str]:
    """`command` with a seed of its own unless it names one: both engines otherwise seed
    their sampling stream alike at every start (vLLM with 0), so a restart replays it and
    two engines of one run draw the same samples (RNG-1 of the trainer review). The
    seed is in the command, which the engine's log starts with."""
    if any(arg == "--seed" or arg.startswith("--seed=") for arg in command):
        return command
    return [*command, "--seed", str(secrets.randbits(31))]


def start_line(engine: str, port: int, model_path: str, served: str | None = None) -> str:
    """The console's line for an engine start: its kind, port and model, a local one (a
    checkpoint) by its directory's name after the name it is served as (`tiny
    (step-120)`; a built tiny model, whose directory is its cache key, by that name
    alone), cut to fit beside the launcher's prefix. The whole command is in the
    engine's log file and at DEBUG on `COMMAND_LOGGER`."""
    from atroposlib.utils.tiny_model import read_build_record

    local = Path(model_path).is_absolute() or os.path.exists(model_path)  # else a hub id
    model = Path(model_path).name if local else model_path
    if local and served and served not in (model, DEFAULT_SERVED_NAME):
        built = read_build_record(model_path) is not None
        model = served if built else f"{served} ({model})"
    head = f"starting {engine} engine on port {port}: "
    return head + shorten(model, MESSAGE_WIDTH - len(head))


class EngineProcess:
    """One engine subprocess; `start`, `restart(new_checkpoint)`, `stop`."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.kind = resolve_engine(config)
        self.engine = self.kind.name
        self.proc: subprocess.Popen | None = None
        self.model_path: str | None = None
        self.restarts = 0
        self.log_path = Path(config.log_path) if config.log_path else None

    @property
    def url(self) -> str:
        return self.config.url

    def start(self, model_path: str | os.PathLike[str]) -> None:
        """Launch the engine on `model_path` and wait until it is healthy."""
        self.launch(model_path)
        self.wait_healthy()

    def launch(self, model_path: str | os.PathLike[str]) -> None:
        """Launch without waiting: start several, then wait for each (`wait_healthy`).
        Call it from a thread that outlives the engine: the engine gets SIGTERM when the
        thread that started it ends (PR_SET_PDEATHSIG is per thread)."""
        if self.alive():
            raise EngineError("engine already running; use restart()")
        self.model_path = str(model_path)
        if self.log_path is None:
            import tempfile

            fd, name = tempfile.mkstemp(prefix="atropos-engine-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        command = with_fresh_seed(self.kind.command(self.config, self.model_path))
        self._wait_port_free()
        served = self.config.served_model_name
        logger.info("%s", start_line(self.engine, self.config.port, self.model_path, served))
        whole = shlex.join(command)
        command_logger.debug("engine command: %s", whole)
        env = {**self.kind.launch_env(), **os.environ, **self.config.env}
        with open(self.log_path, "ab") as log:
            log.write(f"$ {whole}\n".encode())  # the engine's log starts with its command
            log.flush()
            self.proc = spawn(command, log, env)

    def wait_healthy(self) -> None:
        def up() -> bool:
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise EngineError(
                    f"{self.engine} engine exited with code {code} before it was "
                    f"healthy; last log lines:\n{self.log_tail()}"
                )
            return self.healthy()

        try:
            poll_until(up, self.config.health_timeout_s, f"{self.engine} engine not healthy")
        except WaitTimeout as exc:
            self.stop()
            raise EngineError(f"{exc}; last log lines:\n{self.log_tail()}") from None

    def healthy(self) -> bool:
        return answers_200(f"{self.url}{self.kind.health_path}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _wait_port_free(self) -> None:
        """An engine left by a crashed owner may still hold the port while it stops; a new
        one started meanwhile would fail to bind, or its health check would reach the old."""
        port = self.config.port
        try:
            poll_until(lambda: not port_in_use(port), PORT_FREE_TIMEOUT_S, f"port {port} busy")
        except WaitTimeout as exc:
            raise EngineError(f"{exc}: another process serves on it") from None

    def check(self) -> None:
        """Raise `EngineError` with the log tail if the engine has died."""
        if self.proc is not None and not self.alive():
            raise EngineError(
                f"{self.engine} engine died with code {self.proc.returncode}; "
                f"last log lines:\n{self.log_tail()}"
            )

    def restart(self, model_path: str | os.PathLike[str] | None = None) -> None:
        """Stop and start again, from `model_path` (a new checkpoint) or the same weights."""
        path = model_path or self.model_path
        if path is None:
            raise EngineError("restart() needs a model path: the engine was never started")
        self.stop()
        self.restarts += 1
        self.start(path)

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, self.config.stop_grace_s)
            self.proc = None

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
