"""The status line reads the trainer's metrics incrementally and never fails on a dead API."""

from __future__ import annotations

import json

from atroposlib.launch.status import StatusReader


def test_recent_score_follows_the_metrics_file_as_it_grows(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    reader = StatusReader("http://127.0.0.1:9", metrics, total_steps=20)  # nothing listens
    assert reader.read(0, 0).recent_score is None  # no file yet
    rows = "".join(json.dumps({"step": i, "score_mean": i / 10}) + "\n" for i in range(1, 13))
    metrics.write_text(rows + '{"step": 13, "sco')  # the last line is still being written
    snap = reader.read(engine_restarts=2, env_restarts=0)
    assert snap.recent_score == sum(i / 10 for i in range(3, 13)) / 10
    assert snap.step is None and "engine restarts 2" in snap.line()
    with open(metrics, "a") as out:
        out.write('re_mean": 1.3}\n')
    assert reader.read(0, 0).recent_score == sum(i / 10 for i in range(4, 14)) / 10
    reader.close()
