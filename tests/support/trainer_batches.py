"""A fixed two-sequence batch to feed the example trainer's `train_step` directly."""

from __future__ import annotations


def batch() -> list[dict]:
    tokens = [[1, 5, 6, 7, 2], [1, 5, 6, 8, 2]]
    return [
        {
            "tokens": tokens,
            "masks": [[-100, -100, 6, 7, 2], [-100, -100, 6, 8, 2]],
            "scores": [1.0, 0.0],
        }
    ]
