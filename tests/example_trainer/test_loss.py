"""The GRPO loss against hand-computed values: every branch of the clip, both signs."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from example_trainer.advantages import group_advantages  # noqa: E402
from example_trainer.loss import LossSettings, policy_loss, token_logprobs  # noqa: E402
from tests.support.tolerances import SAME_LIBRARY_LOGPROB_REL, logprob_tolerance  # noqa: E402

EPS = 0.2


def one_token(ratio: float, advantage: float, settings: LossSettings | None = None):
    """Loss and d loss / d logp for a single trained token with the given ratio."""
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    old = torch.zeros(1, 1)
    loss, metrics = policy_loss(
        logp,
        old,
        torch.tensor([[advantage]]),
        torch.ones(1, 1, dtype=torch.bool),
        settings or LossSettings(clip_eps=EPS),
        total_tokens=1,
        total_sequences=1,
    )
    loss.backward()
    return loss.item(), logp.grad.item(), metrics


def test_ratio_one_is_minus_advantage():
    loss, grad, metrics = one_token(1.0, 2.0)
    assert loss == pytest.approx(-2.0) and grad == pytest.approx(-2.0)
    assert metrics["clip_fraction"] == 0.0 and metrics["logprob_mismatch"] == pytest.approx(0.0)


@pytest.mark.parametrize(
    ("ratio", "advantage", "expected_loss", "expected_grad", "cut"),
    [
        # A > 0: gradient flows below 1+eps, vanishes above it
        (0.5, 1.0, -0.5, -0.5, False),
        (1.5, 1.0, -(1 + EPS), 0.0, True),
        # A < 0: gradient vanishes below 1-eps, flows above 1+eps (Atropos zeroes this one)
        (0.5, -1.0, (1 - EPS), 0.0, True),
        (1.5, -1.0, 1.5, 1.5, False),
        # inside the trust region both terms agree
        (1.1, -1.0, 1.1, 1.1, False),
    ],
)
def test_clip_is_one_sided_for_both_signs(ratio, advantage, expected_loss, expected_grad, cut):
    loss, grad, metrics = one_token(ratio, advantage)
    assert loss == pytest.approx(expected_loss, abs=1e-6)
    assert grad == pytest.approx(expected_grad, abs=1e-6)
    assert metrics["clip_fraction"] == (1.0 if cut else 0.0)


def test_asymmetric_clip_high():
    settings = LossSettings(clip_eps=0.2, clip_eps_high=0.28)
    loss, grad, _ = one_token(1.25, 1.0, settings)  # inside 1.28: still learning
    assert loss == pytest.approx(-1.25) and grad == pytest.approx(-1.25)
    loss, grad, _ = one_token(1.3, 1.0, settings)
    assert loss == pytest.approx(-1.28) and grad == 0.0


def test_token_and_sequence_normalisation():
    logp = torch.zeros(2, 3)
    advantages = torch.tensor([[1.0, 1.0, 1.0], [4.0, 4.0, 4.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)  # 2 + 1 trained tokens
    token, _ = policy_loss(logp, logp, advantages, mask, LossSettings(), 3, 2)
    assert token.item() == pytest.approx(-(1 + 1 + 4) / 3)
    sequence, _ = policy_loss(logp, logp, advantages, mask, LossSettings(loss_type="grpo"), 3, 2)
    assert sequence.item() == pytest.approx(-((1 + 1) / 2 + 4 / 1) / 2)


def test_kl_term_is_k3():
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    settings = LossSettings(kl_coef=0.1)
    loss, metrics = policy_loss(
        logp,
        logp,
        torch.zeros(1, 1),
        torch.ones(1, 1, dtype=torch.bool),
        settings,
        1,
        1,
        ref_logprobs=ref,
    )
    delta = math.log(0.25) - math.log(0.5)
    k3 = math.exp(delta) - delta - 1
    assert metrics["kl"] == pytest.approx(k3) and loss.item() == pytest.approx(0.1 * k3)
    without, _ = policy_loss(
        logp,
        logp,
        torch.zeros(1, 1),
        torch.ones(1, 1, dtype=torch.bool),
        LossSettings(kl_coef=0.0),
        1,
        1,
        ref_logprobs=ref,
    )
    assert without.item() == 0.0


def test_masked_and_padded_positions_contribute_nothing():
    logp = torch.tensor([[0.1, -5.0, 3.0]], requires_grad=True)
    advantages = torch.tensor([[1.0, 100.0, -100.0]])
    mask = torch.tensor([[1, 0, 0]], dtype=torch.bool)
    loss, _ = policy_loss(logp, logp.detach(), advantages, mask, LossSettings(), 1, 1)
    loss.backward()
    assert loss.item() == pytest.approx(-1.0)
    assert logp.grad[0, 1].item() == 0.0 and logp.grad[0, 2].item() == 0.0


def test_labels_are_shifted():
    vocab = 5
    logits = torch.randn(1, 4, vocab)
    ids = torch.tensor([[1, 2, 3, 4]])
    got = token_logprobs(logits, ids)
    expected = torch.log_softmax(logits, -1)[0, torch.arange(3), ids[0, 1:]]
    assert got.shape == (1, 3) and torch.allclose(got[0], expected)


def test_gradient_accumulation_invariance():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 11))
    ids = torch.randint(0, 11, (8, 6))
    mask = torch.rand(8, 5) > 0.3
    advantages = torch.randn(8, 1).expand(8, 5)
    old = torch.randn(8, 5) * 0.01 - 2.0
    total_tokens, total_sequences = int(mask.sum()), 8

    def grads(splits: int, normalization: str) -> list[torch.Tensor]:
        model.zero_grad()
        for part in torch.arange(8).chunk(splits):
            logp = token_logprobs(model(ids[part]), ids[part])
            loss, _ = policy_loss(
                logp,
                old[part],
                advantages[part],
                mask[part],
                LossSettings(loss_type=normalization),
                total_tokens,
                total_sequences,
            )
            loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    for normalization in ("dapo", "grpo", "dr_grpo", "cispo"):
        whole, split = grads(1, normalization), grads(4, normalization)
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(whole, split, strict=True))


def test_group_advantages():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert torch.allclose(group_advantages(scores, "none"), torch.tensor([0.5, -0.5, -0.5, 0.5]))
    scaled = group_advantages(scores, "group")
    assert scaled.mean().abs() < 1e-6 and scaled.std().item() == pytest.approx(1.0, abs=1e-4)


@pytest.mark.learning
def test_grpo_steps_raise_the_rewarded_completion(tiny_model_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path)
    # the task as the tiny model knows it (system line included): without the system line
    # the prompt is outside what it was trained on, and pushing three digits down there
    # moves mass to non-digit tokens instead of to the rewarded one
    prompt = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "Answer with one digit."},
            {"role": "user", "content": "What is 3 + 4 mod 10?"},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answers = ["7", "2", "5", "9"]
    rows = [
        prompt_ids + tokenizer(a + "<|im_end|>", add_special_tokens=False)["input_ids"]
        for a in answers
    ]
    width = max(map(len, rows))
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    mask = torch.zeros(len(rows), width - 1, dtype=torch.bool)
    for i, row in enumerate(rows):
        mask[i, len(prompt_ids) - 1 : len(row) - 1] = True
    advantages = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]))[:, None].expand(-1, width - 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def sequence_logprobs() -> torch.Tensor:
        with torch.no_grad():
            return (token_logprobs(model(ids).logits, ids) * mask).sum(dim=1)

    before = sequence_logprobs()
    for _ in range(20):
        logp = token_logprobs(model(ids).logits, ids)
        loss, _ = policy_loss(
            logp, logp.detach(), advantages, mask, LossSettings(), int(mask.sum()), 4
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = sequence_logprobs()
    # The direction the advantages set, not a speed: how far 20 AdamW steps move a
    # completion depends on the tiny model each machine built (its kernels shape it),
    # so a calibrated "+1.0 nats" held on one machine and failed on another (+0.79).
    # The margin only has to rule out float rounding: 100 times the largest rounding
    # error a summed log-probability of these rows can carry under another kernel path.
    rows_logits = model(ids).logits.detach()
    margin = 100 * logprob_tolerance(rows_logits, SAME_LIBRARY_LOGPROB_REL) * int(mask.sum(1).max())
    change = after - before
    assert change[0] > margin, (before, after, margin)
    assert all(change[i] < -margin for i in (1, 2, 3)), (before, after, margin)


@pytest.mark.parametrize("sentinel", [math.nan, math.inf, -math.inf, 1e9, -1e9, -9999.0])
def test_extreme_values_at_masked_positions_change_nothing(sentinel):
    """T3: exp() of a masked position's placeholder used to reach the loss as inf * 0 = NaN."""
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1]], dtype=torch.bool)
    advantages = torch.tensor([[-1.0] * 4, [2.0] * 4])
    clean_old = torch.tensor([[-1.0, -0.5, -2.0, -1.0], [-1.0, -1.0, -0.1, -3.0]])
    clean_ref = clean_old - 0.3
    settings = LossSettings(kl_coef=0.1, clip_eps_high=0.28)

    def run(old: torch.Tensor, ref: torch.Tensor):
        logp = torch.tensor([[-95.0, -0.6, -1.8, -0.2], [-0.3, -88.0, -0.2, -2.5]])
        logp.requires_grad_(True)
        loss, metrics = policy_loss(logp, old, advantages, mask, settings, 4, 2, ref_logprobs=ref)
        loss.backward()
        return loss, logp.grad, metrics

    poisoned_old = torch.where(mask, clean_old, torch.tensor(sentinel))
    poisoned_ref = torch.where(mask, clean_ref, torch.tensor(sentinel))
    loss, grad, metrics = run(poisoned_old, poisoned_ref)
    clean_loss, clean_grad, clean_metrics = run(clean_old, clean_ref)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert loss.item() == clean_loss.item() and torch.equal(grad, clean_grad)
    assert metrics == clean_metrics


def test_equal_scores_give_exactly_zero_advantages():
    """T4: the float32 mean of [0.9] * 16 is off by one ulp; divided by ~0 that was -0.056."""
    for scores in ([0.9] * 16, [0.3] * 7, [1e6 + 0.1] * 5):
        for scale in ("group", "none"):
            advantages = group_advantages(torch.tensor(scores), scale)
            assert torch.count_nonzero(advantages) == 0, (scores, scale, advantages)


def test_a_group_of_one_keeps_its_raw_score():
    """T5: upstream trains a singleton group on its score (there is no group to compare to)."""
    for scale in ("group", "none"):
        assert group_advantages(torch.tensor([0.75]), scale).tolist() == [0.75]
