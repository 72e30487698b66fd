"""What each process of a run is (`ProcessPlan`), the values they share (`Shared`), the
engines the launcher runs itself (a standalone policy engine and a distillation
teacher), and the replay of a stored run's groups. `plan.py` builds the rest of the
run from these."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from atroposlib.launch.checks import check_model_name
from atroposlib.launch.config import (
    ConfigError,
    LaunchConfig,
    StandaloneEngineSection,
    describe_errors,
)
from atroposlib.launch.resolving import resolve_model
from atroposlib.trainer_contract import LaunchSettings
from atroposlib.utils.exposure import API_KEY_ENVIRONMENT, ENGINE_KEY_ENVIRONMENT

REPLAY_MODULE = "atroposlib.cli.rollouts"
"""`atropos-rollouts`, whose `replay` posts a stored run's groups into an API."""


@dataclass
class ProcessPlan:
    name: str
    command: list[str]
    health_url: str | None = None
    max_restarts: int = 0
    env: dict[str, str] = field(default_factory=dict)  # extra environment variables
    not_restartable: str | None = None
    """Why a crash of this process must end the run (None: it is restarted)."""
    section: int | None = None
    """An environment's index in the YAML's list (its copies share it)."""
    fresh_seed: bool = False
    """Each start adds a `--seed` of its own unless the command names one: an engine's
    sampling stream, which vLLM otherwise seeds with 0 at every (re)start (RNG-1)."""
    evaluate_only: bool = False
    """An environment that is not started during the run: its `evaluate` command runs
    after the trainer finished (final_eval.py), on the starting and the final model."""
    done_at_exit_0: bool = False
    """Exit 0 means its work is done (an environment's share, a replay's last post): it
    is not restarted, and the run goes on."""


@dataclass
class Shared:
    """The values every process must agree on, decided once."""

    run_dir: Path
    python: str
    model: str
    served: str
    api_url: str
    engine_port: int
    key: str | None
    engine_count: int = 1
    """Engines on consecutive ports from `engine_port` (the trainer's --num-engines)."""
    teacher_port: int | None = None
    """The distillation teacher's engine, when the YAML has a `teacher:` section."""

    @property
    def teacher_url(self) -> str | None:
        return None if self.teacher_port is None else f"http://127.0.0.1:{self.teacher_port}"

    @property
    def engine_url(self) -> str:
        return f"http://127.0.0.1:{self.engine_port}"

    @property
    def engine_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{self.engine_port + i}" for i in range(self.engine_count)]

    def key_env(self, *names: str, role: str | None = None) -> dict[str, str]:
        """The run's key (or its `role` key) under each of `names`, for a child's
        environment (never its argv)."""
        key = self.role_key(role) if role else self.key
        return {name: key for name in names} if key else {}

    def role_key(self, role: str) -> str | None:
        """The key of one role ("env": run-api's environment routes; "engine": sampling),
        derived from the run's key, so a resumed run derives the same ones. The run's key
        itself (the trainer's, and `<run_dir>/api-key`'s) opens every run-api route; an
        environment holds only the two role keys (docs/security.md, "Keys by role")."""
        if not self.key:
            return None
        return hmac.new(self.key.encode(), role.encode(), hashlib.sha256).hexdigest()


def engine_plan(
    config: LaunchConfig, shared: Shared, settings: LaunchSettings
) -> ProcessPlan | None:
    section = config.engine
    if section is None:
        return None
    args = list(section.flags)
    corrects = {k.replace("-", "_"): v for k, v in config.trainer.args.items()}.get(
        "vllm_importance_sampling_correction"
    )
    if str(corrects).lower() in ("true", "1", "yes") and "--logprobs-mode" not in args:
        # the correction needs the logprobs of what each token was drawn from (IS-1)
        args += ["--logprobs-mode", "processed_logprobs"]
    return standalone_engine(
        "engine", section, args, shared.served, shared.engine_port, shared, settings, shared.model
    )


