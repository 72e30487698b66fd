"""The YAML of `atropos-launch`, validated, and the plan resolved from it.

Design: the YAML names *what* runs (the API, environments, the trainer, an
optional standalone engine) and their own flags; everything they must agree
on (the policy path, ports, URLs, the run directory, the seed) is written once
at the top level or chosen here, and `plan` hands the same values to every
process. Every mistake that can be found before anything starts (an unknown
key, a missing script, a port in use, a bad trainer flag) is a `ConfigError`
naming it, so a run never half-starts.
"""

from __future__ import annotations

import importlib.util
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

TINY_MODEL = "tiny"


class ConfigError(ValueError):
    """A launch config that cannot run; the message names the problem."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ApiSection(Section):
    """The trajectory API (`run-api`)."""

    port: int | Literal["auto"] = Field("auto", description="Port, or auto for a free one.")
    args: dict[str, Any] = Field(
        default_factory=dict, description="More run-api flags (APISettings fields)."
    )


class EngineSection(Section):
    """A standalone inference engine; the trainer then uses it and restarts nothing."""

    engine: Literal["auto", "vllm", "transformers"] = Field("auto", description="Which engine.")
    port: int | Literal["auto"] = Field("auto", description="Port, or auto for a free one.")
    args: list[str] = Field(default_factory=list, description="More engine flags.")


class EnvironmentSection(Section):
    """One environment script or module, run as `copies` processes."""

    name: str | None = Field(None, description="Log prefix (default: the script's stem).")
    script: str | None = Field(None, description="Path of the env script (relative to the YAML).")
    module: str | None = Field(None, description="Or a module run with python -m.")
    subcommand: Literal["serve", "process", "evaluate"] = Field(
        "serve", description="Env subcommand."
    )
    copies: int = Field(1, ge=1, description="How many processes of this environment.")
    env: dict[str, Any] = Field(default_factory=dict, description="--env.* overrides.")
    openai: dict[str, Any] = Field(default_factory=dict, description="--openai.* overrides.")
    args: list[str] = Field(default_factory=list, description="More raw flags.")
    max_restarts: int = Field(3, ge=0, description="Restarts after a crash before giving up.")

    @property
    def label(self) -> str:
        return self.name or Path(self.script or self.module or "env").stem.split(".")[-1]


class TrainerSection(Section):
    """The trainer; `args` are its flags (TrainingConfig fields for the example trainer)."""

    module: str = Field("example_trainer.grpo", description="Trainer module (python -m).")
    nproc: int = Field(1, ge=1, description="Processes (torchrun --nproc_per_node) when > 1.")
    args: dict[str, Any] = Field(default_factory=dict, description="Trainer flags.")


class LaunchConfig(Section):
    """A whole run: `atropos-launch CONFIG.yaml`."""

    model: str = Field(..., description="Policy: hub name, local directory, or 'tiny'.")
    served_model_name: str | None = Field(
        None, description="Name envs send as 'model' (default: the model)."
    )
    run_dir: str | None = Field(None, description="Default: runs/<config name>-<time>.")
    seed: int = Field(0, description="Seed given to the trainer.")
    python: str = Field(sys.executable, description="Python that runs every process.")
    health_timeout_s: float = Field(600, gt=0, description="Wait this long for each /health.")
    stop_grace_s: float = Field(
        60, gt=0, description="Time the trainer gets to write its final checkpoint on stop."
    )
    api: ApiSection = Field(default_factory=ApiSection)
    engine: EngineSection | None = Field(None, description="Optional standalone engine.")
    environments: list[EnvironmentSection] = Field(..., min_length=1)
    trainer: TrainerSection = Field(default_factory=TrainerSection)


@dataclass
class ProcessPlan:
    name: str
    command: list[str]
    health_url: str | None = None
    max_restarts: int = 0
    env: dict[str, str] = field(default_factory=dict)  # extra environment variables


@dataclass
class Plan:
    """Everything resolved: the commands to run, in start order, and where things go."""

    config: LaunchConfig
    run_dir: Path
    api_url: str
    engine_url: str
    model: str
    training_steps: int
    api: ProcessPlan
    trainer: ProcessPlan
    engine: ProcessPlan | None = None
    environments: list[ProcessPlan] = field(default_factory=list)

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def metrics_path(self) -> Path:
        return self.checkpoints / "metrics.jsonl"

    @property
    def rollouts_dir(self) -> Path:
        return self.run_dir / "rollouts"


def load_config(path: str | Path) -> LaunchConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    try:
        return LaunchConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_describe(exc)}") from exc


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "(top level)"
        if error["type"] == "extra_forbidden":
            problems.append(f"unknown key '{where}'")
        else:
            problems.append(f"{where}: {error['msg']}")
    return "; ".join(problems)


def port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _port(value: int | str, what: str, taken: set[int]) -> int:
    if value == "auto":
        port = free_port()
        while port in taken:
            port = free_port()
    else:
        port = int(value)
        if port in taken or port_in_use(port):
            raise ConfigError(f"port {port} ({what}) is already in use")
    taken.add(port)
    return port


def flags(values: dict[str, Any], prefix: str = "--", dashes: bool = True) -> list[str]:
    """{'batch_size': 8} -> ['--batch-size', '8']; booleans as true/false."""
    out = []
    for key, value in values.items():
        name = key.replace("_", "-") if dashes else key
        if isinstance(value, bool):
            value = "true" if value else "false"
        out += [f"{prefix}{name}", str(value)]
    return out


def resolve_model(model: str) -> str:
    """'tiny' is the locally built tiny model (built if missing); anything else is as given."""
    if model == TINY_MODEL:
        from atroposlib.utils.tiny_model import TinyModelSpec, default_cache_dir, ensure_tiny_model

        target = default_cache_dir() / TinyModelSpec().cache_key()
        if not (target / "config.json").exists():
            print(
                f"[launch] building the tiny model once into {target} (about a minute)", flush=True
            )
        return str(ensure_tiny_model())
    return model


def plan(config: LaunchConfig, config_path: str | Path) -> Plan:
    """Resolve paths and ports once, check what can be checked, and build every command."""
    base = Path(config_path).resolve().parent
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(config.run_dir or f"runs/{Path(config_path).stem}-{stamp}").resolve()
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(f"run directory {run_dir} already holds a run; pick another run_dir")
    taken: set[int] = set()
    api_port = _port(config.api.port, "api", taken)
    api_url = f"http://127.0.0.1:{api_port}"
    model = resolve_model(config.model)
    served = config.served_model_name or config.model
    py = config.python

    api_args = {"port": api_port, "state_dir": str(run_dir / "api-state"), **config.api.args}
    _check_fields("api.args", api_args, "atroposlib.api.settings", "APISettings")
    api = ProcessPlan(
        "api",
        [py, "-m", "atroposlib.cli.run_api", *flags(api_args)],
        health_url=f"{api_url}/health",
    )

    trainer_args = dict(config.trainer.args)
    engine = None
    if config.engine is not None:
        engine_port = _port(config.engine.port, "engine", taken)
        from atroposlib.inference.launcher import EngineConfig, engine_command, resolve_engine

        engine_config = EngineConfig(
            engine=config.engine.engine,
            served_model_name=served,
            port=engine_port,
            python=py,
            extra_args=config.engine.args,
        )
        engine = ProcessPlan(
            "engine",
            engine_command(engine_config, resolve_engine(engine_config), model),
            health_url=f"{engine_config.url}/health",
        )
        trainer_args["inference_engine"] = "none"
    else:
        engine_port = _port(trainer_args.pop("vllm_port", "auto"), "trainer engine", taken)
    trainer_args = {
        "model_name": model,
        "served_model_name": served,
        "atropos_url": api_url,
        "vllm_port": engine_port,
        "save_path": str(run_dir / "checkpoints"),
        "seed": config.seed,
        "log_format": "text",
        **{k: v for k, v in trainer_args.items() if k not in ("save_path", "atropos_url")},
    }
    training_steps = int(trainer_args.get("training_steps", 10))
    if config.trainer.module == "example_trainer.grpo":
        validated = _check_fields(
            "trainer.args", trainer_args, "example_trainer.config", "TrainingConfig"
        )
        training_steps = validated.training_steps
    nproc = config.trainer.nproc
    runner = (
        [py, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        if config.trainer.nproc > 1
        else [py]
    )
    trainer = ProcessPlan(
        "trainer",
        [*runner, "-m", config.trainer.module, *flags(trainer_args)],
        health_url=None if engine else f"http://127.0.0.1:{engine_port}/health",
    )
    engine_url = f"http://127.0.0.1:{engine_port}"

    environments = []
    labels: dict[str, int] = {}
    for section in config.environments:
        entry = _env_entry(section, base)
        for _ in range(section.copies):
            label = section.label
            labels[label] = labels.get(label, 0) + 1
            name = f"{label}-{labels[label]}" if section.copies > 1 or labels[label] > 1 else label
            env_values = {
                "rollout_server_url": api_url,
                "tokenizer_name": model,
                "total_steps": training_steps,
                "use_wandb": False,
                "include_messages": True,
                "data_path_to_save_groups": str(run_dir / "rollouts" / f"{name}.jsonl"),
                **section.env,
            }
            openai_values = {
                "base_url": f"{engine_url}/v1",
                "model_name": served,
                **section.openai,
            }
            environments.append(
                ProcessPlan(
                    name,
                    [
                        py,
                        *entry,
                        section.subcommand,
                        *flags(env_values, "--env.", dashes=False),
                        *flags(openai_values, "--openai.", dashes=False),
                        *section.args,
                    ],
                    max_restarts=section.max_restarts,
                    # backlogs and spools belong to this run, not to the working directory
                    env={"ATROPOS_ENV_STATE_DIR": str(run_dir / "env-state" / name)},
                )
            )
    return Plan(
        config=config,
        run_dir=run_dir,
        api_url=api_url,
        engine_url=engine_url,
        model=model,
        training_steps=training_steps,
        api=api,
        trainer=trainer,
        engine=engine,
        environments=environments,
    )


def _env_entry(section: EnvironmentSection, base: Path) -> list[str]:
    if bool(section.script) == bool(section.module):
        raise ConfigError(f"environment '{section.label}': give exactly one of script or module")
    if section.module:
        if importlib.util.find_spec(section.module.split(".")[0]) is None:
            raise ConfigError(f"environment module not found: {section.module}")
        return ["-m", section.module]
    script = Path(section.script)
    candidates = [script] if script.is_absolute() else [base / script, Path.cwd() / script]
    for candidate in candidates:
        if candidate.is_file():
            return [str(candidate.resolve())]
    raise ConfigError(f"environment script not found: {section.script}")


def _check_fields(where: str, values: dict[str, Any], module: str, model_name: str) -> BaseModel:
    model = getattr(importlib.import_module(module), model_name)
    unknown = sorted(set(values) - set(model.model_fields))
    if unknown:
        raise ConfigError(f"unknown key '{where}.{unknown[0]}' (not a {model_name} field)")
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_describe(exc)}") from exc
