"""Summary statistics of a list of measurements, written into a wandb-style metrics dict.

The dict is updated in place (and returned) so that callers can collect several
series into the one dict they log.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["get_std_min_max_avg"]


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
