"""Fixed groups to feed the example trainer directly, as `/batch` would serve them."""

from __future__ import annotations

from typing import Any


def batch() -> list[dict]:
    tokens = [[1, 5, 6, 7, 2], [1, 5, 6, 8, 2]]
    return [
        {
            "tokens": tokens,
            "masks": [[-100, -100, 6, 7, 2], [-100, -100, 6, 8, 2]],
            "scores": [1.0, 0.0],
        }
    ]


PROMPT = [1, 5, 6]


def rollout_group(**fields: Any) -> dict[str, Any]:
    """Two sequences: a 3-token prompt (masked, logprob placeholder 1.0), 2 trained tokens.

    `fields` replace or add group fields (advantages, ref_logprobs, scores...).
    """
    tokens = [PROMPT + [7, 2], PROMPT + [8, 2]]
    return {
        "tokens": tokens,
        "masks": [[-100] * 3 + t[3:] for t in tokens],
        "scores": [1.0, 0.0],
        "inference_logprobs": [[1.0] * 3 + [-0.4, -0.2], [1.0] * 3 + [-1.5, -0.3]],
        **fields,
    }
