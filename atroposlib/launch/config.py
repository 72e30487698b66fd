"""The YAML of `atropos-launch`, validated (the plan is resolved from it in `plan.py`).

Design: the YAML names *what* runs (the API, environments, the trainer, an
optional standalone engine) and their own flags; everything they must agree
on (the policy path, ports, URLs, the run directory, the seed, the token
limit) is written once at the top level or chosen by the plan.
"""

from __future__ import annotations

import difflib
import re
import sys
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from atroposlib.inference.engines import EngineName
from atroposlib.utils.sections import Section, leaf_fields

Port = Annotated[int, Field(ge=1, le=65535)]
MAX_COPIES = 256
"""More processes of one environment than any machine runs usefully: a typo, not a plan."""

DEFAULT_TRAINER = "example_trainer.grpo"
DEFAULT_TRAINER_FLAGS = "example_trainer.config"
"""Where the default trainer's `LAUNCH_CONFIG` is read: its own module imports torch,
3 s of CPU per launch for a class this one holds without it (test_config checks that
both name the same class)."""


class ConfigError(ValueError):
    """A launch config that cannot run; the message names the problem."""


class ApiSection(Section):
    """The trajectory API (`run-api`)."""

    port: Port | Literal["auto"] = Field("auto", description="Port, or auto for a free one.")
    args: dict[str, Any] = Field(
        default_factory=dict, description="More run-api flags (APISettings fields)."
    )
    max_restarts: int = Field(
        3, ge=0, description="Restarts on its durable store after a crash before giving up."
    )


class RawFlagsSection(Section):
    """A section whose process takes flags no model here describes (vLLM's, a script's):
    `args` is a mapping like every section's, and `extra_flags` holds raw ones. A list
    under `args` (this file's earlier form) is read as `extra_flags`."""

    args: dict[str, Any] = Field(
        default_factory=dict,
        description="More flags, as name: value (--name value; true: the bare --name, "
        "false: --no-name).",
    )
    extra_flags: list[str] = Field(default_factory=list, description="More raw flags.")

    @model_validator(mode="before")
    @classmethod
    def _list_args_are_raw_flags(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("args"), list):
            data = {**data, "extra_flags": [*data["args"], *data.get("extra_flags", [])]}
            del data["args"]
        return data

    @property
    def flags(self) -> list[str]:
        """`args` then `extra_flags`, as the command line takes them."""
        out = []
        for key, value in self.args.items():
            name = key.replace("_", "-")
            if value is True:
                out.append(f"--{name}")
            elif value is False:
                out.append(f"--no-{name}")
            else:
                out += [f"--{name}", str(value)]
        return out + self.extra_flags


class StandaloneEngineSection(RawFlagsSection):
    """A standalone inference engine; the trainer then uses it and restarts nothing."""

    engine: EngineName = Field(
        "auto", description="Which engine: auto or a registered kind (cpu, vllm)."
    )
    port: Port | Literal["auto"] = Field("auto", description="Port, or auto for a free one.")
    max_model_len: int | None = Field(
        None, gt=0, description="Longest prompt + completion (default: the trainer's seq_len)."
    )
    max_restarts: int = Field(3, ge=0, description="Restarts after a crash before giving up.")


class TeacherSection(StandaloneEngineSection):
    """A second engine serving a distillation teacher. Environments whose `env:` sets
    `teacher_enabled: true` (a `TeacherDistillationEnv`) are pointed at it with
    `--teacher.*` flags; the trainer never touches its weights."""

    model: str = Field(
        ..., description="Teacher: hub name, local directory, 'tiny' or 'tiny-teacher'."
    )
    served_model_name: str | None = Field(
        None, description="Name the environments send as 'model' (default: the model)."
    )


EnvSubcommand = Literal["serve", "process", "evaluate"]
ENV_SUBCOMMANDS: tuple[str, ...] = typing.get_args(EnvSubcommand)
"""An environment CLI's subcommands (atroposlib/envs/cli.py), which follow its entry."""


