"""What `atropos-launch` and a trainer agree on: settings in, metrics rows and events out.

Design: a trainer is a process the launcher starts as `python -m MODULE FLAGS`.
The contract is three things, all here, so any trainer can satisfy it:

- Settings in. The launcher passes every field of `LaunchSettings` as a
  `--kebab-case` flag, after the user's own `trainer.args`. A trainer module may
  expose `LAUNCH_CONFIG`, a pydantic model of all its flags; the launcher then
  checks the whole set at config time, before anything starts.
- Metrics out. One `MetricsRow` per optimizer step, appended to
  `<save_path>/metrics.jsonl` through `RunRecords.metrics`. The launcher's status
  line and report read `step`, `score_mean` and `loss`; any further fields ride along.
- Events out. Engine starts and restarts and saved checkpoints, as `TrainerEvent`
  records in `<save_path>/events.jsonl` through `RunRecords.event`, never as log text.
- Groups out (optional). The `group_id`s of each step's batch, as a
  `TrainedGroups` record in `<save_path>/trained_groups.jsonl`, written before that
  step's checkpoint. The launcher counts them against what environments delivered.
- Its engine out (optional). How it serves the policy, as the fields of
  `atroposlib.inference.launcher.EngineConfig` in `<save_path>/engine.json`
  (`write_engine_recipe`), written when it starts its first engine. The launcher
  serves the final checkpoint the same way to evaluate it once more at the last step
  (`launch/final_eval.py`): the trainer's own engine stops with it.
- A key in. With `keys: per_run` (the default) run-api wants the run's key, which
  the trainer finds in `$ATROPOS_API_KEY` and sends as `Authorization: Bearer KEY`.
  A trainer that sends none (upstream's) runs with `keys: none` in the YAML.
- Resume in. A trainer that exits non-zero is started again with `--resume` and the
  path of its latest `checkpoint_saved` event (or as first started, if none), so it
  must accept `--resume DIR`. Exit code 2 means "starting again cannot help" (bad
  flags, the API refused it): the launcher then stops the run instead.

A step trained again after a resume appends its records again: the last record of
a step is the one that counts (`read_metrics`, `read_trained_groups`).

Both files are append-only JSON lines; a reader skips a line still being written,
so a trainer that dies mid-write loses at most that line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

METRICS_FILE = "metrics.jsonl"
EVENTS_FILE = "events.jsonl"
GROUPS_FILE = "trained_groups.jsonl"
ENGINE_FILE = "engine.json"
FINAL_EXIT_CODE = 2
"""A trainer's exit code for "a restart would fail the same way"."""
LAUNCH_CONFIG_ATTRIBUTE = "LAUNCH_CONFIG"


class LaunchSettings(BaseModel):
    """The values the launcher decides once and hands to the trainer as flags."""

    model_name: str
    """The policy to train: a local directory or a hub name (the same one every process uses)."""
    served_model_name: str
    """The name environments send as `model` to the inference engine."""
    atropos_url: str
    """The trajectory API the trainer registers with and pulls batches from."""
    vllm_port: int
    """The inference engine's port: the one the trainer starts, or the launcher's own engine.
    Upstream's trainer flag (`--vllm-port`), whatever the engine: a trainer written for
    upstream takes it as it is (the example trainer also as `--engine-port`)."""
    save_path: str
    """Where checkpoints, `metrics.jsonl` and `events.jsonl` go."""
    seed: int
    """Seed of the trainer's random state."""
    training_steps: int = Field(ge=1)
    """Optimizer steps to run; the trainer exits 0 after the last one."""
    seq_len: int = Field(gt=0)
    """The run's token limit: the longest sequence the trainer trains on, registered with
    the API as `max_token_len`. Environments and the engine are checked against it."""
    log_format: str = "text"
    """Plain lines: the launcher prefixes each one with the process name."""
    inference_engine: str | None = None
    """`"none"` when the launcher runs the engine itself; the trainer must then start none."""
    num_engines: int | None = Field(None, ge=1)
    """Engines the trainer starts, on ports `vllm_port`, `vllm_port` + 1, ...; environments
    get them all. Given only when the YAML sets it (None: one, and no such flag)."""

    def flags(self) -> dict[str, Any]:
        """The settings as flag values (unset optional ones left out)."""
        return self.model_dump(exclude_none=True)


class MetricsRow(BaseModel):
    """One optimizer step, as the launcher reads it."""

    model_config = ConfigDict(extra="allow")

    step: int = Field(ge=1)
    """The step just finished, counting from 1."""
    score_mean: float
    """Mean score of the step's rollouts: what the launcher judges learning by."""
    loss: float
    """The step's training loss."""
    time: float | None = None
    """Unix time the step ended (`RunRecords` sets it): curves against wall time."""


ENV_SCORE_PREFIX = "score_mean/env_"
"""A metrics row's optional `score_mean/env_<env_id>`: one environment's mean score in
the step's batch (the launcher's report computes the same per environment name from
the rollouts and trained_groups.jsonl, so a trainer that omits it loses nothing)."""


