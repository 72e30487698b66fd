"""Trainer step: tokens/s, MFU, peak memory per rank, and the step against a bare
forward+backward, for DDP and FSDP, checkpointing on and off, whole and chunked logprobs.

It builds a random-weight model of a Qwen2.5 shape (`tiny` keeps Qwen's 152k vocabulary
on a 64-wide, 2-layer body, for a CPU), and trains the same batch (64 x 1,024 tokens
by default, half of each prompt) with the real `Trainer.train_step`: one warm-up step,
then one timed step. Each row runs in fresh processes (`--ranks` of them under
torchrun; gloo on a CPU, nccl on GPUs), so its peak memory is its own:
`torch.cuda.max_memory_allocated` on a GPU, the process's peak resident size on a CPU.

- tokens/s: trained batch tokens (prompt included) over the timed step.
- MFU: (6 x parameters + 12 x layers x width x sequence length) FLOPs per token, times
  tokens/s, over `--peak-tflops` per rank.
- state/rank: bytes of parameters, fp32 masters and optimizer state this rank holds.
- step/bare: the step's time over a forward and backward of the same micro-batches with
  a plain sum for a loss (no loss terms, no optimizer, no gradient clipping).

A last measurement takes the logprob-and-backward step alone (`--logprob-rows`
positions of hidden states through the shape's head), whole against
`--logprob-chunk-tokens`, each in a fresh process.

    python benchmarks/trainer_step.py --shape tiny --sequences 8 --seq-len 128 \
        --micro-batch-tokens 1024 --logprob-chunk-tokens 256 --logprob-rows 1024   # a CPU
    python benchmarks/trainer_step.py --shape 1.5b --device cuda --ranks 1 --peak-tflops 989

`--dtype auto` (the default) is bfloat16 on a GPU and float32 on a CPU: a CPU without
native bfloat16 (AVX2, most AVX-512) emulates it, and the CPU example above then did not
finish in 20 minutes.

The last line reads
`trainer-step: fsdp/ddp bytes per rank = R, chunked/full logprob peak = C`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VOCAB = 151936
SHAPES = {  # Qwen2.5's configurations; `tiny` keeps the vocabulary, shrinks the body
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128),
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, intermediate_size=4864),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, intermediate_size=8960),
    "3b": dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16,
               num_key_value_heads=2, intermediate_size=11008),
    "7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, intermediate_size=18944),
}  # fmt: skip


def resolved_dtype(dtype: str, device: str) -> str:
    """`auto`: bfloat16 on a GPU, float32 on a CPU (see the module docstring)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if device.startswith("cuda") else "float32"


