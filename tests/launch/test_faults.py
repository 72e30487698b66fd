"""A run survives the loss of any one process.

Each test runs a short quickstart (the mod-arithmetic env on the tiny model, a
durable API, hot weight reload), kills a process with SIGKILL, and checks that the
run reaches its last step and that every group an environment got a 200 for was
trained exactly once or is still queued: ids from the environments' ledgers against
the trainer's ledger and the API's store, not totals.
- The trainer is killed at every one of steps 1 to 10 of one run, with the hot mode's
  default checkpoint interval (10): nine times before its first checkpoint, when it
  starts over from step 0 on the batches the API kept, and once after it. Then it gets
  a SIGTERM, as a scheduler's preemption sends: it checkpoints and exits 0 before its
  last step, and must be resumed, not taken for finished.
- The API, the environment and the engine are each killed once, at a random step from
  2 to 7 (the seed is in every failure message), with a checkpoint every 3 steps.
- The API is frozen (SIGSTOP) for longer than the clients' timeouts.
The environment's case also answers what test_launch.py once asked in a launch of its
own: a killed environment is restarted and the run completes.
"""

from __future__ import annotations

import json
import os
import random
import re
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


def fault_config(run_dir, checkpoint_every: int | None, steps: int = STEPS) -> dict:
    """`checkpoint_every` None: the hot mode's default interval."""
    config = launch_config(run_dir, steps=steps)
    config["api"] = {"args": {}}  # durable: a crash is restarted on its store
    config["trainer"]["args"].update(
        weight_bridge_mode="hot_reload", api_timeout_s=CLIENT_TIMEOUT_S
    )
    if checkpoint_every is not None:
        config["trainer"]["args"]["save_checkpoint_interval"] = checkpoint_every
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


def assert_every_acknowledged_group_trained_once(
    run, run_dir, where: str, steps: int = STEPS
) -> dict:
    assert run.wait(420) == 0, f"{where}\n{run.output()[-5000:]}"
    assert [r.step for r in read_metrics(run_dir / "metrics.jsonl")] == list(range(1, steps + 1))
    groups = account(
        run_dir / "env-state",
        run_dir / "checkpoints" / "trained_groups.jsonl",
        run_dir / "api-state",
    )
    per_step = read_trained_groups(run_dir / "checkpoints" / "trained_groups.jsonl")
    assert [len(r.group_ids) for r in per_step] == [GROUPS_PER_STEP] * steps, where
    assert groups.trained_without_id == 0, where
    assert groups.duplicated == set(), f"{where}: trained twice {sorted(groups.duplicated)}"
    assert groups.lost == set(), f"{where}: lost {sorted(groups.lost)}"
    assert set(groups.trained) <= groups.delivered, (
        f"{where}: trained but never acknowledged {sorted(set(groups.trained) - groups.delivered)}"
    )
    assert len(groups.trained) == steps * GROUPS_PER_STEP, where
    numbers = json.loads((run_dir / "summary.json").read_text())
    assert numbers["groups"] == groups.numbers(), where
    assert run.leftovers() == [], f"{where}: processes outlived the launcher"
    return numbers


@pytest.mark.parametrize("target", ["api", "mod_arithmetic"])
def test_a_killed_process_is_restarted_and_nothing_is_lost_or_trained_twice(
    launch, tmp_path, target
):
    run_dir = tmp_path / "run"
    run, where = start_and_reach_random_step(launch, run_dir)
    os.kill(run.child_pid(TARGETS[target]), signal.SIGKILL)
    numbers = assert_every_acknowledged_group_trained_once(run, run_dir, where)
    out = run.output()
    assert f"{target} crashed with exit code -9; restarting in" in out, where
    assert numbers["restarts"][target] == 1, (where, numbers["restarts"])
    assert f"restarts after crashes: {target} 1" in out, where
    restarted = [line for line in out.splitlines() if f"restarting {target}" in line]
    assert restarted and "(restart 1/3)" in restarted[0], (where, restarted)


def newest_row_step(run_dir) -> int:
    """The step of the trainer's newest metrics row: after a restart from step 0 the rows
    start again at 1, so this is where the trainer running now is."""
    path = run_dir / "checkpoints" / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return json.loads(lines[-1])["step"] if lines else 0


def test_a_trainer_killed_at_every_step_loses_nothing_and_trains_nothing_twice(launch, tmp_path):
    """RUN-1: a trainer killed before its first checkpoint came back from step 0, was
    refused by the API, and ended the run; the hot modes wrote no checkpoint before the
    last step, so that was any crash."""
    last_kill, steps = 10, 14
    run_dir = tmp_path / "run"
    config = fault_config(run_dir, checkpoint_every=None, steps=steps)
    config["trainer"]["max_restarts"] = 2 * last_kill
    run = launch(config)
    checkpoint = run_dir / "checkpoints" / f"step-{last_kill}"
    step, kills = 1, 0
    while step <= last_kill:

        def reached(step=step) -> int:
            assert run.proc.poll() is None, f"the run ended before step {step}"
            now = newest_row_step(run_dir)
            # the last kill waits for the checkpoint, written after the step's records
            return now if now >= step and (step < last_kill or checkpoint.is_dir()) else 0

        now = wait_until(reached, 300, f"the trainer never reached step {step}", poll_s=0.02)
        os.kill(run.child_pid(TARGETS["trainer"]), signal.SIGKILL)
        kills += 1
        # a kill that came a step late is still a kill; before the first checkpoint the
        # trainer starts over and passes this step again
        step += now == step
    # LCH-2: a SIGTERM from outside (a scheduler's preemption) makes the trainer checkpoint
    # and exit 0 before its last step; that is no finish, and it is resumed like a crash
    wait_until(
        lambda: newest_row_step(run_dir) > last_kill, 300, "the trainer never passed step 10"
    )
    os.kill(run.child_pid(TARGETS["trainer"]), signal.SIGTERM)
    where = f"the trainer killed after each of steps 1 to {last_kill} ({kills} kills), then TERM"
    numbers = assert_every_acknowledged_group_trained_once(run, run_dir, where, steps)
    assert numbers["restarts"]["trainer"] == kills + 1, (where, numbers["restarts"])
    out = run.output()
    restarted = [line for line in out.splitlines() if "restarting trainer" in line]
    assert len(restarted) == kills + 1, restarted
    # before the first checkpoint (step 10) it starts over; after it, it resumes from it
    assert all("from step 0 (no checkpoint yet)" in line for line in restarted[:-2]), restarted
    assert f"/step-{last_kill} " in restarted[-2], restarted
    assert re.search(r"trainer stopped at step 1[1-3] of 14 with exit code 0", out), where
    assert re.search(r"/step-1[1-3] ", restarted[-1]), restarted  # its final checkpoint
