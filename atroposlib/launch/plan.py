"""The plan of a run: every command resolved from the YAML, checked before anything starts.

Design: `plan` decides each shared value once (ports, URLs, the run directory,
the policy path, the token limit) and builds each process's command from it,
one small function per process. The trainer is reached only through
`atroposlib.trainer_contract`: its shared settings are `LaunchSettings`, and its
own flags are checked against the `LAUNCH_CONFIG` its module exposes, if any.
Every mistake that can be found before anything starts (an unknown key, a
missing script, a port in use, a bad trainer flag, limits that disagree) is a
`ConfigError` naming it, so a run never half-starts.
"""

from __future__ import annotations

import importlib
import importlib.util
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from atroposlib.api.settings import APISettings
from atroposlib.launch.checks import check_model_name
from atroposlib.launch.config import (
    ConfigError,
    EnvironmentSection,
    LaunchConfig,
    describe_errors,
)
from atroposlib.launch.processes import (
    ProcessPlan,
    Shared,
    engine_plan,
    replay_plan,
    teacher_plan,
)
from atroposlib.launch.resolving import (
    declared_config,
    declared_default,
    flags,
    pick_port,
    resolve_model,
    validated,
)
from atroposlib.trainer_contract import (
    LaunchSettings,
    events_path,
    metrics_path,
)
from atroposlib.utils.exposure import (
    API_KEY_ENVIRONMENT,
    ENGINE_KEY_ENVIRONMENT,
    ENGINE_URLS_ENVIRONMENT,
    ENV_KEY_ENVIRONMENT,
)

ENGINES_FILE = "engines.yaml"
"""The trainer's engines as an environment's `openai:` list (written with several)."""
EVALS_DIR = "evals"
"""Each environment's evaluations: <run_dir>/evals/<name>/ (metrics.json, history.jsonl)."""
SCORES_DIR = "scores"
"""Every group each environment scored, kept or dropped: <run_dir>/scores/<name>.jsonl."""
KEY_FILE = "api-key"
"""The run's key in its run directory (mode 0600), for clients such as view-run."""
LAUNCHER_OWNED = {
    "save_path": "the launcher keeps the trainer's checkpoints in <run_dir>/checkpoints; "
    "set run_dir",
    "atropos_url": "the launcher points the trainer at the API it runs; set api.port",
}
"""The trainer settings the launcher owns outright: a trainer.args entry is refused, why."""


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
    teacher: ProcessPlan | None = None
    """The distillation teacher's engine (the YAML's `teacher:` section), if any."""
    environments: list[ProcessPlan] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    """Files the run writes into its directory before anything starts (relative path: text)."""
    api_state_dir: Path | None = None
    """The API's durable store (None: it runs ephemeral)."""
    key: str | None = None
    """The run's key for the API and the engine (None: keys: none)."""
    resumed: bool = False
    """The run directory holds an earlier run of this config, which goes on."""
    seq_len: int = 0
    """The run's token limit: the trainer's seq_len, every environment's max_token_length."""
    engine_context: int = 0
    """The policy engine's context (max_model_len): what a prompt and its completion share."""
    engine_context_key: str = "trainer.args.seq_len"
    """The YAML key that set `engine_context`."""
    replay: ProcessPlan | None = None
    """`atropos-rollouts replay` of another run's groups (the YAML's `replay:`), if any."""
    start_from: Path | None = None
    """A fork's parent checkpoint, which the trainer resumes (None: it starts from `model`)."""
    start_step: int = 0
    """The step the trainer starts from: 0, or a fork's parent step."""

    @property
    def processes(self) -> list[ProcessPlan]:
        """Every process, in start order (an evaluate-only environment's after the run)."""
        every = [self.api, self.engine, self.teacher, self.trainer, *self.environments]
        return [p for p in [*every, self.replay] if p is not None]

    @property
    def starting_model(self) -> str:
        """The weights the trainer starts from: the fork's parent checkpoint, or the policy."""
        return str(self.start_from) if self.start_from is not None else self.model

    @property
    def checkpoints(self) -> Path:
        """The trainer's save path: checkpoints, metrics and events."""
        return self.run_dir / "checkpoints"

    @property
    def metrics_path(self) -> Path:
        return metrics_path(self.checkpoints)

    @property
    def events_path(self) -> Path:
        return events_path(self.checkpoints)

    @property
    def rollouts_dir(self) -> Path:
        return self.run_dir / "rollouts"


