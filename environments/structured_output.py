"""Structured output: answer a request with JSON that validates against a pydantic model's schema.

Task: the prompt shows a JSON schema (or, in the hub's own rows, the pydantic code) and a
request ("Describe a classic novel."); the answer is one JSON value, bare or in a
```` ```json ```` fence (upstream's `<json_output>` tags work too).

Reward: the "json_schema" reward of the registry (`reward_fns/json_schema_reward.py`):
1.0 when the answer validates against the schema *and* the pydantic model (its custom
validators included), `invalid_schema_score` (0.25) for well-formed JSON that does not,
0.0 for no parseable JSON (prose around bare JSON, a truncated object, JSON only inside
`<think>`). A valid answer always beats an invalid one; the small floor for any JSON
gives a young policy a first step to climb.

Data: justus27/pydantic-adherance-test, the dataset upstream's
pydantic_schema_following_environment loads, in its columns: `problem_id`, `task_type`
(generation or editing; both are "answer with valid JSON"), `prompt`,
`verification_info` (a JSON string with `pydantic_config`, the model's Python source, and
`model_name`) and `metadata`. The hub has one split; like upstream, `eval_fraction` of
the rows (after a seeded shuffle) are held out for `evaluate`. The shipped sample
(environments/data/structured_output/train.jsonl) has 30 authored models in the same
columns; its prompts show `model_json_schema()` of the model.

`pydantic_config` is executed in this process to build the model (upstream does the
same): only point this env at datasets you trust.

Evaluate: greedy `eval/valid_rate` (answers scoring 1.0), `eval/json_rate` (parseable
JSON) and `eval/mean_score`, with one sample per problem (its schema errors included).

Offline: a prompt here holds a whole JSON schema, 670-1,070 tokens with the tiny model's
byte-level tokenizer, more than its 512-token context, so this env needs a larger model,
such as its default on vLLM (GPU):

    python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen2.5-1.5B-Instruct \\
        --port 9001 &
    python environments/structured_output.py process --env.total_steps 4

The tiny model (environments/README.md) cannot learn the task, but served with a longer
context, in place of the 512-token one, it runs the pipeline (data, prompt, sampling,
scoring, the groups file and its viewer); its replies are noise either way:

    atropos-inference-server --model ./tiny-model --port 9001 --served-model-name tiny \\
        --max-model-len 4096 &
    python environments/structured_output.py process --env.total_steps 2 \\
        --env.group_size 2 --env.max_tokens 64 --env.ensure_scores_are_not_same false \\
        --env.use_wandb false --env.tokenizer_name ./tiny-model \\
        --openai.base_url http://127.0.0.1:9001/v1 --openai.model_name tiny
"""

from __future__ import annotations

import json
import logging
import random
import sys
from pathlib import Path
from typing import Any

from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.data_source import DataSourceConfig, load_rows
from atroposlib.envs.reward_fns.json_schema_reward import (
    NO_JSON,
    json_schema_score,
    parse_answer,
    schema_errors,
)
from atroposlib.envs.single_turn import Sample, SingleTurnConfig, SingleTurnEnv

logger = logging.getLogger(__name__)

SAMPLE_DIR = Path(__file__).resolve().parent / "data" / "structured_output"
SYSTEM_PROMPT = (
    "You answer with structured data. Reply with a single JSON value that validates "
    "against the schema you are given, either bare or inside one ```json code fence, "
    "and nothing else."
)
_MODELS: dict[str, Any] = {}


def build_model(pydantic_config: str, model_name: str) -> Any:
    """The pydantic model class `model_name` defined by `pydantic_config` (cached)."""
    key = f"{model_name}\0{pydantic_config}"
    if key not in _MODELS:
        namespace: dict[str, Any] = {"__name__": f"schema_{model_name}"}
        exec(compile(pydantic_config, f"<pydantic_config {model_name}>", "exec"), namespace)
        model = namespace[model_name]
        model.model_rebuild(_types_namespace=namespace)
        _MODELS[key] = model
    return _MODELS[key]


