"""The single-turn tool-calling env: rows to items, the hub path, and its rows of the env table
(`process`/`serve`/`evaluate` end to end: tests/environments/test_env_table.py)."""

from __future__ import annotations

import asyncio
import json
import sys
import types

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
from tests.support.env_table import EvaluateRow, ProcessRow, Run, ServeRow, chat, scripted
from tests.support.scripted_model import last_turn

pytest.importorskip("torch")

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


def write_rows(run: Run) -> str:
    path = run.tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return str(path)


def request_of(group: dict) -> str:
    return group["messages"][0][1]["content"]


def check_process(groups: list[dict], run: Run) -> None:
    assert {request_of(g) for g in groups} == set(CASES)
    for group in groups:
        assert [m[-1]["content"] for m in group["messages"]] == CASES[request_of(group)][1]
        assert_prompt_masked(group)
    prompt = run.tokenizer.decode(run.model.requests[0]["prompt"])
    assert "<tools>" in prompt and '"convert_currency"' in prompt  # the tools reach the model


def check_serve(groups: list[dict], run: Run) -> None:
    for group in groups:
        assert sorted(group["scores"]) == [0.0, 0.0, 0.0, 1.0]
        assert_prompt_masked(group)


def check_evaluate(results: dict, samples: list[dict], run: Run) -> None:
    assert results["eval/percent_correct"] == pytest.approx(0.5)
    assert results["eval/name_accuracy"] == pytest.approx(0.5)
    assert results["eval/parse_rate"] == pytest.approx(1.0)
    by_request = {s["request"]: s for s in samples}
    assert by_request["Convert 12 euros to dollars."]["score"] == 1.0
    assert by_request["Weather in Oslo and Rome?"]["calls"] == [
        {"name": "get_weather", "arguments": {"city": "Oslo"}}
    ]
    offered = [tool("get_weather"), tool("convert_currency")]
    assert all(r["tools"] == offered for r in run.model.requests)


def check_offline(groups: list[dict]) -> None:
    """The documented command on the tiny model: its noise makes no right call."""
    for group in groups:
        assert set(group["scores"]) == {0.0}
        assert_prompt_masked(group)


# The questions every env is asked (tests/environments/test_env_table.py).
POLICY = scripted(lambda prompt, n: CASES[last_turn(prompt)][1][:n])
PROCESS = ProcessRow(
    env=ToolCallingEnv,
    model=POLICY,
    group_size=4,
    steps=2,
    scores=lambda group: CASES[request_of(group)][2],
    args=lambda run: [
        *("--env.dataset_path", write_rows(run), "--env.max_tokens", "200"),
        *("--env.max_token_length", "4096"),
    ],
    check=check_process,
)
SERVE = ServeRow(
    env=ToolCallingEnv,
    model=POLICY,
    group_size=4,
    batch_size=8,
    max_token_len=4096,
    groups=4,
    args=lambda run: ["--env.dataset_path", write_rows(run), "--env.max_tokens", "200"],
    check=check_serve,
)
EVALUATE = EvaluateRow(
    env=ToolCallingEnv,
    model=chat(lambda messages, n: [EVAL_REPLIES[messages[-1]["content"]]] * n),
    samples=2,
    args=lambda run: ["--env.dataset_path", write_rows(run)],
    check=check_evaluate,
)
OFFLINE = check_offline


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
