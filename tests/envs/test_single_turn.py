"""`SingleTurnEnv`: the documented 40-line task runs, and each hook does what it says.

The task is the one in docs/environments.md ("A single-turn task in 40 lines"), read
from the page, so the page cannot drift from the code. Training samples come from a
scripted vLLM look-alike (exact replies, real token ids, real truncation at
`max_tokens`); evaluation answers come from a scripted chat server.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from atroposlib.envs.base import APIServerConfig
from atroposlib.envs.single_turn import Sample, SingleTurnConfig, SingleTurnEnv
from tests.support.policy_server import PolicyChatServer
from tests.support.scripted_model import ScriptedModel, last_turn
from tests.support.source import SINGLE_TURN_SECTION, documented_block

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Peru": "Lima", "Chile": "Santiago"}
MAX_TOKENS = 12  # the tiny tokenizer spends about a token per character


def documented_task() -> str:
    return documented_block("environments.md", SINGLE_TURN_SECTION, "python")


@pytest.fixture
def capitals(tmp_path: Path) -> Any:
    """The documented module, imported from a file as `python capitals.py` would."""
    path = tmp_path / "capitals.py"
    path.write_text(documented_task())
    spec = importlib.util.spec_from_file_location("capitals", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def country(prompt: str) -> str:
    return next(name for name in CAPITALS if name in last_turn(prompt))


def answers(name: str) -> list[str]:
    """Right; right with a full stop; wrong; right so far but cut off at max_tokens."""
    capital = CAPITALS[name]
    return [capital, capital + ".", "Lyon", capital + " " * 40]


def replies(prompt: str, n: int) -> list[str]:
    return answers(country(prompt))[:n]


@pytest.fixture
def scripted(tiny_model_path: Path):
    with ScriptedModel(replies, tiny_model_path) as server:
        yield server


def make_env(
    env_cls: type, tiny_model_path: Path, url: str, server_type: str = "vllm", **config: Any
) -> Any:
    settings = {"tokenizer_name": str(tiny_model_path), "group_size": 4, "use_wandb": False}
    server = APIServerConfig(
        model_name="tiny", base_url=url, server_type=server_type, api_key="x", timeout=60
    )
    env_config = SingleTurnConfig(**{**settings, "max_tokens": MAX_TOKENS, **config})
    env = env_cls(env_config, server)
    asyncio.run(env.setup())
    return env


def test_the_documented_task_is_about_forty_lines(capitals):
    assert len(documented_task().strip().splitlines()) <= 42
    config, servers = capitals.CapitalsEnv.config_init()
    assert config.tokenizer_name == servers[0].model_name == "Qwen/Qwen2.5-1.5B-Instruct"
    assert config.group_size == 8 and servers[0].base_url == "http://localhost:9001/v1"


def test_training_groups_are_scored_per_sample_and_walk_the_items(
    capitals, scripted, tiny_model_path
):
    env = make_env(capitals.CapitalsEnv, tiny_model_path, scripted.url)
    assert sorted(i["country"] for i in env.train_items) == ["France", "Japan"]
    seen = []
    for _ in range(3):  # one more than there are items: the walk wraps around
        item = asyncio.run(env.get_next_item())
        group, backlog = asyncio.run(env.collect_trajectories(item))
        seen.append(item["country"])
        assert backlog == []
        # the cut-off answer reads as the capital, but score_sample sees it was truncated
        assert group["scores"] == [1.0, 1.0, 0.0, 0.0]
        assert "overrides" not in group  # zero_truncated_advantage is off by default
        sent = [conversation[-1]["content"] for conversation in group["messages"]]
        assert sent[:3] == answers(item["country"])[:3]
        assert sent[3].strip() == item["capital"]
        for tokens, masks, logprobs in zip(
            group["tokens"], group["masks"], group["inference_logprobs"], strict=True
        ):
            assert len(tokens) == len(masks) == len(logprobs)
    assert seen[2] == seen[0] != seen[1] and env.position == 3
    assert env.train_metrics(env.train_scores) == {"train/percent_correct": 0.5}
    assert all(request["max_tokens"] == MAX_TOKENS for request in scripted.requests)


def test_the_position_survives_a_restart_through_the_env_checkpoint(
    capitals, scripted, tiny_model_path, tmp_path
):
    env = make_env(capitals.CapitalsEnv, tiny_model_path, scripted.url)
    env.checkpoint_dir, env.wandb_prepend, env.curr_step = str(tmp_path / "ckpt"), "capitals", 5
    served = [asyncio.run(env.get_next_item())["country"] for _ in range(1)]
    env.save_checkpoint(5)
    saved = tmp_path / "ckpt" / "env_checkpoints" / "capitals" / "step-5.json"
    assert json.loads(saved.read_text()) == {"position": 1}
    resumed = make_env(capitals.CapitalsEnv, tiny_model_path, scripted.url)
    resumed.checkpoint_dir, resumed.wandb_prepend = env.checkpoint_dir, "capitals"
    resumed.curr_step = 5
    resumed.load_checkpoint()
    assert resumed.position == 1
    remaining = {i["country"] for i in env.train_items} - set(served)
    assert asyncio.run(resumed.get_next_item())["country"] in remaining


def test_evaluate_answers_greedily_and_writes_metrics_and_samples(
    capitals, tiny_model_path, tmp_path
):
    def answer(messages: list[dict], n: int) -> list[str]:
        asked = messages[-1]["content"]
        return ["Lima" if "Peru" in asked else "Valparaiso"] * n

    with PolicyChatServer(answer) as chat:
        env = make_env(
            capitals.CapitalsEnv,
            tiny_model_path,
            chat.url,
            server_type="openai",
            data_dir_to_save_evals=str(tmp_path / "eval"),
        )
        asyncio.run(env.evaluate())
        requests = list(chat.requests)
    results = json.loads((tmp_path / "eval" / "metrics.json").read_text())["results"]["all"]
    assert results["eval/accuracy"] == results["eval/mean_score"] == 0.5
    samples = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").open()]
    assert [(s["response"], s["score"]) for s in samples] == [("Lima", 1.0), ("Valparaiso", 0.0)]
    assert len(requests) == 2 and all(r["temperature"] == 0.0 for r in requests)


def test_the_hooks_see_finish_reasons_and_tokens_and_shape_the_group(
    capitals, scripted, tiny_model_path
):
    class Hooked(capitals.CapitalsEnv):
        seen: list[Sample] = []

        def score_sample(self, sample: Sample, item: dict) -> float:
            self.seen.append(sample)
            return super().score_sample(sample, item)

        def sampling_for(self, item: dict, split: str) -> dict[str, Any]:
            return {"top_p": 0.5} if split == "train" else {}

        def zero_truncated_advantage(self) -> bool:
            return True

        def finish_group(self, group: dict, samples: list[Sample]) -> dict:
            group["scores"] = [s - 0.5 for s in group["scores"]]
            return group

        def train_metrics(self, groups: list[list[float]]) -> dict[str, float]:
            return {"train/groups": float(len(groups))}

    env = make_env(Hooked, tiny_model_path, scripted.url)
    group, _ = asyncio.run(env.collect_trajectories(env.train_items[0]))
    assert group["scores"] == [0.5, 0.5, -0.5, -0.5]  # finish_group after the raw scores
    assert env.train_scores == [[1.0, 1.0, 0.0, 0.0]]  # metrics see the raw scores
    assert env.train_metrics(env.train_scores) == {"train/groups": 1.0}
    assert group["overrides"] == [{}, {}, {}, {"set_advantage_to_zero": True}]
    assert [s.finish_reason for s in env.seen] == ["stop", "stop", "stop", "length"]
    assert scripted.requests[-1]["top_p"] == 0.5
    texts = answers(env.train_items[0]["country"])
    for sample, tokens, text in zip(env.seen, group["tokens"], texts, strict=True):
        assert tokens[-len(sample.tokens) :] == list(sample.tokens)  # the completion's ids
        ids = env.tokenizer.encode(text, add_special_tokens=False)
        assert list(sample.tokens[: len(ids)]) == ids[:MAX_TOKENS]
    assert len(env.seen[3].tokens) == MAX_TOKENS and env.seen[3].truncated


def test_config_defaults_set_the_config_and_the_server_it_samples_from():
    from environments.mod_arithmetic import ModArithmeticEnv
    from environments.tool_calling_server import ToolCallingEnv

    config, (server,) = ToolCallingEnv.config_init()
    assert (
        config.tokenizer_name
        == server.model_name
        == ToolCallingEnv.config_defaults["tokenizer_name"]
    )
    assert server.base_url == "http://localhost:9004/v1" and server.num_requests_for_eval == 256
    assert server.server_type == "vllm" and config.group_size == 16
    bare, baseline = SingleTurnEnvWithoutDefaults.config_init()
    assert type(bare) is SingleTurnConfig and type(baseline).__name__ == "ServerBaseline"
    assert ModArithmeticEnv.config_defaults == {}  # it overrides config_init, as upstream's do


class SingleTurnEnvWithoutDefaults(SingleTurnEnv):
    env_config_cls = SingleTurnConfig

    def messages_for(self, item: dict) -> list[dict]:
        return []

    def score(self, completion: str, item: dict) -> float:
        return 0.0


def test_a_configured_reward_scores_instead_and_the_saved_group_keeps_its_item(
    capitals, scripted, tiny_model_path, tmp_path
):
    """`reward:` (TRL's signature: completions, prompts, the item's fields as columns)
    replaces `score`; the rollouts file keeps the item, which the API is not sent."""
    from pydantic import ValidationError

    rewards = tmp_path / "rewards.py"
    rewards.write_text(
        "def starts_with_l(completions, prompts, country, capital, **_):\n"
        "    assert country[0] in prompts[0][-1]['content'] and capital[0]\n"
        "    return [1.0 if completions[0].startswith('L') else 0.0]\n"
    )
    saved = tmp_path / "groups.jsonl"
    env = make_env(
        capitals.CapitalsEnv,
        tiny_model_path,
        scripted.url,
        reward=f"{rewards}:starts_with_l",
        data_path_to_save_groups=str(saved),
    )
    item = asyncio.run(env.get_next_item())
    group, _ = asyncio.run(env.collect_trajectories(item))
    assert group["scores"] == [0.0, 0.0, 1.0, 0.0]  # "Lyon" alone starts with an L
    asyncio.run(env.handle_send_to_api(group, item, do_send_to_api=False))
    line = json.loads(saved.read_text())
    assert line["item"] == item and line["scores"] == group["scores"] and "item" not in group
    with pytest.raises(ValidationError, match="'no_such' is not registered"):
        SingleTurnConfig(reward="no_such")  # refused with the config, before a start
