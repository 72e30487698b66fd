"""A step's rollout figures (TRL's names) on hand-computed batches, and its console line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from atroposlib.utils.logging import MESSAGE_WIDTH
from example_trainer.data import flatten
from example_trainer.step_report import CompletionEnds, rollout_numbers, step_line

EOS, NEWLINE, IM_END = 2, 10, 4


class Tokenizer:
    """Token 2 is EOS, 10 a newline (blank); every other token is a word."""

    eos_token_id = EOS

    def decode(self, tokens: list[int]) -> str:
        return "".join("\n" if t == NEWLINE else f"w{t}" for t in tokens)


def group(scores: list[float], *rows: tuple[list[int], list[int]]) -> dict:
    return {"tokens": [r[0] for r in rows], "masks": [r[1] for r in rows], "scores": scores}


BATCH = [
    group(
        [1.0, 1.0],  # no spread
        ([5, 6, 7, EOS, NEWLINE], [-100, -100, 7, EOS, NEWLINE]),  # 3 trained, finished
        ([5, 6, 7, 8], [-100, -100, 7, 8]),  # 2, no end token: cut off by the engine
    ),
    group(
        [0.0, 1.0, 0.5],
        ([5, 7, EOS], [-100, 7, EOS]),  # 2, finished
        ([5, 6, 7, 8, 9, EOS], [-100, 6, 7, 8, 9, EOS]),  # cut at seq_len 5: 4, unfinished
        ([5, EOS], [-100, EOS]),  # 1, finished
    ),
    group(
        [0.25, 0.25],  # no spread
        ([5, 6, EOS], [-100, 6, EOS]),  # 2, finished
        ([5, 6, EOS], [-100, 6, EOS]),  # 2, finished
    ),
]


def test_a_batchs_spread_and_completion_figures_are_trls():
    sequences = flatten(BATCH, "group", seq_len=5)
    numbers = rollout_numbers(sequences, CompletionEnds(Tokenizer()))
    assert numbers == pytest.approx(
        {
            "score_mean": 4 / 7,
            "score_std": numbers["score_std"],  # torch's, unchanged
            "frac_reward_zero_std": 2 / 3,
            "completions/mean_length": (3 + 2 + 2 + 4 + 1 + 2 + 2) / 7,
            "completions/min_length": 1.0,
            "completions/max_length": 4.0,
            "completions/clipped_ratio": 2 / 7,
            "completions/mean_terminated_length": (3 + 2 + 1 + 2 + 2) / 5,
        }
    )


def test_each_environment_gets_its_own_mean_score():
    """Groups name their env_id: env 3's sequences score (1 + 1 + 0.25 + 0.25) / 4, env
    5's (0 + 1 + 0.5) / 3; a group without one counts only in the whole batch's mean."""
    batch = [{**BATCH[0], "env_id": 3}, {**BATCH[1], "env_id": 5}, {**BATCH[2], "env_id": 3}]
    numbers = rollout_numbers(flatten(batch, "group", seq_len=5), CompletionEnds(Tokenizer()))
    assert numbers["score_mean/env_3"] == pytest.approx(2.5 / 4)
    assert numbers["score_mean/env_5"] == pytest.approx(1.5 / 3)
    unnamed = rollout_numbers(flatten(BATCH, "group", seq_len=5), CompletionEnds(Tokenizer()))
    assert not [key for key in unnamed if key.startswith("score_mean/env_")]


def test_the_models_end_tokens_count_and_a_batch_that_never_finished_has_no_terminated_mean():
    ended_by_im_end = group([1.0, 0.0], ([5, 6, IM_END], [-100, 6, IM_END]), ([5, 6], [-100, 6]))
    sequences = flatten([ended_by_im_end], "group", seq_len=64)
    tokenizer_only = rollout_numbers(sequences, CompletionEnds(Tokenizer()))
    assert tokenizer_only["completions/clipped_ratio"] == 1.0
    assert "completions/mean_terminated_length" not in tokenizer_only
    assert tokenizer_only["frac_reward_zero_std"] == 0.0
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[IM_END, 7]))
    with_model = rollout_numbers(sequences, CompletionEnds(Tokenizer(), model))
    assert with_model["completions/clipped_ratio"] == 0.5
    assert with_model["completions/mean_terminated_length"] == 2.0
    assert rollout_numbers([], CompletionEnds(Tokenizer())) == {}


QUICKSTART = {  # a quickstart step's figures
    "loss": 0.0123,
    "score_mean": 0.6451,
    "grad_norm": 2.4012,
    "kl": 0.0,
    "clip_fraction": 0.0344,
    "wait_s": 0.81,
    "train_s": 0.23,
    "sync_s": 0.02,
}


def test_the_step_line_fits_80_columns_beside_the_launchers_prefix():
    line = step_line(58, 100, QUICKSTART)
    assert line == "step 58/100 score 0.645 loss 0.0123 grad 2.4 clip 0.034 1.1s"
    assert len("trainer        | " + line) <= 80
    # a long run with a KL term and a stale bound: what does not fit goes, clip first
    long_run = {
        **QUICKSTART,
        "loss": -0.0123,
        "score_mean": -0.512,
        "grad_norm": 12.345,
        "kl": 0.0012,
        "stale_sequences_dropped": 12.0,
        "wait_s": 11.25,
    }
    line = step_line(1234, 5000, long_run)
    assert line == "step 1234/5000 score -0.512 loss -0.0123 grad 12.3 11.5s"
    assert len(line) <= MESSAGE_WIDTH
    # clip, KL, then the dropped count go, in that order, as the width shrinks
    assert step_line(1234, 5000, long_run, width=74) == (
        "step 1234/5000 score -0.512 loss -0.0123 grad 12.3 dropped 12 stale 11.5s"
    )
    assert "kl 0.0012 dropped" in step_line(1234, 5000, long_run, width=84)
    tiny_loss = step_line(1, 4, {**QUICKSTART, "loss": -0.00001, "kl": 0.0})
    assert tiny_loss.startswith("step 1/4 score 0.645 loss 0.0000 grad")  # not -0.0000
    roomy = step_line(1234, 5000, long_run, width=200)
    assert roomy == (
        "step 1234/5000 score -0.512 loss -0.0123 grad 12.3 kl 0.0012 clip 0.034 "
        "dropped 12 stale 11.5s"
    )


def test_a_distillation_step_shows_its_kl_to_the_teacher_before_the_grad_norm():
    distilled = {**QUICKSTART, "distill_kl": 0.5234, "wait_s": 11.25}
    line = step_line(58, 100, distilled)
    assert line == "step 58/100 score 0.645 loss 0.0123 teacher-kl 0.523 11.5s"
    assert len(line) <= MESSAGE_WIDTH
    roomy = step_line(58, 100, distilled, width=200)
    assert "grad 2.4 teacher-kl 0.523 clip 0.034" in roomy
