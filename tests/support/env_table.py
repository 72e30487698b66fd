"""The questions every library environment is asked, as rows of one table per question.

Each env's test module keeps its rows beside its data and policies: `PROCESS` (a
scripted policy's `process` run, scored exactly), `EVALUATE` (an `evaluate` run's
metrics and samples), `SERVE` (`serve` feeding a real run-api) and `OFFLINE` (a check
of the groups its documented offline command writes on the tiny model,
test_offline_commands.py). tests/environments/test_env_table.py asks each question
once, over every module's row (`table`).

The runs are in this process, through `run_cli` with the argv the script would get:
one worker's imports serve every env instead of a Python start per run. The CLI
contract itself (the script runs as a process, as documented) is asked once per env by
test_offline_commands.py. What an in-process run changes for the whole process is put
back afterwards (`in_process`): logging (run_cli configures it), the working directory,
the environment, sys.argv, signal handlers. `serve` runs on the main thread as it does
as a process (an upstream env's math_verify needs signals); the trainer stand-in pulling
its batches, and stopping it after, is a thread.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import importlib.util
import io
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import (
    AbstractContextManager,
    ExitStack,
    contextmanager,
    nullcontext,
    redirect_stderr,
    redirect_stdout,
)
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import httpx
import pytest

from atroposlib.envs.cli import run_cli
from atroposlib.envs.reporting import METRICS_LOGGER
from atroposlib.envs.runtime import STATE_LOGGER
from atroposlib.envs.server_handling.server_baseline import OUTAGE_LOGGER
from tests.support.compat_runs import ENVS, read_jsonl, register_trainer
from tests.support.policy_server import Policy, PolicyChatServer
from tests.support.scripted_model import ScriptedModel, TextPolicy
from tests.support.waiting import wait_until

ROW_MODULES = [
    "tests.environments.test_agent_mod_arithmetic",
    "tests.environments.test_code_execution_server",
    "tests.environments.test_gsm8k_server",
    "tests.environments.test_gym_blackjack",
    "tests.environments.test_gym_taxi",
    "tests.environments.test_instruction_following",
    "tests.environments.test_letter_counting_environment",
    "tests.environments.test_math_server",
    "tests.environments.test_mcqa_thinking_env",
    "tests.environments.test_multimodal_counting",
    "tests.environments.test_rlaif_server",
    "tests.environments.test_structured_output",
    "tests.environments.test_text_reversal_environment",
    "tests.environments.test_tool_calling_server",
    "tests.environments.test_tool_use_multiturn_server",
    "tests.compat.test_managed_chat_env",
    "tests.compat.test_gymnasium_env",
]

CONFIGURED_LOGGERS = ("httpx", "httpx2", METRICS_LOGGER, OUTAGE_LOGGER, STATE_LOGGER)
"""Loggers whose level `run_cli` sets (configure_logging, keep_debug_in_files), whether
or not they existed before it ran."""

# ------------------------------------------------------------------ the policy's servers


@dataclass
class Model:
    """A server a run talks to, as its flags and checks see it."""

    url: str  # ends in /v1
    server_type: str  # vllm: token ids (ScriptedModel, the tiny model); openai: chat
    model_name: str = "tiny"
    requests: list[dict[str, Any]] = field(default_factory=list)  # what it was asked
    server: Any = None

    def flags(self, namespace: str = "openai") -> list[str]:
        """The `--<namespace>.*` flags that point an env at this server."""
        return [
            *(f"--{namespace}.base_url", self.url, f"--{namespace}.model_name", self.model_name),
            *(f"--{namespace}.server_type", self.server_type, f"--{namespace}.api_key", "x"),
            *(f"--{namespace}.timeout", "60"),
        ]


ModelFactory = Callable[["Run"], AbstractContextManager[Model]]


def scripted(
    policy: TextPolicy | None = None, new_policy: Callable[[], TextPolicy] | None = None
) -> ModelFactory:
    """A vLLM look-alike serving `policy` (or a fresh `new_policy()` per run)."""

    @contextmanager
    def serve(run: Run) -> Iterator[Model]:
        chosen = policy if new_policy is None else new_policy()
        with ScriptedModel(chosen, run.tiny_model_path) as server:
            yield Model(server.url, "vllm", requests=server.requests, server=server)

    return serve


def chat(policy: Policy, model_name: str = "tiny") -> ModelFactory:
    """An OpenAI-compatible chat server answering with `policy(messages, n)`."""

    @contextmanager
    def serve(run: Run) -> Iterator[Model]:
        with PolicyChatServer(policy) as server:
            yield Model(server.url, "openai", model_name, server.requests, server)

    return serve


def tiny_engine(run: Run) -> AbstractContextManager[Model]:
    """The session's inference server with the real tiny model (it records no requests)."""
    server = run.request.getfixturevalue("inference_server")
    return nullcontext(Model(f"{server.url}/v1", "vllm", server=server))


