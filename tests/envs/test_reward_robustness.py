"""No reward in the registry raises on any completion: it scores it, or scores it 0.

Every built-in reward gets the same seeded batch of hostile completions (wrong types,
unclosed tags, megabyte strings, lone surrogates, deep nesting) with valid item
arguments, and then hostile item arguments. `compute` must return one finite float per
completion (a missing optional package, an ImportError at setup, is the one allowed
exception); `__call__` must never raise.
"""

from __future__ import annotations

import math
import pkgutil
import random

import pytest

import atroposlib.envs.reward_fns as reward_fns
from atroposlib.envs.reward_fns import registry

GOLD_CALL = '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
# a valid item for each reward that needs one (the arguments its environment passes)
ITEMS = {
    "accuracy_reward": {"solution": "42"},
    "answer_tag_reward": {"gold": "42"},
    "choice_letter_reward": {"gold": "B"},
    "cosine_scaled_reward": {"solution": "42"},
    "ifeval_reward": {
        "instruction_id_list": ["punctuation:no_comma", "length_constraints:number_words"],
        "kwargs": [{}, {"num_words": 3, "relation": "at least"}],
    },
    "json_schema_reward": {"schema": {"type": "object", "required": ["a"]}},
    "math_think_reward": {"answer": "42"},
    "math_verify_reward": {"answer": "42"},
    "r1_reward": {"solution": "42"},
    "cascading_r1_math_reward": {"solution": "42"},
    "reversal_similarity_reward": {"original": "stressed"},
    "tool_call_reward": {"gold_calls": GOLD_CALL},
}
SETTINGS = {
    "combined_reward": {"rewards": ["think_format", "format"]},
    # no hub here: a model that cannot load (every completion then gets default_reward)
    "cosine_scaled_reward": {"model_name": "/nonexistent/no-model"},
}
HOSTILE_ITEMS = [
    {"solution": None, "gold": object(), "answer": ["x"], "schema": "{", "gold_calls": 7},
    {"instruction_id_list": ["no:such"], "kwargs": None, "original": 5, "ground_truth": "{"},
]


def reward_modules() -> list[str]:
    skip = {"registry", "reward_function"}
    return sorted(
        m.name
        for m in pkgutil.iter_modules(reward_fns.__path__)
        if not m.name.startswith("_") and m.name not in skip
    )


def hostile_completions(seed: int = 27) -> list[object]:
    rng = random.Random(seed)
    texts = [
        "",
        "   ",
        "<think>",
        "</think>",
        "<think>" * 500,
        "<answer>" * 50 + "</answer>",
        "\\boxed{" * 300,
        "\\boxed{42}",
        "<think>ok</think><answer>42</answer>",
        "{" * 5000,
        "[" * 900 + "]" * 900,
        "9" * 100_000,
        "word " * 50_000,
        "\x00\x01\x02",
        "\ud800 lone surrogate",
        "😀" * 1000,
        "<tool_call>" * 20,
        GOLD_CALL,
        "B",
        "desserts",
    ]
    texts += ["".join(rng.choice("<>/{}[]\\ \nab1$") for _ in range(200)) for _ in range(5)]
    shapes = [
        None,
        7,
        3.5,
        [],
        {},
        {"role": "assistant", "content": None},
        {"role": "assistant", "content": 5},
        {"message": {"role": "assistant", "content": "<answer>42</answer>"}},
        [{"role": "user", "content": "hi"}],
        [{"role": "assistant", "content": "42"}],
        object(),
    ]
    return texts + shapes


@pytest.mark.parametrize("module", reward_modules())
def test_no_reward_raises_on_any_completion(module, caplog):
    try:
        reward = registry.create(module, **SETTINGS.get(module, {}))
    except ImportError as error:  # an optional package, named in the message
        pytest.skip(str(error))
    completions = hostile_completions()
    try:
        scores = reward.compute(completions, **ITEMS.get(module, {}))
    except ImportError as error:  # a missing optional package is a setup error
        assert "package" in str(error) or "pip install" in str(error)
    else:
        assert len(scores) == len(completions)
        assert all(isinstance(s, float) and math.isfinite(s) for s in scores), scores
    for item in HOSTILE_ITEMS:
        scores = reward(completions, **item)
        assert len(scores) == len(completions)
        assert all(isinstance(s, float) and math.isfinite(s) for s in scores)
