"""Keep multi-step episodes within the token budget: shorten reasoning, drop old turns.

A game environment feeds each step's conversation back to the model, so a long
``<think>`` block or a long history grows every later prompt. Two levers, both
applied the way Atropos environments (blackjack, rubik's cube) expect:

- ``truncate_thinking`` keeps only the end of a ``<think>`` block (its last
  paragraph when that fits, else its last tokens), counted with the real tokenizer,
  because the conclusion of the reasoning matters more than how it began;
- ``ensure_trajectory_token_limit`` drops the oldest turns after the system
  prompt, the same number from every alternative of a step so that they stay
  comparable, re-tokenizes, and discards a step that still does not fit.

``ScoredDataGroup`` here is a plain dict; steps also carry ``seed`` and
``parsed_actions``, which game environments add.
"""

from __future__ import annotations

import logging
from typing import Any

from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

__all__ = ["ensure_trajectory_token_limit", "strip_thinking", "truncate_thinking"]

logger = logging.getLogger(__name__)

ScoredDataGroup = dict[str, Any]
"""A step's group in `ScoredDataGroup`'s shape (atroposlib.protocol), read as a dict: utils
sits below the protocol and does not import it."""

THINK_START = "<think>"
THINK_END = "</think>"
ELLIPSIS = "..."
AGENT_ROLES = ("agent", "assistant")
OBSERVATION_ROLE = "environment"


def _think_span(text: str) -> tuple[int, int] | None:
    """Start of the first ``<think>`` and of the first ``</think>``, when in that order."""
    start, end = text.find(THINK_START), text.find(THINK_END)
    if start == -1 or end == -1 or start > end:
        return None
    return start, end


def strip_thinking(response_text: str) -> str:
    """The response without its ``<think>...</think>`` block (unchanged when there is none).

    The text around the block is kept as is, whitespace included.
    """
    span = _think_span(response_text)
    if span is None:
        return response_text
    start, end = span
    return response_text[:start] + response_text[end + len(THINK_END) :]


def _kept_think_tokens(
    tokenizer: Any, content: str, tokens: list[int], max_think_tokens: int
) -> list[int]:
    """What stays of an over-long think block: its last paragraph if that fits, else its tail."""
    paragraphs = [p.strip() for p in content.split("\n\n") if p.strip()]
    if paragraphs and len(paragraphs[-1]) < len(content):
        last = tokenizer.encode(paragraphs[-1], add_special_tokens=False)
        if len(last) <= max_think_tokens:
            return list(last)
    return list(tokens[len(tokens) - max_think_tokens :]) if max_think_tokens > 0 else []


def truncate_thinking(response_text: str, tokenizer: Any, max_think_tokens: int) -> str:
    """Shorten the ``<think>`` block of a response to at most ``max_think_tokens`` tokens.

    The block is rewritten as ``<think>\\n{content}\\n</think>`` (``<think></think>``
    when empty); shortened content starts with ``"... "``. A response without a
    well-formed block, or one the tokenizer fails on, is returned unchanged.
    """
    span = _think_span(response_text) if isinstance(response_text, str) else None
    if span is None:
        return response_text
    start, end = span
    before = response_text[: start + len(THINK_START)]
    after = response_text[end:]
    content = response_text[start + len(THINK_START) : end].strip()
    if not content:
        return before + after
    try:
        tokens = tokenizer.encode(content, add_special_tokens=False)
        truncated = len(tokens) > max_think_tokens
        if truncated:
            tokens = _kept_think_tokens(tokenizer, content, tokens, max_think_tokens)
        kept = tokenizer.decode(tokens, skip_special_tokens=True)
    except Exception:
        logger.exception("truncate_thinking failed on %.200r; keeping it whole", response_text)
        return response_text
    if truncated and kept.strip():
        kept = f"{ELLIPSIS} {kept.lstrip()}"
    kept = kept.strip()
    if not kept or kept == ELLIPSIS:
        return before + after
    return f"{before}\n{kept}\n{after}"


