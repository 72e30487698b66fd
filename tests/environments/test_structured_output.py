"""The structured-output env: rows to items, `process` and `evaluate` end to end, the hub path."""

from __future__ import annotations

import asyncio
import json
import sys
import types
from pathlib import Path

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
from tests.support.compat_runs import failure, run_env, tiny_flags
from tests.support.env_groups import assert_prompt_masked
from tests.support.policy_server import PolicyChatServer
from tests.support.scripted_model import last_turn, scripted_model_fixture

SCRIPT = str(Path(__file__).resolve().parents[2] / "environments" / "structured_output.py")
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


scripted = scripted_model_fixture(lambda prompt, n: REPLIES[model_named(last_turn(prompt))][0][:n])


@pytest.fixture
def rows_file(tmp_path):
    path = tmp_path / "schemas.jsonl"
    path.write_text("".join(json.dumps(row(name)) + "\n" for name in MODELS))
    return path


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


def test_process_scores_a_scripted_policy_exactly(scripted, rows_file, tiny_model_path, tmp_path):
    out = tmp_path / "groups.jsonl"
    done = run_env(
        SCRIPT,
        "process",
        tmp_path,
        *("--env.dataset_path", str(rows_file), "--env.tokenizer_name", str(tiny_model_path)),
        *("--env.group_size", "2", "--env.total_steps", "2"),
        *("--env.use_wandb", "false", "--env.data_path_to_save_groups", str(out)),
        *("--env.max_token_length", "1024", "--env.max_tokens", "64"),
        *scripted.flags(),
    )
    assert done.returncode == 0, failure(done)
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 2 and out.with_suffix(".html").is_file()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path))
    names = []
    for group in groups:
        name = model_named(group["messages"][0][1]["content"])
        names.append(name)
        assert group["scores"] == REPLIES[name][1]
        assert [m[-1]["content"] for m in group["messages"]] == REPLIES[name][0]
        assert_prompt_masked(group, tokenizer)
    assert len(set(names)) == 2  # two training problems; the third is held out


def test_process_on_the_tiny_model(inference_server, rows_file, tiny_model_path, tmp_path):
    # the tiny model's context (512) is shorter than the sample's schemas: small rows
    out = tmp_path / "groups.jsonl"
    done = run_env(
        SCRIPT,
        "process",
        tmp_path,
        "--env.dataset_path",
        str(rows_file),
        *("--env.group_size", "2", "--env.total_steps", "1", "--env.max_tokens", "8"),
        *("--env.use_wandb", "false", "--env.data_path_to_save_groups", str(out)),
        *("--env.max_token_length", "512", "--env.ensure_scores_are_not_same", "false"),
        *tiny_flags(tiny_model_path, f"{inference_server.url}/v1", server_type="vllm"),
    )
    assert done.returncode == 0, failure(done)
    (group,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(group["tokens"]) == 2 and set(group["scores"]) <= {0.0, 0.25, 1.0}
    assert "pydantic model named" in group["messages"][0][1]["content"]


def test_evaluate_writes_metrics_and_samples(rows_file, tiny_model_path, tmp_path):
    def policy(messages, n):
        return [EVAL_REPLIES[model_named(messages[-1]["content"])]] * n

    with PolicyChatServer(policy) as server:
        done = run_env(
            SCRIPT,
            "evaluate",
            tmp_path,
            *("--env.dataset_path", str(rows_file), "--env.eval_fraction", "1.0"),
            *("--env.use_wandb", "false", "--env.data_dir_to_save_evals", str(tmp_path / "ev")),
            *tiny_flags(tiny_model_path, server.url),
        )
    assert done.returncode == 0, failure(done)
    results = json.loads((tmp_path / "ev" / "metrics.json").read_text())["results"]["all"]
    assert results["eval/valid_rate"] == pytest.approx(1 / 3)
    assert results["eval/json_rate"] == pytest.approx(2 / 3)
    assert results["eval/mean_score"] == pytest.approx(1.25 / 3)
    samples = {s["model_name"]: s for s in read_jsonl(tmp_path / "ev" / "samples.jsonl")}
    assert set(samples) == set(MODELS)
    assert samples["Planet"]["score"] == 0.25 and samples["Planet"]["schema_errors"]
    assert samples["Pet"]["is_json"] is False


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