def item_from_row(row: dict[str, Any]) -> dict[str, Any] | None:
    """A hub/sample row as an item (prompt, schema, model source); None if unusable."""
    try:
        info = row["verification_info"]
        info = json.loads(info) if isinstance(info, str) else info
        model = build_model(info["pydantic_config"], info["model_name"])
        schema = model.model_json_schema()
    except Exception as error:  # a row whose model does not build cannot be graded
        logger.warning("skipping row %s: %r", row.get("problem_id"), error)
        return None
    return {
        "problem_id": row.get("problem_id", ""),
        "task_type": row.get("task_type", "generation"),
        "prompt": row["prompt"],
        "schema": schema,
        "pydantic_config": info["pydantic_config"],
        "model_name": info["model_name"],
    }


def split_rows(
    rows: list[dict[str, Any]], eval_fraction: float, seed: int
) -> tuple[list[dict], list[dict]]:
    """(train, eval) items: a seeded shuffle, the first `eval_fraction` (at least 1) held out."""
    items = [item for item in map(item_from_row, rows) if item is not None]
    if not items:
        raise ValueError("no usable rows (every pydantic_config failed to build)")
    random.Random(seed).shuffle(items)
    held = max(1, round(len(items) * eval_fraction))
    train = items[held:]
    if not train:
        logger.warning("every row is held out for evaluation; training on them too")
        train = items
    return train, items[:held]


def score_item(completion: str, item: dict[str, Any], invalid_schema_score: float) -> float:
    model = build_model(item["pydantic_config"], item["model_name"])
    return json_schema_score(completion, item["schema"], model, invalid_schema_score)


class StructuredOutputConfig(SingleTurnConfig, DataSourceConfig):
    """`SingleTurnConfig`, where the rows come from, and the reward settings."""

    hub_dataset: str = Field(
        "justus27/pydantic-adherance-test", description="Hub dataset (upstream's)."
    )
    hub_split: str = Field("train", description="The hub split the rows come from.")
    eval_fraction: float = Field(
        0.1, ge=0.0, le=1.0, description="Share of rows held out for evaluate (at least 1)."
    )
    invalid_schema_score: float = Field(
        0.25, ge=0.0, lt=1.0, description="Score of well-formed JSON that fails the schema."
    )
    max_tokens: int = Field(1024, ge=1, description="Most completion tokens per rollout.")
    eval_size: int = Field(100_000, ge=1, description="Most held-out problems evaluated.")
    seed: int = Field(0, description="Seed of the shuffle that picks the held-out rows.")


class StructuredOutputEnv(SingleTurnEnv):
    """JSON answers checked against a pydantic model's schema; partial credit for JSON."""

    name = "structured_output"
    env_config_cls = StructuredOutputConfig
    config: StructuredOutputConfig
    config_defaults = {
        "tokenizer_name": "Qwen/Qwen2.5-1.5B-Instruct",
        "group_size": 16,
        "max_token_length": 4096,
        "steps_per_eval": 50,
        "use_wandb": True,
    }

    async def setup(self) -> None:
        rows = load_rows(self.config, "train", SAMPLE_DIR, hub_split=self.config.hub_split)
        self.train_items, self.eval_items = split_rows(
            rows, self.config.eval_fraction, self.config.seed
        )

    def messages_for(self, item: dict[str, Any]) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": item["prompt"]},
        ]

    def score(self, completion: str, item: dict[str, Any]) -> float:
        return score_item(completion, item, self.config.invalid_schema_score)

    async def eval_sample(self, item: dict[str, Any], sample: Sample) -> dict[str, Any]:
        value = parse_answer(sample.text)
        is_json = value is not NO_JSON
        return {
            "problem_id": item["problem_id"],
            "model_name": item["model_name"],
            "prompt": item["prompt"],
            "completion": sample.text,
            "is_json": is_json,
            "schema_errors": schema_errors(value, item["schema"])[:5] if is_json else [],
            "score": self.score(sample.text, item),
        }

    def eval_summary(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """Valid rate, JSON rate and mean score of the greedy answers."""
        count = max(1, len(samples))
        return {
            "eval/valid_rate": sum(s["score"] == 1.0 for s in samples) / count,
            "eval/json_rate": sum(s["is_json"] for s in samples) / count,
            "eval/mean_score": sum(s["score"] for s in samples) / count,
        }


if __name__ == "__main__":
    StructuredOutputEnv.cli()
