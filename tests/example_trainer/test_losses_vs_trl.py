"""Our losses against TRL's own GRPOTrainer._compute_loss on the same tensors.

TRL's method is called unbound on a stand-in for the trainer that holds the settings
and answers the model's forward with given logprobs and entropies, so the loss and its
gradients with respect to those logprobs come from TRL's code, not from a copy of it.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from example_trainer.importance import correction_weights  # noqa: E402
from example_trainer.loss import LossSettings, policy_loss  # noqa: E402
from example_trainer.losses import LOSSES  # noqa: E402

B, T, MAX_LENGTH = 3, 5, 8


class Accelerator:
    num_processes = 1
    sync_gradients = True

    @staticmethod
    def gather(tensor):
        return tensor.reshape(-1) if tensor.dim() == 0 else tensor

    gather_for_metrics = gather

    @staticmethod
    def reduce(tensor, reduction="sum"):
        return tensor


def trl_loss(settings: LossSettings, tensors: dict, is_ratio=None, entropy_coef=0.0):
    """TRL's loss and d loss / d (logprobs, entropies) for `tensors`."""
    logp = tensors["logp"].clone().requires_grad_(True)
    entropy = tensors["entropy"].clone().requires_grad_(True)
    mask = tensors["mask"].float()
    stand_in = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, entropy, None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=settings.importance_sampling_level,
        beta=settings.kl_coef,
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        loss_type=LOSSES[settings.loss_type].trl_loss_type,
        epsilon_low=settings.clip_eps,
        epsilon_high=settings.eps_high,
        use_vllm=is_ratio is not None,
        vllm_importance_sampling_correction=is_ratio is not None,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=MAX_LENGTH,
        accelerator=Accelerator(),
        _entropy_bonus_enabled=entropy_coef > 0,
        entropy_coef=entropy_coef,
        use_adaptive_entropy=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        aux_loss_enabled=False,
    )
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": tensors["advantages"],
        "old_per_token_logps": tensors["old"],
        "ref_per_token_logps": tensors["ref"],
        "num_items_in_batch": mask.sum(),
    }
    if is_ratio is not None:
        inputs["importance_sampling_ratio"] = is_ratio
    # TRL imports on first use, not at collection: with it come peft and bitsandbytes,
    # about 7 s of CPU that every pytest session would pay, this module's tests or not
    trl = pytest.importorskip("trl")
    loss = trl.GRPOTrainer._compute_loss(stand_in, None, inputs)
    loss.backward()
    return loss.detach(), logp.grad, entropy.grad


def our_loss(settings: LossSettings, tensors: dict, behaviour=None):
    logp = tensors["logp"].clone().requires_grad_(True)
    entropy = tensors["entropy"].clone().requires_grad_(True)
    mask = tensors["mask"]
    loss, metrics = policy_loss(
        logp,
        tensors["old"],
        tensors["advantages"][:, None].expand(B, T),
        mask,
        settings,
        int(mask.sum()),
        B,
        behaviour_logprobs=behaviour,
        ref_logprobs=tensors["ref"],
        entropy=entropy if settings.entropy_coef else None,
    )
    loss.backward()
    return loss.detach(), logp.grad, entropy.grad, metrics


def batch(seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=generator) * 3
    return {
        "logp": logp,
        # ratios from about 0.5 to 2: inside and outside every clip range used here
        "old": logp + (torch.rand(B, T, generator=generator) - 0.5) * 1.4,
        "ref": logp + (torch.rand(B, T, generator=generator) - 0.5) * 0.6,
        "entropy": torch.rand(B, T, generator=generator) * 2,
        "advantages": torch.tensor([1.3, -0.7, 0.4]),
        "mask": torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool),
    }


CASES = [
    LossSettings(loss_type="dapo"),
    LossSettings(loss_type="grpo"),
    LossSettings(loss_type="dr_grpo", max_length=MAX_LENGTH),
    LossSettings(loss_type="dapo", clip_eps_high=0.28),
    LossSettings(loss_type="cispo", clip_eps_high=1.5),
    # GSPO, with its paper's clip range
    LossSettings(
        loss_type="grpo", importance_sampling_level="sequence", clip_eps=3e-4, clip_eps_high=4e-4
    ),
    LossSettings(loss_type="dapo", importance_sampling_level="sequence", clip_eps=0.05),
    LossSettings(loss_type="dapo", kl_coef=0.1),
    LossSettings(loss_type="grpo", kl_coef=0.05, clip_eps_high=0.28),
    LossSettings(loss_type="dr_grpo", kl_coef=0.1, max_length=MAX_LENGTH),
    LossSettings(loss_type="dapo", entropy_coef=0.01),
    LossSettings(loss_type="grpo", entropy_coef=0.02),
]


