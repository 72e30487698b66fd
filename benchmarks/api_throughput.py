"""Load test of the trajectory API: concurrent posters and one trainer.

C posters send gzip-compressed groups (8 sequences x 1024 tokens by default, as
real environments do) while a trainer pulls batches of 64 sequences. Prints
groups/s in, sequences/s out, post and /batch latency percentiles, and the
number of groups lost or served twice. A second phase pre-fills the queue with
N groups and measures /batch latency with that backlog.

The client speaks raw HTTP/1.1 over asyncio streams so that, on a 2-core
machine, as much CPU as possible is left to the server being measured.

    python benchmarks/api_throughput.py                 # starts its own run-api
    python benchmarks/api_throughput.py --url http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from urllib.parse import urlparse

import httpx
import orjson

try:
    from tqdm import tqdm
except ImportError:  # progress is optional
    tqdm = None


class RawHttp:
    """A minimal keep-alive HTTP/1.1 client: one connection, one request at a time."""

    def __init__(self, host: str, port: int, api_key: str | None) -> None:
        self.host, self.port = host, port
        self.auth = f"Authorization: Bearer {api_key}\r\n".encode() if api_key else b""
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(
        self, method: str, path: str, body: bytes = b"", gz: bool = False
    ) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Length: {len(body)}\r\n"
        head += "Content-Type: application/json\r\n"
        if gz:
            head += "Content-Encoding: gzip\r\n"
        self.writer.write(head.encode() + self.auth + b"\r\n" + body)
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        return status, await self.reader.readexactly(length)


def make_bodies(count: int, group_size: int, seq_len: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    pool = [[rng.randrange(150_000) for _ in range(seq_len - 1)] for _ in range(64)]
    bodies = []
    iterator = range(count)
    if tqdm is not None:
        iterator = tqdm(iterator, desc="building payloads", leave=False)
    for tag in iterator:
        tokens = [[tag] + rng.choice(pool) for _ in range(group_size)]
        group = {
            "tokens": tokens,
            "masks": [[-100] * (seq_len // 4) + t[seq_len // 4 :] for t in tokens],
            "scores": [rng.random() for _ in range(group_size)],
        }
        bodies.append(gzip.compress(orjson.dumps(group), compresslevel=1))
    return bodies


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def post_all(client_count: int, bodies: list[bytes], host: str, port: int, key: str | None):
    latencies: list[float] = []
    accepted: list[int] = []
    queue: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
    for tag, body in enumerate(bodies):
        queue.put_nowait((tag, body))

    async def poster() -> None:
        http = RawHttp(host, port, key)
        while not queue.empty():
            tag, body = queue.get_nowait()
            while True:
                start = time.perf_counter()
                status, _ = await http.request("POST", "/scored_data", body, gz=True)
                if status == 200:
                    latencies.append(time.perf_counter() - start)
                    accepted.append(tag)
                    break
                if status != 503:
                    raise RuntimeError(f"post failed with {status}")
                await asyncio.sleep(0.05)

    await asyncio.gather(*(poster() for _ in range(client_count)))
    return latencies, accepted


async def trainer(
    host: str,
    port: int,
    key: str | None,
    stop_when,
    latencies: list[float],
    seen: list[int],
    poll_s: float,
):
    """Pull batches until `stop_when(sequences)`; sleep `poll_s` after an empty answer."""
    http = RawHttp(host, port, key)
    sequences = 0
    first = last = None
    while not stop_when(sequences):
        start = time.perf_counter()
        status, body = await http.request("GET", "/batch")
        elapsed = time.perf_counter() - start
        batch = orjson.loads(body)["batch"]
        if not batch:
            await asyncio.sleep(poll_s)
            continue
        latencies.append(elapsed)
        first = first or start
        last = time.perf_counter()
        for group in batch:
            seen.append(group["tokens"][0][0])
            sequences += len(group["tokens"])
    return sequences, (last - first) if first else 0.0


def register(url: str, key: str | None, batch_size: int, seq_len: int) -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        client.get("/reset_data").raise_for_status()
        client.post(
            "/register",
            json={
                "wandb_group": "bench",
                "wandb_project": "bench",
                "batch_size": batch_size,
                "max_token_len": seq_len,
                "checkpoint_dir": "",
                "save_checkpoint_interval": 0,
                "starting_step": 0,
                "num_steps": 10**9,
            },
        ).raise_for_status()
        client.get("/batch").raise_for_status()


async def throughput_phase(args, host, port, bodies) -> dict:
    register(args.url, args.api_key, args.batch_size, args.seq_len)
    target = len(bodies) * args.group_size
    batch_latency: list[float] = []
    seen: list[int] = []
    start = time.perf_counter()
    train_task = asyncio.create_task(
        trainer(host, port, args.api_key, lambda n: n >= target, batch_latency, seen, args.poll_s)
    )
    post_latency, accepted = await post_all(args.concurrency, bodies, host, port, args.api_key)
    post_seconds = time.perf_counter() - start
    try:
        sequences, _ = await asyncio.wait_for(train_task, timeout=60)
    except TimeoutError:
        sequences = len(seen) * args.group_size
    lost = len(set(accepted) - set(seen))
    duplicated = len(seen) - len(set(seen))
    return {
        "groups_in_per_s": len(accepted) / post_seconds,
        "sequences_out_per_s": sequences / (time.perf_counter() - start),
        "post_p50_ms": percentile(post_latency, 0.5) * 1e3,
        "post_p99_ms": percentile(post_latency, 0.99) * 1e3,
        "batch_p50_ms": percentile(batch_latency, 0.5) * 1e3,
        "batch_p99_ms": percentile(batch_latency, 0.99) * 1e3,
        "lost": lost,
        "duplicated": duplicated,
    }


async def backlog_phase(args, host, port, bodies, queued: int) -> dict:
    """Hold the queue at `queued` groups: pull a batch (timed), post its groups back."""
    register(args.url, args.api_key, args.batch_size, args.seq_len)
    reps = (queued + len(bodies) - 1) // len(bodies)
    await post_all(args.concurrency, (bodies * reps)[:queued], host, port, args.api_key)
    http = RawHttp(host, port, args.api_key)
    latencies: list[float] = []
    for _ in range(args.backlog_batches):
        start = time.perf_counter()
        status, body = await http.request("GET", "/batch")
        latencies.append(time.perf_counter() - start)
        batch = orjson.loads(body)["batch"]
        if not batch:
            raise RuntimeError(f"no batch with {queued} groups queued: {body[:200]!r}")
        for group in batch:
            await http.request("POST", "/scored_data", bodies[group["tokens"][0][0]], gz=True)
    return {
        "queued_groups": queued,
        "batch_p50_ms": percentile(latencies, 0.5) * 1e3,
        "batch_p99_ms": percentile(latencies, 0.99) * 1e3,
    }


def start_server(args) -> subprocess.Popen:
    if not args.port:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            args.port = sock.getsockname()[1]
    port = args.port
    state_dir = tempfile.mkdtemp(prefix="atropos-bench-")
    cmd = [
        sys.executable,
        "-m",
        "atroposlib.cli.run_api",
        "--port",
        str(port),
        "--state-dir",
        state_dir,
        "--log-level",
        "warning",
    ]
    if args.ephemeral:
        cmd.append("--ephemeral")
    proc = subprocess.Popen(cmd, env={**os.environ, "ATROPOS_API_KEY": args.api_key or ""})
    proc.state_dir = state_dir
    for _ in range(200):
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("run-api did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="API to measure (default: start a durable run-api here)")
    parser.add_argument(
        "--port", type=int, default=0, help="port for the self-started server (0: a free one)"
    )
    parser.add_argument("--ephemeral", action="store_true", help="self-started server in memory")
    parser.add_argument("--api-key", default=os.environ.get("ATROPOS_API_KEY"))
    parser.add_argument("--concurrency", "-c", type=int, default=8)
    parser.add_argument(
        "--groups", type=int, default=3000, help="groups posted in the throughput phase"
    )
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument(
        "--poll-s", type=float, default=0.01, help="trainer's sleep after an empty /batch"
    )
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--backlogs", default="100,10000", help="queue depths for the /batch latency phase"
    )
    parser.add_argument(
        "--backlog-batches", type=int, default=100, help="batches pulled per backlog"
    )
    args = parser.parse_args()

    server = None
    if args.url is None:
        server = start_server(args)
        args.url = f"http://127.0.0.1:{args.port}"
    parsed = urlparse(args.url)
    host, port = parsed.hostname, parsed.port or 80
    try:
        per_batch = max(1, args.batch_size // args.group_size)
        count = max(per_batch, args.groups // per_batch * per_batch)  # no leftover partial batch
        bodies = make_bodies(count, args.group_size, args.seq_len, 0)
        size_kib = len(bodies[0]) / 1024
        print(f"payload: {size_kib:.0f} KiB gzip per group of {args.group_size} x {args.seq_len}")
        result = asyncio.run(throughput_phase(args, host, port, bodies))
        print(
            f"throughput (C={args.concurrency}, {len(bodies)} groups): "
            f"{result['groups_in_per_s']:.0f} groups/s in, "
            f"{result['sequences_out_per_s']:.0f} sequences/s out, "
            f"post p50 {result['post_p50_ms']:.1f} ms p99 {result['post_p99_ms']:.1f} ms, "
            f"/batch p50 {result['batch_p50_ms']:.1f} ms p99 {result['batch_p99_ms']:.1f} ms, "
            f"lost {result['lost']}, duplicated {result['duplicated']}"
        )
        for depth in (int(x) for x in args.backlogs.split(",") if x):
            backlog = asyncio.run(backlog_phase(args, host, port, bodies, depth))
            print(
                f"backlog {backlog['queued_groups']} groups: "
                f"/batch p50 {backlog['batch_p50_ms']:.1f} ms p99 {backlog['batch_p99_ms']:.1f} ms"
            )
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
            shutil.rmtree(server.state_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
