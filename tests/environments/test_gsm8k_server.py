"""The GSM8K env: its sample and grader, `process`/`serve`/`evaluate` end to end, the hub path."""

from __future__ import annotations

import asyncio
import json
import sys
import types
from pathlib import Path

import pytest

from atroposlib.envs.base import APIServerConfig
from atroposlib.envs.data_source import read_jsonl
from environments.gsm8k_server import (
    SAMPLE_DIR,
    GSM8KConfig,
    GSM8KEnv,
    gold_answer,
    item_from_row,
)
from tests.support.compat_runs import failure, run_env, serve_flags, serve_groups, tiny_flags
from tests.support.policy_server import PolicyChatServer
from tests.support.scripted_model import last_turn, scripted_model_fixture

SCRIPT = str(Path(__file__).resolve().parents[2] / "environments" / "gsm8k_server.py")
TRAIN = read_jsonl(SAMPLE_DIR / "train.jsonl")
TEST = read_jsonl(SAMPLE_DIR / "test.jsonl")
GOLD = {row["question"]: gold_answer(row["answer"]) for row in TRAIN + TEST}
MAX_TOKENS = 120  # the tiny tokenizer is about a token per character


def wrong(gold: str) -> str:
    return str(float(gold) + 1)


def replies(question: str) -> list[str]:
    """Right and well formed, right without <think>, right only while thinking, cut off."""
    gold = GOLD[question]
    return [
        f"<think>Work it out step by step.</think> So the answer is \\boxed{{{gold}}}.",
        f"The answer is \\boxed{{{gold}}}.",
        f"<think>Is it \\boxed{{{gold}}}? No.</think> \\boxed{{{wrong(gold)}}}",
        "<think>" + "and then " * 40 + f"</think> \\boxed{{{gold}}}",
    ]


EXPECTED = [1.0, 0.9, 0.0, -0.1]
scripted = scripted_model_fixture(lambda prompt, n: replies(last_turn(prompt))[:n])


def test_the_shipped_sample_is_gsm8k_shaped():
    assert len(TRAIN) >= 40 and len(TEST) >= 30
    assert not {r["question"] for r in TRAIN} & {r["question"] for r in TEST}
    for row in TRAIN + TEST:
        assert set(row) == {"question", "answer"}
        steps, final = row["answer"].rsplit("\n#### ", 1)
        assert "<<" in steps and float(final.replace(",", "")) == float(gold_answer(row["answer"]))
    assert sum(p.stat().st_size for p in SAMPLE_DIR.iterdir()) < 1 << 20


def test_rows_convert_and_gold_drops_thousands_separators():
    row = {"question": "How many?", "answer": "1000 * 12 = <<1000*12=12000>>12000\n#### 12,000"}
    assert item_from_row(row) == {**row, "gold": "12000"}
    assert gold_answer("#### -3.5") == "-3.5"


def assert_prompt_masked(group: dict, tokenizer) -> None:
    """Masks are -100 exactly on the rendered prompt, the completion's own ids after it."""
    for tokens, masks, messages in zip(
        group["tokens"], group["masks"], group["messages"], strict=True
    ):
        rendered = tokenizer.apply_chat_template(
            messages[:-1], add_generation_prompt=True, tokenize=False
        )
        prompt = tokenizer(rendered)["input_ids"]
        assert tokens[: len(prompt)] == prompt
        assert masks[: len(prompt)] == [-100] * len(prompt)
        assert masks[len(prompt) :] == tokens[len(prompt) :] and len(tokens) > len(prompt)


def test_process_scores_a_scripted_policy_exactly(scripted, tiny_model_path, tmp_path):
    out = tmp_path / "groups.jsonl"
    done = run_env(
        SCRIPT,
        "process",
        tmp_path,
        *("--env.tokenizer_name", str(tiny_model_path), "--env.max_tokens", str(MAX_TOKENS)),
        *("--env.group_size", "4", "--env.total_steps", "2", "--env.max_token_length", "2048"),
        *("--env.use_wandb", "false", "--env.data_path_to_save_groups", str(out)),
        *scripted.flags(),
    )
    assert done.returncode == 0, failure(done)
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 2 and out.with_suffix(".html").is_file()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path))
    for group in groups:
        question = group["messages"][0][1]["content"]
        assert question in GOLD and "<think>" in group["messages"][0][0]["content"]
        assert group["scores"] == pytest.approx(EXPECTED)
        assert group["overrides"] == [{}, {}, {}, {"set_advantage_to_zero": True}]
        assert [m[-1]["content"] for m in group["messages"]][:3] == replies(question)[:3]
        assert_prompt_masked(group, tokenizer)
    assert all(r["max_tokens"] == MAX_TOKENS for r in scripted.requests)