def plan(
    config: LaunchConfig,
    config_path: str | Path,
    resume: bool = False,
    start_from: Path | None = None,
    start_step: int = 0,
) -> Plan:
    """Resolve paths and ports once, check what can be checked, and build every command.

    `resume`: the run directory holds an earlier run of this config, which goes on
    (`atropos-launch --resume RUN_DIR`); otherwise it must be new or empty.
    `start_from`: a fork's parent checkpoint (of `start_step`), which the trainer is
    given as `--resume` (lineage.py)."""
    base = Path(config_path).resolve().parent
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(config.run_dir or f"runs/{Path(config_path).stem}-{stamp}").resolve()
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run directory {run_dir} is a file; pick another run_dir")
    if not resume and run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(
            f"run directory {run_dir} already holds a run; continue it with "
            f"`atropos-launch --resume {run_dir}`, or pick another run_dir"
        )
    check_model_name(config.model)  # before anything: every process would fail on it
    taken: set[int] = set()
    api_port = pick_port(config.api.port, "api", taken)
    trainer_args = dict(config.trainer.args)
    requested_engine_port = config.engine.port if config.engine else "auto"
    if config.engine is None:
        # the example trainer's --engine-port is upstream's --vllm-port, the contract's
        named = trainer_args.pop("engine_port", None)
        requested_engine_port = trainer_args.pop("vllm_port", named or "auto")
    engine_count = int(trainer_args.get("num_engines", 1))
    if engine_count > 1 and config.engine is not None:
        raise ConfigError(
            "trainer.args.num_engines: the trainer starts and syncs its engines itself; "
            "drop the engine: section (it runs one engine the trainer does not restart)"
        )
    shared = Shared(
        run_dir=run_dir,
        python=config.python,
        model=resolve_model(config.model),
        served=config.served_model_name or config.model,
        api_url=f"http://127.0.0.1:{api_port}",
        engine_port=pick_port(requested_engine_port, "engine", taken, engine_count),
        key=_run_key(config),
        engine_count=engine_count,
        teacher_port=pick_port(config.teacher.port, "teacher", taken) if config.teacher else None,
    )
    api = _api_plan(config, shared, api_port)
    if start_from is not None:
        if "resume" in trainer_args:
            raise ConfigError(
                "trainer.args.resume: a fork's trainer resumes its parent's checkpoint; drop it"
            )
        trainer_args["resume"] = str(start_from)
    trainer, settings = _trainer_plan(config, shared, trainer_args)
    engine = engine_plan(config, shared, settings)
    teacher = teacher_plan(config, shared, settings)
    environments = _environment_plans(config, shared, settings, base)
    files = {ENGINES_FILE: _engines_yaml(shared)} if shared.engine_count > 1 else {}
    return Plan(
        files=files,
        config=config,
        api_state_dir=_api_state_dir(config, shared),
        run_dir=run_dir,
        api_url=shared.api_url,
        engine_url=shared.engine_url,
        model=shared.model,
        training_steps=settings.training_steps,
        seq_len=settings.seq_len,
        **_engine_context(config, trainer_args, settings.seq_len),
        api=api,
        trainer=trainer,
        engine=engine,
        teacher=teacher,
        environments=environments,
        replay=replay_plan(
            config, shared, base, _replay_fill(config, settings, environments, start_step)
        ),
        key=shared.key,
        resumed=resume,
        start_from=start_from,
        start_step=start_step,
    )


def _replay_fill(
    config: LaunchConfig,
    settings: LaunchSettings,
    environments: list[ProcessPlan],
    start_step: int,
) -> int | None:
    """The sequences a replay must post when no environment samples: every remaining
    step's batch (the groups are posted again, pass after pass, to make them up)."""
    if config.replay is None or any(not e.evaluate_only for e in environments):
        return None
    args = {k.replace("-", "_"): v for k, v in config.trainer.args.items()}
    module = config.trainer.module
    batch = args.get("batch_size") or declared_default(
        declared_config(module), "batch_size", module
    )
    return (settings.training_steps - start_step) * int(batch)


def _engine_context(
    config: LaunchConfig, trainer_args: dict[str, Any], seq_len: int
) -> dict[str, Any]:
    """The launcher's engine's max_model_len, else the trainer's engines', else seq_len;
    and the key that set it (the Plan's fields)."""
    if config.engine is not None and config.engine.max_model_len:
        return {
            "engine_context": config.engine.max_model_len,
            "engine_context_key": "engine.max_model_len",
        }
    if trainer_args.get("max_model_len"):
        given = int(trainer_args["max_model_len"])
        return {"engine_context": given, "engine_context_key": "trainer.args.max_model_len"}
    return {"engine_context": seq_len, "engine_context_key": "trainer.args.seq_len"}


def _run_key(config: LaunchConfig) -> str | None:
    """The YAML's api.args.api_key, else a fresh one unless keys: none."""
    given = config.api.args.get("api_key")
    if given:
        return str(given)
    return secrets.token_urlsafe(32) if config.keys == "per_run" else None


