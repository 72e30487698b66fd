"""A run directory as `atropos-launch` leaves it, for the `atropos-rollouts` tests.

Groups are built by the environments' own code (tests/support/recorded_runs.py's
`chat_group`, `append_groups` with the item each was scored against) and the trainer's
record of its steps by the trainer contract's own writer (`RunRecords`), so the store
reads what a real run writes. Answers are mod-10 sums, so a reward can be checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from atroposlib.envs.sending import append_groups
from atroposlib.protocol import WEIGHT_VERSIONS_FIELD
from atroposlib.trainer_contract import RunRecords
from tests.support.recorded_runs import chat_group

REWARDS = Path(__file__).with_name("rewards_for_tests.py")
"""Rewards a rescore test names by path (`REWARDS:right`)."""
STEPS = 3
GROUPS_PER_STEP = 2
UNTRAINED = 1
"""Groups sent after the last step: queued when the run ended, never trained."""


def problem(index: int) -> tuple[int, int]:
    return index % 10, (3 * index + 1) % 10


def arithmetic_group(index: int, version: int) -> tuple[dict[str, Any], dict[str, int]]:
    """Four replies to "a + b mod 10": right, right + 1 (twice), and a wrong one, scored
    1.0 for right + 1 (a reward that paid for the wrong answer)."""
    a, b = problem(index)
    right, plus_one = (a + b) % 10, (a + b + 1) % 10
    replies = [str(right), str(plus_one), str(plus_one), str((a + b + 5) % 10)]
    group = chat_group(f"What is {a} + {b} mod 10?", replies, [0.0, 1.0, 1.0, 0.0])
    group[WEIGHT_VERSIONS_FIELD] = [str(version)] * len(replies)
    return group, {"a": a, "b": b}


def write_stored_run(run_dir: Path) -> Path:
    """`STEPS` trained steps of `GROUPS_PER_STEP` groups each (sampled one step before the
    step that trained them), then `UNTRAINED` groups no step trained."""
    path = str(run_dir / "rollouts" / "mod_arithmetic.jsonl")
    records = RunRecords(run_dir / "checkpoints")
    index = 0
    for step in range(1, STEPS + 1):
        ids = []
        for _ in range(GROUPS_PER_STEP):
            group, item = arithmetic_group(index, version=step - 1)
            append_groups(path, [group], item)
            ids.append(group["group_id"])
            index += 1
        records.trained_groups(step, ids)
    for _ in range(UNTRAINED):
        group, item = arithmetic_group(index, version=STEPS)
        append_groups(path, [group], item)
        index += 1
    (run_dir / "config.yaml").write_text("model: tiny\n")
    return run_dir
