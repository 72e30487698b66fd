"""Where every acknowledged group went: trained once, still queued, or lost.

Three records, all written by the processes as they work, so a crash of any one
of them leaves the others' intact:

- what environments were told 200 for: each env client's delivery ledger
  (`atroposlib.delivery_ledger`), under the run's `env-state/`;
- what the trainer trained on: `trained_groups.jsonl` (the trainer contract), the
  last record of each step counting, since a resumed trainer trains a step again;
- what is still queued in the API's durable store when the run ends, read through the
  store's own query (`atroposlib.api.store.queued_group_ids`).

A group is lost when it was acknowledged and is neither trained, skipped by the
trainer as untrainable (counted apart), nor queued, and
duplicated when the final training lineage holds it twice. Ids are compared, not
totals, so a loss and a duplicate cannot cancel out. Steps after the newest
checkpoint (a trainer that died and was not resumed) are not in that lineage:
their groups stay leased in the API's store for a resume, so they count as queued.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atroposlib.api.store import queued_group_ids
from atroposlib.delivery_ledger import delivered_ids
from atroposlib.trainer_contract import read_trained_groups


@dataclass
class GroupAccount:
    delivered: set[str] = field(default_factory=set)
    trained: Counter[str] = field(default_factory=Counter)
    skipped: set[str] = field(default_factory=set)
    """Groups the trainer consumed but could not train on (RUN-3 of the review)."""
    queued: set[str] | None = None
    """Groups left in the API's store (None: it ran ephemeral, or the store is unreadable)."""
    trained_without_id: int = 0

    @property
    def lost(self) -> set[str] | None:
        if self.queued is None:
            return None
        return self.delivered - set(self.trained) - self.skipped - self.queued

    @property
    def duplicated(self) -> set[str]:
        return {group for group, times in self.trained.items() if times > 1}

    def numbers(self) -> dict[str, Any]:
        lost = self.lost
        return {
            "delivered": len(self.delivered),
            "trained": len(self.trained),
            "queued_at_end": None if self.queued is None else len(self.queued),
            "lost": None if lost is None else len(lost),
            "duplicated": len(self.duplicated),
            "skipped": len(self.skipped),
            "trained_without_id": self.trained_without_id,
        }

    def line(self) -> str:
        numbers = self.numbers()
        unknown = "unknown (ephemeral API)"
        queued = numbers["queued_at_end"]
        lost = numbers["lost"]
        # under 76 characters: one line of the closing panel in an 80-column terminal
        return (
            f"groups: {numbers['delivered']} acknowledged, {numbers['trained']} trained, "
            f"{unknown if queued is None else queued} queued, "
            f"lost {unknown if lost is None else lost}, trained twice {numbers['duplicated']}"
            + (f", skipped as untrainable {numbers['skipped']}" if numbers["skipped"] else "")
        )


def account(
    env_state_root: Path,
    trained_groups: Path,
    api_state_dir: Path | None,
    kept_through: int | None = None,
) -> GroupAccount:
    """`kept_through`: the newest checkpoint's step; later steps are not in the lineage."""
    result = GroupAccount(delivered=delivered_ids(env_state_root))
    for record in read_trained_groups(trained_groups):
        if kept_through is not None and record.step > kept_through:
            continue
        result.trained.update(i for i in record.group_ids if i is not None)
        result.skipped.update(i for i in record.skipped_ids if i is not None)
        result.trained_without_id += sum(i is None for i in record.group_ids)
    if api_state_dir is not None and api_state_dir.exists():
        try:
            result.queued = queued_group_ids(api_state_dir, kept_through)
        except Exception:
            result.queued = None
    return result
