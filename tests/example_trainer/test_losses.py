"""The loss choices, advantage estimators, IS weights and staleness bound against
values worked out by hand (TRL's own code is the yardstick in test_losses_vs_trl.py)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from example_trainer.advantages import group_advantages  # noqa: E402
from example_trainer.config import TrainingConfig  # noqa: E402
from example_trainer.data import Sequence, drop_stale, micro_batches, staleness  # noqa: E402
from example_trainer.importance import correction_weights  # noqa: E402
from example_trainer.loss import LossSettings, policy_loss, token_entropy  # noqa: E402


def same(actual, expected) -> None:
    """Nested lists or tensors equal to float rounding."""
    found = torch.as_tensor(actual, dtype=torch.float64)
    assert torch.allclose(found, torch.tensor(expected, dtype=torch.float64), atol=1e-6), found


def run(settings: LossSettings, log_ratios, advantages, logp=None, **kwargs):
    """Loss and gradient for one row of trained tokens with the given log-ratios."""
    log_ratios = torch.tensor([log_ratios], dtype=torch.float64)
    logp = torch.tensor([logp], dtype=torch.float64) if logp is not None else log_ratios.clone()
    logp.requires_grad_(True)
    old = logp.detach() - log_ratios
    mask = torch.ones_like(old, dtype=torch.bool)
    tokens = mask.numel()
    loss, metrics = policy_loss(
        logp,
        old,
        torch.tensor([advantages], dtype=torch.float64),
        mask,
        settings,
        tokens,
        1,
        **kwargs,
    )
    loss.backward()
    return loss.item(), logp.grad[0].tolist(), metrics


# ----------------------------------------------------------- advantages
def test_rloo_compares_each_score_with_the_mean_of_the_others():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0])
    # 1 - (0 + 0 + 1) / 3 = 2/3 and 0 - (1 + 0 + 1) / 3 = -2/3
    assert group_advantages(scores, "none", "rloo").tolist() == pytest.approx(
        [2 / 3, -2 / 3, -2 / 3, 2 / 3]
    )
    uneven = torch.tensor([3.0, 1.0, 2.0])  # 3 - 1.5, 1 - 2.5, 2 - 2
    assert group_advantages(uneven, "none", "rloo").tolist() == pytest.approx([1.5, -1.5, 0.0])
    # k / (k - 1) times the GRPO centring, whatever the scores
    centred = group_advantages(uneven, "none", "grpo")
    assert group_advantages(uneven, "none", "rloo").tolist() == pytest.approx(
        (centred * 3 / 2).tolist()
    )
    assert group_advantages(torch.tensor([0.4, 0.4]), "group", "rloo").tolist() == [0.0, 0.0]
    assert group_advantages(torch.tensor([0.4]), "none", "rloo").tolist() == [pytest.approx(0.4)]


# ----------------------------------------------------------- losses
def test_dr_grpo_divides_by_a_constant_not_by_lengths():
    settings = LossSettings(loss_type="dr_grpo", max_length=10)
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    advantages = torch.tensor([[2.0] * 3, [-1.0] * 3])
    loss, _ = policy_loss(logp, logp.detach(), advantages, mask, settings, 4, 2)
    loss.backward()
    # ratio 1: -(2 + 3 * -1) / (2 sequences x 10)
    assert loss.item() == pytest.approx(1 / 20)
    same(logp.grad.tolist(), [[-0.1, 0.0, 0.0], [0.05, 0.05, 0.05]])


def test_grpo_averages_each_sequence_then_the_sequences():
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    advantages = torch.tensor([[2.0] * 3, [-1.0] * 3])
    loss, _ = policy_loss(logp, logp.detach(), advantages, mask, LossSettings("grpo"), 4, 2)
    loss.backward()
    assert loss.item() == pytest.approx((-2.0 + 1.0) / 2)
    same(logp.grad.tolist(), [[-1.0, 0, 0], [1 / 6, 1 / 6, 1 / 6]])


def test_gspo_takes_one_ratio_per_sequence_from_the_mean_log_ratio():
    settings = LossSettings("grpo", importance_sampling_level="sequence")
    loss, grad, metrics = run(settings, [math.log(1.1), math.log(1.3)], [1.0, 1.0])
    ratio = math.sqrt(1.1 * 1.3)  # 1.196: inside 1 + 0.2
    assert loss == pytest.approx(-ratio)
    # d(-r)/dl_t = -r / 2 for each token; the sequence mean over 2 tokens is -r
    assert grad == pytest.approx([-ratio / 2, -ratio / 2])
    assert metrics["clip_fraction"] == 0.0
    # past 1 + eps the whole sequence is clipped: no gradient to any of its tokens
    _, grad, metrics = run(settings, [math.log(1.2), math.log(1.5)], [1.0, 1.0])
    assert grad == [0.0, 0.0] and metrics["clip_fraction"] == 1.0


@pytest.mark.parametrize(
    ("ratio", "expected_weight", "capped"), [(2.0, 2.0, False), (6.0, 5.0, True), (0.1, 0.1, False)]
)
def test_cispo_weighs_the_log_likelihood_by_a_capped_stop_gradient_ratio(
    ratio, expected_weight, capped
):
    settings = LossSettings("cispo", clip_eps_high=5.0)
    loss, grad, metrics = run(settings, [math.log(ratio)], [1.5], logp=[-0.7])
    assert loss == pytest.approx(-expected_weight * 1.5 * -0.7)
    # the weight is a constant: d/dlogp is -w A, never zero (PPO would stop at 1.2)
    assert grad == pytest.approx([-expected_weight * 1.5])
    assert metrics["clip_fraction"] == (1.0 if capped else 0.0)


def test_token_entropy_and_the_bonus_raise_entropy():
    uniform = torch.zeros(1, 2, 4)
    same(token_entropy(uniform).tolist(), [[math.log(4)]])
    peaked = torch.tensor([[[4.0, 0.0, 0.0, 0.0], [0.0] * 4]])
    p = torch.softmax(peaked[0, 0], -1)
    assert token_entropy(peaked)[0, 0].item() == pytest.approx(float(-(p * p.log()).sum()))
    logits = peaked.clone().requires_grad_(True)
    entropy = token_entropy(logits)
    logp = torch.zeros(1, 1, requires_grad=True)
    settings = LossSettings(entropy_coef=0.5)
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, metrics = policy_loss(
        logp, logp.detach(), torch.zeros(1, 1), mask, settings, 1, 1, entropy=entropy
    )
    assert loss.item() == pytest.approx(-0.5 * entropy.item())
    assert metrics["entropy"] == pytest.approx(entropy.item())
    loss.backward()
    with torch.no_grad():
        after = token_entropy(logits - 0.5 * logits.grad)
    assert after.item() > entropy.item(), "a step down the loss must raise the entropy"


# ----------------------------------------------------------- importance sampling
OLD_MINUS_BEHAVIOUR = [[math.log(0.2), 0.0, math.log(5.0)], [math.log(2.0), math.log(2.0), 0.0]]
TRAINED = torch.tensor([[True, True, True], [True, True, False]])


def weights(mode: str, low: float | None = 0.5, high: float | None = 3.0, segments=None):
    old = torch.tensor(OLD_MINUS_BEHAVIOUR, dtype=torch.float64)
    segments = torch.tensor([[0, 0, 0], [1, 1, 1]]) if segments is None else segments
    found, cut = correction_weights(
        old, torch.zeros_like(old), TRAINED, segments, int(segments.max()) + 1, mode, low, high
    )
    return found.tolist(), cut.tolist()


def test_token_truncate_clamps_each_tokens_weight():
    found, cut = weights("token_truncate")
    same(found, [[0.5, 1.0, 3.0], [2.0, 2.0, 0.0]])
    assert cut == [[True, False, True], [False, False, False]]


def test_token_mask_zeroes_each_weight_outside_the_band():
    found, cut = weights("token_mask")
    same(found, [[0.0, 1.0, 0.0], [2.0, 2.0, 0.0]])
    assert cut == [[True, False, True], [False, False, False]]


def test_sequence_modes_weigh_a_sequence_by_its_summed_log_ratio():
    # sequence 0: 0.2 x 1 x 5 = 1; sequence 1: 2 x 2 = 4 (its untrained token is ignored)
    found, cut = weights("sequence_truncate")
    same(found, [[1.0, 1.0, 1.0], [3.0, 3.0, 0.0]])
    assert cut == [[False] * 3, [True, True, False]]
    found, _ = weights("sequence_mask")
    same(found, [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    found, _ = weights("sequence_mask", high=None)  # no upper bound: nothing is masked
    same(found, [[1.0, 1.0, 1.0], [4.0, 4.0, 0.0]])


def test_sequence_weights_follow_the_segments_of_a_packed_row():
    # one row holding two sequences: tokens 0-1 and token 2 (row 1 is left as is)
    segments = torch.tensor([[0, 0, 1], [2, 2, 2]])
    found, _ = weights("sequence_truncate", low=None, high=None, segments=segments)
    same(found, [[0.2, 0.2, 5.0], [4.0, 4.0, 0.0]])


def test_the_correction_weight_scales_the_loss_and_is_reported():
    settings = LossSettings(is_mode="token_truncate", is_clip_min=None, is_clip_max=2.0)
    behaviour = torch.tensor([[math.log(0.25), 0.0]], dtype=torch.float64)
    logp = torch.tensor([[0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    advantages = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    loss, metrics = policy_loss(
        logp, logp.detach(), advantages, mask, settings, 2, 1, behaviour_logprobs=behaviour
    )
    loss.backward()
    # weights exp(0 - log 0.25) = 4 -> 2 (truncated) and 1; ratio 1 against the trainer
    assert loss.item() == pytest.approx(-(2.0 + 1.0) / 2)
    same(logp.grad.tolist(), [[-1.0, -0.5]])
    assert metrics["is_weight_mean"] == pytest.approx(1.5)
    assert metrics["is_weight_max"] == pytest.approx(2.0)
    assert metrics["is_clip_fraction"] == pytest.approx(0.5)
    # k3 of KL(behaviour || trainer) per token: r - 1 - log r with r = 4, then 1
    assert metrics["mismatch_kl"] == pytest.approx((4 - 1 - math.log(4)) / 2)
    assert metrics["logprob_mismatch"] == pytest.approx(math.log(4) / 2)


# ----------------------------------------------------------- packed rows
def sequences() -> list[Sequence]:
    def one(tokens, advantage, offset):
        n = len(tokens)
        return Sequence(
            tokens=tokens,
            masks=[-100] + tokens[1:],
            score=advantage,
            advantages=[advantage] * n,
            inference_logprobs=[-1.0 + offset * k for k in range(n)],
            ref_logprobs=None,
        )

    return [one([5, 6, 7], 1.0, 0.1), one([3, 4, 5, 6, 8], -0.5, -0.2)]


@pytest.mark.parametrize(
    "settings",
    [
        LossSettings("grpo"),
        LossSettings("dapo", importance_sampling_level="sequence"),
        LossSettings("grpo", is_mode="sequence_truncate", is_clip_max=1.3),
    ],
    ids=["grpo", "gspo", "sequence-is"],
)
def test_packed_and_padded_micro_batches_give_the_same_loss_and_gradient(settings):
    """Per-sequence sums follow the segments: a packed row is not one long sequence."""
    results = []
    for pack in (False, True):
        (chunk,) = micro_batches(sequences(), 1, 0, token_budget=64, pack=pack)
        scale = torch.tensor(0.3, requires_grad=True)
        labels = chunk.input_ids[:, 1:].float()
        behaviour = torch.nan_to_num(chunk.old_logprobs, nan=0.0)
        logp = behaviour + scale * torch.sin(labels)  # the same value per token either way
        loss, _ = policy_loss(
            logp,
            behaviour,
            chunk.advantages,
            chunk.loss_mask,
            settings,
            7,
            2,
            segments=chunk.segments,
            behaviour_logprobs=behaviour + 0.1 * torch.cos(labels),
        )
        loss.backward()
        results.append((loss.item(), scale.grad.item()))
    assert results[1] == pytest.approx(results[0], rel=1e-6)


# ----------------------------------------------------------- staleness
def test_drop_stale_keeps_what_is_at_most_k_versions_old():
    def at(version):
        return Sequence([1, 2], [-100, 2], 0.0, [0.0, 0.0], None, None, version=version)

    batch = [at(7), at(6), at(5), at(None), at(4)]
    kept, dropped = drop_stale(batch, 7, 1)
    assert [s.version for s in kept] == [7, 6, None] and dropped == 2
    assert staleness(kept, 7) == {"staleness_mean": 0.5, "staleness_max": 1.0}
    assert drop_stale(batch, 7, None) == (batch, 0)
    assert drop_stale(batch, 7, 0)[1] == 3


def test_a_version_ahead_of_the_trainer_is_of_unknown_age_not_a_negative_lag():
    """A replayed group from another run's later weights (atropos-rollouts replay)."""

    def at(version):
        return Sequence([1, 2], [-100, 2], 0.0, [0.0, 0.0], None, None, version=version)

    batch = [at(40), at(3), at(2)]
    kept, dropped = drop_stale(batch, 3, 0)
    assert [s.version for s in kept] == [40, 3] and dropped == 1
    assert staleness(batch, 3) == {"staleness_mean": 0.5, "staleness_max": 1.0}
    assert staleness([at(40)], 3) == {}


