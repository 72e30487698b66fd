"""End to end on CPU: run-api + the arith environment + atropos-grpo with the CPU engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.envs.test_serve import EnvProcess, serve_args

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
    found = subprocess.run(["pgrep", "-af", f"--port {port}"], capture_output=True, text=True)
    return [line for line in found.stdout.splitlines() if "inference_server" in line]


@pytest.mark.slow
def test_grpo_loop_checkpoints_restarts_and_resumes(api_factory, tiny_model_path, tmp_path):
    api = api_factory()
    port = free_port()
    save = tmp_path / "ckpt"
    log = open(tmp_path / "trainer.log", "wb")
    trainer = subprocess.Popen(
        trainer_cmd(tiny_model_path, api.url, port, save), stdout=log, stderr=subprocess.STDOUT
    )
    env = EnvProcess(tmp_path, "serve", *serve_args(api.url, f"http://127.0.0.1:{port}"))
    try:
        assert trainer.wait(300) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    finally:
        env.stop()
        if trainer.poll() is None:
            trainer.kill()
    text = (tmp_path / "trainer.log").read_text()
    assert (save / "step-2" / "model.safetensors").exists()
    assert (save / "step-4" / "trainer_state.pt").exists()
    assert f"--model {save}/step-2" in text and f"--model {save}/step-4" in text
    steps = [json.loads(line)["step"] for line in (save / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict()
    trained = AutoModelForCausalLM.from_pretrained(save / "step-4").state_dict()
    assert any(not torch.equal(base[k], trained[k]) for k in base)
    assert engine_processes(port) == [], "the engine outlived the trainer"

    env2 = EnvProcess(tmp_path, "serve", *serve_args(api.url, f"http://127.0.0.1:{port}"))
    second = subprocess.Popen(
        trainer_cmd(tiny_model_path, api.url, port, save, "--resume", str(save / "step-4"))
        + ["--training-steps", "6"],
        stdout=open(tmp_path / "trainer2.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        assert second.wait(300) == 0, (tmp_path / "trainer2.log").read_text()[-3000:]
    finally:
        env2.stop()
        if second.poll() is None:
            second.kill()
    steps = [json.loads(line)["step"] for line in (save / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert (save / "step-6").exists()
    assert engine_processes(port) == []
    assert os.path.exists(save / "engine.log")