def _api_args(config: LaunchConfig, shared: Shared) -> dict[str, Any]:
    """run-api's flags; its key goes in its environment (see `_run_key`)."""
    args = {k: v for k, v in config.api.args.items() if k != "api_key"}
    return {"state_dir": str(shared.run_dir / "api-state"), **args}


def _api_state_dir(config: LaunchConfig, shared: Shared) -> Path | None:
    args = _api_args(config, shared)
    return None if args.get("ephemeral") else Path(args["state_dir"]).resolve()


def _api_plan(config: LaunchConfig, shared: Shared, port: int) -> ProcessPlan:
    args = {"port": port, **_api_args(config, shared)}
    validated("api.args", args, APISettings)
    return ProcessPlan(
        "api",
        [shared.python, "-m", "atroposlib.cli.run_api", *flags(args)],
        health_url=f"{shared.api_url}/health",
        max_restarts=config.api.max_restarts,
        env={
            **shared.key_env(API_KEY_ENVIRONMENT),
            **shared.key_env(ENV_KEY_ENVIRONMENT, role="env"),
        },
        not_restartable=(
            "the API runs with ephemeral: true, so its queue and registrations died with it"
            if args.get("ephemeral")
            else None
        ),
    )


def _trainer_plan(
    config: LaunchConfig, shared: Shared, args: dict[str, Any]
) -> tuple[ProcessPlan, LaunchSettings]:
    """The trainer's command, and the settings it got (the others are checked against them)."""
    module = config.trainer.module
    declared = declared_config(module)
    for key in LAUNCHER_OWNED.keys() & args.keys():
        raise ConfigError(f"trainer.args.{key}: {LAUNCHER_OWNED[key]}")
    tracking = config.tracking.trainer_args(shared.run_dir.name, declared, module)
    for key, value in tracking.items():
        args.setdefault(key, value)  # a trainer.args entry wins

    def chosen(name: str, default: Any) -> Any:
        return args.pop(name, default)

    values = {
        "model_name": chosen("model_name", shared.model),
        "served_model_name": chosen("served_model_name", shared.served),
        "atropos_url": shared.api_url,
        "vllm_port": shared.engine_port,
        "save_path": str(shared.run_dir / "checkpoints"),
        "seed": chosen("seed", config.seed),
        "log_format": chosen("log_format", "text"),
        "inference_engine": chosen("inference_engine", None),
        "num_engines": chosen("num_engines", None),
    }
    if config.engine is not None:
        values["inference_engine"] = "none"  # the launcher runs the engine
    for name in ("training_steps", "seq_len"):
        values[name] = args.pop(name) if name in args else declared_default(declared, name, module)
    try:
        settings = LaunchSettings.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(f"trainer.args: {describe_errors(exc)}") from exc
    every_flag = {**settings.flags(), **args}
    if declared is not None:
        validated("trainer.args", every_flag, declared)
    nproc = config.trainer.nproc
    # several ranks meet on a store that listens on loopback only (local_ranks says why)
    ranks = [shared.python, "-m", "atroposlib.launch.local_ranks", "--nproc", str(nproc), "--"]
    runner = [*ranks, shared.python] if nproc > 1 else [shared.python]
    trainer = ProcessPlan(
        "trainer",
        [*runner, "-m", module, *flags(every_flag)],
        health_url=None if config.engine else f"{shared.engine_url}/health",
        max_restarts=config.trainer.max_restarts,
        # its own engine, if it runs one, inherits the engine key
        env={
            **shared.key_env(API_KEY_ENVIRONMENT),
            **shared.key_env(*ENGINE_KEY_ENVIRONMENT, role="engine"),
        },
    )
    return trainer, settings


