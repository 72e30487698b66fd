"""`SingleTurnEnv`: the shape most library environments share, written once.

A single-turn task is an item, the chat it becomes, and a score for each completion
against that item. Training samples a group through `sample_group` (ManagedServer:
exact tokens, masks and logprobs); `evaluate` answers the eval items greedily
(`max_eval_workers` at a time; samples stay in item order) and writes upstream's
metrics.json and samples.jsonl through `evaluate_log`. A subclass fills in
`messages_for`, `score` and where its items come from, and overrides `eval_metrics`
to add breakdowns (per subject, per level).
"""

from __future__ import annotations

import asyncio
import random
import time
from abc import abstractmethod
from collections.abc import Awaitable
from typing import Any

from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.type_definitions import Item


class SingleTurnConfig(BaseEnvConfig):
    """`BaseEnvConfig` plus sampling and evaluation settings of a single-turn task."""

    max_tokens: int = Field(512, ge=1, description="Most completion tokens per rollout.")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature for rollouts.")
    eval_size: int = Field(200, ge=1, description="Most items in one evaluation.")
    seed: int = Field(0, description="Seed for shuffling or generating training items.")


class SingleTurnEnv(BaseEnv):
    """Items in, scored groups out; subclasses set `train_items` and `eval_items` in setup."""

    env_config_cls = SingleTurnConfig
    config: SingleTurnConfig  # a type only: BaseEnv.__init__ sets it (config_init builds one)
    train_items: list[Item]
    eval_items: list[Item]

    @abstractmethod
    def messages_for(self, item: Item) -> list[dict[str, Any]]:
        """The chat the policy answers for this item."""

    @abstractmethod
    def score(self, completion: str, item: Item) -> float | Awaitable[float]:
        """One completion's reward."""

    def eval_record(self, item: Item) -> dict[str, Any]:
        """What an eval sample shows of its item besides the response and score."""
        return {}

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """Breakdowns beyond accuracy and mean score (per subject...)."""
        return {}

    def shuffle_train_items(self) -> None:
        random.Random(self.config.seed).shuffle(self.train_items)
        self._position = 0

    async def get_next_item(self) -> Item:
        position = getattr(self, "_position", 0)
        self._position = position + 1
        return self.train_items[position % len(self.train_items)]

    async def collect_trajectories(self, item: Item) -> tuple[Any, list]:
        group = await self.sample_group(
            self.messages_for(item),
            lambda completion: self.score(completion, item),
            max_tokens=self.config.max_tokens,
            temperature=self.config.temperature,
        )
        return group, []

    async def _answer(self, item: Item) -> dict[str, Any]:
        chat = await self.server.chat_completion(
            messages=self.messages_for(item),
            max_tokens=self.config.max_tokens,
            temperature=0.0,
            split="eval",
        )
        response = chat.choices[0].message.content or ""
        value = self.score(response, item)
        value = float(await value if isinstance(value, Awaitable) else value)
        return {**self.eval_record(item), "response": response, "score": value}

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        started = time.time()
        slots = asyncio.Semaphore(max(1, self.config.max_eval_workers))

        async def answer(item: Item) -> dict[str, Any]:
            async with slots:
                return await self._answer(item)

        items = self.eval_items[: self.config.eval_size]
        samples = list(await asyncio.gather(*(answer(item) for item in items)))
        count = max(1, len(samples))
        metrics = {
            "eval/accuracy": sum(s["score"] >= 1.0 for s in samples) / count,
            "eval/mean_score": sum(s["score"] for s in samples) / count,
            **self.eval_metrics(samples),
        }
        await self.evaluate_log(
            metrics,
            samples=samples,
            start_time=started,
            end_time=time.time(),
            generation_parameters={"temperature": 0.0, "max_tokens": self.config.max_tokens},
        )
