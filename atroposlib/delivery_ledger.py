"""What an environment's client writes when the API acknowledges a post, and how the
launcher reads it back: the delivered half of a run's group account.

Each env client appends one `DeliveredGroups` line per acknowledged post to
`delivered.jsonl` beside its spool (a replayed key may appear twice). `atropos-launch`
counts those ids against the trainer's `TrainedGroups` (atroposlib.trainer_contract)
and the API's queue (`atroposlib.api.store.queued_group_ids`). Append-only JSON lines,
so a process killed mid-write loses at most that line, which the reader skips.
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

DELIVERED_LEDGER = "delivered.jsonl"


class DeliveredGroups(BaseModel):
    """One acknowledged post: its idempotency key and the ids of its groups."""

    time: float = Field(default_factory=time.time)
    key: str | None = None
    group_ids: list[str | None]


def ledger_path(spool_dir: Path) -> Path:
    """The ledger of the env client whose spool is `spool_dir` (it sits beside it)."""
    return spool_dir.parent / DELIVERED_LEDGER


def record_delivered(ledger: Path, key: str | None, group_ids: list[str | None]) -> None:
    with open(ledger, "a") as out:
        out.write(DeliveredGroups(key=key, group_ids=group_ids).model_dump_json() + "\n")


def delivered_ids(env_state_root: Path) -> set[str]:
    """Every group id any env client under `env_state_root` was told 200 for."""
    ids: set[str] = set()
    for ledger in sorted(env_state_root.rglob(DELIVERED_LEDGER)):
        for line in ledger.read_text().splitlines():
            try:
                record = DeliveredGroups.model_validate_json(line)
            except ValidationError:
                continue  # a line cut short by a kill
            ids.update(i for i in record.group_ids if i is not None)
    return ids