# ----------------------------------------------------------- flags
def config(**fields) -> TrainingConfig:
    return TrainingConfig(model_name="m", **fields)


def test_the_flags_resolve_their_defaults_from_the_loss():
    assert config().loss.loss_type == "dapo" and config().loss.scale_advantages == "group"
    assert config(loss_type="dr_grpo").loss.scale_advantages == "none"
    assert config(advantage_estimator="rloo").loss.scale_advantages == "none"
    chosen = config(advantage_estimator="rloo", scale_advantages="group")
    assert chosen.loss.scale_advantages == "group"
    assert config(loss_normalization="sequence").loss.loss_type == "grpo"
    assert config(loss_type="cispo").loss.clip_eps_high == 5.0
    gspo = config(loss_type="gspo").loss  # GSPO's paper: per-sequence ratio, tiny clips
    assert (gspo.clip_eps, gspo.clip_eps_high, gspo.importance_sampling_level) == (
        3e-4,
        4e-4,
        "sequence",
    )
    assert config(loss_type="gspo", clip_eps=0.1).loss.clip_eps == 0.1
    with pytest.raises(ValueError, match="defined on each sequence's ratio"):
        config(loss_type="gspo", importance_sampling_level="token")
    assert config().loss.ratio_reference == "inference"
    assert config(vllm_importance_sampling_correction=True).loss.ratio_reference == "trainer"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"loss_type": "cispo", "clip_eps_high": 0.28}, "cap of at least 1"),
        (
            {"vllm_importance_sampling_correction": True, "ratio_reference": "inference"},
            "count that gap twice",
        ),
        ({"loss_normalization": "token", "loss_type": "grpo"}, "give one"),
        (
            {"vllm_importance_sampling_clip_min": 2.0, "vllm_importance_sampling_clip_max": 1.0},
            "must be below",
        ),
        ({"kl_reference": "model"}, "set --kl-coef"),
        ({"max_staleness": -1}, "greater than or equal to 0"),
    ],
)
def test_contradictory_flags_are_refused_with_the_reason(fields, message):
    with pytest.raises(ValueError, match=message):
        config(**fields)