def build_model(shape: str, folder: Path, dtype: str) -> int:
    """Random weights of `shape` and a stand-in tokenizer in `folder`; the parameter count."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        **SHAPES[shape],
        vocab_size=VOCAB,
        tie_word_embeddings=shape in ("tiny", "0.5b", "1.5b", "3b"),
        max_position_embeddings=32768,
    )
    model = Qwen2ForCausalLM(config).to(torch.bfloat16 if dtype == "bfloat16" else torch.float32)
    model.save_pretrained(folder)
    vocab = {"<pad>": 0, "<unk>": 1}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="<pad>", unk_token="<unk>"
    ).save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def the_batch(sequences: int, length: int) -> list[dict]:
    """Groups of 8 random sequences: the first half of each masked as its prompt."""
    import torch

    generator = torch.Generator().manual_seed(1)
    groups, half = [], length // 2
    for start in range(0, sequences, 8):
        rows = min(8, sequences - start)
        tokens = torch.randint(3, VOCAB - 1, (rows, length), generator=generator).tolist()
        groups.append(
            {
                "tokens": tokens,
                "masks": [[-100] * half + t[half:] for t in tokens],
                "scores": [float(i % 2) for i in range(rows)],
                "inference_logprobs": [[1.0] * half + [-2.0] * (length - half)] * rows,
            }
        )
    return groups


def peak_bytes(device) -> int:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_worker(args: argparse.Namespace) -> None:
    """One row, on every rank: warm-up step, timed step, timed bare pass; rank 0 prints."""
    import torch

    from example_trainer.config import TrainingConfig
    from example_trainer.data import flatten, micro_batches, split_trainable
    from example_trainer.grpo import Trainer
    from example_trainer.sharding import (
        local_bytes,
        optimizer_state_tensors,
        padded_micro_batch_count,
    )

    config = TrainingConfig(
        model_name=args.model,
        device=args.device,
        dtype=args.dtype,
        inference_engine="none",
        seq_len=args.seq_len,
        batch_size=args.sequences,
        micro_batch_tokens=args.micro_batch_tokens,
        logprob_chunk_tokens=args.chunk,
        gradient_checkpointing=args.checkpointing,
        parallelism=args.parallelism,
        save_path=tempfile.mkdtemp(),
        lr=1e-6,
        num_threads=args.threads,
    )
    trainer = Trainer(config)
    batch = the_batch(args.sequences, args.seq_len)
    trainer.train_step(batch)  # warm-up: kernels, allocator, optimizer state
    if trainer.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(trainer.device)
    synchronize(trainer.device)
    started = time.perf_counter()
    metrics = trainer.train_step(batch)
    synchronize(trainer.device)
    step_s = time.perf_counter() - started
    peak = peak_bytes(trainer.device)
    masters = [m for p, m in trainer.master.pairs if m is not p]
    state = local_bytes(list(trainer.model.parameters()) + masters)
    state += local_bytes(optimizer_state_tensors(trainer.optimizer))
    groups, _ = split_trainable(batch, trainer.vocab_size)
    sequences = trainer.parallel.shard(
        flatten(groups, "group", args.seq_len), lambda s: len(s.tokens)
    )
    chunks = micro_batches(sequences, 1, 0, args.micro_batch_tokens, trainer.forward.packs)
    enabled = trainer.sharded and trainer.parallel.enabled
    count = padded_micro_batch_count(len(chunks), enabled, trainer.device)
    synchronize(trainer.device)
    started = time.perf_counter()
    for index in range(count):
        last = index == count - 1
        if index >= len(chunks):
            trainer.forward.idle_pass(last, 0, None)
            continue
        with trainer.forward.gradient_sync(last):
            chunk = chunks[index]
            rest = (chunk.attention_mask, chunk.position_ids)
            on_device = [None if t is None else t.to(trainer.device) for t in rest]
            trainer.forward(chunk.input_ids.to(trainer.device), *on_device).sum().backward()
    synchronize(trainer.device)
    bare_s = time.perf_counter() - started
    if trainer.parallel.is_main:
        print(
            "ROW "
            + json.dumps(
                {
                    "step_s": step_s,
                    "bare_s": bare_s,
                    "peak": peak,
                    "state": state,
                    "loss": metrics["loss"],
                }
            ),
            flush=True,
        )
    trainer.parallel.close()


def logprob_worker(args: argparse.Namespace) -> None:
    """The logprob-and-backward step alone: whole logits or chunked; prints its peak."""
    import torch

    from example_trainer.logprobs import chunked_token_logprobs
    from example_trainer.loss import token_logprobs

    device = torch.device(args.device if args.device != "auto" else "cpu")
    torch.manual_seed(0)
    width = SHAPES[args.shape]["hidden_size"]
    rows = args.logprob_rows // 1024
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    head = torch.nn.Linear(width, VOCAB, bias=False, device=device, dtype=dtype)
    hidden = torch.randn(rows, 1024, width, device=device, dtype=dtype)
    hidden.requires_grad_()
    ids = torch.randint(0, VOCAB, (rows, 1024), device=device)
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else peak_bytes(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if args.chunk:
        values = chunked_token_logprobs(hidden, head, ids, args.chunk)
    else:
        values = token_logprobs(head(hidden), ids)
    values.sum().backward()
    synchronize(device)
    print("ROW " + json.dumps({"peak": peak_bytes(device) - base}), flush=True)


def run_row(args: argparse.Namespace, part: str, ranks: int, **row: object) -> dict:
    """This script as a worker, in `ranks` fresh processes; the row rank 0 printed."""
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in row.items()]
    forwarded = [
        *("--shape", args.shape, "--device", args.device, "--dtype", args.dtype),
        *("--sequences", str(args.sequences), "--seq-len", str(args.seq_len)),
        *("--micro-batch-tokens", str(args.micro_batch_tokens)),
        *("--logprob-rows", str(args.logprob_rows), "--threads", str(args.threads)),
    ]
    script = [str(Path(__file__).resolve()), "--worker", part, *forwarded, *flags]
    if ranks > 1:
        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
        command = [str(torchrun), "--standalone", f"--nproc_per_node={ranks}", *script]
    else:
        command = [sys.executable, *script]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("ROW ")]
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    return json.loads(lines[-1][4:])


def flops_per_token(shape: str, params: int, length: int) -> float:
    body = SHAPES[shape]
    return 6 * params + 12 * body["num_hidden_layers"] * body["hidden_size"] * length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--ranks", type=int, default=2, help="processes per row")
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--logprob-chunk-tokens", type=int, default=1024)
    parser.add_argument("--logprob-rows", type=int, default=8192, help="positions, x1024")
    parser.add_argument("--peak-tflops", type=float, default=0.0, help="per rank; 0: no MFU")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank (CPU)")
    parser.add_argument(
        "--rows",
        default="",
        help="only these rows, as parallelism:checkpointing:logprobs, comma-separated "
        "(e.g. fsdp:on:chunked); default: all eight",
    )
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--worker", choices=["step", "logprob"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--parallelism", default="ddp", help=argparse.SUPPRESS)
    parser.add_argument("--chunk", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--checkpointing", type=lambda v: v == "True", default=False, help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    args.dtype = resolved_dtype(args.dtype, args.device)
    if args.logprob_rows < 1024 or args.logprob_rows % 1024:
        parser.error(f"--logprob-rows {args.logprob_rows}: give a multiple of 1024")
    if args.worker == "step":
        return step_worker(args)
    if args.worker == "logprob":
        return logprob_worker(args)

    folder = Path(tempfile.mkdtemp(prefix="trainer-step-"))
    try:
        params = build_model(args.shape, folder, args.dtype)
        tokens = args.sequences * args.seq_len
        print(
            f"{args.shape}: {params / 1e6:.1f}M parameters, {args.dtype}, {args.ranks} rank(s) "
            f"on {args.device}, {args.sequences} x {args.seq_len} tokens, micro-batches of "
            f"{args.micro_batch_tokens} tokens",
            flush=True,
        )
        header = "parallelism  ckpt  logprobs   tok/s     MFU    peak/rank  state/rank  step/bare"
        print(header, flush=True)
        state = {}
        wanted = {row.strip() for row in args.rows.split(",") if row.strip()}
        for parallelism in ("ddp", "fsdp"):
            for checkpointing in (False, True):
                for chunk in (0, args.logprob_chunk_tokens):
                    name = (
                        f"{parallelism}:{'on' if checkpointing else 'off'}:"
                        f"{'chunked' if chunk else 'whole'}"
                    )
                    if wanted and name not in wanted:
                        continue
                    row = run_row(
                        args,
                        "step",
                        args.ranks,
                        model=folder,
                        parallelism=parallelism,
                        chunk=chunk,
                        checkpointing=checkpointing,
                    )
                    label = (
                        f"{parallelism:<12} {'on' if checkpointing else 'off':<5} "
                        f"{'chunked' if chunk else 'whole':<9}"
                    )
                    if "error" in row:
                        print(f"{label} failed: {row['error']}", flush=True)
                        continue
                    state.setdefault(parallelism, row["state"])
                    rate = tokens / row["step_s"]
                    flops = rate * flops_per_token(args.shape, params, args.seq_len)
                    peak_flops = args.ranks * args.peak_tflops * 1e12
                    mfu = f"{flops / peak_flops:.3f}" if args.peak_tflops else "-"
                    print(
                        f"{label} {rate:8.0f}  {mfu:>6}  {row['peak'] / 2**30:7.2f} GiB "
                        f"{row['state'] / 2**30:7.2f} GiB  {row['step_s'] / row['bare_s']:6.2f}",
                        flush=True,
                    )
        peaks = {}
        for chunk in (0, args.logprob_chunk_tokens):
            peaks[chunk] = run_row(args, "logprob", 1, chunk=chunk).get("peak")
        whole, chunked = peaks[0], peaks[args.logprob_chunk_tokens]
        print(
            f"logprob-and-backward, {args.logprob_rows} positions x {VOCAB} vocabulary: "
            f"whole {whole / 2**20:.0f} MiB, chunked ({args.logprob_chunk_tokens}) "
            f"{chunked / 2**20:.0f} MiB",
            flush=True,
        )
        bytes_ratio = (
            f"{state['fsdp'] / state['ddp']:.2f}" if {"ddp", "fsdp"} <= state.keys() else "n/a"
        )
        peak_ratio = f"{chunked / whole:.2f}" if whole and chunked else "n/a"
        print(
            f"trainer-step: fsdp/ddp bytes per rank = {bytes_ratio}, "
            f"chunked/full logprob peak = {peak_ratio}"
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
