"""Single-turn function calling: answer a request with the right hermes tool calls.

Task: the prompt offers tools (an OpenAI `tools` list, rendered by the chat template, or
as a hermes `# Tools` system block when the template cannot) and a user request; the
model answers with `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, one
per call, parallel calls allowed. Sampling goes through `ManagedServer` with the hermes
tool parser (`self.server.tool_parser = "hermes"`), so the tools reach the prompt the
way the model was trained to read them.

Reward: the "tool_call" reward of the registry (`reward_fns/tool_call_reward.py`): 1.0
when the reply's calls are exactly the gold calls (any order; arguments compared as JSON
values, so `12` equals `12.0` and key order is free), else 0.0: a wrong name or
argument, an extra or missing call, a call only inside `<think>`, prose JSON or a
malformed block. What is scored is the reply's own text (decoded from the sampled
tokens), not the server's parse, so training scores exactly what the reward's unit
tests pin down (the parser also reads calls inside `<think>` and forgives an unclosed
block; the reward does neither). As upstream, when a whole group is right, sequences
longer than half of `max_token_length` lose score linearly down to 0 at the limit
(`length_penalty`), so an all-right group still teaches brevity.

Data: NousResearch/XLAM-Atropos (config "default", split "train"), the dataset
upstream's tool_calling_server loads. Its one column, `conversations`, is a list of
`{"from", "value"}` turns: `system` (instructions with the tools as JSON inside
`<tools></tools>`), `human` (the request) and `gpt` (the gold `<tool_call>` blocks). The
tools are read out of the system turn and passed as `tools=`; the rest of that turn is
replaced by this env's short instruction. Like upstream, the hub's single split is
shuffled (seed 42) and `eval_size` rows (100) are held out for `evaluate`. The shipped
sample (environments/data/tool_calling/) has 30 train and 20 test rows authored in the
same columns; a `--env.dataset_path` file serves as both splits.

Evaluate: greedy answers to the test rows through `chat_completion(tools=...)`, so any
OpenAI-compatible server works (structured `tool_calls` from a server with a tool
parser, or blocks left in the text by one without); reports `eval/percent_correct`
(upstream's key), `eval/name_accuracy` (the right set of function names) and
`eval/parse_rate`, with one sample per row.

Offline: a prompt here holds the tools' JSON schemas, 900-1,500 tokens with the tiny
model's byte-level tokenizer, more than its 512-token context, so this env needs a larger
model, such as its default on vLLM (GPU; the env's default port is 9004):

    python -m vllm.entrypoints.openai.api_server \\
        --model NousResearch/DeepHermes-3-Llama-3-8B-Preview --port 9004 &
    python environments/tool_calling_server.py process --env.total_steps 4

The tiny model (environments/README.md) cannot learn the task, but served with a longer
context, in place of the 512-token one, it runs the pipeline (data, tools in the prompt,
sampling, scoring, the groups file and its viewer); its replies are noise either way:

    atropos-inference-server --model ./tiny-model --port 9001 --served-model-name tiny \\
        --max-model-len 4096 &
    python environments/tool_calling_server.py process --env.total_steps 2 \\
        --env.group_size 2 --env.max_tokens 64 --env.ensure_scores_are_not_same false \\
        --env.use_wandb false --env.tokenizer_name ./tiny-model \\
        --openai.base_url http://127.0.0.1:9001/v1 --openai.model_name tiny
"""

from __future__ import annotations

import ast
import json
import logging
import random
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.data_source import DataSourceConfig, load_rows
from atroposlib.envs.reward_fns.tool_call_reward import (
    message_calls,
    read_gold_calls,
    tool_call_score,
)
from atroposlib.envs.scored_data import ScoredDataGroup, length_penalized
from atroposlib.envs.single_turn import Sample, SingleTurnConfig, SingleTurnEnv

logger = logging.getLogger(__name__)