# ------------------------------------------------------------------ rows


def no_check(*args: Any) -> None:
    """A row with nothing to ask beyond the common part."""


EnvClass = type | Callable[[], type]
"""A row's env: the class, or a function loading it when the row runs (an upstream-style
env file of tests/compat/envs, whose imports collection need not pay for)."""


def env_class(env: EnvClass) -> type:
    return env if isinstance(env, type) else env()


def compat_env(script: str, class_name: str) -> Callable[[], type]:
    """Loads `class_name` from tests/compat/envs/<script> when called."""

    def load() -> type:
        name = f"compat_envs_{Path(script).stem}"
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, ENVS / script)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # pydantic resolves the config's annotations there
            spec.loader.exec_module(module)
        return getattr(sys.modules[name], class_name)

    return load


@dataclass(frozen=True)
class ProcessRow:
    """`process` against a scripted policy: every written group's scores are known.

    `args(run)` are the env's flags beyond the common ones (tokenizer, wandb off,
    group size, steps, the output file, the model's `--openai.*`); `scores(group)` what
    each written group must score (None: `check` says); `check(groups, run)` what else
    this env's groups must show.
    """

    env: EnvClass
    model: ModelFactory
    group_size: int
    steps: int
    scores: Callable[[dict[str, Any]], list[float]] | None
    args: Callable[[Run], list[str]] = lambda run: []
    check: Callable[[list[dict[str, Any]], Run], None] = no_check
    servers: Mapping[str, ModelFactory] = field(default_factory=dict)


@dataclass(frozen=True)
class EvaluateRow:
    """`evaluate` against a policy whose answers are known: its metrics and samples.

    `check(results, samples, run)` gets metrics.json's `results["all"]` and the rows of
    samples.jsonl; `greedy`: every request the model recorded asked temperature 0.
    """

    env: EnvClass
    model: ModelFactory
    samples: int
    check: Callable[[dict[str, Any], list[dict[str, Any]], Run], None]
    args: Callable[[Run], list[str]] = lambda run: []
    greedy: bool = True
    servers: Mapping[str, ModelFactory] = field(default_factory=dict)


@dataclass(frozen=True)
class ServeRow:
    """`serve` against a real run-api and a trainer stand-in pulling `batches` batches.

    `groups`: how many groups those batches hold; `scores(group)` what each must score
    (None: `check` says); `check(groups, run)` the rest.
    """

    env: EnvClass
    model: ModelFactory
    group_size: int
    batch_size: int
    max_token_len: int
    groups: int
    scores: Callable[[dict[str, Any]], list[float]] | None = None
    args: Callable[[Run], list[str]] = lambda run: []
    check: Callable[[list[dict[str, Any]], Run], None] = no_check
    batches: int = 2


def table(kind: str) -> list[Any]:
    """One pytest param per module in ROW_MODULES that has a `kind` row, id'd by the env.

    A module that skips on import (gymnasium or torch missing) gives a skipped param.
    """
    params = []
    for name in ROW_MODULES:
        short = name.rsplit(".", 1)[1].removeprefix("test_")
        try:
            module = importlib.import_module(name)
        except pytest.skip.Exception as skipped:
            params.append(pytest.param(None, id=short, marks=pytest.mark.skip(reason=str(skipped))))
            continue
        if hasattr(module, kind):
            params.append(pytest.param(getattr(module, kind), id=short))
    return params


def scores_and_questions_within(
    scores: list[float], questions: Mapping[str, Any]
) -> Callable[[list[dict[str, Any]]], None]:
    """An `OFFLINE` check: every score is one the reward gives, and every group's user
    turn is one of the env's questions."""

    def check(groups: list[dict[str, Any]]) -> None:
        for group in groups:
            assert set(group["scores"]) <= set(scores)
            assert group["messages"][0][1]["content"] in questions

    return check


def offline_check(script_stem: str) -> Callable[[list[dict[str, Any]], Any], None]:
    """The `OFFLINE` check of the env named `script_stem` (none: the common part only)."""
    for name in ROW_MODULES:
        if name.endswith(f".test_{script_stem}"):
            return getattr(importlib.import_module(name), "OFFLINE", no_check)
    return no_check


