"""Multi-turn tool use: call tools the env executes, read their results, then answer.

Task: a question that needs the tools (`tool_use_multiturn_tools.py`): a calculator, a
unit converter and a lookup in a small shipped country table, e.g. "What is the
population density of Japan ...?" (two lookups, then a division). The model calls tools
with hermes `<tool_call>` blocks (parallel calls allowed); the env executes each call and
sends the JSON result back as a `role: tool` turn; this repeats until the model replies
without a call, with the final answer inside `<answer></answer>`, or `max_turns` replies
were made.

Reward: 1.0 for a right final answer (numbers within half a unit of the requested
rounding, so an unrounded right value counts; text compared without case and
punctuation), 0.0 for a wrong or missing one. A reply with a malformed call (a block
that is not a JSON object with a name and object arguments, or one left unclosed) ends
the episode at `-malformed_penalty`; running out of turns, or of the token budget,
scores `-turn_limit_penalty`. Both are below any answered episode, so the format is
learnt first. A call to an unknown tool or with bad arguments is not penalised: its
error comes back as the result and the model may recover, at the cost of a turn.

Design decisions:
- One episode, one sequence. Every turn of an episode goes through one `ManagedServer`
  (hermes tool parser on, so the tools are rendered for the model), so the whole
  conversation is one node: every reply is trained on, the prompt and every tool result
  are masked (-100). Each sample of a group is its own episode with its own managed
  server, so identical replies in different samples never merge into one node.
- What the model wrote is what is parsed and scored: the reply's own tokens, read with
  the "tool_call" reward's parser (calls inside `<think>` are not made). The reply goes
  back verbatim as the assistant turn, so the next prompt extends the same tokens.
- Items are generated, not loaded: `task_for(seed, index)` with the shipped table
  (`data/tool_use_multiturn/countries.jsonl`). Upstream's tool_use_multiturn_server
  replays the recorded tool results of interstellarninja/toolace_hermes_sequential_tool_use;
  executing real tools instead means a call is judged by what it returns, not by
  matching the recording. Evaluation plays the fixed tasks of `eval_seed`, greedily,
  through the same loop (a server with token ids, as for training).

Offline: the first prompt holds the tools' JSON schemas, about 1,800 tokens with the tiny
model's byte-level tokenizer, more than its 512-token context, and each turn adds to it, so
this env needs a larger model, such as its default on vLLM (GPU; the env's default port is
9004):

    python -m vllm.entrypoints.openai.api_server \\
        --model NousResearch/DeepHermes-3-Llama-3-8B-Preview --port 9004 &
    python environments/tool_use_multiturn_server.py process --env.total_steps 4

The tiny model (environments/README.md) cannot learn the task, but served with a longer
context, in place of the 512-token one, and with the episode's token budget
(`max_token_length`) cut to that context, it runs the pipeline (tools in the prompt, the
turn loop, scoring, the groups file and its viewer); its replies are noise either way:

    atropos-inference-server --model ./tiny-model --port 9001 --served-model-name tiny \\
        --max-model-len 4096 &
    python environments/tool_use_multiturn_server.py process --env.total_steps 2 \\
        --env.group_size 2 --env.max_tokens 64 --env.max_token_length 4096 \\
        --env.ensure_scores_are_not_same false --env.use_wandb false \\
        --env.tokenizer_name ./tiny-model --openai.base_url http://127.0.0.1:9001/v1 \\
        --openai.model_name tiny
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.reward_fns.tool_call_reward import (
    parse_tool_calls,
    response_part,
)
from atroposlib.envs.server_handling.chat_prompt import (
    render_prompt,
    template_renders_tools,
)
from environments.tool_use_multiturn_tools import KINDS, TOOLS, execute, task_for

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You solve the user's question with the tools you are given. Call a tool with a "
    '<tool_call>{"name": ..., "arguments": {...}}</tool_call> block; its result comes back '
    "to you. Call as many tools, over as many turns, as you need. When you know the "
    "answer, reply without any tool call and put the final answer alone inside "
    "<answer></answer>, for example <answer>42</answer>."
)
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
PROMPT_MARGIN = 8  # tokens: re-encoding a whole prompt may split a boundary differently


def answer_right(reply: str, task: dict[str, Any]) -> bool:
    """Whether the reply's last `<answer>` (outside `<think>`) is the task's answer."""
    found = ANSWER.findall(response_part(reply))
    if not found:
        return False
    given, expected = found[-1].strip(), task["answer"]
    if isinstance(expected, str):
        plain = lambda s: re.sub(r"[\W_]+", " ", s).strip().casefold()  # noqa: E731
        return plain(given) == plain(expected)
    numbers = NUMBER.findall(given.replace(",", ""))
    if len(numbers) != 1:
        return False
    decimals = task["decimals"]
    tolerance = 1e-6 if decimals is None else 0.5 * 10.0**-decimals + 1e-9
    return abs(float(numbers[0]) - float(expected)) <= tolerance


@dataclass
class Episode:
    """One played task: the conversation, its final node, how it ended and its score."""

    task: dict[str, Any]
    messages: list[dict[str, Any]]
    node: Any = None
    outcome: str = "limit"  # answered | malformed | limit | budget
    correct: bool = False
    tool_calls: int = 0
    tool_errors: int = 0
    score: float = 0.0
    calls: list[dict[str, Any]] = field(default_factory=list)


class ToolUseMultiturnConfig(BaseEnvConfig):
    """`BaseEnvConfig` plus the task stream, the turn limit, the penalties and sampling."""

    seed: int = Field(0, description="Seed of the training task stream.")
    eval_seed: int = Field(1_000_000, description="Seed of the fixed evaluation tasks.")
    eval_size: int = Field(50, ge=1, description="Tasks in the greedy evaluation.")
    task_kinds: str = Field(
        ",".join(KINDS), description=f"Comma-separated task kinds, of: {', '.join(KINDS)}."
    )
    max_turns: int = Field(5, ge=1, description="Most assistant replies per episode.")
    malformed_penalty: float = Field(0.2, ge=0.0, description="Score -x for a malformed call.")
    turn_limit_penalty: float = Field(0.2, ge=0.0, description="Score -x for no final answer.")
    max_tokens: int = Field(512, ge=1, description="Most tokens per reply.")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature for rollouts.")

    @field_validator("task_kinds")
    @classmethod
    def _known_kinds(cls, value: str) -> str:
        kinds = [k.strip() for k in value.split(",") if k.strip()]
        unknown = sorted(set(kinds) - set(KINDS))
        if not kinds or unknown:
            raise ValueError(f"task kinds must be among {', '.join(KINDS)} (got {value!r})")
        return ",".join(kinds)


class ToolUseMultiturnEnv(BaseEnv):
    """Questions solved over several turns of real tool calls; 1 for the right answer."""

    name = "tool_use_multiturn"
    env_config_cls = ToolUseMultiturnConfig
    config_defaults = {
        "tokenizer_name": "NousResearch/DeepHermes-3-Llama-3-8B-Preview",
        "group_size": 8,
        "max_token_length": 8192,
        "steps_per_eval": 50,
        "use_wandb": True,
    }
    server_defaults = {"base_url": "http://localhost:9004/v1"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recent: list[Episode] = []
        self._native_tools: bool | None = None

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self.config.task_kinds.split(","))

    async def setup(self) -> None:
        self.server.tool_parser = "hermes"
        self.index = 0

    async def get_next_item(self) -> dict[str, Any]:
        self.index += 1
        return task_for(self.config.seed, self.index - 1, self.kinds)

    def _budget(self) -> int:
        limit = self.config.max_token_length
        return min(limit, self.max_token_len) if self.max_token_len > 0 else limit

    def _prompt_tokens(self, messages: list[dict[str, Any]]) -> int:
        if self._native_tools is None:
            self._native_tools = template_renders_tools(self.tokenizer)
        text = render_prompt(self.tokenizer, messages, tools=TOOLS, native_tools=self._native_tools)
        return len(self.tokenizer.encode(text, add_special_tokens=True)) + PROMPT_MARGIN

    def _reply_text(self, node: Any, before: int) -> str:
        """The latest reply as sampled: the node's tokens after `before`, less a stop token."""
        ids = list(node.tokens[before:])
        start = next((i for i, m in enumerate(node.masked_tokens[before:]) if m != -100), len(ids))
        ids = ids[start:]
        special = set(getattr(self.tokenizer, "all_special_ids", None) or [])
        while ids and ids[-1] in special:
            ids.pop()
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    async def play(self, task: dict[str, Any], temperature: float, split: str = "train") -> Episode:
        """One episode of `task` (see the module doc for the rules)."""
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task["question"]},
        ]
        episode = Episode(task=task, messages=messages)
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            for _ in range(self.config.max_turns):
                room = self._budget() - self._prompt_tokens(messages)
                if room < 1:
                    episode.outcome = "budget"
                    break
                before = len(episode.node.tokens) if episode.node is not None else 0
                await managed.chat_completion(
                    messages=messages,
                    tools=TOOLS,
                    n=1,
                    max_tokens=min(self.config.max_tokens, room),
                    temperature=temperature,
                    split=split,
                )
                nodes = managed.get_state()["nodes"]
                if len(nodes) != 1:
                    logger.warning(
                        "an episode spans %d sequences; training on the last", len(nodes)
                    )
                episode.node = nodes[-1]
                reply = self._reply_text(episode.node, before)
                messages.append({"role": "assistant", "content": reply})
                calls = parse_tool_calls(reply)
                if calls is None:
                    episode.outcome = "malformed"
                    break
                if not calls:
                    episode.outcome, episode.correct = "answered", answer_right(reply, task)
                    break
                for call in calls:
                    result, ok = execute(call["name"], call["arguments"])
                    episode.calls.append({**call, "result": result})
                    episode.tool_calls += 1
                    episode.tool_errors += not ok
                    messages.append({"role": "tool", "name": call["name"], "content": result})
        if messages[-1]["role"] == "tool":  # results nobody read are not in the sequence
            while messages[-1]["role"] == "tool":
                messages.pop()
        episode.score = self.score(episode)
        return episode

    def score(self, episode: Episode) -> float:
        if episode.outcome == "answered":
            return 1.0 if episode.correct else 0.0
        if episode.outcome == "malformed":
            return -self.config.malformed_penalty
        return -self.config.turn_limit_penalty

    async def collect_trajectories(
        self, item: dict[str, Any]
    ) -> tuple[dict[str, Any] | None, list]:
        """`group_size` episodes of one task, each one whole sequence."""
        episodes = await asyncio.gather(
            *(self.play(item, self.config.temperature) for _ in range(self.config.group_size))
        )
        if any(episode.node is None for episode in episodes):
            logger.error("task %s: the first prompt does not fit the token budget", item["index"])
            return None, []
        self.recent.extend(episodes)
        group = {
            "tokens": [e.node.tokens for e in episodes],
            "masks": [e.node.masked_tokens for e in episodes],
            "scores": [e.score for e in episodes],
            "inference_logprobs": [e.node.logprobs for e in episodes],
            "messages": [e.messages for e in episodes],
        }
        return group, []

    async def wandb_log(self, wandb_metrics: dict | None = None) -> None:
        """Adds train/accuracy, the outcome rates and tool calls per episode."""
        metrics = dict(wandb_metrics or {})
        if self.recent:
            metrics.update(summary(self.recent, "train"))
            self.recent = []
        await super().wandb_log(metrics)

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """Greedy episodes of the fixed evaluation tasks."""
        started = time.time()
        tasks = [
            task_for(self.config.eval_seed, i, self.kinds) for i in range(self.config.eval_size)
        ]
        episodes = await asyncio.gather(*(self.play(t, 0.0, split="eval") for t in tasks))
        samples = [
            {
                "question": e.task["question"],
                "kind": e.task["kind"],
                "answer": e.task["answer"],
                "final_reply": next(
                    (m["content"] for m in reversed(e.messages) if m["role"] == "assistant"), ""
                ),
                "outcome": e.outcome,
                "correct": e.correct,
                "score": e.score,
                "calls": e.calls,
            }
            for e in episodes
        ]
        await self.evaluate_log(
            summary(episodes, "eval"),
            start_time=started,
            end_time=time.time(),
            generation_parameters={
                "temperature": 0.0,
                "max_tokens": self.config.max_tokens,
                "max_turns": self.config.max_turns,
            },  # fmt: skip
            samples=samples,
        )


def summary(episodes: list[Episode], prefix: str) -> dict[str, float]:
    """Accuracy, mean score, outcome rates and tool calls per episode."""
    count = max(1, len(episodes))
    return {
        f"{prefix}/accuracy": sum(e.correct for e in episodes) / count,
        f"{prefix}/mean_score": sum(e.score for e in episodes) / count,
        f"{prefix}/malformed_rate": sum(e.outcome == "malformed" for e in episodes) / count,
        f"{prefix}/turn_limit_rate": sum(e.outcome in ("limit", "budget") for e in episodes)
        / count,
        f"{prefix}/tool_calls_per_episode": sum(e.tool_calls for e in episodes) / count,
        f"{prefix}/tool_error_rate": sum(e.tool_errors for e in episodes)
        / max(1, sum(e.tool_calls for e in episodes)),
    }


if __name__ == "__main__":
    ToolUseMultiturnEnv.cli()
