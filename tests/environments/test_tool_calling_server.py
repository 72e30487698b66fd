"""The single-turn tool-calling env: rows to items, `process`/`serve`/`evaluate`, the hub path."""

from __future__ import annotations

import asyncio
import json
import sys
import types
from pathlib import Path

import pytest

from atroposlib.envs.base import APIServerConfig
from atroposlib.envs.data_source import read_jsonl
from environments.tool_calling_server import (
    SAMPLE_DIR,
    ToolCallingConfig,
    ToolCallingEnv,
    item_from_row,
    parse_tools,
)
from tests.support.compat_runs import failure, run_env, serve_flags, serve_groups, tiny_flags
from tests.support.policy_server import PolicyChatServer
from tests.support.scripted_model import last_turn, scripted_model_fixture

pytest.importorskip("torch")

SCRIPT = str(Path(__file__).resolve().parents[2] / "environments" / "tool_calling_server.py")
TOOLS = {
    "get_weather": {"city": {"type": "string"}},
    "convert_currency": {"amount": {"type": "number"}, "to": {"type": "string"}},
}


def tool(name: str) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": name,
            "parameters": {
                "type": "object",
                "properties": TOOLS[name],
                "required": list(TOOLS[name]),
            },
        },
    }


def block(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


# request -> (gold answer, the group's replies, their scores)
CASES = {
    "Weather in Oslo and Rome?": (
        block("get_weather", city="Oslo") + "\n" + block("get_weather", city="Rome"),
        [
            block("get_weather", city="Rome") + block("get_weather", city="Oslo"),  # any order
            block("get_forecast", city="Oslo") + block("get_weather", city="Rome"),  # wrong name
            f"<think>{block('get_weather', city='Oslo')}{block('get_weather', city='Rome')}"
            "</think>Sunny in both.",  # calls only while thinking
            'I would call {"name": "get_weather", "arguments": {"city": "Oslo"}}.',  # prose
        ],
        [1.0, 0.0, 0.0, 0.0],
    ),
    "Convert 12 euros to dollars.": (
        block("convert_currency", amount=12, to="USD"),
        [
            "Sure.\n" + block("convert_currency", to="USD", amount=12.0),  # 12.0 == 12
            block("convert_currency", amount=12, to="GBP"),  # wrong argument
            block("convert_currency", amount=12, to="USD") + block("get_weather", city="X"),
            '<tool_call>\n{"name": "convert_currency", "arguments": {"amount": 12,',  # cut off
        ],
        [1.0, 0.0, 0.0, 0.0],
    ),
}
EVAL_REPLIES = {
    "Weather in Oslo and Rome?": block("get_weather", city="Oslo"),  # a missing call
    "Convert 12 euros to dollars.": block("convert_currency", amount=12.0, to="USD"),
}


def row(request: str, tools: list[str]) -> dict:
    listed = json.dumps([tool(name) for name in tools])
    return {
        "conversations": [
            {"from": "system", "value": f"Call functions.\n<tools>\n{listed}\n</tools>\nUse JSON."},
            {"from": "human", "value": request},
            {"from": "gpt", "value": CASES[request][0]},
        ]
    }


ROWS = [row(r, ["get_weather", "convert_currency"]) for r in CASES]

scripted = scripted_model_fixture(lambda prompt, n: CASES[last_turn(prompt)][1][:n])


@pytest.fixture
def rows_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_the_shipped_sample_converts_and_its_gold_calls_use_offered_tools():
    for split, count in (("train", 30), ("test", 20)):
        rows = read_jsonl(SAMPLE_DIR / f"{split}.jsonl")
        assert len(rows) == count
        for r in rows:
            item = item_from_row(r)
            assert item is not None
            names = {t["function"]["name"] for t in item["tools"]}
            assert {call["name"] for call in item["gold"]} <= names
            for call in item["gold"]:
                params = next(t for t in item["tools"] if t["function"]["name"] == call["name"])
                assert set(call["arguments"]) <= set(params["function"]["parameters"]["properties"])
    train = {r["conversations"][1]["value"] for r in read_jsonl(SAMPLE_DIR / "train.jsonl")}
    test = {r["conversations"][1]["value"] for r in read_jsonl(SAMPLE_DIR / "test.jsonl")}
    assert train.isdisjoint(test)


def test_tools_are_read_in_openai_bare_and_xlam_shapes():
    xlam = [
        {
            "name": "live_giveaways",
            "description": "d",
            "parameters": {
                "type": {"description": "kind", "type": "str", "default": "game"},
                "count": {"description": "n", "type": "int, optional"},
            },
        }
    ]
    (tool_,) = parse_tools(f"<tools> {json.dumps(xlam)} </tools>")
    assert tool_["type"] == "function"
    assert tool_["function"]["parameters"]["properties"] == {
        "type": {"description": "kind", "type": "string"},
        "count": {"description": "n", "type": "integer"},
    }
    bare = {"name": "f", "parameters": {"type": "object", "properties": {}}}
    assert parse_tools(f"<tools>\n{json.dumps(bare)}\n</tools>")[0]["function"]["name"] == "f"
    assert parse_tools(f"<tools>{[tool('get_weather')]!r}</tools>")[0] == tool("get_weather")
    assert item_from_row({"conversations": [{"from": "human", "value": "hi"}]}) is None


def assert_prompt_masked(group: dict) -> None:
    for tokens, masks in zip(group["tokens"], group["masks"], strict=True):
        prompt = masks.index(next(m for m in masks if m != -100))
        assert prompt > 0 and masks[:prompt] == [-100] * prompt
        assert masks[prompt:] == tokens[prompt:]


def test_process_scores_a_scripted_policy_exactly(scripted, rows_file, tiny_model_path, tmp_path):
    out = tmp_path / "groups.jsonl"
    done = run_env(
        SCRIPT,
        "process",
        tmp_path,
        *("--env.dataset_path", str(rows_file), "--env.tokenizer_name", str(tiny_model_path)),
        *("--env.group_size", "4", "--env.total_steps", "2", "--env.max_tokens", "200"),
        *("--env.use_wandb", "false", "--env.data_path_to_save_groups", str(out)),
        *("--env.max_token_length", "4096"),
        *scripted.flags(),
    )
    assert done.returncode == 0, failure(done)
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 2 and out.with_suffix(".html").is_file()
    assert {g["messages"][0][1]["content"] for g in groups} == set(CASES)
    for group in groups:
        request = group["messages"][0][1]["content"]
        assert len(group["tokens"]) == len(group["masks"]) == 4
        assert group["scores"] == CASES[request][2]
        assert [m[-1]["content"] for m in group["messages"]] == CASES[request][1]
        assert_prompt_masked(group)
    prompt = scripted.tokenizer.decode(scripted.requests[0]["prompt"])
    assert "<tools>" in prompt and '"convert_currency"' in prompt  # the tools reach the model


def test_process_on_the_tiny_model(inference_server, tiny_model_path, tmp_path):
    # the tiny model reads 512 tokens (characters, nearly): one bare tool and a short prompt
    bare = {"type": "function", "function": {"name": "f", "parameters": {}}}
    tiny_row = {
        "conversations": [
            {"from": "system", "value": f"<tools>[{json.dumps(bare)}]</tools>"},
            {"from": "human", "value": "Call f."},
            {"from": "gpt", "value": '<tool_call>{"name": "f", "arguments": {}}</tool_call>'},
        ]
    }
    rows = tmp_path / "tiny.jsonl"
    rows.write_text(json.dumps(tiny_row) + "\n")
    out = tmp_path / "groups.jsonl"
    done = run_env(
        SCRIPT,
        "process",
        tmp_path,
        *("--env.dataset_path", str(rows), "--env.system_prompt", "Call tools."),
        *("--env.group_size", "2", "--env.total_steps", "1", "--env.max_tokens", "8"),
        *("--env.use_wandb", "false", "--env.data_path_to_save_groups", str(out)),
        *("--env.max_token_length", "8192"),
        *tiny_flags(tiny_model_path, f"{inference_server.url}/v1", server_type="vllm"),
    )
    assert done.returncode == 0, failure(done)
    (group,) = read_jsonl(out)
    assert len(group["tokens"]) == 2 and group["scores"] == [0.0, 0.0]
    assert all(len(t) == len(m) for t, m in zip(group["tokens"], group["masks"], strict=True))
    assert_prompt_masked(group)


def test_serve_sends_scored_groups_to_a_real_api(
    api, scripted, rows_file, tiny_model_path, tmp_path
):
    args = [
        *("--env.dataset_path", str(rows_file), "--env.tokenizer_name", str(tiny_model_path)),
        *("--env.group_size", "4", "--env.max_tokens", "200", "--env.use_wandb", "false"),
        *scripted.flags(),
        *serve_flags(api.url),
    ]
    groups, _ = serve_groups(
        api.url, SCRIPT, tmp_path / "serve", *args, batch_size=8, max_token_len=4096
    )
    assert len(groups) >= 2
    for group in groups:
        assert sorted(group["scores"]) == [0.0, 0.0, 0.0, 1.0]
        assert_prompt_masked(group)


def test_evaluate_writes_metrics_and_samples(rows_file, tiny_model_path, tmp_path):
    with PolicyChatServer(lambda messages, n: [EVAL_REPLIES[messages[-1]["content"]]] * n) as s:
        done = run_env(
            SCRIPT,
            "evaluate",
            tmp_path,
            *("--env.dataset_path", str(rows_file), "--env.use_wandb", "false"),
            *("--env.data_dir_to_save_evals", str(tmp_path / "ev")),
            *tiny_flags(tiny_model_path, s.url),
        )
        requests = list(s.requests)
    assert done.returncode == 0, failure(done)
    results = json.loads((tmp_path / "ev" / "metrics.json").read_text())["results"]["all"]
    assert results["eval/percent_correct"] == pytest.approx(0.5)
    assert results["eval/name_accuracy"] == pytest.approx(0.5)
    assert results["eval/parse_rate"] == pytest.approx(1.0)
    samples = {s["request"]: s for s in read_jsonl(tmp_path / "ev" / "samples.jsonl")}
    assert samples["Convert 12 euros to dollars."]["score"] == 1.0
    assert samples["Weather in Oslo and Rome?"]["calls"] == [
        {"name": "get_weather", "arguments": {"city": "Oslo"}}
    ]
    assert all(r["tools"] == [tool("get_weather"), tool("convert_currency")] for r in requests)
    assert all(r["temperature"] == 0.0 for r in requests)


def test_hub_rows_load_and_convert(monkeypatch, tiny_model_path):
    calls = []
    hub_rows = [row(r, ["get_weather", "convert_currency"]) for r in CASES] * 3

    def load_dataset(name, subset=None, split=None):
        calls.append((name, subset, split))
        return hub_rows

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    config = ToolCallingConfig(
        data_source="hub", eval_size=2, tokenizer_name=str(tiny_model_path), use_wandb=False
    )
    env = ToolCallingEnv(config, APIServerConfig(model_name="tiny"), testing=True)
    asyncio.run(env.setup())
    assert calls == [("NousResearch/XLAM-Atropos", "default", "train")]
    assert len(env.train_items) == 4 and len(env.eval_items) == 2
    item = asyncio.run(env.get_next_item())
    _, replies, scores = CASES[item["request"]]
    assert [env.score(r, item) for r in replies] == scores
    assert env.server.tool_parser == "hermes"
