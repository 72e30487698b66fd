"""`SingleTurnEnv`: the shape most library environments share, written once.

A single-turn task is an item, the chat it becomes, and a score for each completion
against that item. Training samples a group through `ManagedServer` (exact tokens, masks
and logprobs); `evaluate` answers the eval items greedily (`max_eval_workers` at a time;
samples stay in item order) and writes upstream's metrics.json and samples.jsonl
through `evaluate_log`. A subclass fills in `messages_for`, `score` and where its items
come from (`train_items`, `eval_items` in setup); everything else is an optional hook:

- `score_sample(sample, item)`: scoring that needs more than the text: a `Sample`
  carries the finish reason (`sample.truncated`), the completion's token ids and, in
  evaluation, the API's message (its parsed `tool_calls`);
- `reward` (a config field, no code): score training samples with a registered reward
  or a plain function instead (`envs/reward_spec.py`); evaluation keeps `score_sample`;
- `sampling_for(item, split)`: per-item sampling arguments (`tools=`, `top_p=`...);
- `finish_group(group, samples)`: reshape a scored group (a length penalty);
  `zero_truncated_advantage()` masks completions cut off at `max_tokens`;
- `train_metrics(groups)`: what `wandb_log` adds from the raw scores of the groups
  sampled since the last log (default `train/percent_correct`);
- `eval_sample(item, sample)` and `eval_summary(samples)`: an eval sample's record and
  the metrics of a whole evaluation (default `eval/accuracy`, `eval/mean_score` plus
  `eval_metrics`, for per-subject breakdowns).

The position in `train_items` is saved in the env checkpoint (`position`), so a resumed
run goes on where it stopped. A task that generates its items instead overrides
`get_next_item` (and counts them in `position`).
"""

from __future__ import annotations

import asyncio
import random
import time
from abc import abstractmethod
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from pydantic import Field, field_validator

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, maybe_await
from atroposlib.envs.reward_spec import load_reward
from atroposlib.envs.scored_data import ScoredDataGroup, group_from_chat
from atroposlib.type_definitions import Item


class SingleTurnConfig(BaseEnvConfig):
    """`BaseEnvConfig` plus sampling and evaluation settings of a single-turn task."""

    max_tokens: int = Field(512, ge=1, description="Most completion tokens per rollout.")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature for rollouts.")
    eval_size: int = Field(200, ge=1, description="Most items in one evaluation.")
    seed: int = Field(0, description="Seed for shuffling or generating training items.")
    reward: str | None = Field(
        None,
        description="Score training samples with this reward instead of the environment's "
        "`score_sample` (evaluation keeps its own): a registered reward name, "
        "module:function or path/to/file.py:function (TRL's signature: completions, "
        "prompts and the item's fields as lists); see docs/rollouts.md.",
    )

    @field_validator("reward")
    @classmethod
    def _reward_loads(cls, spec: str | None) -> str | None:
        """A reward that cannot load is refused with the config, before anything starts
        (the launcher's checks parse each environment's config)."""
        if spec:
            load_reward(spec)
        return spec


@dataclass(frozen=True)
class Sample:
    """One completion as scoring sees it."""

    text: str
    finish_reason: str | None = None
    tokens: tuple[int, ...] = ()  # the completion's token ids (training samples only)
    message: Any = None  # the API's message (tool_calls...; evaluation samples only)

    @property
    def truncated(self) -> bool:
        """Cut off at `max_tokens`."""
        return self.finish_reason == "length"


