"""`export`: stored groups as an SFT or DPO dataset, or as groups, with no environment.

`sft` and `dpo` are `atropos-sft-gen --from-run` and `atropos-dpo-gen --from-run` on the
chosen groups (an environment, a span of steps, a re-scored dataset): the same rules,
records and de-duplication (`atroposlib.datagen`). `groups` writes each chosen group's
JSON as stored, with the step that trained it, for any tool that reads ScoredData lines
(view-run, jsonl2html).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from atroposlib.datagen.finished import RunReader, run_finished
from atroposlib.datagen.records import dpo_rules, sft_rules
from atroposlib.datagen.settings import DpoGenSettings, SftGenSettings
from atroposlib.datagen.writer import OutputError, check_output
from atroposlib.rollouts.store import StoredGroup

Format = Literal["sft", "dpo", "groups"]
FORMATS: tuple[Format, ...] = ("sft", "dpo", "groups")


@dataclass(frozen=True)
class Chosen:
    """The chosen groups in the shape the data tools read (view-run's RecordedRun)."""

    groups: dict[str, list[dict[str, Any]]]
    skipped_count: int = 0


def export(
    groups: list[StoredGroup],
    run_dir: Path,
    form: Format,
    out: Path,
    resolve_model: Callable[[str], str],
    num_seqs_to_save: int | None = None,
    tokenizer: str | None = None,
    save_messages: bool | None = None,
) -> int:
    """Write the dataset; the exit status (the data tools' lines on stderr)."""
    if form == "groups":
        return _groups(groups, out)
    chosen = Chosen({})
    for group in groups:
        chosen.groups.setdefault(group.env, []).append(group.data)
    reader = RunReader(lambda _path: chosen, lambda _run: [], resolve_model)
    given: dict[str, Any] = {"from_run": str(run_dir)}
    if num_seqs_to_save is not None:
        given["num_seqs_to_save"] = num_seqs_to_save
    if tokenizer is not None:
        given["tokenizer"] = tokenizer
    if save_messages is not None:
        given["save_messages"] = save_messages
    if form == "sft":
        sft = SftGenSettings(**given)
        return run_finished("atropos-rollouts export", str(out), sft, sft_rules(sft), "seq", reader)
    dpo = DpoGenSettings(**given)
    return run_finished("atropos-rollouts export", str(out), dpo, dpo_rules(dpo), "pair", reader)


def _groups(groups: list[StoredGroup], out: Path) -> int:
    try:
        check_output(out, False)
    except OutputError as error:
        print(f"atropos-rollouts export: error: {error}", file=sys.stderr)
        return 1
    with open(out, "w") as handle:
        for group in groups:
            handle.write(json.dumps({**group.data, "step": group.step}) + "\n")
    print(f"atropos-rollouts export: wrote {len(groups)} groups to {out}", file=sys.stderr)
    return 0
