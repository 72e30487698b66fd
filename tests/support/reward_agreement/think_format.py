"""Seeded reasoning-block shapes for "think_format", and TRL's `think_format_reward` on them.

The reference is `trl.rewards.think_format_reward` (TRL 1.16.0,
`trl/rewards/format_rewards.py`), installed with the dev extra.
"""

from __future__ import annotations

import random

PIECES = ["<think>", "</think>", "reasoning", "answer", " ", "\n", "", "<THINK>", "</ think>"]


def completions(n: int = 400, seed: int = 27) -> list[str]:
    rng = random.Random(seed)
    made = []
    for _ in range(n):
        if rng.random() < 0.5:  # near the right shape
            think = rng.choice(["", " ", "step one", "a\nb"])
            answer = rng.choice(["", "\n", "42", " 42 "])
            text = rng.choice(["", " ", "\n"]) + f"<think>{think}</think>{answer}"
            text += rng.choice(["", "", "</think>", "<think>", "<think>x</think>"])
        else:
            text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 6)))
        made.append(text)
    return made


def trl_verdict(text: str) -> float:
    from trl.rewards import think_format_reward

    return think_format_reward([[{"content": text}]])[0]
