"""The status line reads the trainer's records incrementally and never fails on a dead API."""

from __future__ import annotations

import pytest

from atroposlib.launch.status import StatusReader
from atroposlib.trainer_contract import EventKind, RunRecords

pytestmark = pytest.mark.integration


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
    assert snap.step is None and "engine restarts 1" in snap.line()
    with open(records.metrics_path, "a") as out:
        out.write('re_mean": 1.3}\n')
    records.event(EventKind.ENGINE_CRASHED, 4)
    records.event(EventKind.ENGINE_RESTARTED, 4, reason="engine died")
    snap = reader.read({"api": 1, "arith_env": 1, "trainer": 0})
    assert snap.recent_score == sum(i / 10 for i in range(4, 14)) / 10
    assert snap.new_engine_recoveries == [4]
    assert "engine restarts 2" in snap.line()
    assert snap.line().endswith("| crash restarts: api 1, arith_env 1, engine 1")
    assert reader.read({}).new_engine_recoveries == []  # each recovery is announced once
    reader.close()
