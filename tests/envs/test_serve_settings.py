"""Upstream's special values of env settings, in real env processes.

`worker_timeout` -1 (no timeout), `total_steps` -1 (the trainer's num_steps), and a
`data_path_to_save_groups` that already exists (a new numbered file, never truncation).
A real run-api, the CPU inference server and the arith env as a subprocess; an env
process costs about 5 s of CPU, so the two -1 values are asked of one env, and the
numbered file is the one `process`'s JSONL and HTML are checked in.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.support.groups import start_trainer
from tests.support.processes import EnvProcess, serve_args

pytest.importorskip("torch")


def queued_groups(client: httpx.Client) -> int:
    return client.get("/status").json()["queue_size"]


def test_minus_one_means_no_worker_timeout_and_the_trainers_num_steps(
    api_factory, inference_server, tmp_path
):
    api = api_factory()
    with httpx.Client(base_url=api.url, timeout=30) as client:
        start_trainer(client, batch_size=4, max_token_len=128, num_steps=2)
        env = EnvProcess(
            tmp_path,
            "serve",
            *serve_args(
                api.url,
                inference_server.url,
                "--env.worker_timeout",
                "-1",
                "--env.total_steps",
                "-1",
                "--env.max_batches_offpolicy",
                "1",
            ),
        )
        batches = 0
        try:
            deadline = time.monotonic() + 180
            while env.proc.poll() is None and time.monotonic() < deadline:
                if "timed out" in env.log():  # -1 read as a timeout: rollouts abandoned at once
                    break
                if client.get("/batch").json()["batch"]:
                    batches += 1
                else:
                    time.sleep(0.2)
            code = env.proc.wait(1)
        finally:
            env.stop()
    assert "timed out" not in env.log(), env.log()
    assert code == 0, env.log()
    assert batches >= 2, f"the env stopped after {batches} batches:\n{env.log()}"
    assert "reached total_steps 2" in env.log()


def test_process_writes_jsonl_and_html_and_never_overwrites_an_earlier_output(
    inference_server, tmp_path
):
    """Upstream's rule: groups.jsonl exists, so groups_1.jsonl, then groups_2.jsonl."""
    out = tmp_path / "groups.jsonl"
    earlier = {out: '{"earlier": "run"}\n', tmp_path / "groups_1.jsonl": '{"second": "run"}\n'}
    for path, text in earlier.items():
        path.write_text(text)
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
    for path, text in earlier.items():
        assert path.read_text() == text, f"{path} was changed"
    chosen = tmp_path / "groups_2.jsonl"
    groups = [json.loads(line) for line in chosen.read_text().splitlines()]
    assert len(groups) == 3 and all(len(g["tokens"]) == 2 for g in groups)
    page = (tmp_path / "groups_2.html").read_text()
    for group in groups:
        for conversation in group["messages"]:
            assert conversation[-1]["content"].replace("<", "&lt;") in page
    assert "wrote 3 groups" in env.log()
    assert str(chosen) in env.log()


def test_process_that_keeps_nothing_exits_1_and_says_why(inference_server, tmp_path):
    """Every rollout fails (the server serves no such model): one clear line and exit 1."""
    env = EnvProcess(
        tmp_path,
        "process",
        *("--openai.base_url", f"{inference_server.url}/v1"),
        *("--openai.model_name", "no-such-model", "--env.total_steps", "1"),
        *("--env.data_path_to_save_groups", str(tmp_path / "groups.jsonl")),
    )
    assert env.proc.wait(180) == 1, env.log()
    assert "process: no rollout was kept out of 10 items (10 failed" in env.log()
    assert "Traceback" not in env.log().split("no rollout was kept")[-1]
