"""Does the tiny model learn to read the question for every seed and kernel path?

Builds the tiny model (unverified, into temporary directories) for several
seeds, each under several of torch's CPU kernel paths (ATEN_CPU_CAPABILITY:
`default`, `avx2`, `avx512` on x86-64 where the CPU has them), and prints the
figures the build is checked against. A build method that works only on the
machine it was written on shows up here as a failing row.

    python benchmarks/tiny_model_robustness.py                 # seeds 0-4, every kernel path
    python benchmarks/tiny_model_robustness.py --seeds 0 1 --capabilities avx2 --jobs 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def available_capabilities() -> list[str]:
    """The kernel paths this CPU can run (torch falls back silently on one it cannot)."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    found = ["default"]
    if " avx2" in flags:
        found.append("avx2")
    if " avx512f" in flags and " avx512bw" in flags and " avx512vl" in flags:
        found.append("avx512")
    return found


def build_one(seed: int) -> None:
    """Child process: build without the check and print the build record as JSON."""
    from atroposlib.utils.tiny_model import (
        TinyModelSpec,
        build_tiny_model,
        check_reading,
        read_build_record,
    )
    from atroposlib.utils.tiny_model_training import Reading

    spec = TinyModelSpec(seed=seed)
    with tempfile.TemporaryDirectory() as out:
        record = read_build_record(build_tiny_model(out, spec, verify=False))
    record["problems"] = check_reading(Reading(**record["reading"]), spec)
    print(json.dumps(record))


def run_one(seed: int, capability: str) -> dict:
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "TQDM_DISABLE": "1"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, __file__, "--one", str(seed)],
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode != 0:
        return {"seed": seed, "asked": capability, "error": done.stderr.strip()[-500:]}
    record = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "seed": seed,
        "asked": capability,
        "wall_s": time.monotonic() - started,
        **record,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--capabilities", nargs="+", default=None)
    parser.add_argument("--jobs", type=int, default=1, help="builds at once (each uses 1 thread)")
    parser.add_argument("--json", type=Path, default=None, help="also write every record here")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        build_one(args.one)
        return 0
    capabilities = args.capabilities or available_capabilities()
    runs = [(seed, cap) for seed in args.seeds for cap in capabilities]
    print(f"{len(runs)} builds: seeds {args.seeds} x kernels {capabilities}", flush=True)
    header = (
        f"{'seed':>4} {'kernels':>8} {'steps':>5} {'build_s':>7} "
        f"{'p_right':>7} {'greedy':>6} {'p_end':>5}  verdict"
    )
    print(header, flush=True)
    rows, failures = [], 0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for row in pool.map(lambda run: run_one(*run), runs):
            rows.append(row)
            if "error" in row:
                failures += 1
                print(f"{row['seed']:>4} {row['asked']:>8}  build crashed: {row['error']}")
                continue
            reading, problems = row["reading"], row["problems"]
            failures += bool(problems)
            print(
                f"{row['seed']:>4} {row['machine']['torch_cpu_capability']:>8} "
                f"{row['steps']:>5} {row['seconds']:>7.1f} {reading['p_right']:>7.3f} "
                f"{reading['greedy_accuracy']:>6.2f} {reading['p_end_after_digit']:>5.3f}  "
                + ("ok" if not problems else "FAILS: " + "; ".join(problems)),
                flush=True,
            )
    machine = next((r["machine"] for r in rows if "machine" in r), {})
    print(
        f"{len(rows) - failures}/{len(rows)} builds pass on {machine.get('cpu')} "
        f"(torch {machine.get('torch_version')}, "
        f"transformers {machine.get('transformers_version')})"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