class EventKind(str, Enum):
    ENGINE_STARTED = "engine_started"
    ENGINE_RESTARTED = "engine_restarted"
    ENGINE_RESTART_FAILED = "engine_restart_failed"
    ENGINE_CRASHED = "engine_crashed"
    """The trainer found its engine dead (and restarts it): a restart after a crash."""
    CHECKPOINT_SAVED = "checkpoint_saved"
    WEIGHT_SYNC_FAILED = "weight_sync_failed"
    """A hot push the engine did not take; the trainer restarts the engine instead."""


class TrainerEvent(BaseModel):
    """Something the launcher counts or shows: an engine (re)start, a checkpoint."""

    kind: EventKind
    step: int = Field(ge=0)
    """The trainer's step when it happened."""
    time: float = Field(default_factory=time.time)
    detail: dict[str, Any] = Field(default_factory=dict)
    """Free-form facts, e.g. `{"path": ...}` for a checkpoint or `{"reason": ...}`."""


class TrainedGroups(BaseModel):
    """The groups one optimizer step trained on (None for a group without an id)."""

    step: int = Field(ge=1)
    group_ids: list[str | None]
    skipped_ids: list[str | None] = Field(default_factory=list)
    """Groups of the step's batch that it could not train on (a NaN at a trained
    position, a token id out of the vocabulary): consumed and counted, not lost."""


def metrics_path(save_path: str | Path) -> Path:
    return Path(save_path) / METRICS_FILE


def events_path(save_path: str | Path) -> Path:
    return Path(save_path) / EVENTS_FILE


def groups_path(save_path: str | Path) -> Path:
    return Path(save_path) / GROUPS_FILE


RECIPE_LEFT_OUT = ("port", "log_path")
"""What a recipe does not carry: where one engine ran and logged."""


def write_engine_recipe(save_path: str | Path, engine: dict[str, Any]) -> None:
    """`engine.json`: the trainer's engine settings (an `EngineConfig`'s fields, without
    the weight bridge's flags and keys), so its policy can be served again."""
    recipe = {k: v for k, v in engine.items() if k not in RECIPE_LEFT_OUT}
    path = Path(save_path) / ENGINE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(recipe, indent=2))


def read_engine_recipe(save_path: str | Path) -> dict[str, Any] | None:
    """The trainer's engine settings, or None (a trainer that wrote none, or ran none)."""
    try:
        recipe = json.loads((Path(save_path) / ENGINE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return recipe if isinstance(recipe, dict) else None


class RunRecords:
    """The trainer's writer for both files; lines are flushed one at a time."""

    def __init__(self, save_path: str | Path) -> None:
        self.metrics_path = metrics_path(save_path)
        self.events_path = events_path(save_path)
        self.groups_path = groups_path(save_path)

    def metrics(self, step: int, values: dict[str, Any]) -> MetricsRow:
        row = MetricsRow.model_validate({"time": time.time(), **values, "step": step})
        _append(self.metrics_path, row)
        return row

    def event(self, kind: EventKind, step: int, **detail: Any) -> TrainerEvent:
        record = TrainerEvent(kind=kind, step=step, detail=detail)
        _append(self.events_path, record)
        return record

    def trained_groups(
        self, step: int, group_ids: list[str | None], skipped_ids: Sequence[str | None] = ()
    ) -> TrainedGroups:
        record = TrainedGroups(step=step, group_ids=group_ids, skipped_ids=list(skipped_ids))
        _append(self.groups_path, record)
        return record


def _append(path: Path, record: BaseModel) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as out:
        out.write(record.model_dump_json() + "\n")


Record = TypeVar("Record", bound=BaseModel)


class RecordTail:
    """Reads the complete lines appended since the last call; bad lines are skipped."""

    def __init__(self, path: Path, model: type[Record]) -> None:
        self.path, self.model, self.offset = path, model, 0

    def read_new(self) -> list[Any]:
        if not self.path.exists():
            return []
        found = []
        with open(self.path, "rb") as records:
            records.seek(self.offset)
            for line in records:
                if not line.endswith(b"\n"):
                    break  # being written; read it next time
                self.offset += len(line)
                try:
                    found.append(self.model.model_validate(json.loads(line)))
                except (json.JSONDecodeError, ValidationError):
                    continue
        return found


def _last_per_step(records: list[Any]) -> list[Any]:
    """A step trained again after a resume replaces its earlier record; sorted by step."""
    return sorted({r.step: r for r in records}.values(), key=lambda r: r.step)


def read_metrics(path: Path) -> list[MetricsRow]:
    return _last_per_step(RecordTail(path, MetricsRow).read_new())


def read_trained_groups(path: Path) -> list[TrainedGroups]:
    return _last_per_step(RecordTail(path, TrainedGroups).read_new())


def read_events(path: Path) -> list[TrainerEvent]:
    return RecordTail(path, TrainerEvent).read_new()
