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
`--openai.*` flag. Offline, on the tiny model (environments/README.md serves it;
the env reads its tokenizer from the tiny model's cache, built on first use):

    python environments/mod_arithmetic.py process --env.total_steps 2 \
        --openai.base_url http://127.0.0.1:9001/v1 --openai.model_name tiny
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

from pydantic import Field

# `python environments/mod_arithmetic.py` puts environments/ on sys.path, not the repo root
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.base import APIServerConfig
from atroposlib.envs.single_turn import Sample, SingleTurnConfig, SingleTurnEnv
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


class ModArithmeticConfig(SingleTurnConfig):
    """`SingleTurnConfig` plus the sampling and problem settings of this task."""

    seed: int = Field(0, description="Seed for the stream of training problems.")
    max_tokens: int = Field(
        4, ge=1, description="Most completion tokens per answer (a digit and <|im_end|> is 2)."
    )
    eval_size: int = Field(
        50,
        ge=1,
        le=100,
        description="Problems in the greedy evaluation: a fixed sample of the 100 (a, b) pairs.",
    )
    eval_seed: int = Field(1234, description="Seed that picks the evaluation problems.")


class ModArithmeticEnv(SingleTurnEnv):
    """(a + b) mod 10 for one-digit a, b; reward 1.0 for the right digit, else 0."""

    name = "mod_arithmetic"
    env_config_cls = ModArithmeticConfig
    config: ModArithmeticConfig

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
        chosen = random.Random(self.config.eval_seed).sample(pairs, self.config.eval_size)
        self.eval_items = [{"a": a, "b": b} for a, b in chosen]

    async def get_next_item(self) -> dict[str, int]:
        """A fresh random problem (a stream, not a list: `position` counts them)."""
        self.position += 1
        return {"a": self.rng.randrange(10), "b": self.rng.randrange(10)}

    def messages_for(self, item: dict[str, int]) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question_for(item["a"], item["b"])},
        ]

    def score(self, completion: str, item: dict[str, int]) -> float:
        return score_answer(completion, answer_for(item["a"], item["b"]))

    def train_metrics(self, groups: list[list[float]]) -> dict[str, float]:
        """train/accuracy: the share of all sampled answers that were right."""
        scores = [s for group in groups for s in group]
        return {"train/accuracy": sum(scores) / len(scores), "train/samples": len(scores)}

    async def eval_sample(self, item: dict[str, int], sample: Sample) -> dict[str, Any]:
        return {
            "question": question_for(item["a"], item["b"]),
            "answer": answer_for(item["a"], item["b"]),
            "completion": sample.text,
            "score": self.score(sample.text, item),
        }

    def eval_summary(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """Greedy accuracy over the fixed evaluation problems."""
        return {"eval/accuracy": sum(s["score"] for s in samples) / max(1, len(samples))}


if __name__ == "__main__":
    ModArithmeticEnv.cli()
