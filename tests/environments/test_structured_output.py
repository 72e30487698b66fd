"""The structured-output env: rows to items, the hub path, and its rows of the env table
(`process` and `evaluate` end to end: tests/environments/test_env_table.py)."""

from __future__ import annotations

import asyncio
import json
import sys
import types

import pytest

from atroposlib.envs.base import APIServerConfig
from atroposlib.envs.data_source import read_jsonl
from environments.structured_output import (
    SAMPLE_DIR,
    StructuredOutputConfig,
    StructuredOutputEnv,
    item_from_row,
    split_rows,
)
from tests.support.env_groups import assert_prompt_masked
from tests.support.env_table import EvaluateRow, ProcessRow, Run, chat, scripted
from tests.support.scripted_model import last_turn

HEAD = "from pydantic import BaseModel, Field\nfrom typing import Literal, List\n\n"
MODELS = {
    "Book": "class Book(BaseModel):\n    title: str\n    year: int = Field(ge=1400)\n",
    "Planet": "class Planet(BaseModel):\n    name: str\n    moons: int = Field(ge=0)\n"
    "    kind: Literal['rocky', 'gas giant']\n",
    "Pet": "class Pet(BaseModel):\n    name: str\n    legs: List[int] = Field(min_length=1)\n",
}


def row(name: str) -> dict:
    return {
        "problem_id": f"pydantic_adherance_{name}",
        "task_type": "generation",
        "prompt": f"Return a json compatible with the pydantic model named {name}:\n"
        f"```python\n{HEAD + MODELS[name]}```",
        "verification_info": json.dumps(
            {"pydantic_config": HEAD + MODELS[name], "model_name": name}
        ),
        "metadata": json.dumps({"difficulty": 0}),
    }


# per model: the group's replies and their scores
REPLIES = {
    "Book": (
        ['```json\n{"title": "Emma", "year": 1815}\n```', '{"title": "Emma", "year": 99}'],
        [1.0, 0.25],
    ),
    "Planet": (
        ['{"name": "Mars", "moons": 2, "kind": "rocky"}', "Mars has two moons."],
        [1.0, 0.0],
    ),
    "Pet": (
        ['<think>ok</think>{"name": "Rex", "legs": [4]}', '<think>{"name": "Rex"}'],
        [1.0, 0.0],
    ),
}
EVAL_REPLIES = {
    "Book": '{"title": "Emma", "year": 1815}',
    "Planet": '{"name": "Mars", "moons": -1, "kind": "rocky"}',
    "Pet": "A dog called Rex.",
}


def model_named(text: str) -> str:
    return next(name for name in MODELS if f"model named {name}" in text)


def test_the_shipped_sample_builds_every_model():
    rows = read_jsonl(SAMPLE_DIR / "train.jsonl")
    train, test = split_rows(rows, 0.1, 0)
    assert len(rows) == len(train) + len(test) == 30 and len(test) == 3
    assert {item["problem_id"] for item in train}.isdisjoint(i["problem_id"] for i in test)
    for item in train + test:
        assert json.dumps(item["schema"]) in item["prompt"]
    assert (SAMPLE_DIR / "train.jsonl").stat().st_size < 1 << 20


def test_a_row_whose_model_does_not_build_is_skipped():
    broken = {
        **row("Book"),
        "verification_info": json.dumps(
            {"pydantic_config": "class Book(BaseModel): ...", "model_name": "Book"}
        ),
    }
    assert item_from_row(broken) is None
    assert item_from_row(row("Book"))["schema"]["required"] == ["title", "year"]


def write_rows(run: Run) -> str:
    path = run.tmp_path / "schemas.jsonl"
    path.write_text("".join(json.dumps(row(name)) + "\n" for name in MODELS))
    return str(path)


def name_of(group: dict) -> str:
    return model_named(group["messages"][0][1]["content"])


def check_process(groups: list[dict], run: Run) -> None:
    for group in groups:
        assert [m[-1]["content"] for m in group["messages"]] == REPLIES[name_of(group)][0]
        assert_prompt_masked(group, run.tokenizer)
    assert len({name_of(group) for group in groups}) == 2  # two training problems; one held out


def check_evaluate(results: dict, samples: list[dict], run: Run) -> None:
    assert results["eval/valid_rate"] == pytest.approx(1 / 3)
    assert results["eval/json_rate"] == pytest.approx(2 / 3)
    assert results["eval/mean_score"] == pytest.approx(1.25 / 3)
    by_name = {s["model_name"]: s for s in samples}
    assert set(by_name) == set(MODELS)
    assert by_name["Planet"]["score"] == 0.25 and by_name["Planet"]["schema_errors"]
    assert by_name["Pet"]["is_json"] is False


def check_offline(groups: list[dict]) -> None:
    """The documented command on the tiny model: the sample's schemas, its reward's steps."""
    for group in groups:
        assert set(group["scores"]) <= {0.0, 0.25, 1.0}
        assert "pydantic model named" in group["messages"][0][1]["content"]


# The questions every env is asked (tests/environments/test_env_table.py).
PROCESS = ProcessRow(
    env=StructuredOutputEnv,
    model=scripted(lambda prompt, n: REPLIES[model_named(last_turn(prompt))][0][:n]),
    group_size=2,
    steps=2,
    scores=lambda group: REPLIES[name_of(group)][1],
    args=lambda run: [
        *("--env.dataset_path", write_rows(run)),
        *("--env.max_token_length", "1024", "--env.max_tokens", "64"),
    ],
    check=check_process,
)
EVALUATE = EvaluateRow(
    env=StructuredOutputEnv,
    model=chat(lambda messages, n: [EVAL_REPLIES[model_named(messages[-1]["content"])]] * n),
    samples=3,
    args=lambda run: ["--env.dataset_path", write_rows(run), "--env.eval_fraction", "1.0"],
    check=check_evaluate,
)
OFFLINE = check_offline


def test_hub_rows_load_and_convert(monkeypatch, tiny_model_path):
    calls = []

    def load_dataset(name, subset=None, split=None):
        calls.append((name, subset, split))
        return [row(name) for name in MODELS]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    config = StructuredOutputConfig(
        data_source="hub", tokenizer_name=str(tiny_model_path), use_wandb=False
    )
    env = StructuredOutputEnv(config, APIServerConfig(model_name="tiny"), testing=True)
    asyncio.run(env.setup())
    assert calls == [("justus27/pydantic-adherance-test", None, "train")]
    assert len(env.train_items) == 2 and len(env.eval_items) == 1
    book = next(i for i in env.train_items + env.eval_items if i["model_name"] == "Book")
    assert env.score(REPLIES["Book"][0][0], book) == 1.0
