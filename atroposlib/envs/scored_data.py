"""Building groups: from single rollouts, or from one prompt's chat samples.

The shapes (`ScoredDataGroup`, `ScoredDataItem`) are defined in `atroposlib.protocol`.
"""

from __future__ import annotations

from typing import Any

from atroposlib.protocol import (
    ITEM_FIELDS,
    WEIGHT_VERSIONS_FIELD,
    ScoredDataGroup,
    ScoredDataItem,
)

__all__ = [
    "ScoredDataGroup",
    "ScoredDataItem",
    "group_from_chat",
    "length_penalized",
    "stack_items",
]


def stack_items(items: list[ScoredDataItem]) -> ScoredDataGroup:
    """A group from single rollouts; optional keys only when every item has them."""
    group: ScoredDataGroup = {"tokens": [], "masks": [], "scores": []}
    for key in ITEM_FIELDS:
        values = [item.get(key) for item in items]
        if key in ("tokens", "masks") or (values and all(v is not None for v in values)):
            group[key] = values  # type: ignore[literal-required]
    group["scores"] = [item["scores"] for item in items]
    overrides = next((i.get("group_overrides") for i in items if i.get("group_overrides")), None)
    if overrides:
        group["group_overrides"] = overrides
    return group


def group_from_chat(
    messages: list[dict[str, str]],
    replies: list[str | None],
    nodes: list[Any],
    scores: list[float],
) -> ScoredDataGroup:
    """The usual group of one prompt's samples through `ManagedServer`.

    `nodes` (from `managed.get_state()["nodes"]`) carry the token ids, masks and
    sampling logprobs aligned with `replies`, the samples' texts; each conversation
    ends with its reply as the assistant turn. `weight_versions` is added when the
    engine labelled its samples (see `atroposlib.protocol.WEIGHT_VERSIONS_FIELD`).
    """
    group: ScoredDataGroup = {
        "tokens": [node.tokens for node in nodes],
        "masks": [node.masked_tokens for node in nodes],
        "scores": list(scores),
        "inference_logprobs": [node.logprobs for node in nodes],
        "messages": [messages + [{"role": "assistant", "content": reply}] for reply in replies],
    }
    versions = [(node.metadata or {}).get("weight_version") for node in nodes]
    if any(v is not None for v in versions):
        group[WEIGHT_VERSIONS_FIELD] = versions  # type: ignore[literal-required]
    return group


def length_penalized(scores: list[float], lengths: list[int], limit: int) -> list[float]:
    """Upstream's rule for a group that is all right (every score 1.0), which would
    otherwise teach nothing: full score up to half of `limit` tokens, then linearly less,
    down to 0.0 at `limit`. Any other group is returned unchanged."""
    if not scores or any(score != 1.0 for score in scores) or limit <= 0:
        return list(scores)
    threshold = limit / 2
    return [1.0 - min(1.0, max(0.0, (length - threshold) / threshold)) for length in lengths]
