"""Read a run's stored groups, each with the step that trained it, without the API.

Design: an `atropos-launch` run already keeps everything this needs, in two files the
processes append to as they go. Each environment appends every group it sends to
`RUN_DIR/rollouts/<env>.jsonl` (the API's `ScoredData` JSON: tokens, masks, scores,
`inference_logprobs`, `weight_versions`, `group_id`, the chat as `messages` and, from a
`SingleTurnEnv`, the `item` it was scored against). The trainer appends, per step, the
ids of the groups it trained to `checkpoints/trained_groups.jsonl` (the trainer
contract; a step trained again after a resume counts once, its last record). Joining
the two on `group_id` gives every group its trained step; a group no step trained (still
queued when the run ended, or dropped as too stale) has step None.

The API's own store (`api-state/`) is not read: it deletes a group once a checkpoint
covers its step, so it holds the queue, not the history. A line a crash cut short is
skipped and counted, never fatal.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atroposlib.protocol import GROUP_ID_FIELD, WEIGHT_VERSIONS_FIELD
from atroposlib.trainer_contract import GROUPS_FILE, read_trained_groups
from atroposlib.viewer.recorded import ROLLOUTS, RecordedRunError, read_run
from atroposlib.weight_sync.versions import version_number

ROLLOUTS_DIR = ROLLOUTS
"""The run directory's folder of per-environment jsonl files (atropos-launch's layout)."""
CHECKPOINTS_DIR = "checkpoints"
"""The trainer's save path in a launched run: its trained_groups.jsonl is there."""


class StoreError(ValueError):
    """A run directory (or step, or environment) that cannot be used; one line."""


@dataclass(frozen=True)
class StoredGroup:
    """One group as its environment sent it, and where the run trained it."""

    env: str
    """The environment: its rollouts file's stem (the launcher's process name)."""
    data: dict[str, Any]
    """The group's JSON as written (ScoredData fields, `messages`, `item`, `group_id`)."""
    step: int | None
    """The trainer step that trained it; None if no step did."""

    @property
    def group_id(self) -> str | None:
        value = self.data.get(GROUP_ID_FIELD)
        return value if isinstance(value, str) else None

    @property
    def scores(self) -> list[float]:
        return [float(score) for score in self.data.get("scores") or []]

    @property
    def versions(self) -> list[int | None]:
        """Per sequence, the trainer step whose weights sampled it (None: not labelled)."""
        return [version_number(v) for v in self.data.get(WEIGHT_VERSIONS_FIELD) or []]

    @property
    def staleness(self) -> list[int]:
        """Per labelled sequence, how many steps older its weights were than the step
        that trained it; empty for a group no step trained."""
        if self.step is None:
            return []
        return [self.step - v for v in self.versions if v is not None]


@dataclass
class RunStore:
    """Every stored group of a run, in each environment's send order."""

    run_dir: Path
    groups: list[StoredGroup]
    skipped: dict[str, int] = field(default_factory=dict)
    """Environment -> lines of its file that could not be read (a crash mid-line)."""

    @property
    def environments(self) -> list[str]:
        return sorted({group.env for group in self.groups})

    @property
    def trained_steps(self) -> list[int]:
        return sorted({g.step for g in self.groups if g.step is not None})

    def select(
        self, env: str | None = None, steps: tuple[int, int] | None = None
    ) -> list[StoredGroup]:
        """The groups of `env` (every environment when None) trained at steps A..B
        (both included; every group, trained or not, when `steps` is None)."""
        if env is not None and env not in self.environments:
            raise StoreError(
                f"{self.run_dir} has no environment {env!r}; it has {', '.join(self.environments)}"
            )
        chosen = [g for g in self.groups if env is None or g.env == env]
        if steps is None:
            return chosen
        low, high = steps
        return [g for g in chosen if g.step is not None and low <= g.step <= high]

    def at_step(self, step: int, env: str | None = None) -> list[StoredGroup]:
        """The groups step `step` trained; StoreError naming the steps that exist."""
        chosen = self.select(env, (step, step))
        if not chosen:
            steps = self.trained_steps
            span = f"steps {steps[0]}..{steps[-1]}" if steps else "no steps"
            raise StoreError(f"step {step} trained no group in {self.run_dir} (it trained {span})")
        return chosen


def read_store(run_dir: str | Path) -> RunStore:
    """Every group a run directory holds, joined with the steps that trained them."""
    root = Path(run_dir)
    if not root.is_dir():
        raise StoreError(f"{root} is not a run directory (it does not exist)")
    files = sorted((root / ROLLOUTS_DIR).glob("*.jsonl"))
    if not files:
        raise StoreError(
            f"{root} holds no stored groups: no {ROLLOUTS_DIR}/*.jsonl (atropos-launch "
            "writes one per environment in a run directory)"
        )
    try:
        recorded = read_run(root)  # view-run's reader of the same files
    except RecordedRunError as error:
        raise StoreError(str(error)) from None
    trained = trained_steps_by_group(root)
    store = RunStore(root, [], {env: len(lines) for env, lines in recorded.skipped.items()})
    for env, found in recorded.groups.items():
        for data in found:
            gid = data.get(GROUP_ID_FIELD)
            step = trained.get(gid) if isinstance(gid, str) else None
            store.groups.append(StoredGroup(env, data, step))
    return store


def trained_steps_by_group(run_dir: Path) -> dict[str, int]:
    """group_id -> the step that trained it, from the trainer's record of its steps."""
    for path in (run_dir / CHECKPOINTS_DIR / GROUPS_FILE, run_dir / GROUPS_FILE):
        if path.is_file():
            return {gid: r.step for r in read_trained_groups(path) for gid in r.group_ids if gid}
    return {}


def iter_groups(run_dir: str | Path, env: str | None = None) -> Iterator[StoredGroup]:
    """The groups of a run (or of one environment), for a script: the library's reader."""
    yield from read_store(run_dir).select(env)


def parse_steps(text: str) -> tuple[int, int]:
    """ "A:B" (both included), "A:" (from A), ":B" or "N" as a (low, high) step range."""
    low, colon, high = text.partition(":")
    try:
        first = int(low) if low.strip() else 0
        last = int(high) if high.strip() else (2**31 if colon else first)
    except ValueError:
        raise StoreError(f"steps {text!r}: expected A:B, A:, :B or N (whole numbers)") from None
    if first > last:
        raise StoreError(f"steps {text!r}: the first step is after the last")
    return first, last
