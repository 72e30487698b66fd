"""get_std_min_max_avg: the four statistics upstream's BaseEnv.perf_stats logs per series;
plain_numbers: those numpy values as Python numbers where a dict is printed or written."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from atroposlib.utils.metrics import get_std_min_max_avg, plain_numbers


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


def test_plain_numbers_turns_numpy_into_what_json_and_a_log_line_show():
    metrics = get_std_min_max_avg("t", [0.25, 0.75], {"n": np.int64(3), "ok": np.bool_(True)})
    metrics["nested"] = {"f32": np.float32(0.5), "list": (np.int32(1), np.array([2, 3]))}
    plain = plain_numbers(metrics)
    assert plain == {
        "n": 3,
        "ok": True,
        "t_mean": 0.5,
        "t_std": 0.25,
        "t_max": 0.75,
        "t_min": 0.25,
        "nested": {"f32": 0.5, "list": [1, [2, 3]]},
    }
    assert "np." not in repr(plain) and "array" not in repr(plain)
    assert json.loads(json.dumps(plain)) == plain  # numpy's int64 and float32 would raise
    assert type(plain["t_mean"]) is float and type(plain["n"]) is int
    assert plain_numbers("text") == "text" and plain_numbers(None) is None
