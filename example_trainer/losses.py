"""The policy losses as registered kinds: each one is a small function of typed inputs.

Design (verl's `register_policy_loss`, prime-rl's `LossInputs`/`LossOutputs`):
`loss.policy_loss` does what every loss shares (the ratio, the importance-sampling
correction, the KL, the entropy bonus, the normaliser and the metrics) and calls the
registered function only for what differs: each trained token's loss, and which
tokens' gradient it cut. A new loss is one function under `@register_loss`, picked by
`--loss-type NAME`; a user's loss outside the library is picked by
`--loss-import-path module:function` (prime-rl's `CustomLossConfig`).

Each registration states its TRL counterpart (`trl=`, TRL's `loss_type`, or None),
and `tests/example_trainer/test_losses_vs_trl.py` runs every registered loss with one
against TRL's own `_compute_loss`.

This module never imports torch (the functions use tensor methods only), so
`atropos-launch` checks `--loss-type` against the registry without paying for torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator

if TYPE_CHECKING:
    from torch import Tensor

# A log-ratio (or KL log-ratio) beyond +-20 (a factor of 5e8) is clamped, and its
# gradient stops there: exp() of it would overflow float32 at 88, and one such token
# would otherwise decide the whole clipped gradient of the step.
LOG_RATIO_LIMIT = 20.0

Normaliser = Literal["token", "sequence", "constant"]
DistillMode = Literal["reverse_kl", "forward_topk"]
"""The distillation term's estimator (distill.py says what each one is)."""
"""How token losses become the batch loss, always over the whole accumulated batch:
token: sum over all trained tokens / their count (DAPO); sequence: each sequence's
mean / sequences (DeepSeekMath's GRPO); constant: sum / (sequences x --seq-len)
(Dr. GRPO)."""


@dataclass(frozen=True)
class LossInputs:
    """What a loss sees of one micro-batch; every tensor is [B, T] over token positions."""

    logprobs: Tensor
    """The policy's logprobs of the sampled tokens, carrying the gradient; 0 where untrained."""
    ratio: Tensor
    """r_t = exp(logp_t - old_t), per token or per sequence (`--importance-sampling-level`),
    its log clamped to +-20; 1 where untrained."""
    advantages: Tensor
    """Each token's advantage; 0 where untrained."""
    trained: Tensor
    """Bool: the positions the loss trains."""
    clip_low: float
    """The ratio's lower clip bound, 1 - `--clip-eps`."""
    clip_high: float
    """`--clip-eps-high` (or `--clip-eps`) above 1: the upper clip bound is 1 + this;
    a capping loss (`clip_eps_high_is_cap`) takes it as the cap itself."""


@dataclass(frozen=True)
class LossOutputs:
    """A loss's answer: each token's loss before the correction weight, the KL and the
    normaliser, and the tokens whose gradient it cut (reported as `clip_fraction`)."""

    per_token: Tensor
    gradient_cut: Tensor


LossFunction = Callable[[LossInputs], LossOutputs]


@dataclass(frozen=True)
class LossKind:
    """A registered loss and what the trainer must know about it."""

    name: str
    per_token: LossFunction
    normaliser: Normaliser
    trl_loss_type: str | None
    """TRL's `loss_type` that computes the same loss, or None when TRL has none."""
    scale_advantages: Literal["group", "none"] = "group"
    """`--scale-advantages`'s default under this loss."""
    clip_eps_high_is_cap: bool = False
    """`--clip-eps-high` is an absolute cap on a weight (at least 1), not a clip range."""
    default_clip_eps_high: float | None = None
    """`--clip-eps-high`'s default under this loss."""
    default_clip_eps: float | None = None
    """`--clip-eps`'s default under this loss (None: the flag's own)."""
    ratio_level: Literal["token", "sequence"] = "token"
    """"sequence": the loss is defined on each sequence's ratio, whatever
    `--importance-sampling-level` says (GSPO)."""


LOSSES: dict[str, LossKind] = {}
"""Every loss `--loss-type` can name, by name."""


def register_loss(
    name: str,
    *,
    trl: str | None,
    normaliser: Normaliser = "token",
    scale_advantages: Literal["group", "none"] = "group",
    clip_eps_high_is_cap: bool = False,
    default_clip_eps_high: float | None = None,
    default_clip_eps: float | None = None,
    ratio_level: Literal["token", "sequence"] = "token",
) -> Callable[[LossFunction], LossFunction]:
    """Register the decorated function as the loss `name` (a name is taken once)."""

    def register(function: LossFunction) -> LossFunction:
        taken = LOSSES.get(name)
        if taken is not None and taken.per_token is not function:
            raise ValueError(f"a loss named {name!r} is already registered")
        LOSSES[name] = LossKind(
            name,
            function,
            normaliser,
            trl,
            scale_advantages,
            clip_eps_high_is_cap,
            default_clip_eps_high,
            default_clip_eps,
            ratio_level,
        )
        return function

    return register