SAMPLE_DIR = Path(__file__).resolve().parent / "data" / "tool_calling"
SYSTEM_PROMPT = (
    "You are a function-calling assistant. Answer the user's request by calling the tools "
    "you are given: write one <tool_call></tool_call> block per call, holding a JSON object "
    'with the function\'s "name" and its "arguments", and make every call the request needs. '
    "You may think inside <think></think> first; calls written there are not made."
)
TOOLS_BLOCK = re.compile(r"<tools>(.*?)</tools>", re.DOTALL)
JSON_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean",
              "list": "array", "dict": "object"}  # fmt: skip


def _as_schema(parameters: Any) -> dict[str, Any]:
    """JSON-schema parameters; xLAM's `{arg: {"type": "str", ...}}` maps are converted."""
    if not isinstance(parameters, dict):
        return {"type": "object", "properties": {}}
    if parameters.get("type") == "object" or "properties" in parameters:
        return parameters
    properties = {}
    for name, spec in parameters.items():
        spec = dict(spec) if isinstance(spec, dict) else {}
        kind = str(spec.get("type", "string")).split(",")[0].strip().lower()
        kind = kind.split("[")[0]
        spec["type"] = JSON_TYPES.get(kind, kind if kind in JSON_TYPES.values() else "string")
        spec.pop("default", None)
        properties[name] = spec
    return {"type": "object", "properties": properties}


def parse_tools(system: str) -> list[dict[str, Any]]:
    """The OpenAI `tools` list in a system turn's `<tools>` block (JSON or Python literal)."""
    # the longest block: instructions often name the tags ("inside <tools> </tools>") first
    text = max(TOOLS_BLOCK.findall(system), key=len, default="").strip()
    if not text:
        raise ValueError("the system turn has no <tools> block")
    try:
        listed = json.loads(text)
    except ValueError:
        try:
            listed = ast.literal_eval(text)
        except (ValueError, SyntaxError):  # one JSON object per line
            listed = [json.loads(line) for line in text.splitlines() if line.strip()]
    listed = listed if isinstance(listed, list) else [listed]
    tools = []
    for entry in listed:
        function = entry.get("function", entry)
        if not isinstance(function.get("name"), str):
            raise ValueError(f"a tool without a name: {entry!r}")
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": function["name"],
                    "description": function.get("description", ""),
                    "parameters": _as_schema(function.get("parameters")),
                },
            }
        )
    return tools


def item_from_row(row: dict[str, Any]) -> dict[str, Any] | None:
    """A hub/sample row as {"request", "tools", "gold", "answer"}; None when unusable."""
    turns = {}
    for turn in row.get("conversations") or []:
        turns.setdefault(turn.get("from"), turn.get("value") or "")
    try:
        return {
            "request": turns["human"],
            "tools": parse_tools(turns["system"]),
            "gold": read_gold_calls(turns["gpt"]),
            "answer": turns["gpt"],
        }
    except (KeyError, ValueError, AttributeError) as error:
        logger.warning("skipping a row: %r", error)
        return None


def items_from_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    items = [item for item in map(item_from_row, rows) if item is not None]
    if not items:
        raise ValueError("no usable rows (each needs system <tools>, human and gpt turns)")
    return items


class ToolCallingConfig(SingleTurnConfig, DataSourceConfig):
    """`SingleTurnConfig`, where the rows come from, and the reward settings."""

    hub_dataset: str = Field("NousResearch/XLAM-Atropos", description="Hub dataset (upstream's).")
    hub_subset: str | None = Field("default", description="Hub dataset configuration.")
    hub_split: str = Field("train", description="The hub split the rows come from.")
    eval_size: int = Field(
        100,
        ge=1,
        description="Hub rows held out for evaluate (seeded shuffle); at most this "
        "many test rows are evaluated.",
    )
    seed: int = Field(42, description="Seed of the hub shuffle and of the training order.")
    strict_arguments: bool = Field(
        True, description="Extra arguments fail a call (False: upstream's rule, ignored)."
    )
    system_prompt: str = Field(
        SYSTEM_PROMPT, description="The instruction before the tools (replaces the row's)."
    )
    length_penalty: bool = Field(
        True, description="Upstream's length penalty for all-right groups."
    )
    max_tokens: int = Field(1024, ge=1, description="Most completion tokens per rollout.")
    temperature: float = Field(0.8, ge=0.0, description="Sampling temperature (upstream's).")


