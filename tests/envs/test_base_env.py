"""BaseEnv helpers in-process: sending rules, checkpoints, evaluate_log (canned inference)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

pytest.importorskip("transformers")

from atroposlib.envs.api_client import TrajectoryClient
from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ServerBaseline
from tests.support.arith_env import ArithEnv
from tests.support.groups import RecordingClient, register_env, start_trainer
from tests.support.served import give_client


@pytest.fixture
def env(tiny_model_path, tmp_path):
    config = BaseEnvConfig(tokenizer_name=str(tiny_model_path), group_size=2, use_wandb=False)
    environment = ArithEnv(config, ServerBaseline(), testing=True)
    give_client(environment, RecordingClient())
    environment.env_id = 3
    environment.max_token_len = 10
    return environment


def group(scores=(1.0, 0.0), length=4, size=2) -> dict:
    tokens = [[5] * length for _ in range(size)]
    return {
        "tokens": tokens,
        "masks": [[-100] + t[1:] for t in tokens],
        "scores": list(scores)[:size],
    }


def send(env, payload, **kwargs):
    asyncio.run(env.handle_send_to_api(payload, **kwargs))


def test_sending_rules(env, tmp_path):
    send(env, None)
    send(env, group(size=1, scores=(1.0,)))
    send(env, group(scores=(0.5, 0.5)))
    send(env, group(length=11))
    assert env.client.sent == []
    assert env.stats["dropped_none"] == 1 and env.stats["dropped_wrong_size"] == 1
    assert env.stats["dropped_same_scores"] == 1 and env.stats["dropped_too_long"] == 1
    send(env, group(length=11), abort_on_any_max_length_exceeded=False)
    overridden = group(size=3, scores=(1.0, 0.0, 1.0))
    overridden["group_overrides"] = {"group_size": 3}
    send(env, overridden)
    assert [len(batch[0]["tokens"]) for batch in env.client.sent] == [2, 3]
    send(env, group(length=10))  # exactly the limit fits, as the API and trainer agree
    assert len(env.client.sent[-1][0]["tokens"][0]) == 10
    assert all(batch[0]["env_id"] == 3 for batch in env.client.sent)
    send(env, [group(), group()])
    assert len(env.client.sent[-1]) == 2, "several groups go out in one list post"


def test_every_scored_group_is_recorded_with_its_step_and_why_it_was_dropped(env, tmp_path):
    """What the run report judges a run on: the trainer sees only the kept groups."""
    env.config.data_path_to_save_scores = str(tmp_path / "scores" / "env.jsonl")
    env.curr_step = 4
    send(env, None)  # no scores: nothing to judge
    send(env, [group(scores=(0.5, 0.5)), group(scores=(1.0, 0.0)), group(length=11)])
    recorded = [
        json.loads(line) for line in (tmp_path / "scores" / "env.jsonl").read_text().splitlines()
    ]
    assert recorded == [
        {"step": 4, "scores": [0.5, 0.5], "dropped": "same_scores"},
        {"step": 4, "scores": [1.0, 0.0], "dropped": None},
        {"step": 4, "scores": [1.0, 0.0], "dropped": "too_long"},
    ]
    assert len(env.client.sent[-1]) == 1


def test_same_scores_allowed_when_configured_and_messages_and_jsonl(env, tmp_path):
    env.config.ensure_scores_are_not_same = False
    env.config.include_messages = True
    env.config.data_path_to_save_groups = str(tmp_path / "out" / "groups.jsonl")
    send(env, group(scores=(1.0, 1.0)))
    sent = env.client.sent[0][0]
    assert sent["messages"] == [[{"role": "user", "content": env.tokenizer.decode([5] * 4)}]] * 2
    saved = [
        json.loads(line) for line in (tmp_path / "out" / "groups.jsonl").read_text().splitlines()
    ]
    assert saved == [sent]
    send(env, group(), do_send_to_api=False)
    assert (
        len(env.client.sent) == 1
        and len((tmp_path / "out" / "groups.jsonl").read_text().splitlines()) == 2
    )


def test_group_without_messages_is_accepted_by_the_api(env, api, wire_client, tmp_path):
    """include_messages on an env that sets none: the filled-in messages pass the API's model."""
    start_trainer(wire_client, batch_size=2, max_token_len=64)
    env.env_id = register_env(wire_client, group_size=2)["env_id"]
    env.config.include_messages = True
    env.max_token_len = 64

    async def deliver() -> dict:
        give_client(env, TrajectoryClient(api.url, tmp_path / "spool"))
        await env.handle_send_to_api(group())
        await env.client.close()
        return dict(env.client.counters)

    counters = asyncio.run(deliver())
    assert counters == {"groups_delivered": 1}, counters
    batch = wire_client.get("/batch").json()["batch"]
    text = env.tokenizer.decode([5] * 4)
    assert batch[0]["messages"] == [[{"role": "user", "content": text}]] * 2


