"""The deadlines of the launch and fault tests come from the run's own pace
(tests/support/pace.py): its first step, its steps and its restarts."""

from __future__ import annotations

import json

import pytest

from tests.support.pace import FIRST_STEP_S, SLACK, CountPace, Pace


def write_rows(path, rows) -> None:
    path.write_text("".join(json.dumps({"step": s, "time": t}) + "\n" for s, t in rows))


def test_before_its_first_step_a_run_gets_the_fixed_first_step_allowance(tmp_path):
    pace = Pace(tmp_path / "metrics.jsonl", started=100.0)
    assert pace.allowance(steps=50, restarts=3) == FIRST_STEP_S
    assert pace.allowance(plus_s=7) == FIRST_STEP_S + 7


def test_steps_and_restarts_are_timed_from_the_rows(tmp_path):
    path = tmp_path / "metrics.jsonl"
    pace = Pace(path, started=100.0)
    # first step 30 s after the launch, then 2 s a step; killed at 137, back at step 1 at 177
    write_rows(path, [(1, 130.0), (2, 132.0), (3, 134.0), (4, 136.0), (1, 177.0), (2, 179.0)])
    pace.kills.append(137.0)
    pace.read()
    assert pace.startup_s == 30.0 and pace.step_s == 2.0
    assert pace.restart_s == 40.0  # the kill to the next row, longer than the start
    assert pace.allowance(steps=10, restarts=1) == SLACK * (40.0 + 10 * 2.0)
    assert pace.allowance(steps=1) == 30.0  # never under the run's own start
    assert pace.step == 2


def test_a_run_that_slows_down_gets_more_time_per_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    pace = Pace(path, started=0.0)
    times = [10.0 + i for i in range(10)] + [19.0 + 5 * i for i in range(1, 6)]
    write_rows(path, list(enumerate(times, start=1)))
    pace.read()
    assert pace.step_s == 5.0  # the last steps' mean, above the median of 1 s


def test_an_interval_with_a_kill_in_it_is_a_restart_not_a_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    pace = Pace(path, started=0.0)
    write_rows(path, [(1, 10.0), (2, 11.0), (3, 60.0)])  # resumed at step 3
    pace.kills.append(12.0)
    pace.read()
    assert pace.step_s == 1.0 and pace.restart_s == 48.0


def test_a_stalled_wait_fails_saying_how_far_the_run_got(tmp_path):
    path = tmp_path / "metrics.jsonl"
    pace = Pace(path)
    write_rows(path, [(1, pace.started + 0.01), (2, pace.started + 0.02)])
    with pytest.raises(AssertionError) as failure:
        pace.wait(lambda: False, "the trainer never reached step 5", steps=3, poll_s=0.01)
    said = str(failure.value)
    assert said.startswith("the trainer never reached step 5: waited ")
    assert "newest step 2 (2 rows, 0 kills)" in said


def test_a_count_is_timed_as_it_is_seen():
    seen = [0]
    pace = CountPace(lambda: seen[0])
    pace.read()
    assert pace.startup_s is None
    seen[0] = 4
    pace.read()
    assert pace.step == 4 and pace.startup_s is not None
    assert pace.wait(lambda: seen[0] >= 4, "no groups") is True
