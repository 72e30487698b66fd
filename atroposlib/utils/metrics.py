"""Summary statistics of a list of measurements, written into a wandb-style metrics dict.

The dict is updated in place (and returned) so that callers can collect several
series into the one dict they log. The values are numpy scalars, as upstream's
(wandb takes them); `plain_numbers` turns them into Python numbers where a dict is
printed or written as JSON, so a log reads `0.5`, not `np.float64(0.5)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["get_std_min_max_avg", "plain_numbers"]


def plain_numbers(value: Any) -> Any:
    """`value` with numpy scalars and arrays, at any depth of dicts, lists and tuples,
    as Python numbers and lists (tuples become lists, as JSON writes them)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {key: plain_numbers(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain_numbers(item) for item in value]
    return value


def get_std_min_max_avg(name: str, data: Sequence[float] | np.ndarray, metrics_dict: dict) -> dict:
    """Add ``{name}_mean``, ``{name}_std`` (population), ``{name}_max`` and ``{name}_min``.

    Returns ``metrics_dict``; raises ValueError on empty ``data``.
    """
    values = np.asarray(data)
    if values.size == 0:
        raise ValueError(f"get_std_min_max_avg: no data for metric {name!r}")
    metrics_dict[f"{name}_mean"] = np.mean(values)
    metrics_dict[f"{name}_std"] = np.std(values)
    metrics_dict[f"{name}_max"] = np.max(values)
    metrics_dict[f"{name}_min"] = np.min(values)
    return metrics_dict
