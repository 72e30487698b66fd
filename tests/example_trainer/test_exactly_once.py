"""The whole loop trains every posted group exactly once, though an answer is lost and the
trainer is killed and resumed (A1 + A2 of the correctness review).

Real parts: run-api, the example trainer on the tiny model, and a proxy between them that
loses the first answer of step 2 on the way back. The test posts the groups itself (12
groups of 4, tagged 10-21 by their first token), so it knows them. The trainer starts no
engine (`--inference-engine none`; it still checkpoints at each restart interval, which
commits the steps): no group passes through one, and each restart of one would cost
7 s of CPU.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from atroposlib.trainer_contract import read_metrics
from atroposlib.utils.ports import free_port
from tests.support.http_proxy import LossyProxy
from tests.support.pace import Pace

pytest.importorskip("torch")
# the waits are paced by the trainer's own steps (tests/support/pace.py); this is a last resort
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]

STEPS, GROUP, BATCH = 6, 4, 8
TAGS = range(10, 10 + STEPS * BATCH // GROUP)


def group(tag: int) -> dict:
    tokens = [[tag, 3 + i, 4 + i, 5, 6, 7] for i in range(GROUP)]
    masks = [[-100, -100, 4 + i, 5, 6, 7] for i in range(GROUP)]
    return {"tokens": tokens, "masks": masks, "scores": [1.0, 0.0, 0.5, 0.25]}


def trainer(tiny_model_path: Path, url: str, save: Path, log: Path, *extra: str):
    command = [
        sys.executable,
        "-m",
        "example_trainer.grpo",
        *("--model-name", str(tiny_model_path), "--atropos-url", url),
        *("--training-steps", str(STEPS), "--batch-size", str(BATCH), "--seq-len", "64"),
        *("--vllm-restart-interval", "2", "--inference-engine", "none"),
        *("--vllm-port", str(free_port()), "--save-path", str(save), "--num-threads", "1"),
        *("--lr", "1e-3", "--batch-poll-s", "0.2"),
        *extra,
    ]
    return subprocess.Popen(command, stdout=open(log, "ab"), stderr=subprocess.STDOUT)


def trained_steps(save: Path) -> list[int]:
    return [row.step for row in read_metrics(save / "metrics.jsonl")]


def test_a_lost_answer_and_a_killed_trainer_lose_no_group(api_factory, tiny_model_path, tmp_path):
    api = api_factory()
    save, log = tmp_path / "ckpt", tmp_path / "trainer.log"
    pace = Pace(save / "metrics.jsonl")
    with LossyProxy(api.url, drop_step=2) as proxy, httpx.Client(base_url=api.url) as client:
        first = trainer(tiny_model_path, proxy.url, save, log)
        registered = lambda: client.get("/info").json()["batch_size"] == BATCH  # noqa: E731
        pace.wait(registered, "the trainer did not register")
        for tag in TAGS:
            answer = client.post("/scored_data", json=group(tag))
            assert answer.status_code == 200, answer.text
        try:
            pace.wait(lambda: len(trained_steps(save)) >= 3, "no third step", steps=3, restarts=1)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(30)
        pace.killed()
        assert (save / "step-2").exists()
        second = trainer(tiny_model_path, proxy.url, save, log, "--resume", str(save / "step-2"))
        try:
            finished = lambda: second.poll() is not None  # noqa: E731
            try:
                pace.wait(finished, "the resumed trainer did not finish", STEPS - 2, restarts=2)
            except AssertionError as failure:
                raise AssertionError(f"{failure}\n{log.read_text()[-3000:]}") from None
            assert second.returncode == 0, log.read_text()[-3000:]
        finally:
            if second.poll() is None:
                second.kill()
        assert client.get("/status").json()["current_step"] == STEPS
    by_step: dict[int, set[tuple[int, ...]]] = {}
    for delivery in proxy.deliveries:
        assert delivery.step is not None, "the trainer asked for a batch without its step"
        by_step.setdefault(delivery.step, set()).add(delivery.tags)
    assert [d.delivered for d in proxy.deliveries if d.step == 2][:2] == [False, True]
    assert all(len(batches) == 1 for batches in by_step.values()), by_step  # same when again
    trained = sorted(tag for step in range(1, STEPS + 1) for tag in next(iter(by_step[step])))
    assert trained == list(TAGS)  # every group once, none twice, none lost
    assert trained_steps(save)[-STEPS + 2 :] == list(range(3, STEPS + 1))
