"""A run survives the loss of any process, at any step.

One run of the short quickstart (the mod-arithmetic env on the tiny model, a durable
API, hot weight reload with a checkpoint every 5 steps) loses its processes one after
another:
- the trainer, with SIGKILL, at every one of steps 1 to 3: twice before its first
  checkpoint, when it starts over from step 0 on the batches the API kept, and once on
  it;
- then, with SIGKILL, the environment, the API and the trainer's engine;
- then the API is frozen (SIGSTOP) for longer than both clients' timeouts;
- then the trainer gets the SIGTERM a scheduler's preemption sends: it checkpoints and
  exits 0 before its last step, and must be resumed, not taken for finished.

Early on, a stranger also tries what a local process or a web page could send (a plain
`/batch`, a wipe, a `text/plain` group, a foreign `Host`), without the run's fresh key
and with it: each is refused, and the ledger below shows that nothing changed.

The run must reach its last step, and every group an environment got a 200 for must be
trained exactly once or still be queued: ids from the environments' ledgers against
the trainer's ledger and the API's store, not totals. One run holds every fault
because each launch costs about 30 s of CPU to start.

Every wait is allowed what it should cost at the run's own pace (tests/support/pace.py:
its first step's time, its steps' and its restarts'), a generous multiple of it, so a
run on a busy machine passes and a stalled one fails saying where it stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from pathlib import Path

import httpx
import pytest

from atroposlib.launch.ledger import account
from atroposlib.trainer_contract import (
    EventKind,
    events_path,
    read_events,
    read_metrics,
    read_trained_groups,
)
from atroposlib.utils.processes import descendant_matching
from tests.support.launch import launch_config
from tests.support.pace import SLACK, Pace
from tests.support.source import REPO

# The waits' own deadlines, from the run's pace, bound each test; this only catches a
# hang outside them (both runs take 2 to 4 minutes on a quiet 2-core machine).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]

GROUPS_PER_STEP = 2  # batch_size 8 / group_size 4
CLIENT_TIMEOUT_S = 3.0
TARGETS = {
    "api": "atroposlib.cli.run_api",
    "trainer": "example_trainer.grpo",
    "engine": "atroposlib.cli.inference_server",
    "mod_arithmetic": "mod_arithmetic.py",
}


def fault_config(run_dir, steps: int) -> dict:
    """The hot mode (its own checkpoint interval is set by the test)."""
    config = launch_config(run_dir, steps=steps)
    config["api"] = {"args": {}}  # durable: a crash is restarted on its store
    config["trainer"]["args"].update(
        weight_bridge_mode="hot_reload", api_timeout_s=CLIENT_TIMEOUT_S
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


def assert_every_acknowledged_group_trained_once(
    run, run_dir, pace: Pace, where: str, steps: int
) -> dict:
    # the steps after the newest checkpoint, the restart to them and the report at the end
    left = steps - newest_checkpoint(run_dir)
    assert run.wait(pace=pace, steps=left, restarts=2) == 0, f"{where}\n{run.output()[-5000:]}"
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


def strangers_are_refused(run_dir) -> None:
    """API-4, KEY-1: without the run's key nothing is taken, wiped or added; with it,
    the forms a browser or a stray client could send are refused too."""
    api = json.loads((run_dir / "commands.json").read_text())["api"]
    url = f"http://127.0.0.1:{api[api.index('--port') + 1]}"
    key_file = run_dir / "api-key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    # RUN-A: no other user reads the run's groups, logs or weights
    readable = []
    for path in [run_dir, *run_dir.rglob("*")]:
        with contextlib.suppress(FileNotFoundError):  # a file replaced meanwhile
            if path.stat().st_mode & 0o077:
                readable.append(f"{path.relative_to(run_dir)} {path.stat().st_mode & 0o777:o}")
    assert readable == [], readable
    key = key_file.read_text().strip()
    auth = {"Authorization": f"Bearer {key}"}
    text = {"Content-Type": "text/plain"}
    group = json.dumps({"tokens": [[1, 2]], "masks": [[1, 2]], "scores": [1.0]})
    attempts = [
        ("GET", "/batch", {}, None, 401),
        ("GET", "/reset_data", {}, None, 401),
        ("POST", "/scored_data", text, group, 401),
        ("POST", "/reset_data", {"Host": "rebind.attacker.example"}, "{}", 401),
        ("GET", "/batch", auth, None, 409),  # the trainer asks by step
        ("GET", "/reset_data", auth, None, 403),  # a keyed API takes only POST
        ("POST", "/scored_data", {**auth, **text}, group, 415),
    ]
    with httpx.Client(base_url=url, timeout=10) as http:
        for method, path, headers, body, expected in attempts:
            answer = http.request(method, path, headers=headers, content=body)
            assert answer.status_code == expected, (method, path, headers, answer.text)


def the_key_is_nowhere_but_its_file(run_dir) -> None:
    key = (run_dir / "api-key").read_text().strip()
    kept = [p for p in run_dir.rglob("*") if p.is_file() and p.name != "api-key"]
    kept = [p for p in kept if p.suffix in {".json", ".yaml", ".log", ".html", ".jsonl"}]
    assert kept and not [p for p in kept if key in p.read_text(errors="replace")]


def passed(run_dir, pace: Pace, step: int) -> None:
    """Wait for a row past `step`, allowing for a restart of whatever was killed last."""
    pace.wait(
        lambda: newest_row_step(run_dir) > step,
        f"the trainer never passed step {step}",
        steps=max(1, step + 1 - newest_row_step(run_dir)),
        restarts=1,
    )


def timeouts_logged(run_dir) -> tuple[int, int]:
    """How often the trainer and the environment said a call timed out (and retried it)."""
    logs = run_dir / "logs"
    return tuple(
        (logs / name).read_text(errors="replace").count("timed out")
        for name in ("trainer.log", "mod_arithmetic.log")
    )


def both_more(now: tuple[int, int], before: tuple[int, int]) -> bool:
    return now[0] > before[0] and now[1] > before[1]


def newest_row_step(run_dir) -> int:
    """The step of the trainer's newest metrics row: after a restart from step 0 the rows
    start again at 1, so this is where the trainer running now is."""
    lines = metric_lines(run_dir)
    return json.loads(lines[-1])["step"] if lines else 0


def metric_lines(run_dir) -> list[str]:
    path = run_dir / "checkpoints" / "metrics.jsonl"
    return path.read_text().splitlines() if path.exists() else []


def newest_checkpoint(run_dir) -> int:
    steps = [p.name.removeprefix("step-") for p in (run_dir / "checkpoints").glob("step-*")]
    return max((int(s) for s in steps if s.isdigit()), default=0)


def checkpoint_recorded(run_dir, step: int) -> bool:
    """The trainer recorded its step-`step` checkpoint: what the launcher resumes from. (The
    directory is renamed into place just before, so a kill that only waits for it can land
    between the two, and the launcher rightly starts over from an older checkpoint.)"""
    return any(
        event.kind is EventKind.CHECKPOINT_SAVED
        and Path(event.detail.get("path", "")).name == f"step-{step}"
        for event in read_events(events_path(run_dir / "checkpoints"))
    )


def kill_the_trainer_after_each_step(
    run, run_dir, pace: Pace, last_kill: int, saved_at, on_kill=None
) -> int:
    """SIGKILL the trainer after each of steps 1 to `last_kill`; the number of kills.

    A step counts once a row for it comes from the trainer running now (rows written
    before the last kill do not count) and, where `saved_at(step)` asks for it, the
    step's checkpoint exists. The trainer's pid is found before the wait, so the kill
    follows the row within a poll. If it still lands a step late, the same step is
    tried again when the restarted trainer will pass it again (it resumes from an
    earlier checkpoint), else the kill counts for the step it landed on.
    """
    step, kills, seen, killed = 1, 0, 0, None
    while step <= last_kill:

        def running(step=step, killed=killed) -> int | None:
            assert run.proc.poll() is None, f"the run ended before step {step}"
            pid = descendant_matching(run.proc.pid, TARGETS["trainer"])
            return pid if pid not in (None, killed) else None

        pid = pace.wait(running, "the trainer was not restarted", restarts=1)

        def reached(step=step, seen=seen) -> bool:
            assert run.proc.poll() is None, f"the run ended before step {step}"
            fresh = metric_lines(run_dir)[seen:]
            return bool(fresh) and json.loads(fresh[-1])["step"] >= step and saved_at(step)

        # a restart, and at most every step again (from step 0, before a checkpoint)
        what = f"the trainer never reached step {step}"
        pace.wait(reached, what, steps=step, restarts=1, poll_s=0.02)
        os.kill(pid, signal.SIGKILL)
        pace.killed()
        killed, kills = pid, kills + 1
        if on_kill is not None:
            on_kill(step)
        lines = metric_lines(run_dir)  # final: the killed trainer writes no more
        seen, landed = len(lines), json.loads(lines[-1])["step"]
        if landed == step or newest_checkpoint(run_dir) >= step:
            step = landed + 1
    return kills


def test_every_process_killed_in_one_run_loses_nothing_and_trains_nothing_twice(launch, tmp_path):
    """RUN-1: a trainer killed before its first checkpoint came back from step 0, was
    refused by the API, and ended the run; the hot modes wrote no checkpoint before the
    last step, so that was any crash."""
    # a checkpoint every 3 steps, not the default 10 (tests/weight_sync/test_bridge.py
    # checks that default): each kill before it restarts the trainer and its engine from
    # step 0 (about 16 s of CPU), which is what every step before the first checkpoint
    # asks, at a third of the cost
    last_kill = 3
    env_at, api_at, engine_at, frozen_at, termed_at = range(last_kill, last_kill + 5)
    steps = termed_at + 4  # the SIGTERMed trainer may stop up to 3 steps later
    run_dir = tmp_path / "run"
    config = fault_config(run_dir, steps)
    config["trainer"]["args"]["save_checkpoint_interval"] = last_kill
    config["trainer"]["max_restarts"] = 2 * last_kill
    run = launch(config)
    pace = run.pace(run_dir)
    kills = kill_the_trainer_after_each_step(
        run,
        run_dir,
        pace,
        last_kill,
        # the last kill waits for the checkpoint, written after the step's records
        saved_at=lambda step: step < last_kill or checkpoint_recorded(run_dir, step),
        on_kill=lambda step: step == 2 and strangers_are_refused(run_dir),
    )
    # then the environment, the API and the engine, each once the trainer has moved on
    for target, after in (("mod_arithmetic", env_at), ("api", api_at), ("engine", engine_at)):
        passed(run_dir, pace, after)
        os.kill(run.child_pid(TARGETS[target]), signal.SIGKILL)
        pace.killed()
    passed(run_dir, pace, frozen_at)
    api, before = run.child_pid(TARGETS["api"]), timeouts_logged(run_dir)
    os.kill(api, signal.SIGSTOP)
    try:  # longer than both clients' timeouts: their calls time out and are asked again
        # each asks the API about once a step, and its call then times out
        pace.wait(
            lambda: both_more(timeouts_logged(run_dir), before),
            "no client timed out while the API was frozen",
            steps=2,
            plus_s=SLACK * CLIENT_TIMEOUT_S,
        )
    finally:
        os.kill(api, signal.SIGCONT)
    # LCH-2: a SIGTERM from outside (a scheduler's preemption) makes the trainer checkpoint
    # and exit 0 before its last step; that is no finish, and it is resumed like a crash
    passed(run_dir, pace, termed_at)
    os.kill(run.child_pid(TARGETS["trainer"]), signal.SIGTERM)
    pace.killed()
    where = (
        f"the trainer killed after each of steps 1 to {last_kill} ({kills} kills), then the "
        "environment, the API and the engine, the API frozen, then the trainer TERMed"
    )
    numbers = assert_every_acknowledged_group_trained_once(run, run_dir, pace, where, steps)
    the_key_is_nowhere_but_its_file(run_dir)
    restarts = {name: n for name, n in numbers["restarts"].items() if n}
    # the frozen API is no crash
    assert restarts == {"trainer": kills + 1, "mod_arithmetic": 1, "api": 1, "engine": 1}, (
        where,
        restarts,
    )
    out = run.output()
    for target in ("mod_arithmetic", "api"):
        assert f"{target} crashed with exit code -9; restarting in" in out, where
        restarted = [line for line in out.splitlines() if f"restarting {target}" in line]
        assert len(restarted) == 1 and "(restart 1/3 in a row)" in restarted[0], (where, restarted)
    assert "the trainer restarted its crashed engine" in out, where
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events].count("engine_crashed") == 1, where
    reasons = [
        event.detail.get("reason")
        for event in read_events(events_path(run_dir / "checkpoints"))
        if event.kind is EventKind.ENGINE_RESTARTED
    ]
    assert reasons == ["engine died"], (where, reasons)  # the trainer's own record of it
    restarted = [line for line in out.splitlines() if "restarting trainer" in line]
    assert len(restarted) == kills + 1, restarted
    # before the first checkpoint (step 3) it starts over; after it, it resumes from it
    assert all("from step 0 (no checkpoint yet)" in line for line in restarted[:-2]), restarted
    assert f"/step-{last_kill} " in restarted[-2], restarted
    stopped = re.search(rf"trainer stopped at step (\d+) of {steps} with exit code 0", out)
    assert stopped and termed_at < int(stopped[1]) < steps, where
    assert f"/step-{stopped[1]} " in restarted[-1], restarted  # its final checkpoint


def test_every_process_killed_at_every_step_of_a_restart_mode_run_loses_nothing(launch, tmp_path):
    """The restart mode (the trainer restarts its engine on each checkpoint): the trainer,
    and with it its engine, SIGKILLed after each of steps 1 to 4: before the first
    checkpoint (2), on it, after it and on the second (4). After each of steps 1 to 3 the
    environment and the API die at the same moment: the whole run crashes at once."""
    last_kill, everything_until, steps, interval = 4, 3, 6, 2
    run_dir = tmp_path / "run"
    config = fault_config(run_dir, steps)
    config["trainer"]["args"].update(weight_bridge_mode="restart", vllm_restart_interval=interval)
    config["trainer"]["max_restarts"] = 2 * last_kill
    others = ("mod_arithmetic", "api")
    together: list[int] = []  # the steps after which everything died

    def kill_the_others(step: int) -> None:
        if step <= everything_until:
            together.append(step)
            for target in others:
                os.kill(run.child_pid(TARGETS[target]), signal.SIGKILL)

    run = launch(config)
    pace = run.pace(run_dir)
    kills = kill_the_trainer_after_each_step(
        run,
        run_dir,
        pace,
        last_kill,
        saved_at=lambda step: step % interval or checkpoint_recorded(run_dir, step),
        on_kill=kill_the_others,
    )
    where = (
        f"restart mode, the trainer killed after each of steps 1 to {last_kill}, the "
        f"environment and the API with it after each of steps 1 to {everything_until}"
    )
    numbers = assert_every_acknowledged_group_trained_once(run, run_dir, pace, where, steps)
    assert together and together[-1] >= everything_until - 1, together
    expected = {"trainer": kills, **{target: len(together) for target in others}}
    assert {k: numbers["restarts"][k] for k in expected} == expected, (where, numbers)
    restarted = [line for line in run.output().splitlines() if "restarting trainer" in line]
    assert len(restarted) == kills and "from step 0 (no checkpoint yet)" in restarted[0], restarted
    assert any(f"/step-{interval} " in line for line in restarted), restarted
