"""The group ledger finds a lost group and a group trained twice by id, even when totals match."""

from __future__ import annotations

import json

from atroposlib.api.store import GroupRow, SQLiteStore, WriteSet
from atroposlib.delivery_ledger import DELIVERED_LEDGER
from atroposlib.launch.ledger import account
from atroposlib.trainer_contract import RunRecords, groups_path


def write_delivered(env_dir, posts: list[list[str]]) -> None:
    env_dir.mkdir(parents=True)
    lines = [json.dumps({"key": f"k{i}", "group_ids": ids}) for i, ids in enumerate(posts)]
    (env_dir / DELIVERED_LEDGER).write_text("\n".join(lines) + '\n{"key": "cut sh')


def store_with(state_dir, queued: list[str], leased: list[str]) -> None:
    store = SQLiteStore(state_dir)
    rows = [
        (GroupRow(id=n, env_id=0, size=2, order=n, buffered=False), group_id)
        for n, group_id in enumerate(queued + leased)
    ]
    body = lambda group_id: json.dumps({"tokens": [[1]], "group_id": group_id}).encode()  # noqa: E731
    store.write(WriteSet(inserts=[(row, body(group_id)) for row, group_id in rows]))
    store.lease([row.id for row, _ in rows[len(queued) :]], step=3, kv={})
    store.close()


def test_a_resumed_step_counts_once_and_losses_and_duplicates_are_named(tmp_path):
    write_delivered(tmp_path / "env-state" / "a", [["g1"], ["g2", "g3"]])
    write_delivered(tmp_path / "env-state" / "b", [["g4"], ["g5"], ["g6"]])
    records = RunRecords(tmp_path / "checkpoints")
    records.trained_groups(1, ["g1", "g2"])
    records.trained_groups(2, ["g3", "g4"])  # trained, then the trainer died ...
    records.trained_groups(2, ["g3", "g4"])  # ... and trained step 2 again after --resume
    records.trained_groups(3, ["g4", None])  # g4 twice in the lineage; one group without id
    store_with(tmp_path / "api-state", queued=["g6"], leased=["g4"])

    groups = account(
        tmp_path / "env-state", groups_path(tmp_path / "checkpoints"), tmp_path / "api-state"
    )
    assert groups.delivered == {"g1", "g2", "g3", "g4", "g5", "g6"}
    assert groups.queued == {"g6"}  # the leased g4 belongs to a trained step
    assert groups.lost == {"g5"}
    assert groups.duplicated == {"g4"}
    assert groups.trained_without_id == 1
    assert groups.numbers() == {
        "delivered": 6,
        "trained": 4,
        "queued_at_end": 1,
        "lost": 1,
        "duplicated": 1,
        "skipped": 0,
        "trained_without_id": 1,
    }
    assert "lost 1, trained twice 1" in groups.line()


def test_without_a_durable_store_the_losses_are_unknown_not_zero(tmp_path):
    write_delivered(tmp_path / "env-state" / "a", [["g1"], ["g2"]])
    RunRecords(tmp_path / "checkpoints").trained_groups(1, ["g1"])
    groups = account(tmp_path / "env-state", groups_path(tmp_path / "checkpoints"), None)
    assert groups.lost is None and groups.numbers()["lost"] is None
    assert "lost unknown (ephemeral API)" in groups.line()


def test_steps_after_the_newest_checkpoint_are_not_in_the_lineage(tmp_path):
    """A trainer that died after step 2 with a checkpoint at 1 and was not resumed: step 2's
    groups are still leased in the store for a resume, so they are queued, not lost."""
    write_delivered(tmp_path / "env-state" / "a", [["g1"], ["g2"], ["g3"]])
    records = RunRecords(tmp_path / "checkpoints")
    records.trained_groups(1, ["g1"])
    records.trained_groups(2, ["g2"])
    store_with(tmp_path / "api-state", queued=["g3"], leased=["g2"])  # leased to step 3 > 1
    groups = account(
        tmp_path / "env-state",
        groups_path(tmp_path / "checkpoints"),
        tmp_path / "api-state",
        kept_through=1,
    )
    assert set(groups.trained) == {"g1"} and groups.queued == {"g2", "g3"}
    assert groups.lost == set() and groups.duplicated == set()