# ------------------------------------------------------------------ one run


@dataclass
class Run:
    """What a row's flags and checks see of one run."""

    tmp_path: Path
    tiny_model_path: Path
    request: pytest.FixtureRequest
    model: Model | None = None
    servers: dict[str, Model] = field(default_factory=dict)
    output: str = ""  # what the run printed and logged (`in_process`)

    @cached_property
    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.tiny_model_path))


@contextmanager
def open_run(
    row: Any, tmp_path: Path, tiny_model_path: Path, request: pytest.FixtureRequest
) -> Iterator[Run]:
    """The row's model and extra servers up, the run's scratch state under tmp_path."""
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    for name, value in {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "hf-datasets"),
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "WANDB_SILENT": "true",
        "TOKENIZERS_PARALLELISM": "false",
        "ATROPOS_ENV_STATE_DIR": str(tmp_path / "env-state"),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # anything a run writes by a relative path lands here
    run = Run(tmp_path, tiny_model_path, request)
    with ExitStack() as stack:
        run.model = stack.enter_context(row.model(run))
        for name, factory in getattr(row, "servers", {}).items():
            run.servers[name] = stack.enter_context(factory(run))
        yield run


@contextmanager
def in_process(run: Run) -> Iterator[None]:
    """An in-process `run_cli`'s output kept in `run.output`, and what it changes for the
    whole process put back after it: the root logger's handlers and the levels and
    handlers of the loggers it configures or that existed before, the working directory,
    the environment, sys.argv, the SIGINT/SIGTERM handlers, and pytest-timeout's alarm
    (math_verify's signal.alarm cancels it in the main thread).

    Its output goes to a buffer, not pytest's capture: a library that makes a logging
    handler on first use binds sys.stderr then, and a test's capture is closed after it.
    Such a handler is pointed at the stderr in effect afterwards.

    An earlier run's HTTP clients, bound to that run's closed event loop, are collected
    before this run's output is captured: finalized during it, they would log "Event loop
    is closed" tracebacks into it (in an env's own process, which runs once, they never
    outlive their loop)."""
    gc.collect()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    names = [
        name
        for name, logger in logging.Logger.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    ]
    loggers = {
        name: (logger.level, logger.disabled, logger.handlers[:])
        for name in [*names, *CONFIGURED_LOGGERS]
        for logger in [logging.getLogger(name)]
    }
    argv, cwd, environ = sys.argv[:], os.getcwd(), dict(os.environ)
    signals = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    alarm_s, started = signal.getitimer(signal.ITIMER_REAL)[0], time.monotonic()
    buffer = io.StringIO()
    try:
        with redirect_stdout(buffer), redirect_stderr(buffer):
            yield
    finally:
        run.output += buffer.getvalue()
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, (was_level, was_disabled, was_handlers) in loggers.items():
            logger = logging.getLogger(name)
            logger.setLevel(was_level)
            logger.disabled = was_disabled
            logger.handlers[:] = was_handlers
        for logger in logging.Logger.manager.loggerDict.values():
            for handler in getattr(logger, "handlers", []):
                if isinstance(handler, logging.StreamHandler) and handler.stream is buffer:
                    handler.setStream(sys.stderr)
        sys.argv[:] = argv
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)
        for sig, handler in signals.items():
            if handler is not None and signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)
        if alarm_s and not signal.getitimer(signal.ITIMER_REAL)[0]:
            left = alarm_s - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.01))


def cli(env: EnvClass, argv: list[str], run: Run) -> None:
    """`python <env script> ARGV` in this process; fails unless it exits 0 without a
    traceback in its output."""
    code: Any = 0
    with in_process(run):
        try:
            run_cli(env_class(env), argv)
        except SystemExit as exit_:
            code = exit_.code
    assert code in (0, None), f"{argv[0]} exited {code}:\n{run.output[-6000:]}"
    assert "Traceback" not in run.output, run.output[-6000:]


def groups_file(run: Run) -> Path:
    return run.tmp_path / "groups.jsonl"


def process_argv(row: ProcessRow, run: Run) -> list[str]:
    assert run.model is not None
    return [
        "process",
        *("--env.tokenizer_name", str(run.tiny_model_path), "--env.use_wandb", "false"),
        *("--env.group_size", str(row.group_size), "--env.total_steps", str(row.steps)),
        *("--env.data_path_to_save_groups", str(groups_file(run))),
        *run.model.flags(),
        *row.args(run),
    ]


