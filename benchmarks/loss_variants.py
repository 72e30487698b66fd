"""Which losses learn: the CPU quickstart once per loss and importance-sampling mode,
and once with a staleness bound.

Each variant runs `atropos-launch configs/quickstart_cpu.yaml` with the same seed and
steps, one after the other, and differs from the quickstart only by the trainer flags
in `VARIANTS`. For each it prints, from the run's own metrics.jsonl:
- the mean score over the first and the last 10 steps, and their difference;
- the wall time of the whole launch (start-up included, which all variants share);
- clip: the mean share of trained tokens whose gradient the clip cut (cispo: capped);
- is cut: the mean share truncated or masked by the IS correction;
- the staleness of the trained samples (mean and max, in versions) and how many
  sequences a staleness bound dropped.

    python benchmarks/loss_variants.py                  # every variant, 100 steps each
    python benchmarks/loss_variants.py --only cispo gspo --steps 60

A variant learns when its score rises by at least `--min-rise` (0.15). The table is
also written as JSON next to the runs; the last line reads
`loss-variants: K of N variants learn`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from quickstart_runs import launch, quickstart_config, read_jsonl, shown

IS = {"vllm_importance_sampling_correction": True}
VARIANTS: dict[str, dict] = {
    "dapo (default)": {},
    "grpo": {"loss_type": "grpo"},
    "dr_grpo": {"loss_type": "dr_grpo"},
    "gspo": {
        "loss_type": "grpo",
        "importance_sampling_level": "sequence",
        "clip_eps": 3e-4,
        "clip_eps_high": 4e-4,
    },
    "cispo": {"loss_type": "cispo"},
    "rloo": {"advantage_estimator": "rloo"},
    "entropy 0.01": {"entropy_coef": 0.01},
    "kl 0.05 to base": {"kl_coef": 0.05, "kl_reference": "model"},
    "is token_truncate": {**IS, "vllm_importance_sampling_mode": "token_truncate"},
    "is token_mask": {**IS, "vllm_importance_sampling_mode": "token_mask"},
    "is sequence_truncate": {**IS, "vllm_importance_sampling_mode": "sequence_truncate"},
    "is sequence_mask": {**IS, "vllm_importance_sampling_mode": "sequence_mask"},
    "max-staleness 1": {"max_staleness": 1},
}


def mean_of(metrics: list[dict], key: str) -> float | None:
    values = [m[key] for m in metrics if key in m]
    return statistics.mean(values) if values else None


def run_variant(name: str, steps: int, seed: int, workdir: Path) -> dict:
    slug = name.replace(" ", "-").replace("(", "").replace(")", "")
    run_dir, wall = launch(slug, quickstart_config(VARIANTS[name], steps, seed), workdir)
    metrics = sorted(read_jsonl(run_dir / "metrics.jsonl"), key=lambda m: m["step"])
    scores = [m["score_mean"] for m in metrics]
    first, last = statistics.mean(scores[:10]), statistics.mean(scores[-10:])
    lags = [m["staleness_max"] for m in metrics if "staleness_max" in m]
    result = {
        "variant": name,
        "flags": VARIANTS[name],
        "first10": first,
        "last10": last,
        "rise": last - first,
        "wall_s": wall,
        "clip": mean_of(metrics, "clip_fraction"),
        "is_cut": mean_of(metrics, "is_clip_fraction"),
        "is_weight_mean": mean_of(metrics, "is_weight_mean"),
        "mismatch_kl": mean_of(metrics, "mismatch_kl"),
        "staleness_mean": mean_of(metrics, "staleness_mean"),
        "staleness_max": max(lags) if lags else None,
        "dropped": int(sum(m.get("stale_sequences_dropped", 0) for m in metrics)),
    }
    print(
        f"[{name}] score {first:.3f} -> {last:.3f} ({last - first:+.3f}) in {wall:.0f}s",
        flush=True,
    )
    return result


def table(results: list[dict], min_rise: float) -> str:
    lines = [
        "| variant | first 10 | last 10 | rise | learns | wall s | clip | IS cut "
        "| staleness mean / max | dropped |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lag = f"{shown(r['staleness_mean'], '.2f')} / {shown(r['staleness_max'], '.0f')}"
        lines.append(
            f"| {r['variant']} | {r['first10']:.3f} | {r['last10']:.3f} | {r['rise']:+.3f} "
            f"| {'yes' if r['rise'] >= min_rise else 'NO'} | {r['wall_s']:.0f} "
            f"| {shown(r['clip'], '.3f')} | {shown(r['is_cut'], '.3f')} | {lag} "
            f"| {r['dropped']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-rise", type=float, default=0.15)
    parser.add_argument("--only", nargs="+", choices=sorted(VARIANTS), metavar="VARIANT")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="loss-variants-"))
    workdir.mkdir(parents=True, exist_ok=True)
    names = args.only or list(VARIANTS)
    results = [run_variant(name, args.steps, args.seed, workdir) for name in names]
    (workdir / "loss_variants.json").write_text(json.dumps(results, indent=2))
    print(f"\n{args.steps} steps each, seed {args.seed}; runs in {workdir}\n")
    print(table(results, args.min_rise))
    learned = sum(r["rise"] >= args.min_rise for r in results)
    print(f"\nloss-variants: {learned} of {len(results)} variants learn")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
