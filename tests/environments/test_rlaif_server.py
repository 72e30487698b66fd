"""RLAIF: the policy's group is scored by a judge model behind its own `--judge.*` flags
(its `process` and `evaluate` are rows of the env table: tests/environments/test_env_table.py)."""

from __future__ import annotations

import asyncio
import re
import sys
import types

import pytest

from atroposlib.envs.base import APIServerConfig
from environments.rlaif_server import RLAIFEnv, item_from_row
from tests.support.compat_runs import run_env
from tests.support.env_table import EvaluateRow, ProcessRow, Run, chat, scripted
from tests.support.judges import prefer_good
from tests.support.library_envs import LIBRARY
from tests.support.policy_server import PolicyChatServer, policy_fixture
from tests.support.scripted_model import scripted_model_fixture

REPLIES = ["GOOD: a clear answer.", "bad", "GOOD: another clear answer.", "meh"]
replies_model = scripted_model_fixture(lambda prompt, n: REPLIES[:n])
judge = policy_fixture(prefer_good)


def judge_flags(url: str) -> list[str]:
    return [
        *("--judge.base_url", url, "--judge.model_name", "judge"),
        *("--judge.server_type", "openai", "--judge.api_key", "x"),
    ]


def check_process(groups: list[dict], run: Run) -> None:
    shown = [r["messages"][-1]["content"] for r in run.servers["judge"].requests]
    assert len(shown) == 16  # 2 groups x a ring of 4 pairs x both orders
    prompts = {g["messages"][0][1]["content"] for g in groups}
    assert all(any(p in s for p in prompts) for s in shown)  # the judge sees the prompt
    firsts = [re.search(r"\[Reply A\]\n(.*?)\n", s).group(1) for s in shown]
    assert sorted(set(firsts)) == sorted(REPLIES)


def check_evaluate(results: dict, samples: list[dict], run: Run) -> None:
    assert all(s["response"] == "GOOD reply" for s in samples)
    assert results["eval/mean_score"] == pytest.approx(8 / 9)


# The questions every env is asked (tests/environments/test_env_table.py): `process`
# scores the group by pairwise wins; `evaluate` reports the judge's mean rating.
JUDGE = {"judge": chat(prefer_good, model_name="judge")}
PROCESS = ProcessRow(
    env=RLAIFEnv,
    model=scripted(lambda prompt, n: REPLIES[:n]),
    group_size=4,
    steps=2,
    scores=lambda group: [1.0, 0.0, 1.0, 0.0],
    args=lambda run: [
        *run.servers["judge"].flags("judge"),
        *("--env.max_tokens", "32", "--env.max_token_length", "512"),
    ],
    check=check_process,
    servers=JUDGE,
)
EVALUATE = EvaluateRow(
    env=RLAIFEnv,
    model=chat(lambda messages, n: ["GOOD reply"] * n),
    samples=8,
    args=lambda run: run.servers["judge"].flags("judge"),
    check=check_evaluate,
    servers=JUDGE,
)


def test_a_dead_judge_drops_groups_and_process_says_so(replies_model, tiny_model_path, tmp_path):
    dead = PolicyChatServer(prefer_good)
    dead.close()
    done = run_env(
        str(LIBRARY / "rlaif_server.py"),
        "process",
        tmp_path,
        *("--env.tokenizer_name", str(tiny_model_path), "--env.use_wandb", "false"),
        *("--env.group_size", "2", "--env.total_steps", "1", "--env.max_tokens", "8"),
        *("--env.judge_unavailable_s", "0.5", "--env.max_token_length", "512"),
        *("--env.data_path_to_save_groups", str(tmp_path / "out.jsonl")),
        *replies_model.flags(),
        *judge_flags(dead.url),
    )
    assert done.returncode == 1
    assert "group dropped: the judge did not answer" in done.stderr
    assert "no rollout was kept" in done.stderr


def test_no_judge_is_a_clear_error(replies_model, tiny_model_path, tmp_path):
    done = run_env(
        str(LIBRARY / "rlaif_server.py"),
        "process",
        tmp_path,
        *("--env.tokenizer_name", str(tiny_model_path), "--env.use_wandb", "false"),
        *replies_model.flags(),
    )
    assert done.returncode != 0 and "no judge: pass --judge.base_url" in done.stderr


def test_the_hub_path_reads_wildchats_first_user_turns(monkeypatch, judge, tiny_model_path):
    calls = []
    rows = [
        {"conversation_hash": "h1", "conversation": [{"role": "user", "content": "Hi there"}]},
        {"conversation_hash": "h2", "conversation": [{"role": "assistant", "content": "only"}]},
    ]

    def load_dataset(name, subset=None, split=None):
        calls.append((name, subset, split))
        return rows

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    config, servers = RLAIFEnv.config_init()
    update = {"data_source": "hub", "tokenizer_name": str(tiny_model_path)}
    judge_config = APIServerConfig(base_url=judge.url, model_name="judge", server_type="openai")
    env = RLAIFEnv(config.model_copy(update=update), servers, judge_config, testing=True)
    asyncio.run(env.setup())
    assert calls == [("allenai/WildChat", None, "train"), ("allenai/WildChat", None, "test")]
    assert env.eval_items == [{"prompt": "Hi there", "id": "h1"}]
    assert item_from_row({"conversation": []}) is None
