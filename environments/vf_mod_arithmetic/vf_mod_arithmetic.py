"""The CPU quickstart's task as a `verifiers` environment: "What is a + b mod 10?".

The same system line and question wording as `environments/mod_arithmetic.py` (the
tiny model was built to read exactly these), a dataset of the 100 (a, b) pairs in a
seeded order, and a rubric of one reward: 1.0 when the answer is the right digit.
`verifiers.load_environment("vf-mod-arithmetic")` imports this module and calls
`load_environment`; `environments/verifiers_server.py --env.vf_env_name
vf-mod-arithmetic` trains on it (`configs/verifiers_cpu.yaml`).
"""

from __future__ import annotations

import random
from typing import Any

import verifiers as vf
from datasets import Dataset

from atroposlib.utils.tiny_model_training import SYSTEM_PROMPT, question_text


def rows(pairs: list[tuple[int, int]]) -> Dataset:
    return Dataset.from_list(
        [{"question": question_text(a, b), "answer": str((a + b) % 10)} for a, b in pairs]
    )


def correct(completion: Any, answer: str, **_: Any) -> float:
    """1.0 when the reply is exactly the right digit (surrounding spaces ignored)."""
    if isinstance(completion, list):
        reply = completion[-1].get("content", "") if completion else ""
    else:
        reply = completion
    return 1.0 if (reply or "").strip() == answer else 0.0


def load_environment(seed: int = 0, eval_size: int = 50, **kwargs: Any) -> vf.SingleTurnEnv:
    pairs = [(a, b) for a in range(10) for b in range(10)]
    random.Random(seed).shuffle(pairs)
    evaluated = random.Random(1234).sample(pairs, eval_size)
    return vf.SingleTurnEnv(
        dataset=rows(pairs),
        eval_dataset=rows(evaluated),
        system_prompt=SYSTEM_PROMPT,
        rubric=vf.Rubric(funcs=[correct], weights=[1.0]),
        **kwargs,
    )
