"""Tolerances for floats computed in different orders, scaled to what is compared.

float32 keeps about 7 significant digits (eps = 1.19e-7). A sum of n terms
taken in another order (AVX2 against AVX-512 kernels, two ranks plus an
all-reduce against one pass, vLLM's kernels against transformers', a KV cache
against a full forward) moves by up to about n * eps times the sum of the
terms' magnitudes. An absolute bound such as 1e-7 therefore holds on one CPU
and fails on another. Each bound here is a multiple of the size of the values
compared, wide enough for any kernel path and still orders of magnitude below
what a real error (a missing factor, a dropped term) produces.
"""

from __future__ import annotations

import torch

# Gradients of one batch, reduced in another order: measured on AMD EPYC, the largest
# difference relative to the tensor's largest entry is 3e-6 between 1 and 2 ranks and
# 4e-6 between the AVX2 and AVX-512 kernels in one process. 1e-4 leaves a 25x margin;
# a missing world-size factor is off by 0.5.
GRADIENT_REL_TO_SCALE = 1e-4

# Log-probabilities from two engines: log_softmax subtracts a log-sum-exp of the logits,
# so its rounding error is proportional to the logits' magnitude, not to the logprob.
# Same library, another batch layout or KV cache: 1e-5 of the largest |logit|.
# Another engine's kernels (vLLM): 1e-4.
SAME_LIBRARY_LOGPROB_REL = 1e-5
OTHER_ENGINE_LOGPROB_REL = 1e-4


def assert_close_to_scale(
    actual: torch.Tensor, expected: torch.Tensor, rel_to_scale: float, name: str = ""
) -> None:
    """Every entry within `rel_to_scale` times the largest |entry| of `expected`.

    Elementwise relative tolerance fails on entries that are near zero by
    cancellation, whose rounding error is set by the terms summed, not the result.
    """
    scale = expected.abs().max().item()
    worst = (actual - expected).abs().max().item()
    assert worst <= rel_to_scale * scale, (
        f"{name}: largest difference {worst:.3g} exceeds {rel_to_scale:g} x scale {scale:.3g}"
    )


def logprob_tolerance(logits: torch.Tensor, rel: float) -> float:
    """The bound for a log-probability computed from `logits` in another order."""
    return rel * max(1.0, logits.abs().max().item())