class EnvironmentSection(RawFlagsSection):
    """One environment script or module, run as `copies` processes."""

    name: str | None = Field(None, description="Log prefix (default: the script's stem).")
    script: str | None = Field(None, description="Path of the env script (relative to the YAML).")
    module: str | None = Field(None, description="Or a module run with python -m.")
    subcommand: EnvSubcommand = Field("serve", description="Env subcommand.")
    copies: int = Field(
        1, ge=1, le=MAX_COPIES, description="How many processes of this environment."
    )
    env: dict[str, Any] = Field(default_factory=dict, description="--env.* overrides.")
    openai: dict[str, Any] = Field(default_factory=dict, description="--openai.* overrides.")
    max_restarts: int = Field(3, ge=0, description="Restarts after a crash before giving up.")
    evaluate_only: bool = Field(
        False,
        description="Samples nothing for training: the launcher evaluates the model the "
        "trainer starts from and the final checkpoint with this environment's own "
        "`evaluate`, after the trainer finishes; for a run trained only on replayed groups.",
    )

    @model_validator(mode="after")
    def _evaluated_once(self) -> EnvironmentSection:
        if self.evaluate_only and self.copies > 1:
            raise ValueError("an evaluate_only environment is evaluated once; drop copies")
        return self

    @property
    def label(self) -> str:
        return self.name or Path(self.script or self.module or "env").stem.split(".")[-1]


class TrainerSection(Section):
    """The trainer: any module that keeps `atroposlib.trainer_contract`; `args` are its flags."""

    module: str = Field(DEFAULT_TRAINER, description="Trainer module (python -m).")
    nproc: int = Field(
        1,
        ge=1,
        description="Ranks on this machine; more than 1 runs them as torchrun --standalone "
        "would, through atroposlib.launch.local_ranks (its store listens on loopback only).",
    )
    args: dict[str, Any] = Field(default_factory=dict, description="Trainer flags.")
    max_restarts: int = Field(
        3, ge=0, description="Restarts with --resume from its latest checkpoint before giving up."
    )


Tracker = Literal["wandb", "trackio"]


class TrackingSection(Section):
    """Where the run's metrics go besides its run directory, with one switch (TRL's
    `report_to`): each tracker named is turned on for the trainer, and wandb for every
    environment too, in the trainer's wandb group (environments ask the API for it)."""

    report_to: list[Tracker] = Field(
        default_factory=list,
        description="Trackers: wandb (the trainer and every environment), trackio (the "
        "trainer). One name, a list, or none (the default: no tracker).",
    )
    project: str | None = Field(
        None, description="Project in every tracker (default: the trainer's, atropos-grpo)."
    )
    run_name: str | None = Field(
        None,
        description="The trainer's run name in every tracker, and with wandb the group of "
        "the trainer's and the environments' runs (default: the run directory's name).",
    )

    @field_validator("report_to", mode="before")
    @classmethod
    def _one_name_or_none(cls, value: Any) -> Any:
        """TRL's spellings: one name alone, or `none`."""
        if value is None or value == "none":
            return []
        return [value] if isinstance(value, str) else value

    def trainer_args(
        self, default_name: str, declared: type[BaseModel] | None, module: str
    ) -> dict[str, Any]:
        """The trainer flags the trackers need, of those the trainer `declared` takes
        (`default_name`: the run's name when the YAML gives none). The run name is also
        the wandb group that ties the environments' runs to the trainer's: the API hands
        it to them (/wandb_info). A tracker's switch the trainer lacks is refused, a name
        it lacks left out; a trainer that declares no flags gets them all."""
        name = self.run_name or default_name
        values: dict[str, Any] = {}
        if "wandb" in self.report_to:
            values |= {"use_wandb": True, "wandb_project": self.project, "wandb_group": name}
        if "trackio" in self.report_to:
            values |= {"use_trackio": True, "trackio_project": self.project}
        if values:
            values["run_name"] = name
        known = leaf_fields(declared) if declared is not None else values
        for key in values.keys() - known.keys():
            if key.startswith("use_"):
                flag = key.replace("_", "-")
                raise ConfigError(f"tracking.report_to: trainer {module} has no --{flag} flag")
        return {k: v for k, v in values.items() if v is not None and k in known}