class SingleTurnEnv(BaseEnv):
    """Items in, scored groups out; subclasses set `train_items` and `eval_items` in setup."""

    env_config_cls = SingleTurnConfig
    config: SingleTurnConfig  # a type only: BaseEnv.__init__ sets it (config_init builds one)
    train_items: list[Item]
    eval_items: list[Item]
    position = 0  # items served from train_items; saved in the env checkpoint

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.train_scores: list[list[float]] = []  # raw group scores since the last log
        # the config's reward (checked with the config); an environment built on a plain
        # BaseEnvConfig, as upstream's subclasses may be, has none
        spec = getattr(self.config, "reward", None)
        self.configured_reward = load_reward(spec) if spec else None

    # ------------------------------------------------------------------ the task
    @abstractmethod
    def messages_for(self, item: Item) -> list[dict[str, Any]]:
        """The chat the policy answers for this item."""

    @abstractmethod
    def score(self, completion: str, item: Item) -> float | Awaitable[float]:
        """One completion's reward."""

    def score_sample(self, sample: Sample, item: Item) -> float | Awaitable[float]:
        """One sample's reward; override to use its finish reason, tokens or message."""
        return self.score(sample.text, item)

    def training_reward(self, sample: Sample, item: Item) -> float | Awaitable[float]:
        """A training sample's reward: the config's `reward` when set, else `score_sample`
        (evaluation always scores with the environment's own `score_sample`)."""
        if self.configured_reward is not None:
            return self.configured_reward.score(sample.text, self.messages_for(item), item)
        return self.score_sample(sample, item)

    def sampling_for(self, item: Item, split: str) -> dict[str, Any]:
        """Extra sampling arguments for this item ("train" or "eval"): tools=, top_p=..."""
        return {}

    def zero_truncated_advantage(self) -> bool:
        """Zero the advantage of completions cut off at `max_tokens`."""
        return False

    def finish_group(self, group: ScoredDataGroup, samples: list[Sample]) -> ScoredDataGroup:
        """The scored group before it is sent (a length penalty goes here)."""
        return group

    def train_metrics(self, groups: list[list[float]]) -> dict[str, float]:
        """What wandb_log adds from the raw scores of the groups sampled since the last log."""
        scores = [s for group in groups for s in group]
        return {"train/percent_correct": sum(s >= 1.0 - 1e-9 for s in scores) / len(scores)}

    # ---------------------------------------------------------------- evaluation
    def eval_record(self, item: Item) -> dict[str, Any]:
        """What an eval sample shows of its item besides the response and score."""
        return {}

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """Breakdowns beyond accuracy and mean score (per subject...)."""
        return {}

    async def eval_sample(self, item: Item, sample: Sample) -> dict[str, Any]:
        """One eval sample's record (it needs a "score")."""
        value = float(await maybe_await(self.score_sample(sample, item)))
        return {**self.eval_record(item), "response": sample.text, "score": value}

    def eval_summary(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """The metrics of one evaluation."""
        count = max(1, len(samples))
        return {
            "eval/accuracy": sum(s["score"] >= 1.0 for s in samples) / count,
            "eval/mean_score": sum(s["score"] for s in samples) / count,
            **self.eval_metrics(samples),
        }

    # ----------------------------------------------------------------- training
    def shuffle_train_items(self) -> None:
        random.Random(self.config.seed).shuffle(self.train_items)
        self.position = 0

    async def get_next_item(self) -> Item:
        item = self.train_items[self.position % len(self.train_items)]
        self.position += 1
        return item

    def save_checkpoint(self, step: int, data: dict | None = None) -> None:
        """Keeps the position in `train_items` across restarts (a stream of generated
        items, with no `train_items`, saves only what it is given)."""
        if getattr(self, "train_items", None):
            data = {**(data or {}), "position": self.position}
        super().save_checkpoint(step, data)

    def sample_from(self, choice: Any, node: Any) -> Sample:
        """A training sample: the choice's text and finish reason, the node's completion."""
        tokens = tuple(t for t, m in zip(node.tokens, node.masked_tokens, strict=True) if m != -100)
        return Sample(choice.message.content or "", choice.finish_reason, tokens)

    async def collect_trajectories(self, item: Item) -> tuple[Any, list]:
        messages = self.messages_for(item)
        choices, nodes = await self.sample_chat(
            messages,
            max_tokens=self.config.max_tokens,
            temperature=self.config.temperature,
            **self.sampling_for(item, "train"),
        )
        samples = [self.sample_from(c, n) for c, n in zip(choices, nodes, strict=True)]
        outcomes = [maybe_await(self.training_reward(s, item)) for s in samples]
        scores = [float(value) for value in await asyncio.gather(*outcomes)]
        self.train_scores.append(scores)
        group = group_from_chat(messages, [s.text for s in samples], nodes, scores)
        if self.zero_truncated_advantage() and any(s.truncated for s in samples):
            group["overrides"] = [
                {"set_advantage_to_zero": True} if s.truncated else {} for s in samples
            ]
        return self.finish_group(group, samples), []

    async def wandb_log(self, wandb_metrics: dict | None = None) -> None:
        """Adds `train_metrics` of the groups sampled since the last log."""
        metrics = dict(wandb_metrics or {})
        if self.train_scores:
            metrics.update(self.train_metrics(self.train_scores))
            self.train_scores = []
        await super().wandb_log(metrics)

    # ---------------------------------------------------------------- evaluate
    async def _answer(self, item: Item) -> dict[str, Any]:
        chat = await self.server.chat_completion(
            messages=self.messages_for(item),
            max_tokens=self.config.max_tokens,
            temperature=0.0,
            split="eval",
            **self.sampling_for(item, "eval"),
        )
        choice = chat.choices[0]
        sample = Sample(choice.message.content or "", choice.finish_reason, message=choice.message)
        return await self.eval_sample(item, sample)

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        started = time.time()
        slots = asyncio.Semaphore(max(1, self.config.max_eval_workers))

        async def answer(item: Item) -> dict[str, Any]:
            async with slots:
                return await self._answer(item)

        items = self.eval_items[: self.config.eval_size]
        samples = list(await asyncio.gather(*(answer(item) for item in items)))
        await self.evaluate_log(
            self.eval_summary(samples),
            samples=samples,
            start_time=started,
            end_time=time.time(),
            generation_parameters={"temperature": 0.0, "max_tokens": self.config.max_tokens},
        )


__all__ = ["Sample", "SingleTurnConfig", "SingleTurnEnv"]
