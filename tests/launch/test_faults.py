"""A run survives the loss of any one process.

Each test runs a short quickstart (the mod-arithmetic env on the tiny model, a
durable API, hot weight reload with a checkpoint every 3 steps), kills one
process with SIGKILL at a random step from 2 to 7 (the seed is in
every failure message), and checks that the run reaches its last step and that
every group an environment got a 200 for was trained exactly once or is still
queued: ids from the environments' ledgers against the trainer's ledger and the
API's store, not totals. The last test freezes the API (SIGSTOP) for longer than
the clients' timeouts. The environment's case also answers what test_launch.py once
asked in a launch of its own: a killed environment is restarted and the run completes.
"""

from __future__ import annotations

import json
import os
import random
import signal

import pytest

from atroposlib.launch.ledger import account
from atroposlib.trainer_contract import read_metrics, read_trained_groups
from tests.support.launch import launch_config
from tests.support.source import REPO
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

STEPS = 30  # a step takes a fraction of a second: the run must outlast the fault
GROUPS_PER_STEP = 2  # batch_size 8 / group_size 4
CLIENT_TIMEOUT_S = 3.0
TARGETS = {
    "api": "atroposlib.cli.run_api",
    "trainer": "example_trainer.grpo",
    "engine": "atroposlib.cli.inference_server",
    "mod_arithmetic": "mod_arithmetic.py",
}


def fault_config(run_dir, checkpoint_every: int) -> dict:
    config = launch_config(run_dir, steps=STEPS)
    config["api"] = {"args": {}}  # durable: a crash is restarted on its store
    config["trainer"]["args"].update(
        weight_bridge_mode="hot_reload",
        save_checkpoint_interval=checkpoint_every,
        api_timeout_s=CLIENT_TIMEOUT_S,
    )
    config["environments"] = [
        {
            "script": str(REPO / "environments" / "mod_arithmetic.py"),
            "env": {"group_size": 4, "api_timeout_s": CLIENT_TIMEOUT_S},
        }
    ]
    return config


def trained_steps(run_dir) -> int:
    return len(read_metrics(run_dir / "checkpoints" / "metrics.jsonl"))


def start_and_reach_random_step(launch, run_dir, checkpoint_every: int = 3):
    seed = int.from_bytes(os.urandom(4), "little")
    kill_step = random.Random(seed).randint(2, 7)
    run = launch(fault_config(run_dir, checkpoint_every))
    reached = run.wait(300, until=lambda: trained_steps(run_dir) >= kill_step)
    assert reached is None, f"seed {seed}: the run ended before step {kill_step}"
    return run, f"seed {seed}, fault at step {kill_step}"


def assert_every_acknowledged_group_trained_once(run, run_dir, where: str) -> dict:
    assert run.wait(420) == 0, f"{where}\n{run.output()[-5000:]}"
    assert [r.step for r in read_metrics(run_dir / "metrics.jsonl")] == list(range(1, STEPS + 1))
    groups = account(
        run_dir / "env-state",
        run_dir / "checkpoints" / "trained_groups.jsonl",
        run_dir / "api-state",
    )
    per_step = read_trained_groups(run_dir / "checkpoints" / "trained_groups.jsonl")
    assert [len(r.group_ids) for r in per_step] == [GROUPS_PER_STEP] * STEPS, where
    assert groups.trained_without_id == 0, where
    assert groups.duplicated == set(), f"{where}: trained twice {sorted(groups.duplicated)}"
    assert groups.lost == set(), f"{where}: lost {sorted(groups.lost)}"
    assert set(groups.trained) <= groups.delivered, (
        f"{where}: trained but never acknowledged {sorted(set(groups.trained) - groups.delivered)}"
    )
    assert len(groups.trained) == STEPS * GROUPS_PER_STEP, where
    numbers = json.loads((run_dir / "summary.json").read_text())
    assert numbers["groups"] == groups.numbers(), where
    assert run.leftovers() == [], f"{where}: processes outlived the launcher"
    return numbers


@pytest.mark.parametrize("target", ["api", "trainer", "mod_arithmetic"])
def test_a_killed_process_is_restarted_and_nothing_is_lost_or_trained_twice(
    launch, tmp_path, target
):
    run_dir = tmp_path / "run"
    run, where = start_and_reach_random_step(launch, run_dir)
    saved = sorted((run_dir / "checkpoints").glob("step-*/trainer_state.pt"))
    os.kill(run.child_pid(TARGETS[target]), signal.SIGKILL)
    numbers = assert_every_acknowledged_group_trained_once(run, run_dir, where)
    out = run.output()
    assert f"{target} crashed with exit code -9; restarting in" in out, where
    assert numbers["restarts"][target] == 1, (where, numbers["restarts"])
    assert f"restarts after crashes: {target} 1" in out, where
    restarted = [line for line in out.splitlines() if f"restarting {target}" in line]
    assert restarted and "(restart 1/3)" in restarted[0], (where, restarted)
    if target == "trainer" and saved:  # it resumes from its latest checkpoint (or a newer one)
        assert "from " in restarted[0] and "/step-" in restarted[0], (where, restarted)


def test_a_killed_engine_is_restarted_by_the_trainer(launch, tmp_path):
    run_dir = tmp_path / "run"
    # the trainer finds its engine dead when it next asks for a batch, and restarts it on
    # its newest pushed weights
    run, where = start_and_reach_random_step(launch, run_dir)
    os.kill(run.child_pid(TARGETS["engine"]), signal.SIGKILL)
    numbers = assert_every_acknowledged_group_trained_once(run, run_dir, where)
    assert "the trainer restarted its crashed engine" in run.output(), where
    assert numbers["restarts"]["engine"] == 1, (where, numbers["restarts"])
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events].count("engine_crashed") == 1, where


def test_an_api_frozen_past_the_client_timeouts_loses_nothing(launch, tmp_path):
    run_dir = tmp_path / "run"
    run, where = start_and_reach_random_step(launch, run_dir)
    api = run.child_pid(TARGETS["api"])
    delivered_before = _acknowledged(run_dir)
    os.kill(api, signal.SIGSTOP)
    try:
        # longer than both clients' timeouts: their calls time out and are asked again
        wait_until(lambda: _timeouts_logged(run_dir), 60, f"{where}: no client timed out")
    finally:
        os.kill(api, signal.SIGCONT)
    numbers = assert_every_acknowledged_group_trained_once(run, run_dir, where)
    assert numbers["restarts"]["api"] == 0, where  # a stall is not a crash
    assert _acknowledged(run_dir) > delivered_before, where


def _acknowledged(run_dir) -> int:
    return sum(
        len(path.read_text().splitlines()) for path in run_dir.glob("env-state/**/delivered.jsonl")
    )


def _timeouts_logged(run_dir) -> bool:
    """Both clients said a call timed out (httpx's ReadTimeout) and retried it."""
    logs = run_dir / "logs"
    trainer = (logs / "trainer.log").read_text(errors="replace")
    env = (logs / "mod_arithmetic.log").read_text(errors="replace")
    return "timed out" in trainer and "timed out" in env