STEP_RANGE = re.compile(r"^(\d+):(\d+)$")


class ReplaySection(Section):
    """Groups another run stored, posted into this run's API by `atropos-rollouts replay`
    (a supervised child named `replay`), to train on them again, re-scored or not."""

    run: str = Field(
        ...,
        description="The run directory whose stored groups are posted (relative to the "
        "YAML, like scripts).",
    )
    rescored: str | None = Field(
        None,
        description="A directory `atropos-rollouts rescore` wrote: its groups instead of "
        "the run's (relative to the YAML).",
    )
    steps: str | None = Field(
        None, description="'A:B': only the groups the run trained at steps A to B."
    )
    keep_uniform: bool = Field(
        False,
        description="Also post groups whose samples all scored the same (left out by "
        "default: no GRPO advantage, only a smaller step).",
    )
    max_restarts: int = Field(
        3, ge=0, description="Restarts after a crash (posting again is idempotent)."
    )

    @field_validator("steps", mode="before")
    @classmethod
    def _a_step_range(cls, value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, int):  # YAML 1.1 reads an unquoted 1:20 in base 60 (80)
            raise ValueError(
                f"YAML read the steps as the number {value}: quote them, as "
                'steps: "1:20" (or --set \'replay.steps="1:20"\')'
            )
        found = STEP_RANGE.match(str(value).strip())
        if found is None or int(found[1]) > int(found[2]):
            raise ValueError(f"give steps as A:B with A <= B (e.g. 1:20), not {value!r}")
        return f"{int(found[1])}:{int(found[2])}"


class LaunchConfig(Section):
    """A whole run: `atropos-launch CONFIG.yaml`."""

    model: str = Field(..., description="Policy: hub name, local directory, 'tiny' or 'tiny-vl'.")
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
    keys: Literal["per_run", "none"] = Field(
        "per_run",
        description="'per_run': a fresh key guards the API and the engine, handed to every "
        "child in its environment and written to <run_dir>/api-key; 'none': no key, for a "
        "trainer that sends none (upstream's).",
    )
    tracking: TrackingSection = Field(
        default_factory=TrackingSection,
        description="Experiment trackers (wandb, trackio) for the trainer and environments.",
    )
    api: ApiSection = Field(default_factory=ApiSection)
    engine: StandaloneEngineSection | None = Field(None, description="Optional standalone engine.")
    teacher: TeacherSection | None = Field(
        None, description="Optional distillation teacher (docs/trainer.md, Distillation)."
    )
    replay: ReplaySection | None = Field(
        None, description="Optional: post a stored run's groups into this run's API."
    )
    environments: list[EnvironmentSection] = Field(
        default_factory=list,
        validate_default=True,
        description="The environments; may be empty with a replay: section.",
    )
    trainer: TrainerSection = Field(default_factory=TrainerSection)

    @field_validator("environments")
    @classmethod
    def _something_feeds_the_trainer(
        cls, value: list[EnvironmentSection], info: ValidationInfo
    ) -> list[EnvironmentSection]:
        """Groups come from an environment that serves, or from a replay: (checked after
        `replay`, declared before this field)."""
        replay = info.data.get("replay", "failed")  # a replay: in error is named by itself
        if replay is not None or any(not e.evaluate_only for e in value):
            return value
        what = "every environment is evaluate_only" if value else "Field required"
        raise PydanticCustomError(
            "nothing_feeds_the_trainer",
            f"{what}: give an environment that samples for training, or a replay: "
            "section whose groups the trainer trains on",
        )


