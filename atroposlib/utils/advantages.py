"""Advantage and statistics helpers kept for compatibility with Atropos user code.

Environments and trainers written against upstream Atropos import these functions from
``atroposlib.utils.advantages``; this module provides the same names, signatures and results
using numpy only. Tensor-like inputs (e.g. CPU torch tensors) are accepted via ``np.asarray``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np


def allclose_to_first(
    values: Sequence[Any],
    rtol: float = 1e-5,
    atol: float = 1e-8,
    equal_nan: bool = False,
    return_vector: bool = False,
) -> bool | list[bool]:
    """Check whether every array in ``values`` is close to the first one.

    Closeness follows ``numpy.allclose`` with the given ``rtol``, ``atol`` and ``equal_nan``.
    With ``return_vector=True`` a per-array list of booleans is returned (the first entry is
    compared with itself). An empty ``values`` gives ``True`` (or ``[]``).
    """
    if len(values) == 0:
        return [] if return_vector else True
    reference = np.asarray(values[0])
    flags = [
        bool(np.allclose(np.asarray(v), reference, rtol=rtol, atol=atol, equal_nan=equal_nan))
        for v in values
    ]
    return flags if return_vector else all(flags)


def _flatten(data: Any) -> Iterator[float]:
    """Yield every number in a possibly jagged nested structure."""
    if isinstance(data, (list, tuple)):
        for item in data:
            yield from _flatten(item)
    else:
        yield from np.asarray(data, dtype=float).ravel().tolist()


def compute_stats(data: Sequence[Any]) -> dict[str, float]:
    """Population mean and variance (ddof=0) of all numbers in a jagged nested list."""
    flat = np.fromiter(_flatten(data), dtype=float)
    if flat.size == 0:
        raise ValueError("compute_stats: no numeric data found")
    return {"mean": float(flat.mean()), "var": float(flat.var())}


def compute_discounted_returns(rewards: Sequence[float] | np.ndarray, gamma: float) -> np.ndarray:
    """Discounted returns ``G_t = r_t + gamma * G_{t+1}`` with ``G`` zero after the last step."""
    r = np.asarray(rewards, dtype=float)
    if r.ndim != 1:
        raise ValueError(f"compute_discounted_returns: expected 1-D rewards, got shape {r.shape}")
    returns = np.zeros_like(r)
    running = 0.0
    for t in range(len(r) - 1, -1, -1):
        running = r[t] + gamma * running
        returns[t] = running
    return returns


def compute_grpo_process_supervision_advantages(
    rewards: Sequence[Sequence[float]],
    gamma: float | None = None,
    std_tol: float = 1e-8,
) -> list[np.ndarray]:
    """Per-step GRPO advantages for process supervision.

    All step rewards of all trajectories are normalised by their global mean and population
    std. Each trajectory then gets the reverse cumulative sum of its normalised rewards
    (``gamma=None``) or their discounted returns (``gamma`` given).
    """
    trajectories = [np.asarray(traj, dtype=float).ravel() for traj in rewards]
    all_steps = np.concatenate(trajectories) if trajectories else np.array([])
    if all_steps.size == 0:
        raise ValueError("compute_grpo_process_supervision_advantages: no rewards given")
    mean = all_steps.mean()
    std = all_steps.std()
    if std < std_tol:
        raise ValueError(
            f"compute_grpo_process_supervision_advantages: reward std {std:.3g} is below "
            f"std_tol {std_tol:.3g}; cannot normalise rewards that are (nearly) all equal"
        )
    advantages = []
    for traj in trajectories:
        normalised = (traj - mean) / std
        if gamma is None:
            advantages.append(np.cumsum(normalised[::-1])[::-1].copy())
        else:
            advantages.append(compute_discounted_returns(normalised, gamma))
    return advantages