def teacher_plan(
    config: LaunchConfig, shared: Shared, settings: LaunchSettings
) -> ProcessPlan | None:
    """The teacher's engine: its own model, served beside the policy's, never synced."""
    section = config.teacher
    if section is None or shared.teacher_port is None:
        return None
    check_model_name(section.model)
    served = section.served_model_name or section.model
    model = resolve_model(section.model)
    port = shared.teacher_port
    return standalone_engine(
        "teacher", section, section.flags, served, port, shared, settings, model
    )


def standalone_engine(
    name: str,
    section: StandaloneEngineSection,
    args: list[str],
    served: str,
    port: int,
    shared: Shared,
    settings: LaunchSettings,
    model: str,
) -> ProcessPlan:
    """An engine the launcher runs (the trainer does not restart it), long enough for the
    trainer's longest sequence, behind the run's engine key."""
    from atroposlib.inference.launcher import EngineConfig, engine_command, resolve_engine

    if "--max-model-len" in section.flags:
        raise ConfigError(f"{name}: give the context length as {name}.max_model_len")
    limit = settings.seq_len
    if section.max_model_len is not None and section.max_model_len < limit:
        raise ConfigError(
            f"{name}.max_model_len {section.max_model_len} is under the trainer's seq_len "
            f"{limit}: the engine could not read the longest sequences the run trains on"
        )
    try:
        engine_config = EngineConfig(
            engine=section.engine,
            served_model_name=served,
            port=port,
            python=shared.python,
            max_model_len=section.max_model_len or limit,
            extra_args=list(args),
        )
    except ValidationError as exc:
        raise ConfigError(f"{name}: {describe_errors(exc)}") from exc
    return ProcessPlan(
        name,
        engine_command(engine_config, resolve_engine(engine_config), model),
        health_url=f"{engine_config.url}/health",
        max_restarts=section.max_restarts,
        fresh_seed=True,
        env=shared.key_env(*ENGINE_KEY_ENVIRONMENT, role="engine"),
    )


def replay_plan(
    config: LaunchConfig, shared: Shared, base: Path, fill: int | None = None
) -> ProcessPlan | None:
    """`atropos-rollouts replay RUN --into API`: posts the stored groups of another run
    (or their re-scored copy) into this run's API with an environment's key, as an
    environment would. Posting is idempotent (the groups keep their ids), so a crash is
    restarted; exit 0 means every group was posted. `fill`: the sequences to post when
    nothing else feeds the trainer (`--fill`: pass after pass over the groups)."""
    section = config.replay
    if section is None:
        return None
    command = [
        shared.python,
        *("-m", REPLAY_MODULE, "replay"),
        str(found_dir(section.run, base, "replay.run")),
        *("--into", shared.api_url),
    ]
    if section.rescored is not None:
        command += ["--rescored", str(found_dir(section.rescored, base, "replay.rescored"))]
    if section.steps is not None:
        command += ["--steps", section.steps]
    if section.keep_uniform:
        command += ["--keep-uniform"]
    if fill:
        command += ["--fill", str(fill)]
    return ProcessPlan(
        "replay",
        command,
        max_restarts=section.max_restarts,
        env={
            **shared.key_env(API_KEY_ENVIRONMENT, role="env"),  # as an environment's
            "ATROPOS_ENV_STATE_DIR": str(shared.run_dir / "env-state" / "replay"),
        },
        done_at_exit_0=True,
    )


def found_dir(given: str, base: Path, key: str) -> Path:
    """A directory the YAML names: relative to the YAML's folder, else to the working
    directory (as scripts are found); ConfigError naming `key` when there is none."""
    path = Path(given).expanduser()
    candidates = [path] if path.is_absolute() else [base / path, Path.cwd() / path]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate.resolve()
    raise ConfigError(f"{key}: no directory {given} (relative to the YAML's folder {base})")