class ToolCallingEnv(SingleTurnEnv):
    """One request, `group_size` replies, each scored by exact match of its tool calls."""

    name = "tool_calling"
    env_config_cls = ToolCallingConfig
    config: ToolCallingConfig
    config_defaults = {
        "tokenizer_name": "NousResearch/DeepHermes-3-Llama-3-8B-Preview",
        "group_size": 16,
        "max_token_length": 4096,
        "steps_per_eval": 25,
        "use_wandb": True,
    }
    server_defaults = {"base_url": "http://localhost:9004/v1", "num_requests_for_eval": 256}

    async def setup(self) -> None:
        self.server.tool_parser = "hermes"
        config = self.config
        if config.data_source == "hub" and not config.dataset_path:
            rows = load_rows(config, "train", SAMPLE_DIR, hub_split=config.hub_split)
            random.Random(config.seed).shuffle(rows)
            held = min(config.eval_size, max(1, len(rows) // 2))
            self.train_items = items_from_rows(rows[held:])
            self.eval_items = items_from_rows(rows[:held])
            self.position = 0
        else:
            self.train_items = items_from_rows(load_rows(config, "train", SAMPLE_DIR))
            self.eval_items = items_from_rows(load_rows(config, "test", SAMPLE_DIR))
            self.shuffle_train_items()

    def messages_for(self, item: dict[str, Any]) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.config.system_prompt},
            {"role": "user", "content": item["request"]},
        ]

    def sampling_for(self, item: dict[str, Any], split: str) -> dict[str, Any]:
        return {"tools": item["tools"]}

    def sample_from(self, choice: Any, node: Any) -> Sample:
        """The reply exactly as sampled (the completion's tokens decoded, less a final
        stop token), not the server's parse: training scores what the reward's tests pin."""
        sample = super().sample_from(choice, node)
        ids = list(sample.tokens)
        special = set(getattr(self.tokenizer, "all_special_ids", None) or [])
        while ids and ids[-1] in special:
            ids.pop()
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        return Sample(text, sample.finish_reason, sample.tokens)

    def score(self, reply: str, item: dict[str, Any]) -> float:
        return tool_call_score(reply, item["gold"], self.config.strict_arguments)

    def finish_group(self, group: ScoredDataGroup, samples: list[Sample]) -> ScoredDataGroup:
        """The length penalty of an all-right group, on whole sequences (upstream's rule)."""
        if self.config.length_penalty:
            lengths = [len(tokens) for tokens in group["tokens"]]
            group["scores"] = length_penalized(
                group["scores"], lengths, self.config.max_token_length
            )
        return group

    async def eval_sample(self, item: dict[str, Any], sample: Sample) -> dict[str, Any]:
        """A greedy reply through the API: its structured `tool_calls` (a server with a
        tool parser) or the blocks left in its text (one without) are scored."""
        calls = message_calls(sample.message)
        names = sorted(call["name"] for call in calls or [])
        return {
            "request": item["request"],
            "expected": item["gold"],
            "completion": sample.text,
            "calls": calls,
            "score": tool_call_score(sample.message, item["gold"], self.config.strict_arguments),
            "names_right": names == sorted(call["name"] for call in item["gold"]),
        }

    def eval_summary(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """Exact-call accuracy (upstream's key), name accuracy and parse rate."""
        count = max(1, len(samples))
        return {
            "eval/percent_correct": sum(s["score"] for s in samples) / count,
            "eval/name_accuracy": sum(s["names_right"] for s in samples) / count,
            "eval/parse_rate": sum(bool(s["calls"]) for s in samples) / count,
        }


if __name__ == "__main__":
    ToolCallingEnv.cli()
