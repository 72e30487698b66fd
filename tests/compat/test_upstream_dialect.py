"""Our env runtime and trainer client against a server speaking upstream's dialect.

The server is `tests/support/upstream_api.py`, a stand-in for upstream's run-api that
enforces its request shapes (env_id of /status-env only in a JSON body, its lax
models, its batch building). The env is a real `BaseEnv` in serve mode: its
`EnvRuntime` and `TrajectoryClient` register, poll /status-env, post groups (gzipped,
with Idempotency-Key headers upstream ignores) and disconnect; the trainer side is
`example_trainer.api`, asking `/batch?step=&committed=` as our trainer does.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import pytest

pytest.importorskip("transformers")

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ServerBaseline
from example_trainer.api import TrajectoryAPI
from example_trainer.config import TrainingConfig
from tests.support.upstream_api import UpstreamAPI
from tests.support.waiting import wait_until_async

GROUP_SIZE = 2
BATCH_SIZE = 4
LENGTH = 300  # long enough that a group's JSON passes 1 KB and goes gzipped


class CountingEnv(BaseEnv):
    """Groups without an LLM: item n gives two sequences starting with token n + 10."""

    name = "counting"

    async def setup(self) -> None:
        self.served = 0

    async def get_next_item(self) -> int:
        self.served += 1
        return self.served

    async def collect_trajectories(self, item: int) -> tuple[dict[str, Any], list]:
        tokens = [[item + 10] + [i + 1] * (LENGTH - 1) for i in range(GROUP_SIZE)]
        group = {
            "tokens": tokens,
            "masks": [[-100] + t[1:] for t in tokens],
            "scores": [1.0, 0.0],
        }
        return group, []

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        return None


def make_env(tiny_model_path, url: str, total_steps: int) -> CountingEnv:
    config = BaseEnvConfig(
        tokenizer_name=str(tiny_model_path),
        group_size=GROUP_SIZE,
        max_token_length=1024,
        rollout_server_url=url,
        total_steps=total_steps,
        use_wandb=False,
        steps_per_eval=-1,
        max_num_workers=2,
        wandb_name="counting",
    )
    return CountingEnv(config, ServerBaseline(), testing=True)


def trainer_config(tmp_path, url: str, steps: int) -> TrainingConfig:
    return TrainingConfig(
        model_name="unused",
        batch_size=BATCH_SIZE,
        seq_len=1024,
        training_steps=steps,
        save_path=str(tmp_path / "ckpt"),
        atropos_url=url,
    )


async def train(api: TrajectoryAPI, steps: int) -> list[list]:
    """What our trainer's loop does: ask each step's batch until it comes."""
    batches = []
    for step in range(1, steps + 1):
        batch = await wait_until_async(
            lambda step=step: api.batch(step=step, committed=step - 1),
            60,
            f"no batch for step {step}",
            poll_s=0.1,
        )
        batches.append(batch)
    return batches


@pytest.mark.parametrize("strict_query", [False, True], ids=["upstream", "refuses-queries"])
async def test_env_and_trainer_run_against_upstreams_api(
    tiny_model_path, tmp_path, monkeypatch, caplog, strict_query
):
    monkeypatch.setenv("ATROPOS_ENV_STATE_DIR", str(tmp_path / "env-state"))
    steps = 2
    with UpstreamAPI(strict_query=strict_query) as upstream:
        api = TrajectoryAPI(upstream.url)
        api.register(trainer_config(tmp_path, upstream.url, steps), starting_step=0)
        assert api.batch(step=1, committed=0) is None  # marks the trainer started
        env = make_env(tiny_model_path, upstream.url, total_steps=steps)
        with caplog.at_level(logging.WARNING):
            serving = asyncio.ensure_future(env.env_manager())
            batches = await train(api, steps)
            await asyncio.wait_for(serving, 60)  # the env sees step 2 and stops by itself

    assert env.env_id == 0 and env.config.batch_size == BATCH_SIZE  # from /register-env, /info
    for batch in batches:
        assert sum(len(group.tokens) for group in batch) == BATCH_SIZE
        for group in batch:
            assert group.env_id == 0 and group.scores == [1.0, 0.0]
            assert len(group.tokens[0]) == LENGTH and group.tokens[0][0] >= 11

    polls = upstream.seen("GET", "/status-env")
    answered = [r for r in polls if r.status == 200]
    assert answered, "the env polled /status-env"
    assert all(r.body == {"env_id": 0} for r in polls), "env_id travels in a JSON body"
    posts = upstream.seen("POST", "/scored_data") + upstream.seen("POST", "/scored_data_list")
    assert posts and all(r.status == 200 for r in posts)
    assert all(r.headers.get("idempotency-key") for r in posts), "sent, and ignored upstream"
    assert any(r.headers.get("content-encoding") == "gzip" for r in posts)
    assert [r.body for r in upstream.seen("POST", "/disconnect-env")] == [{"env_id": 0}]
    assert upstream.state.envs[0]["connected"] is False

    refused = [r for r in upstream.requests if r.status >= 400]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if strict_query:
        # each client met one refusal for its query parameters, then stopped sending them
        assert {(r.method, r.path) for r in refused} == {
            ("GET", "/status-env"),
            ("GET", "/batch"),
        }
        assert len(refused) == 2, [(r.path, r.query) for r in refused]
        assert any("/status-env?env_id=" in w and "JSON body only" in w for w in warnings)
        assert any("/batch?step=&committed=" in w and "plain /batch" in w for w in warnings)
        assert not api.leases
    else:
        assert refused == [], [(r.path, r.status) for r in refused]
        assert all(r.query["env_id"] == "0" for r in polls), "ignored upstream, kept for ours"
        # asked once to hold (after_step, Prefer: wait): upstream answered at once, so the
        # env polls instead from then on
        held = [r for r in polls if "after_step" in r.query]
        assert len(held) <= 1, [r.query for r in polls]
        assert all(r.headers.get("prefer", "").startswith("wait=") for r in held)
        leased = [r.query for r in upstream.seen("GET", "/batch")]
        assert {"step": "1", "committed": "0"} in leased and api.leases


@pytest.mark.integration
def test_status_env_without_a_json_body_is_refused_by_the_stand_in(tmp_path):
    """The stand-in is as strict as upstream: a query-only env_id could not pass."""
    with UpstreamAPI() as upstream, httpx.Client(base_url=upstream.url) as client:
        api = TrajectoryAPI(upstream.url)
        api.register(trainer_config(tmp_path, upstream.url, 1), starting_step=0)
        api.batch(step=1, committed=0)
        body = {"max_token_length": 64, "desired_name": "e", "weight": 1.0, "group_size": 2}
        assert client.post("/register-env", json=body).json()["env_id"] == 0
        assert client.get("/status-env", params={"env_id": 0}).status_code == 422
        answer = client.request("GET", "/status-env", json={"env_id": 0})
        assert answer.status_code == 200 and answer.json()["env_weight"] == 1.0


@pytest.mark.integration
def test_trainer_registers_again_when_the_api_lost_its_registration(tmp_path, caplog):
    """Upstream's server forgets the trainer on a restart (or /reset_data) and answers
    /batch with an error; the trainer registers again instead of stopping."""
    with UpstreamAPI() as upstream:
        api = TrajectoryAPI(upstream.url)
        api.register(trainer_config(tmp_path, upstream.url, 1), starting_step=0)
        assert api.batch(step=1, committed=0) is None
        httpx.get(f"{upstream.url}/reset_data")  # as an upstream API restart does
        assert httpx.get(f"{upstream.url}/info").json()["batch_size"] == -1
        with caplog.at_level(logging.WARNING, logger="example_trainer"):
            assert api.batch(step=1, committed=0) is None
        assert "Trainer not registered" in caplog.text
        assert "registering again at step 0" in caplog.text
        assert httpx.get(f"{upstream.url}/info").json()["batch_size"] == BATCH_SIZE
