"""What every child of `atropos-launch` finds in its environment: wandb's files go to the
run directory, not to the working directory the launcher was started from."""

from __future__ import annotations

import sys

import pytest

from atroposlib.launch.children import Child, child_environment
from atroposlib.launch.plan import ProcessPlan
from tests.support.waiting import wait_until


def test_wandb_goes_to_the_run_dir_unless_the_launchers_environment_says_otherwise(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("WANDB_DIR", raising=False)
    env = child_environment(tmp_path / "run", {"ATROPOS_API_KEY": "k"})
    assert env["WANDB_DIR"] == str(tmp_path / "run")
    assert (env["ATROPOS_API_KEY"], env["PYTHONUNBUFFERED"]) == ("k", "1")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "scratch"))
    assert child_environment(tmp_path / "run", {})["WANDB_DIR"] == str(tmp_path / "scratch")


@pytest.mark.integration
def test_a_childs_offline_wandb_run_lands_in_the_run_dir(tmp_path, monkeypatch):
    """As an environment with use_wandb starts wandb: no `dir=`, so WANDB_DIR decides."""
    pytest.importorskip("wandb")
    for name in ("WANDB_DIR", "WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # the launcher's working directory, which the child inherits
    run_dir = tmp_path / "run"
    script = (
        "import wandb; run = wandb.init(mode='offline', project='p'); "
        "run.log({'x': 1}); run.finish()"
    )
    plan = ProcessPlan("env", [sys.executable, "-c", script])
    child = Child(plan, run_dir / "logs", "cyan", lambda *_: None)
    child.start()
    try:
        wait_until(lambda: not child.alive(), 120, "the wandb child did not finish")
    finally:
        child.stop(5)
    assert child.returncode == 0, child.tail()
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb")), child.tail()
    assert not (work / "wandb").exists()
