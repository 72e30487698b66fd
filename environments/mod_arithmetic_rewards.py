"""Two plain rewards for `mod_arithmetic.py`, in TRL's signature, for an environment's
`reward:` setting and `atropos-rollouts rescore --reward`.

`plus_one` is deliberately wrong: it pays for the answer plus one. docs/rollouts.md runs
the quickstart with it, then re-scores the stored groups with `right` and replays them.
Each keyword is a list with one value per completion: the item's fields `a` and `b`.
"""

from __future__ import annotations

from typing import Any


def right(completions: list[str], a: list[int], b: list[int], **_: Any) -> list[float]:
    """1.0 for the right digit, (a + b) mod 10."""
    return [_pays(c, (x + y) % 10) for c, x, y in zip(completions, a, b, strict=True)]


def plus_one(completions: list[str], a: list[int], b: list[int], **_: Any) -> list[float]:
    """1.0 for (a + b + 1) mod 10: the reward bug the walk-through re-scores."""
    return [_pays(c, (x + y + 1) % 10) for c, x, y in zip(completions, a, b, strict=True)]


def _pays(completion: str, digit: int) -> float:
    return 1.0 if completion.strip() == str(digit) else 0.0
