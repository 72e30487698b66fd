"""Advantage and statistics helpers kept for compatibility with Atropos user code.

Environments and trainers written against upstream Atropos import these functions from
``atroposlib.utils.advantages``; this module provides the same names, signatures and results
using numpy only. Tensor-like inputs (e.g. CPU torch tensors) are accepted via ``np.asarray``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt


def allclose_to_first(
    values: Sequence[Any] | np.ndarray,
    rtol: float = 1e-5,
    atol: float = 1e-8,
    equal_nan: bool = False,
    return_vector: bool = False,
) -> bool | np.ndarray:
    """Check whether every entry of ``values`` is close to the first one.

    ``values`` must be rectangular (it is read with ``np.asarray``); entry ``i`` is close
    when every element of ``values[i]`` is ``np.isclose`` to the matching one of
    ``values[0]``. Returns a Python ``bool``, or with ``return_vector=True`` a 1-D numpy
    bool array with one flag per entry (the first is always True unless it holds a NaN
    and ``equal_nan`` is False). An empty ``values`` gives ``True`` (or an empty array).
    """
    try:
        array = np.asarray(values)
    except ValueError as exc:
        raise ValueError(
            f"allclose_to_first: values must be rectangular (same shape for every entry): {exc}"
        ) from exc
    if array.ndim == 0:
        raise ValueError("allclose_to_first: values must be a sequence, got a scalar")
    if array.shape[0] == 0:
        return np.zeros(0, dtype=bool) if return_vector else True
    close = np.isclose(array, array[0], rtol=rtol, atol=atol, equal_nan=equal_nan)
    flags = close.reshape(close.shape[0], -1).all(axis=1)
    return flags if return_vector else bool(flags.all())


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
    """Discounted returns ``G_t = r_t + gamma * G_{t+1}`` with ``G`` zero after the last step.

    The result is float32 for a list (as upstream), keeps the dtype of a floating numpy
    array, and is float64 for an integer array (upstream would truncate to integers).
    """
    dtype: npt.DTypeLike
    if isinstance(rewards, np.ndarray):
        dtype = rewards.dtype if np.issubdtype(rewards.dtype, np.floating) else np.float64
    else:
        dtype = np.float32
    r = np.asarray(rewards, dtype=dtype)
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
