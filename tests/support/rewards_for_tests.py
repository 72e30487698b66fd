"""Rewards `atropos-rollouts rescore` is pointed at by path in the tests."""

from __future__ import annotations

from typing import Any


def right(completions: list[str], a: list[int], b: list[int], **_: Any) -> list[float]:
    rows = zip(completions, a, b, strict=True)
    return [1.0 if c.strip() == str((x + y) % 10) else 0.0 for c, x, y in rows]


def raises_on_fives(completions: list[str], **_: Any) -> list[float]:
    """Raises for a completion ending in 5: a reward bug on some samples."""
    if completions[0].strip().endswith("5"):
        raise ValueError("cannot grade a five")
    return [0.25]


def not_a_number(completions: list[str], **_: Any) -> list[Any]:
    return ["high"]


def all_ones(completions: list[str], **_: Any) -> list[float]:
    """Every sample the same score: a group GRPO gets no advantage from."""
    return [1.0]
