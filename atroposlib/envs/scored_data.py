"""The shapes environments build: a scored group of rollouts, or one scored rollout.

TypedDicts (plain dicts at runtime) with the trajectory API's field names.
"""

from __future__ import annotations

from typing import Any, TypedDict


class ScoredDataGroup(TypedDict, total=False):
    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    advantages: list[list[float]] | None
    ref_logprobs: list[list[float]] | None
    messages: list[Any] | None
    generation_params: dict[str, Any] | None
    inference_logprobs: list[list[float]] | None
    group_overrides: dict[str, Any] | None
    overrides: list[dict[str, Any]] | None
    images: Any
    distill_token_ids: list[list[list[int]]] | None
    distill_logprobs: list[list[list[float]]] | None
    env_id: int | None


class ScoredDataItem(TypedDict, total=False):
    tokens: list[int]
    masks: list[int]
    scores: float
    advantages: list[float] | None
    ref_logprobs: list[float] | None
    messages: Any
    inference_logprobs: list[float] | None
    group_overrides: dict[str, Any] | None
    overrides: dict[str, Any] | None
    images: Any
    distill_token_ids: list[list[int]] | None
    distill_logprobs: list[list[float]] | None


# Per-sequence keys copied from items into a group (scores handled apart).
ITEM_TO_GROUP_KEYS = (
    "tokens",
    "masks",
    "advantages",
    "ref_logprobs",
    "messages",
    "inference_logprobs",
    "overrides",
    "images",
    "distill_token_ids",
    "distill_logprobs",
)


def stack_items(items: list[ScoredDataItem]) -> ScoredDataGroup:
    """A group from single rollouts; optional keys only when every item has them."""
    group: ScoredDataGroup = {"tokens": [], "masks": [], "scores": []}
    for key in ITEM_TO_GROUP_KEYS:
        values = [item.get(key) for item in items]
        if key in ("tokens", "masks") or (values and all(v is not None for v in values)):
            group[key] = values  # type: ignore[literal-required]
    group["scores"] = [item["scores"] for item in items]
    overrides = next((i.get("group_overrides") for i in items if i.get("group_overrides")), None)
    if overrides:
        group["group_overrides"] = overrides
    return group


def group_from_chat(
    messages: list[dict[str, str]], choices: list[Any], nodes: list[Any], scores: list[float]
) -> ScoredDataGroup:
    """The usual group of one prompt's samples through `ManagedServer`.

    `nodes` (from `managed.get_state()["nodes"]`) carry the token ids, masks and
    sampling logprobs aligned with `choices`; each conversation ends with its
    sample as the assistant turn.
    """
    return {
        "tokens": [node.tokens for node in nodes],
        "masks": [node.masked_tokens for node in nodes],
        "scores": list(scores),
        "inference_logprobs": [node.logprobs for node in nodes],
        "messages": [
            messages + [{"role": "assistant", "content": choice.message.content}]
            for choice in choices
        ],
    }
