"""Engine launcher: real engine subprocesses started, restarted, killed and stopped."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap

import httpx
import pytest

from atroposlib.inference.launcher import (
    EngineConfig,
    EngineError,
    EngineProcess,
    engine_command,
    start_line,
)
from atroposlib.utils.logging import MESSAGE_WIDTH
from atroposlib.utils.ports import free_port
from tests.support.process_tree import alive
from tests.support.waiting import wait_until

torch = pytest.importorskip("torch")

PROMPT = [{"role": "user", "content": "What is 3 + 4 mod 10?"}]


def config(tmp_path, **overrides) -> EngineConfig:
    values = dict(
        engine="transformers",
        served_model_name="policy",
        port=free_port(),
        extra_args=["--num-threads", "1"],
        health_timeout_s=120,
        stop_grace_s=5,
        log_path=str(tmp_path / "engine.log"),
    )
    return EngineConfig(**{**values, **overrides})


def greedy(url: str) -> tuple[str, list[float]]:
    body = {
        "model": "policy",
        "messages": PROMPT,
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "ignore_eos": True,
    }
    choice = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()["choices"][0]
    return choice["message"]["content"], [t["logprob"] for t in choice["logprobs"]["content"]]


def gone(pid: int) -> bool:
    """No such process, or a zombie."""
    return not alive(pid)


def perturbed_checkpoint(source, target):
    from transformers import AutoModelForCausalLM

    shutil.copytree(source, target)
    model = AutoModelForCausalLM.from_pretrained(target)
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    model.save_pretrained(target)
    return target


@pytest.mark.integration
def test_command_lines_match_vllm_flags(tmp_path):
    cfg = config(tmp_path, max_model_len=512, dtype="float32", gpu_memory_utilization=0.5)
    vllm = engine_command(cfg, "vllm", "/ckpt/step-2")
    assert vllm[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "--gpu-memory-utilization" in vllm and vllm[vllm.index("--model") + 1] == "/ckpt/step-2"
    ours = engine_command(cfg, "transformers", "/ckpt/step-2")
    assert ours[2] == "atroposlib.cli.inference_server" and "--gpu-memory-utilization" not in ours
    for flag in ("--served-model-name", "--max-model-len", "--dtype", "--port", "--host"):
        assert flag in vllm and flag in ours


def test_start_restart_from_new_weights_kill_9_and_stop(tiny_model_path, tmp_path):
    """One engine through what a run does to it (three starts, each about 8 s of CPU):
    restarted from new weights, killed with -9 and started again, stopped."""
    with EngineProcess(config(tmp_path)) as engine:
        engine.start(tiny_model_path)
        before = greedy(engine.url)
        first_pid = engine.proc.pid
        engine.restart(perturbed_checkpoint(tiny_model_path, tmp_path / "step-2"))
        assert engine.restarts == 1 and engine.proc.pid != first_pid and gone(first_pid)
        after = greedy(engine.url)
        assert after[1] != before[1], "the engine still serves the old weights"

        os.kill(engine.proc.pid, signal.SIGKILL)
        wait_until(lambda: not engine.alive(), 10, "the killed engine still counts as alive")
        with pytest.raises(EngineError, match="died"):
            engine.check()
        engine.restart()
        assert engine.restarts == 2 and engine.healthy()
        pid = engine.proc.pid
    assert gone(pid)


def test_each_launch_gets_a_seed_of_its_own_unless_the_flags_name_one():
    """RNG-1: vLLM seeds with 0 and the CPU engine did too, at every start."""
    from atroposlib.inference.launcher import with_fresh_seed

    command = ["python", "-m", "vllm.entrypoints.openai.api_server", "--port", "9"]
    seeds = {with_fresh_seed(command)[-1] for _ in range(5)}
    assert with_fresh_seed(command)[-2] == "--seed" and len(seeds) == 5
    for given in (["--seed", "7"], ["--seed=7"]):
        assert with_fresh_seed(command + given) == command + given


def test_an_engine_start_is_one_short_line(tmp_path):
    """Kind, port and model: a checkpoint by its directory's name, a long one cut."""
    checkpoint = tmp_path / "runs/quickstart_cpu-20261127-120000/checkpoints/step-120"
    checkpoint.mkdir(parents=True)
    tiny = tmp_path / "tiny-v3-0-512-96-2-256-512-4000-1500-0.003-0.3-0.4-0.5"
    tiny.mkdir()
    assert start_line("cpu", 9001, str(checkpoint)) == (
        "starting cpu engine on port 9001: step-120"
    )
    assert start_line("vllm", 9001, "Qwen/Qwen2.5-1.5B-Instruct") == (
        "starting vllm engine on port 9001: Qwen/Qwen2.5-1.5B-Instruct"
    )
    cut = start_line("cpu", 65535, str(tiny))
    assert cut == "starting cpu engine on port 65535: tiny-v3-0-512-96-2-256-51..."
    assert len(cut) == MESSAGE_WIDTH
    assert len("trainer        | " + cut) <= 80  # beside the quickstart's launcher prefix
    # by the name it is served as: a checkpoint's after it, a built tiny model's alone
    assert start_line("cpu", 9001, str(checkpoint), "tiny") == (
        "starting cpu engine on port 9001: tiny (step-120)"
    )
    (tiny / "atropos_tiny_model.json").write_text("{}")
    assert start_line("cpu", 9001, str(tiny), "tiny") == "starting cpu engine on port 9001: tiny"
    assert start_line("cpu", 9001, str(checkpoint), "default").endswith(": step-120")


@pytest.mark.integration
def test_a_failing_engine_quotes_its_log(tmp_path, caplog):
    engine = EngineProcess(config(tmp_path))
    with (
        caplog.at_level("DEBUG", logger="atroposlib.inference"),
        pytest.raises(EngineError) as failure,
    ):
        engine.start(tmp_path / "no-such-model")
    assert "cannot load model" in str(failure.value)
    assert not engine.alive()
    # one short line at INFO; the whole command at DEBUG and atop the engine's log
    shown = [r for r in caplog.records if r.levelname == "INFO"]
    assert [r.getMessage() for r in shown] == [
        f"starting cpu engine on port {engine.config.port}: policy (no-such-model)"
    ]
    command = engine_command(engine.config, "transformers", str(tmp_path / "no-such-model"))
    (debug,) = [r for r in caplog.records if r.levelname == "DEBUG"]
    assert debug.name == "atroposlib.inference.command"
    message = debug.getMessage()
    seed = message.rpartition(" --seed ")[2]  # the launch's own (RNG-1)
    assert seed.isdigit() and message == f"engine command: {shlex.join(command)} --seed {seed}"
    head = (tmp_path / "engine.log").read_text().splitlines()[0]
    assert head == f"$ {shlex.join(command)} --seed {seed}"


def test_no_orphan_when_the_parent_is_killed(tiny_model_path, tmp_path):
    pid_file = tmp_path / "engine.pid"
    settings = config(tmp_path).model_dump_json()
    script = textwrap.dedent(f"""
        import time
        from atroposlib.inference.launcher import EngineConfig, EngineProcess
        engine = EngineProcess(EngineConfig.model_validate_json({settings!r}))
        engine.start({str(tiny_model_path)!r})
        open({str(pid_file)!r}, "w").write(str(engine.proc.pid))
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script])
    written = wait_until(
        lambda: pid_file.exists() and pid_file.read_text().strip(),
        120,
        "the parent never started its engine",
    )
    engine_pid = int(written)
    parent.kill()
    parent.wait()
    wait_until(lambda: gone(engine_pid), 15, "the engine outlived its parent")