def evaluate_argv(row: EvaluateRow, run: Run) -> list[str]:
    assert run.model is not None
    return [
        "evaluate",
        *("--env.tokenizer_name", str(run.tiny_model_path), "--env.use_wandb", "false"),
        *("--env.data_dir_to_save_evals", str(run.tmp_path / "evals")),
        *run.model.flags(),
        *row.args(run),
    ]


def read_evaluation(run: Run) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(metrics.json, the rows of samples.jsonl) an evaluate run wrote."""
    evals = run.tmp_path / "evals"
    metrics = json.loads((evals / "metrics.json").read_text())
    return metrics, read_jsonl(evals / "samples.jsonl")


# ------------------------------------------------------------------ the groups' shape


def check_shape(group: dict[str, Any], group_size: int) -> None:
    """Every group of every env: `group_size` sequences, each with a mask per token, the
    first masked (the prompt), some trained, and a trained position's mask its token id."""
    assert len(group["tokens"]) == len(group["masks"]) == len(group["scores"]) == group_size
    for tokens, masks in zip(group["tokens"], group["masks"], strict=True):
        assert len(tokens) == len(masks) and masks[0] == -100
        trained = [(t, m) for t, m in zip(tokens, masks, strict=True) if m != -100]
        assert trained and all(t == m for t, m in trained)


# ------------------------------------------------------------------ serve


class Trainer(threading.Thread):
    """A trainer stand-in on a thread: pulls `count` batches from /batch, then stops the
    env serving on the main thread as SIGTERM stops it (the runtime's stop, on its loop)."""

    def __init__(self, client: httpx.Client, count: int, timeout_s: float = 150) -> None:
        super().__init__(daemon=True)
        self.client, self.count, self.timeout_s = client, count, timeout_s
        self.batches: list[list[dict[str, Any]]] = []
        self.failure: BaseException | None = None
        self.serve_ended = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.env: Any = None

    def serving(self, env_cls: type) -> type:
        """`env_cls`, noting its loop and env when `serve` starts, for `stop`."""
        trainer = self

        class Served(env_cls):  # type: ignore[misc, valid-type]
            async def env_manager(self) -> None:
                trainer.loop, trainer.env = asyncio.get_running_loop(), self
                await super().env_manager()

        Served.__name__ = Served.__qualname__ = env_cls.__name__
        return Served

    def run(self) -> None:
        try:
            wait_until(self._got_them, self.timeout_s, f"{self.count} batches", poll_s=0.2)
        except BaseException as failure:  # raised on the main thread by the test
            self.failure = failure
        finally:
            self.stop()

    def _got_them(self) -> bool:
        batch = self.client.get("/batch").json()["batch"]
        if batch:
            self.batches.append(batch)
        elif self.serve_ended.is_set():
            raise AssertionError(f"serve ended after {len(self.batches)}/{self.count} batches")
        return len(self.batches) >= self.count

    def stop(self) -> None:
        runtime = getattr(self.env, "_runtime", None)
        if self.serve_ended.is_set() or self.loop is None or runtime is None:
            return
        try:
            self.loop.call_soon_threadsafe(runtime._request_stop, signal.SIGTERM)
        except RuntimeError:  # the loop has closed: serve ended meanwhile
            pass


def serve_groups(row: ServeRow, run: Run, api_url: str) -> list[dict[str, Any]]:
    """The groups of the first `row.batches` batches the env served; it stops after."""
    assert run.model is not None
    argv = [
        "serve",
        *("--env.tokenizer_name", str(run.tiny_model_path), "--env.use_wandb", "false"),
        *("--env.group_size", str(row.group_size), "--env.rollout_server_url", api_url),
        *("--slurm", "false"),
        *run.model.flags(),
        *row.args(run),
    ]
    with httpx.Client(base_url=api_url, timeout=30) as client:
        register_trainer(client, batch_size=row.batch_size, max_token_len=row.max_token_len)
        trainer = Trainer(client, row.batches)
        served = trainer.serving(env_class(row.env))
        trainer.start()
        try:
            cli(served, argv, run)
        finally:
            trainer.serve_ended.set()
            trainer.join(30)
    if trainer.failure is not None:
        raise AssertionError(f"{trainer.failure}\n{run.output[-6000:]}")
    assert not trainer.is_alive(), "the trainer stand-in did not finish"
    return [group for batch in trainer.batches for group in batch]
