"""Environments as microservices: real run-api, CPU inference server and env processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.api.helpers import start_trainer

pytest.importorskip("torch")

ENV_SCRIPT = Path(__file__).parent / "arith_env.py"


class EnvProcess:
    def __init__(self, tmp_path: Path, command: str, *args: str) -> None:
        self.log_path = tmp_path / f"env-{command}-{time.monotonic_ns()}.log"
        env = {**os.environ, "ATROPOS_ENV_STATE_DIR": str(tmp_path / "env-state")}
        self.proc = subprocess.Popen(
            [sys.executable, str(ENV_SCRIPT), command, *args],
            stdout=open(self.log_path, "wb"),
            stderr=subprocess.STDOUT,
            env=env,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def serve_args(api_url: str, inference_url: str, *extra: str) -> list[str]:
    return [
        "--env.rollout_server_url",
        api_url,
        "--openai.base_url",
        f"{inference_url}/v1",
        "--env.ensure_scores_are_not_same",
        "false",
        *extra,
    ]


def serving(client: httpx.Client, api, inference_server, tmp_path: Path, *extra: str) -> EnvProcess:
    """Register a trainer (batches of 4) and start the arith env serving for it."""
    start_trainer(client, batch_size=4, max_token_len=128)
    return EnvProcess(tmp_path, "serve", *serve_args(api.url, inference_server.url, *extra))


def pull(client: httpx.Client, batches: int, timeout: float = 120) -> list[dict]:
    groups: list[dict] = []
    deadline = time.monotonic() + timeout
    taken = 0
    while taken < batches and time.monotonic() < deadline:
        batch = client.get("/batch").json()["batch"]
        if batch:
            groups.extend(batch)
            taken += 1
        else:
            time.sleep(0.2)
    assert taken == batches, "batches did not arrive in time"
    return groups


def check_group(group: dict, group_size: int) -> None:
    assert len(group["tokens"]) == len(group["masks"]) == len(group["scores"]) == group_size
    assert group["env_id"] == 0
    for tokens, masks, logprobs in zip(
        group["tokens"], group["masks"], group["inference_logprobs"], strict=True
    ):
        assert len(tokens) == len(masks) == len(logprobs)
        prompt = [i for i, m in enumerate(masks) if m == -100]
        completion = [i for i, m in enumerate(masks) if m != -100]
        assert prompt == list(range(len(prompt))) and completion, "prompt first, then completion"
        assert all(logprobs[i] == 1.0 for i in prompt)
        assert all(masks[i] == tokens[i] and logprobs[i] <= 0 for i in completion)


def test_serve_delivers_well_formed_groups(api_factory, inference_server, tmp_path):
    api = api_factory()
    with httpx.Client(base_url=api.url, timeout=30) as client:
        start_trainer(client, batch_size=8, max_token_len=128)
        env = EnvProcess(tmp_path, "serve", *serve_args(api.url, inference_server.url))
        try:
            groups = pull(client, 2)
        finally:
            code = env.stop()
    assert len(groups) == 4
    for group in groups:
        check_group(group, 4)
    assert code == 0, env.log()
    assert "Traceback" not in env.log()
    envs = httpx.get(f"{api.url}/status-env", params={"env_id": 0}).json()
    assert envs["env_weight"] == 0.01, "the env disconnected on shutdown"


def test_user_exceptions_are_logged_counted_and_survived(api_factory, inference_server, tmp_path):
    api = api_factory()
    with httpx.Client(base_url=api.url, timeout=30) as client:
        env = serving(client, api, inference_server, tmp_path, "--env.fail_first_items", "2")
        try:
            groups = pull(client, 2)
        finally:
            env.stop()
    assert len(groups) == 2
    log = env.log()
    assert "rollout of item" in log and "deliberate failure on item 1" in log
    assert "deliberate failure on item 2" in log and "Traceback" in log


def test_off_policy_bound_stops_generation(api_factory, inference_server, tmp_path):
    api = api_factory()
    with httpx.Client(base_url=api.url, timeout=30) as client:
        env = serving(
            client,
            api,
            inference_server,
            tmp_path,
            "--env.group_size",
            "2",
            "--env.max_batches_offpolicy",
            "1",
        )
        try:
            deadline = time.monotonic() + 60
            while client.get("/status").json()["queue_size"] < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(4)  # workers that could over-generate have had time to
            first = client.get("/status").json()["queue_size"]
            time.sleep(3)
            second = client.get("/status").json()["queue_size"]
        finally:
            env.stop()
    assert first == second == 2, (first, second)


def test_process_writes_jsonl_and_html(inference_server, tmp_path):
    out = tmp_path / "groups.jsonl"
    env = EnvProcess(
        tmp_path,
        "process",
        "--openai.base_url",
        f"{inference_server.url}/v1",
        "--env.total_steps",
        "3",
        "--env.group_size",
        "2",
        "--env.data_path_to_save_groups",
        str(out),
    )
    assert env.proc.wait(180) == 0, env.log()
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 3 and all(len(g["tokens"]) == 2 for g in groups)
    page = (tmp_path / "groups.html").read_text()
    for group in groups:
        for conversation in group["messages"]:
            assert conversation[-1]["content"].replace("<", "&lt;") in page
    assert "wrote 3 groups" in env.log()


@pytest.mark.slow
def test_api_outage_loses_and_duplicates_nothing(api_factory, inference_server, tmp_path):
    api = api_factory()
    saved = tmp_path / "produced.jsonl"
    received: list[dict] = []
    stop_pulling = threading.Event()

    def trainer() -> None:
        with httpx.Client(base_url=api.url, timeout=5) as client:
            while not stop_pulling.is_set():
                try:
                    batch = client.get("/batch").json()["batch"]
                except httpx.HTTPError:
                    batch = None
                if batch:
                    received.extend(batch)
                else:
                    time.sleep(0.2)

    with httpx.Client(base_url=api.url, timeout=30) as client:
        start_trainer(client, batch_size=4, max_token_len=128)
    env = EnvProcess(
        tmp_path,
        "serve",
        *serve_args(api.url, inference_server.url, "--env.data_path_to_save_groups", str(saved)),
    )
    puller = threading.Thread(target=trainer)
    puller.start()
    try:
        while len(received) < 2:
            time.sleep(0.2)
        api.stop()
        time.sleep(20)
        api.start()
        before = len(received)
        deadline = time.monotonic() + 90
        while len(received) < before + 3 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        env.stop()
        time.sleep(1)
        stop_pulling.set()
        puller.join()
    with httpx.Client(base_url=api.url, timeout=30) as client:
        while (batch := client.get("/batch").json()["batch"]) is not None:
            received.extend(batch)
    produced = [json.loads(line) for line in saved.read_text().splitlines()]
    key = lambda g: json.dumps(g["tokens"])  # noqa: E731
    assert Counter(map(key, received)) == Counter(map(key, produced))
    assert len(produced) >= 5


@pytest.mark.parametrize("handling", ["STOP_TRAIN", "LIMIT_TRAIN", "NONE"])
def test_evaluations_run_every_steps_per_eval(api_factory, inference_server, tmp_path, handling):
    api = api_factory()
    evals = tmp_path / "evals"
    with httpx.Client(base_url=api.url, timeout=30) as client:
        env = serving(
            client,
            api,
            inference_server,
            tmp_path,
            "--env.steps_per_eval",
            "2",
            "--env.eval_handling",
            handling,
            "--env.data_dir_to_save_evals",
            str(evals),
        )
        try:
            pull(client, 3)
            deadline = time.monotonic() + 60
            while not (evals / "metrics.json").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            env.stop()
    metrics = json.loads((evals / "metrics.json").read_text())
    assert "eval/accuracy" in metrics["metrics"] and metrics["step"] >= 2


def test_evaluate_subcommand(inference_server, tmp_path):
    evals = tmp_path / "evals"
    env = EnvProcess(
        tmp_path,
        "evaluate",
        "--openai.base_url",
        f"{inference_server.url}/v1",
        "--env.data_dir_to_save_evals",
        str(evals),
    )
    assert env.proc.wait(120) == 0, env.log()
    assert json.loads((evals / "metrics.json").read_text())["metrics"]["eval/accuracy"] >= 0
    assert (evals / "samples.jsonl").exists()


def test_checkpoints_at_the_trainer_interval_and_stop_at_total_steps(
    api_factory, inference_server, tmp_path
):
    api = api_factory()
    checkpoints = tmp_path / "ckpt"
    with httpx.Client(base_url=api.url, timeout=30) as client:
        start_trainer(
            client,
            batch_size=4,
            max_token_len=128,
            checkpoint_dir=str(checkpoints),
            save_checkpoint_interval=1,
        )
        env = EnvProcess(
            tmp_path,
            "serve",
            *serve_args(
                api.url,
                inference_server.url,
                "--env.total_steps",
                "6",
                "--env.max_batches_offpolicy",
                "1",
            ),
        )
        try:
            pull(client, 5)
            assert env.proc.wait(60) == 0, env.log()
        finally:
            env.stop()
    saved = sorted(p.name for p in (checkpoints / "env_checkpoints" / "arith_0").iterdir())
    assert saved and all(name.startswith("step-") for name in saved)
    assert "reached total_steps 6" in env.log()


def test_stuck_workers_time_out(api_factory, inference_server, tmp_path):
    api = api_factory()
    with httpx.Client(base_url=api.url, timeout=30) as client:
        env = serving(client, api, inference_server, tmp_path, "--env.worker_timeout", "0.001")
        try:
            deadline = time.monotonic() + 60
            while "timed out" not in env.log() and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            assert env.stop() == 0
        assert client.get("/status").json()["queue_size"] == 0
    assert "timed out after 0.001s" in env.log()


def test_interrupted_items_go_to_the_backlog_and_come_back(api_factory, inference_server, tmp_path):
    api = api_factory()
    with httpx.Client(base_url=api.url, timeout=30) as client:
        start_trainer(client, batch_size=4, max_token_len=128)
        slow = serve_args(api.url, inference_server.url, "--env.rollout_delay_s", "30")
        first = EnvProcess(tmp_path, "serve", *slow)
        deadline = time.monotonic() + 60
        while "registered as" not in first.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.5)  # workers are now sleeping inside their rollouts
        assert first.stop() == 0, first.log()
        backlog = tmp_path / "env-state" / "arith" / "backlog.json"
        saved = json.loads(backlog.read_text())
        assert saved and all({"a", "b", "n"} <= set(item) for item in saved)
        second = EnvProcess(tmp_path, "serve", *serve_args(api.url, inference_server.url))
        try:
            groups = pull(client, 1)
        finally:
            second.stop()
    assert f"restored {len(saved)} backlog items" in second.log()
    assert not backlog.exists() or json.loads(backlog.read_text()) != saved
    assert groups
