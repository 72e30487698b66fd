"""Restart back-off: a crash loop waits longer each time; progress starts it over."""

from __future__ import annotations

import time

from atroposlib.launch.children import MAX_BACKOFF_S, Child
from atroposlib.launch.plan import ProcessPlan


def child(tmp_path) -> Child:
    """A child that has just started (so none of its crashes came after a stable run)."""
    made = Child(ProcessPlan("trainer", ["true"]), tmp_path, "cyan", lambda *_: None)
    made.started_at = time.monotonic()
    return made


def test_a_crash_loop_backs_off_to_the_cap(tmp_path):
    looping = child(tmp_path)
    delays = [looping.schedule_restart() for _ in range(8)]
    assert delays == [1, 2, 4, 8, 16, MAX_BACKOFF_S, MAX_BACKOFF_S, MAX_BACKOFF_S]


def test_a_crash_after_progress_starts_the_back_off_over(tmp_path):
    """A trainer killed after each of ten steps waited 1, 2, 4 ... 30 s: 150 s of nothing."""
    trainer = child(tmp_path)
    for _ in range(5):
        trainer.schedule_restart()
    assert trainer.schedule_restart(made_progress=True) == 1
    assert trainer.schedule_restart() == 2  # and a loop after it backs off again


def test_the_restart_budget_counts_crashes_in_a_row_not_in_a_lifetime(tmp_path):
    """MISC (review of e6a9d2c): max_restarts was a lifetime budget, so a run of days
    ended at its fourth crash ever, however far apart the crashes were."""
    trainer = child(tmp_path)
    for _ in range(10):  # ten crashes, each after a step
        assert trainer.crashes_in_a_row(made_progress=True) == 0
        trainer.schedule_restart(made_progress=True)
    for expected in range(1, 5):  # then a crash loop: the count climbs
        assert trainer.crashes_in_a_row() == expected
        trainer.schedule_restart()
    trainer.started_at -= 3600  # a stable hour, then a crash: the count starts over
    assert trainer.crashes_in_a_row() == 0