def case_id(settings: LossSettings) -> str:
    parts = [settings.loss_type, settings.importance_sampling_level]
    parts += [
        f"{name}={getattr(settings, name)}"
        for name in ("kl_coef", "entropy_coef")
        if getattr(settings, name)
    ]
    return "-".join(parts) + (
        "" if settings.clip_eps_high is None else f"-high{settings.clip_eps_high}"
    )


def agree_with_trl(settings: LossSettings, seeds: int = 3) -> list[float]:
    """Loss and gradients equal TRL's on `seeds` batches; the clip fractions seen."""
    clipped = []
    for seed in range(seeds):
        tensors = batch(seed)
        theirs, their_grad, their_entropy_grad = trl_loss(
            settings, tensors, entropy_coef=settings.entropy_coef
        )
        ours, our_grad, our_entropy_grad, metrics = our_loss(settings, tensors)
        assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-7)
        assert torch.allclose(our_grad, their_grad, rtol=1e-5, atol=1e-7)
        if settings.entropy_coef:
            assert torch.allclose(our_entropy_grad * tensors["mask"], their_entropy_grad, atol=1e-7)
        clipped.append(metrics["clip_fraction"])
    return clipped


@pytest.mark.parametrize("settings", CASES, ids=case_id)
def test_loss_and_gradients_equal_trls(settings):
    clipped = agree_with_trl(settings)
    # the cases reach the branches they claim to: some tokens are clipped (cispo: capped)
    assert max(clipped) > 0


LIBRARY_LOSSES = sorted(
    name for name, kind in LOSSES.items() if kind.per_token.__module__.startswith("example_")
)
"""Every loss the library registers (not those tests register), whatever else is imported."""


@pytest.mark.parametrize("name", LIBRARY_LOSSES)
def test_every_registered_loss_equals_trls_or_has_none(name):
    """A loss registered with a TRL counterpart is checked against it under its own
    defaults; one registered with `trl=None` says so here."""
    kind = LOSSES[name]
    if kind.trl_loss_type is None:
        pytest.skip(f"{name} is registered as having no TRL counterpart")
    defaults = LossSettings(
        loss_type=name, clip_eps_high=kind.default_clip_eps_high, max_length=MAX_LENGTH
    )
    agree_with_trl(defaults, seeds=1)  # CASES tries the library's own on three


@pytest.mark.parametrize(
    "mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
)
def test_the_importance_sampling_correction_equals_trls(mode):
    """The weight multiplies each token's loss as in TRL; TRL is given our weight, and the
    weight itself is checked against its definition in test_losses.py."""
    tensors = batch(2)
    # the rollout's logprobs: the trainer's ("old") shifted, some far enough to be cut
    behaviour = tensors["old"] - torch.tensor([0.05, -0.3, 1.4])[:, None]
    settings = LossSettings(loss_type="dapo", is_mode=mode, is_clip_min=0.5, is_clip_max=2.0)
    trained = tensors["mask"]
    segments = torch.arange(B)[:, None].expand(B, T)
    weights, _ = correction_weights(tensors["old"], behaviour, trained, segments, B, mode, 0.5, 2.0)
    trl_ratio = weights[:, :1] if mode.startswith("sequence") else weights
    # ours computes the weight itself, from the trainer's logprobs before the update,
    # which are `old` here: the ratio's reference and the IS numerator coincide (TRL's)
    tensors = {**tensors, "logp": tensors["old"].clone()}
    theirs, their_grad, _ = trl_loss(settings, tensors, is_ratio=trl_ratio)
    ours, our_grad, _, metrics = our_loss(settings, tensors, behaviour=behaviour)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-7)
    assert torch.allclose(our_grad, their_grad, rtol=1e-5, atol=1e-7)
    assert 0 < metrics["is_clip_fraction"] < 1
