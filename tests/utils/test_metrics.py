"""get_std_min_max_avg: the four statistics upstream's BaseEnv.perf_stats logs per series;
plain_numbers: those numpy values as Python numbers where a dict is printed or written."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from atroposlib.utils.metrics import RecentRate, get_std_min_max_avg, plain_numbers


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


def test_a_recent_rate_forgets_a_slow_start_once_it_is_a_window_behind():
    """The quickstart's shape: 100 s waiting for the trainer, then 10 groups a second."""
    rate = RecentRate(window_s=60.0)
    assert rate.add(0.0, 0) is None  # one sample: no rate yet
    assert rate.add(100.0, 0) == 0.0
    per_s = [rate.add(100.0 + t, 10.0 * t) for t in range(1, 181)]
    assert per_s[29] == pytest.approx(300 / 130)  # 30 s in: the wait is still in the window
    since_start = 1800 / 280  # what an average since the start would say at 180 s
    assert per_s[-1] == pytest.approx(10.0) and since_start < 6.5
    assert len(rate.samples) == 61  # the anchor and the last 60 s, not the whole run


def test_a_recent_rate_spans_samples_further_apart_than_its_window():
    rate = RecentRate(window_s=60.0)
    rate.add(1000.0, 5)
    assert rate.add(1300.0, 65) == pytest.approx(0.2)  # a 300 s step: the anchor stays
    assert rate.add(1310.0, 75) == pytest.approx(70 / 310)
    # the newest sample at least a window old anchors: 1310 s, not 1000 s or 1300 s
    assert rate.add(1400.0, 85) == pytest.approx(10 / 90)


def test_a_recent_rate_starts_over_when_the_count_or_clock_goes_back():
    rate = RecentRate(window_s=10.0)
    rate.add(0.0, 50)
    rate.add(5.0, 100)
    assert rate.add(6.0, 3) is None  # a restarted service counts from 0 again
    assert rate.add(8.0, 7) == pytest.approx(2.0)
    assert rate.add(7.0, 9) is None  # monotonic clocks do not, but a given time may


def test_a_recent_rate_waits_for_its_minimum_span():
    """A burst at the start (eight rollouts finishing at once) is no pace."""
    rate = RecentRate(window_s=60.0, min_span_s=10.0)
    assert rate.add(0.0, 1) is None
    assert rate.add(0.07, 8) is None  # 100 groups a second, for 70 ms
    assert rate.add(9.9, 20) is None
    assert rate.add(10.0, 21) == pytest.approx(2.0)