def test_process_on_the_tiny_model(inference_server, tiny_model_path, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"question": "What is 2 + 3?", "answer": "2+3=5\n#### 5"}) + "\n")
    out = tmp_path / "groups.jsonl"
    done = run_env(
        SCRIPT,
        "process",
        tmp_path,
        *("--env.dataset_path", str(rows), "--env.system_prompt", "Think, then box."),
        *("--env.group_size", "2", "--env.total_steps", "1", "--env.max_tokens", "8"),
        *("--env.use_wandb", "false", "--env.data_path_to_save_groups", str(out)),
        *("--env.max_token_length", "512", "--env.ensure_scores_are_not_same", "false"),
        *tiny_flags(tiny_model_path, f"{inference_server.url}/v1", server_type="vllm"),
    )
    assert done.returncode == 0, failure(done)
    (group,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(group["tokens"]) == len(group["masks"]) == 2
    assert set(group["scores"]) <= {1.0, 0.9, 0.0, -0.1}
    assert group["messages"][0][1]["content"] == "What is 2 + 3?"


def test_serve_sends_scored_groups_to_a_real_api(api, scripted, tiny_model_path, tmp_path):
    args = [
        *("--env.tokenizer_name", str(tiny_model_path), "--env.max_tokens", str(MAX_TOKENS)),
        *("--env.group_size", "4", "--env.use_wandb", "false"),
        *("--env.max_token_length", "2048"),
        *scripted.flags(),
        *serve_flags(api.url),
    ]
    groups, _ = serve_groups(
        api.url, SCRIPT, tmp_path / "serve", *args, batch_size=8, max_token_len=2048
    )
    assert len(groups) >= 2
    for group in groups:
        assert group["scores"] == pytest.approx(EXPECTED)
        assert len(group["tokens"]) == 4


def eval_reply(question: str) -> str:
    """Right (and well formed) exactly when the gold is even."""
    gold = GOLD[question]
    if float(gold) % 2 == 0:
        return f"<think>even</think> \\boxed{{{gold}}}"
    return f"<think>\\boxed{{{gold}}}</think> \\boxed{{{wrong(gold)}}}"


def test_evaluate_writes_metrics_and_samples(tiny_model_path, tmp_path):
    with PolicyChatServer(lambda messages, n: [eval_reply(messages[-1]["content"])] * n) as s:
        done = run_env(
            SCRIPT,
            "evaluate",
            tmp_path,
            *("--env.use_wandb", "false", "--env.data_dir_to_save_evals", str(tmp_path / "ev")),
            *tiny_flags(tiny_model_path, s.url),
        )
        requests = list(s.requests)
    assert done.returncode == 0, failure(done)
    even = sum(float(gold_answer(r["answer"])) % 2 == 0 for r in TEST)
    assert 0 < even < len(TEST)
    results = json.loads((tmp_path / "ev" / "metrics.json").read_text())["results"]["all"]
    assert results["eval/percent_correct"] == pytest.approx(even / len(TEST))
    assert results["eval/format_rate"] == pytest.approx(1.0)
    samples = read_jsonl(tmp_path / "ev" / "samples.jsonl")
    assert len(samples) == len(TEST) == len(requests)
    for sample in samples:
        assert sample["gold_answer"] == GOLD[sample["question"]]
        assert sample["response"] == eval_reply(sample["question"])
        assert sample["score"] == int(float(sample["gold_answer"]) % 2 == 0)
    assert all(r["temperature"] == 0.0 for r in requests)


def test_hub_rows_load_and_convert(monkeypatch, tiny_model_path):
    calls = []

    def load_dataset(name, subset=None, split=None):
        calls.append((name, subset, split))
        return TRAIN[:5] if split == "train" else TEST[:3]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    config = GSM8KConfig(data_source="hub", tokenizer_name=str(tiny_model_path), use_wandb=False)
    env = GSM8KEnv(config, APIServerConfig(model_name="tiny"), testing=True)
    asyncio.run(env.setup())
    assert calls == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", "test")]
    assert len(env.train_items) == 5 and [i["question"] for i in env.eval_items] == [
        r["question"] for r in TEST[:3]
    ]
    item = env.eval_items[0]
    assert env.score(replies(item["question"])[0], item) == 1.0
    assert env.score(replies(item["question"])[2], item) == 0.0