def _environment_plans(
    config: LaunchConfig, shared: Shared, settings: LaunchSettings, base: Path
) -> list[ProcessPlan]:
    environments = []
    labels: dict[str, int] = {}
    limit = settings.seq_len
    for index, section in enumerate(config.environments):
        entry = _env_entry(section, base)
        own_limit = section.env.get("max_token_length")
        if own_limit is not None and (not isinstance(own_limit, int) or own_limit > limit):
            raise ConfigError(
                f"environments[{index}] ({section.label}): env.max_token_length {own_limit} is "
                f"over the trainer's seq_len {limit}; the API would refuse its longer groups"
            )
        for _ in range(section.copies):
            label = section.label
            labels[label] = labels.get(label, 0) + 1
            name = f"{label}-{labels[label]}" if section.copies > 1 or labels[label] > 1 else label
            env_values = {
                "rollout_server_url": shared.api_url,
                "tokenizer_name": shared.model,
                "total_steps": settings.training_steps,
                "max_token_length": limit,
                "use_wandb": "wandb" in config.tracking.report_to,
                "include_messages": True,
                "eval_at_start": True,  # every eval curve starts at a baseline
                "data_path_to_save_groups": str(shared.run_dir / "rollouts" / f"{name}.jsonl"),
                "data_path_to_save_scores": str(shared.run_dir / SCORES_DIR / f"{name}.jsonl"),
                "data_dir_to_save_evals": str(shared.run_dir / EVALS_DIR / name),
                **section.env,
            }
            openai_values = {
                "base_url": f"{shared.engine_url}/v1",
                "model_name": shared.served,
                **{k: v for k, v in section.openai.items() if k != "api_key"},
            }
            teacher_values = _teacher_flags(config, section, shared, index)
            engines_config = []
            if shared.engine_count > 1 and "base_url" not in section.openai:
                # every engine, as a YAML openai: list; the flags apply to each
                if "--config" in section.flags:
                    raise ConfigError(
                        f"environments[{index}] ({section.label}): with several engines the "
                        "launcher gives each environment their list as --config; move that "
                        "file's keys into env: and openai:"
                    )
                del openai_values["base_url"]
                engines_config = ["--config", str(shared.run_dir / ENGINES_FILE)]
            key_env = {
                # run-api's environment routes only: no /batch, no /reset_data
                **shared.key_env(API_KEY_ENVIRONMENT, role="env"),
                **_engine_key_for(section, shared),
                # backlogs and spools belong to this run, not to the working directory
                "ATROPOS_ENV_STATE_DIR": str(shared.run_dir / "env-state" / name),
            }
            environments.append(
                ProcessPlan(
                    name,
                    [
                        shared.python,
                        *entry,
                        "evaluate" if section.evaluate_only else section.subcommand,
                        *flags(env_values, "--env.", dashes=False),
                        *flags(openai_values, "--openai.", dashes=False),
                        *flags(teacher_values, "--teacher.", dashes=False),
                        *engines_config,
                        *section.flags,
                    ],
                    max_restarts=section.max_restarts,
                    env=key_env,
                    section=index,
                    evaluate_only=section.evaluate_only,
                    done_at_exit_0=True,  # it finished its share
                )
            )
    return environments


def _teacher_flags(
    config: LaunchConfig, section: EnvironmentSection, shared: Shared, index: int
) -> dict[str, Any]:
    """`--teacher.*` for an environment that enables its teacher (`env.teacher_enabled`):
    the run's teacher engine, unless the section names its own teacher server."""
    enabled = str(section.env.get("teacher_enabled", False)).lower() in ("true", "1", "yes")
    if not enabled or shared.teacher_url is None or config.teacher is None:
        return {}
    if "--teacher.base_url" in section.flags or "teacher.base_url" in section.args:
        return {}
    teacher = config.teacher
    return {
        "base_url": f"{shared.teacher_url}/v1",
        "model_name": teacher.served_model_name or teacher.model,
        "server_type": "vllm",  # prompt logprobs come from the engine's /generate
        "tokenizer_name": resolve_model(teacher.model),
    }


def _engines_yaml(shared: Shared) -> str:
    servers = [{"base_url": f"{url}/v1"} for url in shared.engine_urls]
    return yaml.safe_dump({"openai": servers}, sort_keys=False)


def _engine_key_for(section: EnvironmentSection, shared: Shared) -> dict[str, str]:
    """What an environment sends its engine: the YAML's openai.api_key, or the run's key
    when the engine is the run's own, each pinned to the servers it is for (never sent
    to a server elsewhere, such as one a proxy's /setup names)."""
    given = section.openai.get("api_key")
    if given:
        issued_for = section.openai.get("base_url") or ",".join(shared.engine_urls)
        return {ENGINE_KEY_ENVIRONMENT[0]: str(given), ENGINE_URLS_ENVIRONMENT: str(issued_for)}
    if "base_url" in section.openai or not shared.key:
        return {}
    urls = [*shared.engine_urls, *([shared.teacher_url] if shared.teacher_url else [])]
    return {
        **shared.key_env(ENGINE_KEY_ENVIRONMENT[0], role="engine"),
        ENGINE_URLS_ENVIRONMENT: ",".join(urls),
    }


def _env_entry(section: EnvironmentSection, base: Path) -> list[str]:
    if bool(section.script) == bool(section.module):
        raise ConfigError(f"environment '{section.label}': give exactly one of script or module")
    if section.module:
        if importlib.util.find_spec(section.module.split(".")[0]) is None:
            raise ConfigError(f"environment module not found: {section.module}")
        return ["-m", section.module]
    assert section.script  # exactly one of script and module is set (checked above)
    script = Path(section.script)
    candidates = [script] if script.is_absolute() else [base / script, Path.cwd() / script]
    for candidate in candidates:
        if candidate.is_file():
            return [str(candidate.resolve())]
    raise ConfigError(f"environment script not found: {section.script}")