def loss_kind(name: str) -> LossKind:
    """The registered loss `name`, or an error that lists the names there are."""
    kind = LOSSES.get(name)
    if kind is None:
        raise ValueError(
            f"no loss named {name!r}; registered: {', '.join(sorted(LOSSES))} "
            "(a loss of your own: --loss-import-path module:function)"
        )
    return kind


def ratio_level(
    kind: LossKind, level: Literal["token", "sequence"], given: bool
) -> Literal["token", "sequence"]:
    """The ratio level a loss trains with: the flag's, unless the loss is defined on one
    (GSPO on each sequence's), which a contrary flag cannot change."""
    if kind.ratio_level == "token":
        return level
    if given and level != kind.ratio_level:
        raise ValueError(
            f"--loss-type {kind.name} is defined on each sequence's ratio; drop "
            f"--importance-sampling-level {level}"
        )
    return kind.ratio_level


def _known_loss(name: str) -> str:
    loss_kind(name)
    return name


LossType = Annotated[str, AfterValidator(_known_loss)]
"""A loss name that is registered."""

IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def load_loss(import_path: str) -> LossKind:
    """The loss at `module:function` (a module on the Python path or under the current
    directory): the kind its module registered for that function, or else the plain
    function registered under the path itself, per-token normalised, with no TRL
    counterpart."""
    if not IMPORT_PATH.match(import_path):
        raise ValueError(f"--loss-import-path wants module:function, got {import_path!r}")
    module_name, attribute = import_path.split(":")
    if os.getcwd() not in sys.path:  # found as the trainer's `python -m` finds it
        sys.path.insert(0, os.getcwd())
    try:
        found = importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        found = False
    if not found:
        raise ValueError(f"--loss-import-path: no module {module_name!r} on the Python path")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise ValueError(f"--loss-import-path: importing {module_name} failed: {error}") from error
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ValueError(f"--loss-import-path: {module_name} has no function {attribute!r}")
    for kind in LOSSES.values():
        if kind.per_token is function:
            return kind
    register_loss(import_path, trl=None)(function)
    return LOSSES[import_path]


# ------------------------------------------------------------------ the losses
def clipped_surrogate(inputs: LossInputs) -> LossOutputs:
    """PPO's pessimistic clip: -min(r A, clip(r, low, high) A). `min` makes the clip
    one-sided in the right direction for both signs of A: for A > 0 the gradient
    vanishes once r > high, for A < 0 once r < low. (Taking the max for A < 0, as the
    Atropos example trainer does, un-clips harmful updates and zeroes useful ones.)"""
    ratio, advantages = inputs.ratio, inputs.advantages
    low, high = inputs.clip_low, 1.0 + inputs.clip_high
    clipped = ratio.clamp(low, high) * advantages
    per_token = -(ratio * advantages).minimum(clipped)
    cut = ((advantages > 0) & (ratio > high)) | ((advantages < 0) & (ratio < low))
    return LossOutputs(per_token, cut)


register_loss("dapo", trl="dapo")(clipped_surrogate)
register_loss("grpo", trl="grpo", normaliser="sequence")(clipped_surrogate)
register_loss("dr_grpo", trl="dr_grpo", normaliser="constant", scale_advantages="none")(
    clipped_surrogate
)

# GSPO (arXiv:2507.18071): the clipped surrogate on each sequence's ratio, the geometric
# mean of its token ratios, averaged per sequence; its clip ranges are the paper's (and
# TRL's recipe: loss_type grpo, importance_sampling_level sequence, epsilon 3e-4/4e-4).
register_loss(
    "gspo",
    trl="grpo",
    normaliser="sequence",
    ratio_level="sequence",
    default_clip_eps=3e-4,
    default_clip_eps_high=4e-4,
)(clipped_surrogate)

CISPO_DEFAULT_CAP = 5.0
"""--loss-type cispo's IS weight cap without --clip-eps-high (ScaleRL, arXiv:2510.13786)."""


@register_loss(
    "cispo", trl="cispo", clip_eps_high_is_cap=True, default_clip_eps_high=CISPO_DEFAULT_CAP
)
def cispo(inputs: LossInputs) -> LossOutputs:
    """MiniMax-M1's (arXiv:2506.13585): -sg(min(r, cap)) A logp, a stop-gradient weight
    on the log-likelihood, so every token keeps its gradient and only its weight is
    capped (the cap is `--clip-eps-high` itself, as TRL's epsilon_high for cispo)."""
    capped = inputs.ratio.clamp(max=inputs.clip_high).detach()
    per_token = -capped * inputs.advantages * inputs.logprobs
    cut = (inputs.ratio > inputs.clip_high) & (inputs.advantages > 0)
    return LossOutputs(per_token, cut)