def test_checkpoints_round_trip_at_the_current_step(env, tmp_path, caplog):
    """Upstream's rule: the checkpoint of the current step, not the newest; None saves nothing."""
    env.checkpoint_dir = str(tmp_path / "ckpt")
    env.wandb_prepend = "arith_0"
    env.save_checkpoint(5, {"iter": 5, "seen": [1, 2]})
    env.save_checkpoint(10, {"iter": 10, "seen": [1, 2, 3]})
    env.save_checkpoint(15)  # no data: nothing to write
    folder = tmp_path / "ckpt" / "env_checkpoints" / "arith_0"
    assert sorted(p.name for p in folder.iterdir()) == ["step-10.json", "step-5.json"]
    env.curr_step = 5
    caplog.clear()  # the saves above are logged too, when this process logs at INFO already
    with caplog.at_level(logging.INFO, logger="atroposlib.envs"):
        env.load_checkpoint()
    assert env.iter == 5 and env.seen == [1, 2]
    restored = [r for r in caplog.records if str(folder / "step-5.json") in r.getMessage()]
    assert restored and restored[0].levelno >= logging.INFO, "the restore is not logged"
    assert "iter" in restored[0].getMessage() and "seen" in restored[0].getMessage()
    env.curr_step = 7  # no checkpoint of this step: nothing changes
    env.load_checkpoint()
    assert env.iter == 5


def test_evaluate_log_is_awaitable_and_writes_upstreams_shape(env, tmp_path):
    env.config.data_dir_to_save_evals = str(tmp_path / "evals")
    asyncio.run(
        env.evaluate_log(
            {"eval/accuracy": 0.5},
            start_time=100.0,
            end_time=102.5,
            samples=[{"q": 1}, {"q": 2}],
            generation_parameters={"temperature": 0},
        )
    )
    metrics = json.loads((tmp_path / "evals" / "metrics.json").read_text())
    task = f"{env.name or type(env).__name__}_eval"
    assert metrics["results"] == {
        f"atropos|{task}|0": {"eval/accuracy": 0.5},
        "all": {"eval/accuracy": 0.5},
    }
    general = metrics["config_general"]
    assert general["model_name"] == env.server.servers[0].config.model_name
    assert float(general["total_evaluation_time_seconds"]) == 2.5
    assert general["generation_parameters"] == {
        "max_new_tokens": env.config.max_token_length,
        "temperature": 0,
    }
    samples = (tmp_path / "evals" / "samples.jsonl").read_text().splitlines()
    assert [json.loads(s) for s in samples] == [{"q": 1}, {"q": 2}]


def test_evaluate_log_without_a_directory_writes_nothing(env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env.config.data_dir_to_save_evals = None
    asyncio.run(env.evaluate_log({"eval/accuracy": 0.5}))
    assert list(tmp_path.iterdir()) == []


def test_default_collect_trajectories_stacks_items(env):
    async def one(item):
        return {"tokens": [1, 2], "masks": [-100, 2], "scores": 1.0 if item else 0.0}, ["extra"]

    env.collect_trajectory = one
    grouped, backlog = asyncio.run(BaseEnv.collect_trajectories(env, True))
    assert grouped == {
        "tokens": [[1, 2], [1, 2]],
        "masks": [[-100, 2], [-100, 2]],
        "scores": [1.0, 1.0],
    }
    assert backlog == ["extra", "extra"]


def test_wandb_is_untouched_when_disabled(env, monkeypatch, caplog):
    """Whatever imported wandb before (another test may have), this path must not touch it."""
    import logging
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # any `import wandb` now raises
    with (
        caplog.at_level(logging.INFO, logger="atroposlib.envs"),
        caplog.at_level(logging.DEBUG, logger="atroposlib.envs.metrics"),
    ):
        asyncio.run(env.wandb_log({"x": 1.0}))
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("atroposlib.envs")]
    assert "step 0: 0 failed" in logged, logged  # no rate before 10 s of sends
    assert any(m.startswith('step 0 metrics: {"x": 1.0') for m in logged), logged
    assert not any("wandb" in m for m in logged), "an import of wandb was attempted"
    assert getattr(env, "_wandb_run", None) is None


def test_an_env_the_api_forgot_registers_again(env, api, wire_client, tmp_path, caplog):
    """/status-env answering 404 (the API lost its state) is a new registration, not a stop."""
    start_trainer(wire_client, batch_size=2, max_token_len=64)

    async def poll_after_a_reset() -> tuple[int, int, dict]:
        give_client(env, TrajectoryClient(api.url, tmp_path / "spool"))
        await env.register_env()
        first = env.env_id
        assert wire_client.get("/reset_data").status_code == 200
        start_trainer(wire_client, batch_size=2, max_token_len=64)
        status = await env.get_status()
        await env.client.close()
        return first, env.env_id, status

    with caplog.at_level(logging.WARNING, logger="atroposlib.envs"):
        first, again, status = asyncio.run(poll_after_a_reset())
    assert (first, again) == (0, 0)
    assert status["current_step"] == 0 and "env_weight" in status
    assert "HTTP 404" in caplog.text and "registering again" in caplog.text
    assert "registered again as env_id 0" in caplog.text
    assert wire_client.get("/status-env", params={"env_id": 0}).status_code == 200
