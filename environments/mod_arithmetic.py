r"""Modular arithmetic: "What is a + b mod 10?", scored 1.0 for the right digit.

Why this task: it is the smallest environment that can show real RL end to end
on a laptop CPU. The project's tiny model (`atroposlib.utils.tiny_model`) is
pretrained on exactly this ChatML conversation (same system line, same
question wording), so its samples are well-formed one-digit answers from the
first step. The reward is exact and verifiable (one digit: no judge, no
parsing heuristics), rollouts are two tokens long, and the whole task space is
100 problems, so a trainer step costs well under a second on CPU.

GRPO can only sharpen what the policy already partly knows: the task is
learnable in minutes from a model whose answers depend on the question (say
~30% right when sampled). A model that answers every question with the same
digit distribution (~10% right, chance) gives no usable signal, and no
learning rate fixes that.

There are only 100 problems, so `evaluate` has nothing held out: it reports
greedy accuracy on a fixed sample of them (`eval_size`).

Run it beside the trajectory API and a trainer:

    python environments/mod_arithmetic.py serve \
        --env.rollout_server_url http://127.0.0.1:8000 \
        --openai.base_url http://127.0.0.1:9001/v1 --openai.model_name tiny

or without an API (`process`: groups to jsonl plus an HTML viewer), or just
its greedy evaluation (`evaluate`). `--help` lists every `--env.*` and
`--openai.*` flag.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import Field

# `python environments/mod_arithmetic.py` puts environments/ on sys.path, not the repo root
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig
from atroposlib.utils.tiny_model import ensure_tiny_model

# The system line and the question wording the tiny model was trained on, from the one
# place that defines them.
from atroposlib.utils.tiny_model_training import SYSTEM_PROMPT
from atroposlib.utils.tiny_model_training import question_text as question_for


def answer_for(a: int, b: int) -> str:
    return str((a + b) % 10)


def score_answer(completion: str, answer: str) -> float:
    """1.0 when the completion is exactly the right digit (surrounding spaces ignored)."""
    return 1.0 if completion.strip() == answer else 0.0


class ModArithmeticConfig(BaseEnvConfig):
    """`BaseEnvConfig` plus the sampling and problem settings of this task."""

    seed: int = Field(0, description="Seed for the stream of training problems.")
    max_tokens: int = Field(
        4, ge=1, description="Most completion tokens per answer (a digit and <|im_end|> is 2)."
    )
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature for rollouts.")
    eval_size: int = Field(
        50,
        ge=1,
        le=100,
        description="Problems in the greedy evaluation: a fixed sample of the 100 (a, b) pairs.",
    )
    eval_seed: int = Field(1234, description="Seed that picks the evaluation problems.")


class ModArithmeticEnv(BaseEnv):
    """(a + b) mod 10 for one-digit a, b; reward 1.0 for the right digit, else 0."""

    name = "mod_arithmetic"
    env_config_cls = ModArithmeticConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # every sampled score since the last log, including groups dropped for equal scores
        self.recent_scores: list[float] = []

    @classmethod
    def config_init(cls) -> tuple[ModArithmeticConfig, APIServerConfig]:
        config = ModArithmeticConfig(
            tokenizer_name=str(ensure_tiny_model()),
            group_size=8,
            use_wandb=False,
            max_token_length=128,
            steps_per_eval=20,
            # keep groups whose samples all scored the same: they carry no gradient
            # (zero advantage), but then the trainer's score_mean is the policy's
            # real sampled accuracy, and a policy that collapses onto one answer
            # still produces batches instead of stalling the trainer
            ensure_scores_are_not_same=False,
        )
        server = APIServerConfig(
            model_name="tiny",
            base_url="http://127.0.0.1:9001/v1",
            server_type="vllm",
            timeout=120,
        )
        return config, server

    async def setup(self) -> None:
        self.rng = random.Random(self.config.seed)
        pairs = [(a, b) for a in range(10) for b in range(10)]
        self.eval_problems = random.Random(self.config.eval_seed).sample(
            pairs, self.config.eval_size
        )
        self.items_served = 0

    async def get_next_item(self) -> dict[str, int]:
        self.items_served += 1
        return {"a": self.rng.randrange(10), "b": self.rng.randrange(10)}

    @staticmethod
    def messages_for(item: dict[str, int]) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question_for(item["a"], item["b"])},
        ]

    def score(self, completion: str, item: dict[str, int]) -> float:
        return score_answer(completion, answer_for(item["a"], item["b"]))

    async def collect_trajectories(self, item: dict[str, int]) -> tuple[dict[str, Any], list]:
        """One group: `group_size` samples of the same question, each scored 0 or 1."""
        group = await self.sample_group(
            self.messages_for(item),
            lambda completion: self.score(completion, item),
            max_tokens=self.config.max_tokens,
            temperature=self.config.temperature,
        )
        self.recent_scores.extend(group["scores"])
        return group, []

    async def wandb_log(self, wandb_metrics: dict | None = None) -> None:
        """Adds train/accuracy: the share of all sampled answers that were right."""
        metrics = dict(wandb_metrics or {})
        if self.recent_scores:
            metrics["train/accuracy"] = sum(self.recent_scores) / len(self.recent_scores)
            metrics["train/samples"] = len(self.recent_scores)
            self.recent_scores = []
        await super().wandb_log(metrics)

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """Greedy accuracy over the fixed evaluation problems."""
        started = time.time()

        async def one(a: int, b: int) -> dict[str, Any]:
            chat = await self.server.chat_completion(
                messages=self.messages_for({"a": a, "b": b}),
                max_tokens=self.config.max_tokens,
                temperature=0.0,
                split="eval",
            )
            completion = chat.choices[0].message.content or ""
            answer = answer_for(a, b)
            return {
                "question": question_for(a, b),
                "answer": answer,
                "completion": completion,
                "score": score_answer(completion, answer),
            }

        samples = await asyncio.gather(*(one(a, b) for a, b in self.eval_problems))
        accuracy = sum(s["score"] for s in samples) / len(samples)
        await self.evaluate_log(
            {"eval/accuracy": accuracy},
            start_time=started,
            end_time=time.time(),
            generation_parameters={"temperature": 0.0, "max_tokens": self.config.max_tokens},
            samples=samples,
        )


if __name__ == "__main__":
    ModArithmeticEnv.cli()