def read_config_data(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Any:
    """The YAML's data with each `--set KEY=VALUE` applied (not validated yet)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read: {exc}") from exc
    for override in overrides:
        apply_override(data, override)
    return data


def effective_text(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> str:
    """The YAML as written, or re-dumped with the overrides applied when there are any."""
    if not overrides:
        return Path(path).read_text(encoding="utf-8")
    return yaml.safe_dump(read_config_data(path, overrides), sort_keys=False)


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> LaunchConfig:
    data = read_config_data(path, overrides)
    try:
        return LaunchConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {describe_errors(exc, LaunchConfig)}") from exc


SCIENTIFIC = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def apply_override(data: Any, override: str) -> None:
    """`--set trainer.args.lr=1e-5`: set one key of the YAML's data, as TRL's CLI lets
    a flag beat its config file. The value is read as YAML (`8` is a number, `[a, b]` a
    list, `null` removes nothing but sets null); a number in the path indexes a list
    (`environments.0.env.group_size=8`). Missing mappings on the way are created, so an
    unknown key is refused by the same validation as one written in the file."""
    key, sep, text = override.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise ConfigError(f"--set {override!r}: write KEY=VALUE, e.g. trainer.args.lr=1e-5")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {override!r}: the value is not YAML ({exc})") from None
    if isinstance(value, str) and SCIENTIFIC.match(value):
        value = float(value)  # YAML 1.1 reads 1e-5 (no dot) as a string
    if not isinstance(data, dict):
        raise ConfigError(f"--set {override!r}: the config is not a mapping")
    node: Any = data
    for depth, part in enumerate(parts[:-1]):
        where = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            node = node[_list_index(node, part, where, override)]
        elif isinstance(node, dict):
            node = node.setdefault(part, {})
        else:
            raise ConfigError(f"--set {override!r}: {where} is a value, not a section")
    last = parts[-1]
    if isinstance(node, list):
        node[_list_index(node, last, key, override)] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError(f"--set {override!r}: {'.'.join(parts[:-1])} is a value, not a section")


def _list_index(items: list, part: str, where: str, override: str) -> int:
    if not part.isdigit() or int(part) >= len(items):
        raise ConfigError(
            f"--set {override!r}: {where} needs an index below {len(items)} (the list's length)"
        )
    return int(part)


SECRET_NAME = re.compile(r"(key|token|secret|password)$", re.IGNORECASE)
REDACTED = "<redacted>"


def redacted(value: Any) -> Any:
    """`value` with every mapping entry whose name ends in key, token, secret or password
    replaced by REDACTED: what the run directory and the report may show of a config."""
    if isinstance(value, dict):
        return {
            k: REDACTED if isinstance(k, str) and SECRET_NAME.search(k) and v else redacted(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redacted(v) for v in value]
    return value


def redacted_text(text: str) -> str:
    """The YAML as written, or re-dumped with its secrets redacted when it holds any."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    clean = redacted(data)
    return text if clean == data else yaml.safe_dump(clean, sort_keys=False)


def describe_errors(exc: ValidationError, model: type[BaseModel] | None = None) -> str:
    """Every problem at once; an unknown key of `model` with the closest known one."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "(top level)"
        if error["type"] == "extra_forbidden":
            near = closest_key(model, error["loc"]) if model is not None else None
            problems.append(f"unknown key '{where}'" + (f"; did you mean {near}?" if near else ""))
        else:
            problems.append(f"{where}: {error['msg']}")
    return "; ".join(problems)


def closest_key(model: type[BaseModel], loc: tuple[int | str, ...]) -> str | None:
    """The known key nearest the unknown one at `loc`: a sibling's spelling, or under
    trainer: the trainer's argument (`trainer.lr` is `trainer.args.lr`)."""
    parent: type[BaseModel] | None = model
    for part in loc[:-1]:
        if isinstance(part, int) or parent is None:
            continue
        field = parent.model_fields.get(part)
        annotation = field.annotation if field is not None else None
        inner: list[Any] = [*typing.get_args(annotation), annotation]
        parent = next((a for a in inner if isinstance(a, type) and issubclass(a, BaseModel)), None)
    if parent is None:
        return None
    key, prefix = str(loc[-1]), ".".join(str(p) for p in loc[:-1])
    known = list(parent.model_fields)
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return f"{prefix}.{close[0]}" if prefix else close[0]
    if parent is TrainerSection:
        from atroposlib.launch.resolving import declared_config

        trainer = declared_config(DEFAULT_TRAINER)
        names = list(leaf_fields(trainer)) if trainer is not None else []
        close = difflib.get_close_matches(key, names, n=1)
        return f"trainer.args.{close[0]}" if close else None
    return None
