"""The status line reads the trainer's records incrementally and never fails on a dead API;
it fits 80 columns and shows an ETA."""

from __future__ import annotations

import pytest

from atroposlib.launch.status import Snapshot, StatusReader, StepClock, duration
from atroposlib.trainer_contract import EventKind, RunRecords


@pytest.mark.integration
def test_recent_score_and_restarts_follow_the_trainer_records(tmp_path):
    records = RunRecords(tmp_path)
    reader = StatusReader(
        "http://127.0.0.1:9", records.metrics_path, records.events_path, total_steps=20
    )  # nothing listens on port 9
    assert reader.read({}).recent_score is None  # no files yet
    for step in range(1, 13):
        records.metrics(step, {"score_mean": step / 10, "loss": 0.0})
    records.event(EventKind.ENGINE_STARTED, 0)
    records.event(EventKind.CHECKPOINT_SAVED, 2, path="step-2")
    records.event(EventKind.ENGINE_RESTARTED, 2, reason="new weights")
    with open(records.metrics_path, "a") as out:
        out.write('{"step": 13, "loss": 0.0, "sco')  # the last line is still being written
    snap = reader.read({"api": 0, "arith_env": 0})
    assert "crash restarts" not in snap.line()
    assert snap.recent_score == sum(i / 10 for i in range(3, 13)) / 10
    assert snap.step is None and "engine restarts 1" in snap.line(width=200)
    with open(records.metrics_path, "a") as out:
        out.write('re_mean": 1.3}\n')
    records.event(EventKind.ENGINE_CRASHED, 4)
    records.event(EventKind.ENGINE_RESTARTED, 4, reason="engine died")
    snap = reader.read({"api": 1, "arith_env": 1, "trainer": 0})
    assert snap.recent_score == sum(i / 10 for i in range(4, 14)) / 10
    assert snap.new_engine_recoveries == [4]
    assert "engine restarts 2" in snap.line(width=200)
    assert snap.line(width=200).endswith("| crash restarts: api 1, arith_env 1, engine 1")
    assert reader.read({}).new_engine_recoveries == []  # each recovery is announced once
    reader.close()


def test_the_line_fits_80_columns_and_drops_the_least_useful_fields_first():
    full = Snapshot(
        step=1234,
        total=5000,
        queue=123,
        recent_score=0.5123,
        groups_per_s=12.34,
        eta_s=3725,
        engine_restarts=17,
    )
    wide = full.line(width=200)
    assert wide == (
        "step 1234/5000 | ETA 1h02m | score 0.512 | queue 123 | 12.3 groups/s | engine restarts 17"
    )
    assert full.line() == "step 1234/5000 | ETA 1h02m | score 0.512 | queue 123 | 12.3 groups/s"
    crashed = Snapshot(step=3, total=100, engine_restarts=1, restarts={"api": 1, "trainer": 0})
    assert crashed.line() == (
        "step 3/100 | ETA -- | score - | queue - | - groups/s | crash restarts: api 1"
    )
    many = {"api": 2, "mod_arithmetic": 1, "gsm8k_server": 1, "engine": 1, "trainer": 3}
    crowded = Snapshot(step=40, total=100, queue=7, recent_score=0.3, restarts=many, eta_s=50)
    assert crowded.line() == (
        "step 40/100 | ETA 50s | score 0.300 | queue 7 | - groups/s | crash restarts 8"
    )
    assert crowded.line(71) == "step 40/100 | ETA 50s | score 0.300 | queue 7 | crash restarts 8"
    for width in (80, 71, 40, 12, 5):  # 71: beside the plain console's "[launch] "
        for snap in (full, crashed, crowded):
            assert len(snap.line(width)) <= width, (width, snap.line(width))
    assert full.line(40) == "step 1234/5000 | ETA 1h02m | score 0.512"


def test_the_eta_waits_for_a_pace_then_follows_the_steps_since_the_first_move():
    clock = StepClock()
    assert clock.eta_s(None, 100, now=0.0) is None  # the API is not up yet
    assert clock.eta_s(0, 100, now=5.0) is None
    assert clock.eta_s(0, 100, now=40.0) is None  # start-up: the step has not moved
    assert clock.eta_s(1, 100, now=41.0) is None  # the first move starts the clock
    assert clock.eta_s(1, 100, now=41.5) is None
    assert clock.eta_s(3, 100, now=42.0) == pytest.approx(97 * 1.0 / 2)  # 2 steps a second
    assert clock.eta_s(11, 100, now=46.0) == pytest.approx(89 * 5.0 / 10)
    assert clock.eta_s(100, 100, now=90.0) == 0.0
    assert clock.eta_s(2, 100, now=91.0) is None  # the step went back: timing starts over
    assert clock.eta_s(4, 100, now=92.0) is None
    assert clock.eta_s(6, 100, now=93.0) == pytest.approx(94 * 1.0 / 2)
    assert [duration(s) for s in (0, 44.6, 60, 185, 3599, 3600, 7625)] == [
        "0s",
        "45s",
        "1m00s",
        "3m05s",
        "59m59s",
        "1h00m",
        "2h07m",
    ]
    assert Snapshot(step=0, total=10).line().startswith("step 0/10 | ETA -- | ")
