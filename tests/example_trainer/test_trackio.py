"""`--use-trackio`: a real step's metrics reach trackio's local database, as they reach
wandb (test_optimizers_and_wandb.py), and a missing trackio says what to install."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.trainer_batches import batch, make_trainer


@pytest.fixture
def trackio_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """trackio reads TRACKIO_DIR once, when it is imported: a fresh import under this
    test's directory (never the real Hugging Face cache), dropped afterwards so that no
    later test logs into a directory that is gone."""
    if importlib.util.find_spec("trackio") is None:
        pytest.skip("trackio is not installed (the trackio extra)")

    def imported() -> list[str]:
        return [name for name in sys.modules if name.split(".")[0] == "trackio"]

    where = tmp_path / "trackio"
    monkeypatch.setenv("TRACKIO_DIR", str(where))
    for name in imported():
        monkeypatch.delitem(sys.modules, name)  # put back by monkeypatch afterwards
    yield where
    for name in imported():
        del sys.modules[name]


def test_trackio_stores_a_steps_metrics_locally(tiny_model_path, tmp_path, trackio_dir):
    trainer = make_trainer(
        tiny_model_path,
        tmp_path / "save",
        use_trackio=True,
        trackio_project="unit",
        run_name="try-1",
    )
    metrics = trainer.train_step(batch())
    trainer.step = 1
    trainer.log({**metrics, "wait_s": 0.0, "train_s": 0.1, "restart_s": 0.0, "tokens_per_s": 1.0})
    trainer.step_log.close()
    with sqlite3.connect(trackio_dir / "unit.db") as db:
        rows = db.execute("SELECT run_name, step, metrics FROM metrics").fetchall()
        (config,) = db.execute("SELECT config FROM configs WHERE run_name = 'try-1'").fetchone()
    assert [(name, step) for name, step, _ in rows] == [("try-1", 1)]
    logged = json.loads(rows[0][2])
    assert logged["train/loss"] == pytest.approx(metrics["loss"]), sorted(logged)
    assert json.loads(config)["optim"]["lr"] == trainer.config.optim.lr


def test_use_trackio_without_trackio_says_what_to_install(tmp_path, monkeypatch):
    from atroposlib.trainer_contract import RunRecords
    from example_trainer.config import TrainingConfig
    from example_trainer.step_report import StepLog

    monkeypatch.setitem(sys.modules, "trackio", None)  # import now raises ImportError
    config = TrainingConfig(model_name="m", use_trackio=True, save_path=str(tmp_path))
    log = StepLog(RunRecords(tmp_path), config)
    with pytest.raises(SystemExit, match="--use-trackio needs the trackio package: pip install"):
        log.log(1, {"score_mean": 0.5, "loss": 0.0, "grad_norm": 0.0})
