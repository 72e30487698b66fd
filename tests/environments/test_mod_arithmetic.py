"""The mod-10 arithmetic environment asks what the tiny model was taught, and grades exactly."""

from __future__ import annotations

import random

from atroposlib.utils.tiny_model import TinyModelSpec, generate_corpus
from environments.mod_arithmetic import SYSTEM_PROMPT, answer_for, question_for, score_answer


def test_prompts_match_the_tiny_model_corpus():
    conversation = next(generate_corpus(TinyModelSpec(corpus_size=10)))
    assert conversation[0]["content"] == SYSTEM_PROMPT
    a, b = (int(t) for t in conversation[1]["content"].split()[2:5:2])
    assert conversation[1]["content"] == question_for(a, b)


def test_grading():
    rng = random.Random(0)
    for _ in range(50):
        a, b = rng.randrange(10), rng.randrange(10)
        right = answer_for(a, b)
        assert right == str((a + b) % 10)
        assert score_answer(f" {right}\n", right) == 1.0
        assert score_answer(str((int(right) + 1) % 10), right) == 0.0
        assert score_answer(f"{right}{right}", right) == 0.0
