"""The groups a finished run wrote, read from its files for `view-run RUN_DIR`.

Every environment of an `atropos-launch` run appends each group it sends to
`RUN_DIR/rollouts/<env>.jsonl` (`data_path_to_save_groups`: the API's ScoredData plus
`messages`), in send order. Those files are the whole record, so looking at a finished
run needs no API. A line the writer cut short (a crash) is skipped and counted, never
fatal; a path that holds no rollouts at all is a `RecordedRunError` with one sentence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atroposlib.viewer.jsonl2html import read_groups

ROLLOUTS = "rollouts"
"""The run directory's folder of per-environment jsonl files (atropos-launch's layout)."""


class RecordedRunError(ValueError):
    """A path that cannot be shown (message for the user, one line)."""


@dataclass
class RecordedRun:
    """Each environment's groups in the order it sent them, and what could not be read."""

    source: Path
    groups: dict[str, list[dict[str, Any]]]
    """Environment (its file's stem) -> its groups, in the order of its file."""
    skipped: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    """Environment -> (line number, why) of each unreadable line of its file."""

    @property
    def group_count(self) -> int:
        return sum(len(groups) for groups in self.groups.values())

    @property
    def skipped_count(self) -> int:
        return sum(len(lines) for lines in self.skipped.values())


def rollout_files(path: Path) -> list[Path]:
    """The jsonl files to show: `path` itself when it is a file, else the `*.jsonl` of
    `path/rollouts` (a run directory) or of `path` (that folder, named directly)."""
    if not path.exists():
        raise RecordedRunError(f"{path} does not exist")
    if not path.is_dir():
        return [path]
    folder = path / ROLLOUTS if (path / ROLLOUTS).is_dir() else path
    files = sorted(p for p in folder.glob("*.jsonl") if p.is_file())
    if not files:
        raise RecordedRunError(
            f"{path} holds no rollouts: no {ROLLOUTS}/*.jsonl (what atropos-launch writes "
            "in a run directory) and no .jsonl files of groups"
        )
    return files


def read_run(path: Path) -> RecordedRun:
    """Every group under `path` (see `rollout_files`), by environment."""
    run = RecordedRun(source=path, groups={})
    for file in rollout_files(path):
        try:
            groups, skipped = read_groups(file)
        except OSError as error:
            raise RecordedRunError(f"cannot read {file}: {error.strerror or error}") from None
        run.groups[file.stem] = groups
        if skipped:
            run.skipped[file.stem] = skipped
    if not run.group_count:
        unreadable = f", {run.skipped_count} unreadable line(s) skipped" if run.skipped else ""
        raise RecordedRunError(f"{path} holds no groups yet{unreadable}")
    run.groups = {env: groups for env, groups in run.groups.items() if groups}
    return run


def skipped_lines(run: RecordedRun) -> list[str]:
    """One sentence per file with unreadable lines: how many, and the first one's why."""
    lines = []
    for env, skipped in run.skipped.items():
        number, why = skipped[0]
        lines.append(
            f"{env}.jsonl: skipped {len(skipped)} unreadable line(s) (line {number}: {why})"
        )
    return lines
