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
