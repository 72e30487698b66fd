"""get_std_min_max_avg: the four statistics upstream's BaseEnv.perf_stats logs per series."""

from __future__ import annotations

import math

import numpy as np
import pytest

from atroposlib.utils.metrics import get_std_min_max_avg


def test_adds_the_four_statistics_in_place():
    metrics = {"other": 1}
    durations = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]
    returned = get_std_min_max_avg("train_perf/task_duration", durations, metrics)
    assert returned is metrics
    assert metrics == {
        "other": 1,
        "train_perf/task_duration_mean": 5.0,
        "train_perf/task_duration_std": 2.0,  # population standard deviation
        "train_perf/task_duration_max": 9.0,
        "train_perf/task_duration_min": 2.0,
    }


def test_values_match_numpy_for_ints_and_arrays():
    data = [3, 1, 4, 1, 5, 9, 2, 6]
    metrics = get_std_min_max_avg("w", np.array(data), {})
    assert metrics["w_mean"] == pytest.approx(sum(data) / len(data))
    expected_std = math.sqrt(sum((x - 31 / 8) ** 2 for x in data) / len(data))
    assert metrics["w_std"] == pytest.approx(expected_std)
    assert (metrics["w_max"], metrics["w_min"]) == (9, 1)


def test_single_value_has_zero_spread():
    metrics = get_std_min_max_avg("x", [3.5], {})
    assert metrics == {"x_mean": 3.5, "x_std": 0.0, "x_max": 3.5, "x_min": 3.5}


def test_empty_data_is_a_clear_error():
    metrics: dict = {}
    with pytest.raises(ValueError, match="'latency'"):
        get_std_min_max_avg("latency", [], metrics)
    assert metrics == {}
