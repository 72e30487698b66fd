"""What enters the trainer from `/batch`: per-token fields are checked, never reshaped."""

from __future__ import annotations

import logging
import math

import pytest

torch = pytest.importorskip("torch")

from example_trainer.config import TrainingConfig  # noqa: E402
from example_trainer.data import flatten, micro_batches  # noqa: E402
from example_trainer.grpo import Trainer  # noqa: E402
from tests.support.trainer_batches import PROMPT, rollout_group  # noqa: E402


def to_tensors(batch: list[dict]) -> list:
    return micro_batches(flatten(batch, "group", 64), 1, 0)


@pytest.mark.parametrize("field", ["advantages", "inference_logprobs", "ref_logprobs"])
@pytest.mark.parametrize("length", [2, 4, 6])
def test_per_token_field_of_another_length_is_refused(field, length):
    """T1: a short list was broadcast over the sequence, a longer one crashed in torch."""
    rows = [[-0.5] * 5, [-0.5] * length]
    with pytest.raises(ValueError, match=rf"group 0 sequence 1: {field}\[1\] has {length} values"):
        to_tensors([rollout_group(**{field: rows})])


def test_token_level_advantages_of_the_right_length_are_used_as_sent():
    advantages = [[0.0, 0.0, 0.0, 0.5, 0.7], [0.0, 0.0, 0.0, -1.0, -2.0]]
    (chunk,) = to_tensors([rollout_group(advantages=advantages)])
    assert chunk.advantages[0].tolist() == pytest.approx([0.0, 0.0, 0.5, 0.7])
    assert chunk.advantages[1].tolist() == pytest.approx([0.0, 0.0, -1.0, -2.0])


@pytest.mark.parametrize("field", ["inference_logprobs", "ref_logprobs"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_logprob_at_a_trained_position_is_refused(field, bad):
    """T3: a trained position must carry a real logprob; the error names where it is."""
    rows = [[1.0] * 3 + [-0.4, -0.2], [1.0] * 3 + [-1.5, bad]]
    with pytest.raises(ValueError, match=rf"group 0 sequence 1: {field}\[1\]\[4\] is {bad}"):
        to_tensors([rollout_group(**{field: rows})])


def test_sentinels_at_untrained_positions_are_accepted():
    """NaN, infinities and vLLM's -9999 are placeholders where nothing is trained."""
    rows = [[math.nan, math.inf, -9999.0, -0.4, -0.2], [1e9, -math.inf, 1.0, -1.5, -0.3]]
    (chunk,) = to_tensors([rollout_group(inference_logprobs=rows, ref_logprobs=rows)])
    trained = chunk.loss_mask
    assert torch.isfinite(chunk.old_logprobs[trained]).all()


def test_equal_float_scores_give_exactly_zero_advantages():
    """T4: float32 rounding of the mean used to leave -0.056 on every sequence."""
    tokens = [PROMPT + [7, 2]] * 16
    batch = [
        {
            "tokens": tokens,
            "masks": [[-100] * 3 + [7, 2]] * 16,
            "scores": [0.9] * 16,
            "inference_logprobs": [[1.0] * 3 + [-0.4, -0.2]] * 16,
        }
    ]
    for scale in ("group", "none"):
        assert all(a == 0.0 for s in flatten(batch, scale, 64) for a in s.advantages)


def test_a_singleton_group_trains_on_its_raw_score():
    """T5: upstream keeps the score of a group of one; it used to become advantage 0."""
    one = rollout_group()
    one = {key: value[:1] for key, value in one.items()}
    one["scores"] = [0.75]
    for scale in ("group", "none"):
        (sequence,) = flatten([one], scale, 64)
        assert sequence.advantages == [0.75] * 5


def make_trainer(tiny_model_path, tmp_path, **overrides) -> Trainer:
    return Trainer(
        TrainingConfig(
            model_name=str(tiny_model_path),
            lr=1e-3,
            save_path=str(tmp_path),
            device="cpu",
            inference_engine="none",
            kl_coef=0.1,
            **overrides,
        )
    )


def test_sentinels_at_untrained_positions_leave_the_step_as_clean(tiny_model_path, tmp_path):
    """T3: NaN, inf or 1e9 old/ref logprobs on prompt positions made the whole step NaN."""
    trainer = make_trainer(tiny_model_path, tmp_path)
    clean = rollout_group(ref_logprobs=[[1.0] * 3 + [-0.5, -0.1], [1.0] * 3 + [-1.0, -0.6]])
    poisoned = {
        **clean,
        "inference_logprobs": [
            [math.nan, -math.inf, 1e9] + clean["inference_logprobs"][0][3:],
            [math.inf, -9999.0, math.nan] + clean["inference_logprobs"][1][3:],
        ],
        "ref_logprobs": [
            [1e9, math.nan, math.inf] + clean["ref_logprobs"][0][3:],
            [-math.inf, 1e9, -1e9] + clean["ref_logprobs"][1][3:],
        ],
    }

    def step(batch: dict) -> tuple[dict, dict]:
        trainer.optimizer.zero_grad(set_to_none=True)
        metrics = trainer.accumulate_gradients(trainer.sequences([batch]))
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters()}
        return metrics, grads

    clean_metrics, clean_grads = step(clean)
    metrics, grads = step(poisoned)
    assert math.isfinite(metrics["loss"]) and metrics["loss"] == clean_metrics["loss"]
    assert metrics["kl"] == clean_metrics["kl"]
    for name, grad in grads.items():
        assert torch.isfinite(grad).all(), name
        assert torch.equal(grad, clean_grads[name]), name


def test_missing_inference_logprobs_train_with_ratio_one_and_one_warning(
    tiny_model_path, tmp_path, caplog
):
    """T6: the fallback to ratio 1 was silent; it now warns once and is counted every step."""
    trainer = make_trainer(tiny_model_path, tmp_path)
    batch = [rollout_group(), rollout_group(inference_logprobs=None)]
    with caplog.at_level(logging.WARNING, logger="example_trainer"):
        first = trainer.train_step(batch)
        second = trainer.train_step(batch)
    warnings = [r for r in caplog.records if "without inference_logprobs" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert first["sequences_without_inference_logprobs"] == 2.0
    assert second["sequences_without_inference_logprobs"] == 2.0
    assert math.isfinite(first["loss"]) and math.isfinite(second["loss"])


def test_require_inference_logprobs_refuses_such_a_batch(tiny_model_path, tmp_path):
    """T6, upstream's behaviour on request: it raises when the logprobs are missing."""
    trainer = make_trainer(tiny_model_path, tmp_path, require_inference_logprobs=True)
    batch = [rollout_group(), rollout_group(inference_logprobs=None)]
    with pytest.raises(ValueError, match="group 1 came without inference_logprobs"):
        trainer.train_step(batch)
