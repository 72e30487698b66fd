"""Running the CPU quickstart with changed trainer flags, for the benchmarks that
compare one setting against another (`weight_sync.py`, `loss_variants.py`).

Runs go one after another, never side by side: they would share the same cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "configs" / "quickstart_cpu.yaml"


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def quickstart_config(
    trainer_args: dict[str, Any],
    steps: int,
    seed: int,
    replaced: tuple[str, ...] = (),
    base: Path = QUICKSTART,
) -> dict:
    """The quickstart's YAML (or `base`) with `trainer_args` set (the keys in `replaced`
    dropped first), `steps` training steps and `seed`; its relative paths made absolute."""
    config = yaml.safe_load(base.read_text())
    config["seed"] = seed
    args = config["trainer"]["args"]
    for key in replaced:
        args.pop(key, None)
    args.update(trainer_args, training_steps=steps)
    for env in config["environments"]:
        env["script"] = str((base.parent / env["script"]).resolve())
    return config


def launch(name: str, config: dict, workdir: Path) -> tuple[Path, float]:
    """`atropos-launch` of `config` in `workdir/name`: the run directory and the wall
    seconds. Exits with the log's last lines if the run failed."""
    run_dir = workdir / name
    config_path = workdir / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log = workdir / f"{name}.log"
    steps = config["trainer"]["args"]["training_steps"]
    print(f"[{name}] atropos-launch ({steps} steps), log: {log}", flush=True)
    started = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.call(
            [sys.executable, "-m", "atroposlib.cli.launch", str(config_path)]
            + ["--run-dir", str(run_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    wall = time.perf_counter() - started
    if code != 0:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise SystemExit(f"[{name}] atropos-launch exited {code}; last lines:\n{tail}")
    return run_dir, wall


def shown(value: float | None, form: str) -> str:
    """A table cell: `value` formatted, or - when there is none."""
    return "-" if value is None else format(value, form)
