"""What the gym_blackjack and gym_taxi tests share: replies, and checks of a written episode.

The checks read what the env wrote (tokens, masks, messages) with their own means
(a regex for the action, the tokenizer for the text), never with the env's parser.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from atroposlib.envs.base import APIServerConfig

ACTION = re.compile(r'<tool_call>\n\{"name": "take_action", "arguments": \{"action": "(\w+)"\}\}')
PENALTY = -1.5


def call(action: str, thought: str = "") -> str:
    """A well-formed reply that plays `action`, thinking `thought` first when given."""
    body = json.dumps({"name": "take_action", "arguments": {"action": action}})
    think = f"<think>{thought}</think>\n" if thought else ""
    return f"{think}<tool_call>\n{body}\n</tool_call>"


def played_actions(messages: list[dict[str, Any]]) -> list[str]:
    """The action of each assistant turn whose reply is a well-formed `call`."""
    found = [ACTION.search(m["content"]) for m in messages if m["role"] == "assistant"]
    return [match.group(1) for match in found if match]


def unmasked_runs(tokens: list[int], masks: list[int]) -> list[list[int]]:
    """The maximal runs of trained (mask != -100) positions, as token ids."""
    runs: list[list[int]] = []
    previous = -100
    for token, mask in zip(tokens, masks, strict=True):
        if mask != -100:
            assert mask == token
            if previous == -100:
                runs.append([])
            runs[-1].append(token)
        previous = mask
    return runs


def check_sequence(tokens: list[int], masks: list[int], messages: list[dict], tokenizer) -> None:
    """Trained are exactly the replies (each with its stop token): the system prompt, the
    observations and every tool result are in the sequence, masked."""
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    runs = [tokenizer.decode(run) for run in unmasked_runs(tokens, masks)]
    assert runs == [f"{reply}<|im_end|>" for reply in replies]
    text = tokenizer.decode(tokens)
    assert text.startswith("<|im_start|>system\n" + messages[0]["content"])
    at = 0
    for message in messages[1:]:  # every turn, in order, inside the one sequence
        at = text.index(message["content"], at) + len(message["content"])
    assert text.endswith(f"{replies[-1]}<|im_end|>")
    first = next(i for i, m in enumerate(masks) if m != -100)
    assert tokenizer.decode(tokens[:first]).endswith("<|im_start|>assistant\n")


def make_env(env_cls: type, model: Any, tiny_model_path: Path, **settings: Any) -> Any:
    """An env of `env_cls` playing against `model` (a ScriptedModel), built in-process."""
    config = env_cls.env_config_cls(
        tokenizer_name=str(tiny_model_path),
        use_wandb=False,
        ensure_scores_are_not_same=False,
        **{"group_size": 1, "max_tokens": 128, "max_token_length": 4096, **settings},
    )
    server = APIServerConfig(
        model_name="tiny", base_url=model.url, server_type="vllm", api_key="x", timeout=30
    )
    return env_cls(config, [server], slurm=False)


def collect(env: Any, seed: int) -> dict[str, Any]:
    """One group of `seed`, straight from `collect_trajectories`."""

    async def run() -> dict[str, Any]:
        await env.setup()
        group, backlog = await env.collect_trajectories({"seed": seed})
        assert backlog == []
        return group

    return asyncio.run(run())