def _longest(token_lists: list[Any]) -> int:
    return max((len(t) for t in token_lists if isinstance(t, list)), default=0)


def _is_complete(step: Any) -> bool:
    return bool(
        isinstance(step, dict)
        and step.get("messages")
        and step.get("tokens")
        and step.get("masks")
        and step.get("seed") is not None
        and step.get("parsed_actions") is not None
    )


def _droppable(messages: list[dict]) -> int:
    """How many messages the next round should drop from after the system prompt (0: none).

    The last agent reply, and the observation just before it, always stay; an old
    observation is dropped together with the agent reply that answered it.
    """
    kept_at_end = 0
    if len(messages) > 1 and messages[-1].get("role") in AGENT_ROLES:
        kept_at_end = 2 if len(messages) > 2 and messages[-2].get("role") == OBSERVATION_ROLE else 1
    available = len(messages) - 1 - kept_at_end
    if available <= 0:
        return 0
    pair = (
        available >= 2
        and messages[1].get("role") == OBSERVATION_ROLE
        and messages[2].get("role") in AGENT_ROLES
    )
    return 2 if pair else 1


def _shorten_step(
    step: ScoredDataGroup, tokenizer: Any, limit: int, index: int
) -> dict[str, Any] | None:
    """The step with its alternatives' oldest turns dropped until all fit; None if they cannot."""
    messages = [list(alternative) for alternative in step["messages"]]
    tokens: list[list[int]] = [list(t) for t in step["tokens"]]
    masks: list[list[int]] = [list(m) for m in step["masks"]]
    longest = _longest(tokens)
    while longest > limit:
        counts = [_droppable(alternative) for alternative in messages]
        if not any(counts):
            break
        drop = min(c for c in counts if c > 0)
        try:
            retokenized = []
            for alternative, count in zip(messages, counts, strict=True):
                # Never cut into what an alternative must keep, even when the others can lose more.
                del alternative[1 : 1 + min(drop, count)]
                retokenized.append(tokenize_for_trainer(tokenizer, alternative))
        except Exception as error:
            logger.error("Step %d: re-tokenizing after dropping turns failed: %s", index, error)
            return None
        tokens = [r["tokens"] for r in retokenized]
        masks = [r["masks"] for r in retokenized]
        longest = _longest(tokens)
    if longest > limit:
        logger.warning(
            "Step %d: discarded, %d tokens still exceed the limit of %d", index, longest, limit
        )
        return None
    return {
        "seed": step["seed"],
        "messages": messages,
        "tokens": tokens,
        "masks": masks,
        "scores": step.get("scores"),
        "parsed_actions": step.get("parsed_actions"),
    }


def ensure_trajectory_token_limit(
    trajectory: list[ScoredDataGroup], tokenizer: Any, max_trajectory_tokens: int
) -> list[ScoredDataGroup]:
    """The steps of ``trajectory`` whose every alternative fits in ``max_trajectory_tokens``.

    A step that fits is kept as is. One that does not loses its oldest turns (after
    the system prompt; the last observation and agent reply stay), the same number
    in every alternative, and is re-tokenized with ``tokenize_for_trainer``; the
    shortened step keeps only ``seed``, ``messages``, ``tokens``, ``masks``,
    ``scores`` and ``parsed_actions``. Steps that still do not fit, or that lack
    any of the first four or ``parsed_actions``, are dropped. The input is not modified.
    """
    if not trajectory:
        return trajectory
    kept: list[ScoredDataGroup] = []
    for index, step in enumerate(trajectory):
        if not _is_complete(step):
            logger.warning("Step %d lacks messages, tokens, masks, seed or parsed_actions", index)
            continue
        if _longest(step["tokens"]) <= max_trajectory_tokens:
            kept.append(step)
            continue
        shortened = _shorten_step(step, tokenizer, max_trajectory_tokens, index)
        if shortened is not None:
            kept.append(shortened)
    if len(kept) < len(trajectory):
        logger.warning(
            "Token limit %d: kept %d of %d steps", max_trajectory_tokens, len(kept), len(trajectory)
        )
    return kept
