"""What `handle_send_to_api` keeps of a rollout's groups, and where else they go.

The rules, upstream's: a group of the wrong size, a group whose scores are all equal
(with `ensure_scores_are_not_same`) and a group with a sequence over the trainer's
token limit are dropped and counted (`env/dropped_*`, one DEBUG line each, never one
line per group at INFO). A kept group gets the env's id and its own `group_id` from the
start, so the rollouts file and the trainer's record of the steps name it alike.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atroposlib.protocol import GROUP_ID_FIELD
from atroposlib.token_limit import exceeds_token_limit
from atroposlib.type_definitions import Item

if TYPE_CHECKING:
    from atroposlib.envs.base import BaseEnv
    from atroposlib.envs.scored_data import ScoredDataGroup

logger = logging.getLogger("atroposlib.envs")


DROP_REASONS = {
    "same_scores": "all its samples scored the same (ensure_scores_are_not_same: false keeps "
    "such groups)",
    "too_long": "a sequence was over the trainer's token limit",
    "wrong_size": "it did not hold group_size sequences",
    "none": "the rollout returned no group",
}
"""Why a group was dropped, in words: the `dropped_<reason>` counters, the run report."""


def drop(env: BaseEnv, reason: str, detail: str = "") -> None:
    env.stats[f"dropped_{reason}"] += 1
    # counted in stats (and logged each step); one line per group would flood the log
    logger.debug("group dropped (%s)%s", reason, f": {detail}" if detail else "")


def problem(env: BaseEnv, group: ScoredDataGroup, limit_applies: bool) -> tuple[str, str] | None:
    """Why `group` is dropped, if it is: (reason, detail)."""
    size = (group.get("group_overrides") or {}).get("group_size", env.config.group_size)
    if len(group["tokens"]) != size:
        return "wrong_size", f"{len(group['tokens'])} sequences, expected {size}"
    scores = group["scores"]
    if env.config.ensure_scores_are_not_same and len(set(scores)) <= 1 and len(scores) > 1:
        return "same_scores", ""
    limit = env.max_token_len
    if (
        limit > 0
        and limit_applies
        and any(exceeds_token_limit(len(t), limit) for t in group["tokens"])
    ):
        return "too_long", f"a sequence is over max_token_len {limit}"
    return None


async def kept_groups(
    env: BaseEnv,
    scored_data: ScoredDataGroup | list[ScoredDataGroup] | None,
    item: Item,
    limit_applies: bool,
) -> list[ScoredDataGroup]:
    """The groups to send, each stamped and recorded (lengths, the rollout table)."""
    groups = scored_data if isinstance(scored_data, list) else [scored_data]
    ready, scored = [], []
    for group in groups:
        if group is None:
            drop(env, "none")
            continue
        found = problem(env, group, limit_applies)
        scored.append(
            {"step": env.curr_step, "scores": group["scores"], "dropped": found and found[0]}
        )
        if found is not None:
            drop(env, *found)
            continue
        if env.config.include_messages and not group.get("messages"):
            # one conversation per sequence, as the API's model (and upstream) has it
            group["messages"] = [
                [{"role": "user", "content": env.tokenizer.decode(t)}] for t in group["tokens"]
            ]
        group["env_id"] = env.env_id
        group.setdefault(GROUP_ID_FIELD, uuid.uuid4().hex)  # type: ignore[misc]
        for tokens, masks in zip(group["tokens"], group["masks"], strict=True):
            env.completion_lengths.append(sum(1 for m in masks if m != -100) or len(tokens))
        await env.add_rollouts_for_wandb(group, item)
        ready.append(group)
    if env.config.data_path_to_save_scores and scored:
        append_lines(env.config.data_path_to_save_scores, scored)
    return ready


def append_groups(path: str, groups: list[ScoredDataGroup], item: Item = None) -> None:
    """`data_path_to_save_groups`: one JSON line per group, with the `item` it was rolled
    out from when that is JSON (so `atropos-rollouts rescore` can score it again; the
    API is not sent it)."""
    try:
        json.dumps(item)
    except (TypeError, ValueError):
        item = None
    if item is None:
        append_lines(path, groups)
        return
    append_lines(path, [group if "item" in group else {**group, "item": item} for group in groups])


def append_lines(path: str, records: Sequence[Mapping[str, Any]]) -> None:
    """One JSON line per record, appended (`data_path_to_save_groups`, `..._scores`)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "a") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")
