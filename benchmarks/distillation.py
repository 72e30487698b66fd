"""Does a teacher help? `configs/distill_cpu.yaml` four ways, one run after another.

- reward alone: `distill_coef 0` (the teacher still scores every group, so its KL to
  the student is reported, but the trainer learns from the reward only);
- reward + distillation: the config as shipped;
- distillation alone: as shipped, with `env.distill_only true` (every advantage zero:
  the scores are reported, the teacher alone trains);
- reward + distillation with `--distill-mode reverse_kl` (the sampled token's KL)
  instead of the shipped forward_topk.

Same seed, steps and machine for all three. From each run's metrics.jsonl it prints the
mean score over the first and last 10 steps, the first step whose 5-step mean score
reaches `--target` (0.5), the mean KL to the teacher over the first and last 10 steps,
the teacher's mean latency per group and the launch's wall time.

    python benchmarks/distillation.py                    # 60 steps each, about 18 min
    python benchmarks/distillation.py --only "reward alone" "reward + distillation"
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from quickstart_runs import REPO, launch, quickstart_config, read_jsonl, shown

CONFIG = REPO / "configs" / "distill_cpu.yaml"
ARMS: dict[str, tuple[dict, dict]] = {
    "reward alone": ({"distill_coef": 0.0}, {}),
    "reward + distillation": ({}, {}),
    "distillation alone": ({}, {"distill_only": True}),
    "reward + distillation, reverse_kl": ({"distill_mode": "reverse_kl"}, {}),
}
"""Each arm's trainer flags and environment settings over the config's."""


def first_reaching(scores: list[float], target: float, window: int = 5) -> int | None:
    """The first step whose `window`-step mean score reaches `target` (1-based)."""
    for end in range(window, len(scores) + 1):
        if statistics.mean(scores[end - window : end]) >= target:
            return end
    return None


def run_arm(name: str, steps: int, seed: int, target: float, workdir: Path) -> dict:
    trainer_args, env_settings = ARMS[name]
    config = quickstart_config(trainer_args, steps, seed, base=CONFIG)
    for env in config["environments"]:
        env["env"].update(env_settings)
    slug = name.replace(" ", "-").replace("+", "and").replace(",", "")
    run_dir, wall = launch(slug, config, workdir)
    metrics = sorted(read_jsonl(run_dir / "metrics.jsonl"), key=lambda m: m["step"])
    scores = [m["score_mean"] for m in metrics]
    kls = [m["distill_kl"] for m in metrics if "distill_kl" in m]
    waits = [m["teacher_latency_s"] for m in metrics if "teacher_latency_s" in m]
    result = {
        "arm": name,
        "first10": statistics.mean(scores[:10]),
        "last10": statistics.mean(scores[-10:]),
        "reaches_target_at": first_reaching(scores, target),
        "kl_first10": statistics.mean(kls[:10]) if kls else None,
        "kl_last10": statistics.mean(kls[-10:]) if kls else None,
        "teacher_latency_s": statistics.mean(waits) if waits else None,
        "wall_s": wall,
    }
    rise = result["last10"] - result["first10"]
    print(
        f"[{name}] score {result['first10']:.3f} -> {result['last10']:.3f} ({rise:+.3f}), "
        f"{target} at step {result['reaches_target_at']}, {wall:.0f}s",
        flush=True,
    )
    return result


def table(results: list[dict], target: float) -> str:
    lines = [
        f"| arm | first 10 | last 10 | rise | step at {target} | KL first 10 | KL last 10 "
        "| teacher s/group | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['arm']} | {r['first10']:.3f} | {r['last10']:.3f} "
            f"| {r['last10'] - r['first10']:+.3f} | {r['reaches_target_at'] or 'never'} "
            f"| {shown(r['kl_first10'], '.3f')} | {shown(r['kl_last10'], '.3f')} "
            f"| {shown(r['teacher_latency_s'], '.2f')} | {r['wall_s']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=0.5)
    parser.add_argument("--only", nargs="+", choices=sorted(ARMS), metavar="ARM")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="distillation-"))
    workdir.mkdir(parents=True, exist_ok=True)
    names = args.only or list(ARMS)
    results = [run_arm(name, args.steps, args.seed, args.target, workdir) for name in names]
    (workdir / "distillation.json").write_text(json.dumps(results, indent=2))
    print(f"\n{args.steps} steps each, seed {args.seed}; runs in {workdir}\n")
    print(table(results, args.target))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
