"""Soak the CPU loop: run it for N minutes, SIGKILL a random process every M seconds.

    python scripts/soak.py --minutes 20 --kill-every 45

It runs `atropos-launch` on the CPU quickstart (made long enough to last, with a
large restart budget for every process), kills the API, the trainer, the
trainer's engine or an environment at random, stops the run at the end as
Ctrl-C does, and prints what the launcher's ledger found: restarts, groups
acknowledged, trained, still queued, lost and trained twice (`launch/ledger.py`:
ids, not totals). Exit code 1 when a group was lost or trained twice. Not part of
CI: it takes as long as you ask.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import yaml

from atroposlib.utils.processes import descendant_matching

REPO = Path(__file__).resolve().parents[1]
TARGETS = {
    "api": "atroposlib.cli.run_api",
    "trainer": "example_trainer.grpo",
    "engine": "atroposlib.cli.inference_server",
    "environment": "environments/",
}
BUDGET = 10_000  # restarts per process: the soak decides when to stop, not the budget


def soak_config(base: Path, run_dir: Path) -> dict:
    config = yaml.safe_load(base.read_text())
    for env in config["environments"]:
        env["script"] = str((base.parent / env["script"]).resolve())
        env["max_restarts"] = BUDGET
    config["run_dir"] = str(run_dir)
    config.setdefault("api", {})["max_restarts"] = BUDGET
    config.setdefault("trainer", {})["max_restarts"] = BUDGET
    config["trainer"].setdefault("args", {})["training_steps"] = 1_000_000
    return config


def step_of(run_dir: Path) -> int:
    metrics = run_dir / "checkpoints" / "metrics.jsonl"
    if not metrics.exists():
        return 0
    lines = metrics.read_text().splitlines()
    for line in reversed(lines):
        try:
            return json.loads(line)["step"]
        except (ValueError, KeyError):
            continue
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="How long to run.")
    parser.add_argument("--kill-every", type=float, default=45.0, help="Seconds between kills.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the choice of victims.")
    parser.add_argument("--config", default=str(REPO / "configs" / "quickstart_cpu.yaml"))
    parser.add_argument("--run-dir", default=None, help="Default: runs/soak-<time>.")
    args = parser.parse_args()

    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(args.run_dir or REPO / "runs" / f"soak-{stamp}").resolve()
    config_path = run_dir.parent / f"{run_dir.name}.yaml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(soak_config(Path(args.config).resolve(), run_dir)))
    log_path = run_dir.parent / f"{run_dir.name}.log"
    print(f"[soak] run {run_dir}; launcher output in {log_path}", flush=True)
    with open(log_path, "wb") as log:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "atroposlib.cli.launch", str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    rng = random.Random(args.seed)
    kills: Counter[str] = Counter()
    started = time.monotonic()
    end = started + args.minutes * 60
    next_kill = started + args.kill_every
    while time.monotonic() < end and launcher.poll() is None:
        time.sleep(max(0.0, min(next_kill, end) - time.monotonic()))
        if time.monotonic() >= end or launcher.poll() is not None:
            break
        next_kill += args.kill_every
        victim = rng.choice(sorted(TARGETS))
        pid = descendant_matching(launcher.pid, TARGETS[victim])
        elapsed = time.monotonic() - started
        if pid is None:  # down (being restarted) right now: that is a skipped turn
            print(f"[soak] {elapsed / 60:5.1f} min: no {victim} running; skipped", flush=True)
            continue
        os.kill(pid, signal.SIGKILL)
        kills[victim] += 1
        print(
            f"[soak] {elapsed / 60:5.1f} min: killed {victim} (pid {pid}) at step "
            f"{step_of(run_dir)}; kills so far {dict(kills)}",
            flush=True,
        )
    if launcher.poll() is None:
        # SIGTERM, which the launcher treats as Ctrl-C: a SIGINT would be ignored when
        # this script runs in the background (the shell makes background jobs ignore it)
        print("[soak] time is up; stopping the run (SIGTERM, as Ctrl-C)", flush=True)
        launcher.send_signal(signal.SIGTERM)
    try:
        code = launcher.wait(300)
    except subprocess.TimeoutExpired:
        launcher.kill()
        code = launcher.wait()
    minutes = (time.monotonic() - started) / 60
    summary = json.loads((run_dir / "summary.json").read_text())
    groups = summary.get("groups", {})
    restarts = {name: n for name, n in summary.get("restarts", {}).items() if n}
    print(f"[soak] launcher exit code {code} after {minutes:.1f} min")
    print(f"[soak] steps trained: {summary.get('steps')}; kills: {dict(kills)}")
    print(f"[soak] restarts after crashes: {restarts}")
    print(
        f"[soak] groups sent (acknowledged) {groups.get('delivered')}, trained "
        f"{groups.get('trained')}, still queued {groups.get('queued_at_end')}, lost "
        f"{groups.get('lost')}, duplicated {groups.get('duplicated')}"
    )
    return 0 if groups.get("lost") == 0 and groups.get("duplicated") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
