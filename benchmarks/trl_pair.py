"""The CPU quickstart against TRL's GRPOTrainer, paired: the same machine, model, seed
and workload, run alternately, `--rounds` rounds of each.

Each round runs `atropos-launch configs/quickstart_cpu.yaml` (the API, the environment
service, the CPU engine and the trainer, as a user runs them) and
`benchmarks/trl_grpo.py` (TRL 1.x, fp32, `--trl-threads` torch threads), one after
the other and never side by side; the order flips every round, so a drift in the
machine's speed falls on both. Per system it prints the medians of:
- the training phase: TRL's `trainer.train()`; ours from the trainer's engine
  being up to its last checkpoint (start-up, which both have, left out);
- the seconds until the mean score of the last 10 steps first reached 0.5
  (`learning_curve.py`), counted from the same start;
- the mean score over the first 10 and the last 10 steps;
and, for ours, where the trainer's time went (waiting for batches, training,
pushing weights; from metrics.jsonl). Every run is watched for other processes
(`cpu_share.py`); a pairing with a busy run is not a result, and says so.

TRL must be importable by `--trl-python` (default: this Python):

    python benchmarks/trl_pair.py                     # 3 rounds of 100 steps
    python benchmarks/trl_pair.py --rounds 1 --steps 30

The last line reads
`trl-pair: training phase atropos/trl = R, to 0.5 atropos/trl = Q (medians of N rounds)`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from cpu_share import CpuWatch
from learning_curve import Curve
from quickstart_runs import REPO, launch, quickstart_config, read_jsonl

OURS, TRL = "atropos", "trl"


def run_ours(round_index: int, steps: int, seed: int, workdir: Path) -> dict:
    with CpuWatch() as watch:
        run_dir, _ = launch(f"{OURS}-{round_index}", quickstart_config({}, steps, seed), workdir)
    events = read_jsonl(run_dir / "events.jsonl")
    metrics = sorted(read_jsonl(run_dir / "metrics.jsonl"), key=lambda m: m["step"])
    started = next(e["time"] for e in events if e["kind"] == "engine_started")
    done = max(e["time"] for e in events if e["kind"] == "checkpoint_saved")
    curve = Curve()
    for row in metrics:
        curve.add(row["time"] - started, row["score_mean"])
    return {
        "system": "atroposlib quickstart",
        "training_s": done - started,
        **curve.summary(),
        **{key: sum(m.get(key, 0.0) for m in metrics) for key in ("wait_s", "train_s", "sync_s")},
        "staleness_mean": statistics.mean(m.get("staleness_mean", 0.0) for m in metrics),
        "others_share": watch.others_share,
        "quiet": not watch.busy,
        "cpu": watch.verdict(),
    }


def run_trl(
    round_index: int, steps: int, seed: int, threads: int, python: str, workdir: Path
) -> dict:
    from atroposlib.utils.tiny_model import ensure_tiny_model

    out = workdir / f"{TRL}-{round_index}.json"
    log = workdir / f"{TRL}-{round_index}.log"
    print(f"[{TRL}-{round_index}] trl_grpo.py ({steps} steps), log: {log}", flush=True)
    command = [python, str(REPO / "benchmarks" / "trl_grpo.py"), "--model"]
    command += [str(ensure_tiny_model()), "--steps", str(steps), "--seed", str(seed)]
    with open(log, "w") as output, CpuWatch() as watch:
        code = subprocess.call(
            [*command, "--threads", str(threads), "--json", str(out)],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    if code != 0:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise SystemExit(f"[{TRL}-{round_index}] exited {code}; last lines:\n{tail}")
    result = json.loads(out.read_text())
    # the outer watch also sees the Python start-up and model load; the inner one the train
    if watch.busy:
        result.update(others_share=watch.others_share, quiet=False, cpu=watch.verdict())
    return result


def seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def report_line(name: str, result: dict) -> str:
    line = (
        f"[{name}] training {result['training_s']:.1f} s, to 0.5 "
        f"{seconds(result['to_target_s'])}, score {result['first10']:.3f} -> "
        f"{result['last10']:.3f}"
    )
    if "train_s" in result:
        line += (
            f" (wait {result['wait_s']:.1f} s, train {result['train_s']:.1f} s, "
            f"sync {result['sync_s']:.1f} s)"
        )
    return f"{line}; {result['cpu']}"


def median(results: list[dict], key: str) -> float | None:
    values = [r[key] for r in results]
    if any(v is None for v in values):  # a run that never reached it: no median
        return None
    return statistics.median(values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each system")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trl-threads", type=int, default=2, help="TRL's torch threads")
    parser.add_argument("--trl-python", default=sys.executable, help="a Python that has trl")
    parser.add_argument("--workdir", default=None, help="where runs go (default: a temp dir)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="trl-pair-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {OURS: [], TRL: []}
    for index in range(args.rounds):
        order = (OURS, TRL) if index % 2 == 0 else (TRL, OURS)
        for system in order:
            if system == OURS:
                result = run_ours(index, args.steps, args.seed, workdir)
            else:
                result = run_trl(
                    index, args.steps, args.seed, args.trl_threads, args.trl_python, workdir
                )
            results[system].append(result)
            print(report_line(f"{system}-{index}", result), flush=True)
    (workdir / "trl_pair.json").write_text(json.dumps(results, indent=2))

    keys = ("training_s", "to_target_s", "first10", "last10")
    medians = {system: {k: median(runs, k) for k in keys} for system, runs in results.items()}
    print()
    print(f"medians of {args.rounds} rounds ({args.steps} steps, seed {args.seed}):")
    print(f"{'system':<24} {'training':>9} {'to 0.5':>8} {'first10':>8} {'last10':>7}")
    for system, label in ((OURS, results[OURS][0]["system"]), (TRL, results[TRL][0]["system"])):
        m = medians[system]
        print(
            f"{label:<24} {m['training_s']:>7.1f} s {seconds(m['to_target_s']):>8} "
            f"{m['first10']:>8.3f} {m['last10']:>7.3f}"
        )
    busy = [r for runs in results.values() for r in runs if not r["quiet"]]
    if busy:
        print(f"{len(busy)} run(s) shared the CPU with other processes: no comparison")
        print("trl-pair: not a result (the machine was busy)")
        return 1
    ours, theirs = medians[OURS], medians[TRL]
    ratio = ours["training_s"] / theirs["training_s"]
    reached = ours["to_target_s"] is not None and theirs["to_target_s"] is not None
    to_target = f"{ours['to_target_s'] / theirs['to_target_s']:.2f}" if reached else "n/a"
    print(
        f"trl-pair: training phase atropos/trl = {ratio:.2f}, to 0.5 atropos/trl = "
        f"{to_target} (medians of {args.rounds} rounds)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
