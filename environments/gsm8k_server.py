"""GSM8K: grade-school math word problems, scored 1.0 when the final number is right.

The GPU example of the project (`configs/gsm8k_vllm.yaml`): a real model from
the hub (e.g. Qwen2.5-1.5B-Instruct) served by vLLM learns to reason to the
right number. The reward is verifiable: the last number of the completion
(preferably inside \\boxed{...}) must equal the number after "####" in the
dataset's answer. The dataset comes from the hub (`openai/gsm8k`, needs
`pip install datasets`) or from a local jsonl with `question` and `answer`
fields (`--env.dataset_path`), which is how it is tested offline.

    python environments/gsm8k_server.py serve \
        --openai.base_url http://localhost:9001/v1 --openai.model_name Qwen/Qwen2.5-1.5B-Instruct
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig  # noqa: E402

SYSTEM_PROMPT = "Solve the problem step by step, then give the final number as \\boxed{ANSWER}."
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
BOXED = re.compile(r"\\boxed\{([^}]*)\}")


def parse_number(text: str) -> float | None:
    """The number a completion commits to: the last \\boxed{} if any, else its last number."""
    boxed = BOXED.findall(text)
    source = boxed[-1] if boxed else text
    numbers = NUMBER.findall(source)
    if not numbers:
        return None
    try:
        return float(numbers[-1].replace(",", ""))
    except ValueError:
        return None


def reference_answer(answer: str) -> float | None:
    """GSM8K answers end with '#### <number>'."""
    return parse_number(answer.split("####")[-1])


def score(completion: str, reference: float | None) -> float:
    found = parse_number(completion)
    return 1.0 if found is not None and reference is not None and found == reference else 0.0


class GSM8KConfig(BaseEnvConfig):
    """`BaseEnvConfig` plus where the problems come from and how to sample."""

    dataset_name: str = Field("openai/gsm8k", description="Hub dataset (config 'main').")
    dataset_path: str | None = Field(
        None, description="Local jsonl with question/answer fields instead of the hub."
    )
    max_tokens: int = Field(1024, ge=1, description="Most completion tokens per rollout.")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature for rollouts.")
    eval_size: int = Field(200, ge=1, description="Test problems in the greedy evaluation.")
    seed: int = Field(0, description="Shuffle seed for the training problems.")


class GSM8KEnv(BaseEnv):
    name = "gsm8k"
    env_config_cls = GSM8KConfig

    @classmethod
    def config_init(cls) -> tuple[GSM8KConfig, list[APIServerConfig]]:
        config = GSM8KConfig(
            tokenizer_name="Qwen/Qwen2.5-1.5B-Instruct",
            group_size=16,
            max_token_length=2048,
            steps_per_eval=50,
            use_wandb=True,
        )
        server = APIServerConfig(
            model_name="Qwen/Qwen2.5-1.5B-Instruct",
            base_url="http://localhost:9001/v1",
            server_type="vllm",
            num_requests_for_eval=64,
        )
        return config, [server]

    def _load(self, split: str) -> list[dict[str, str]]:
        if self.config.dataset_path:
            lines = Path(self.config.dataset_path).read_text().splitlines()
            return [json.loads(line) for line in lines if line.strip()]
        from datasets import load_dataset

        return list(load_dataset(self.config.dataset_name, "main", split=split))

    async def setup(self) -> None:
        self.train = self._load("train")
        self.test = self._load("test")[: self.config.eval_size]
        random.Random(self.config.seed).shuffle(self.train)
        self.position = 0

    async def get_next_item(self) -> dict[str, str]:
        item = self.train[self.position % len(self.train)]
        self.position += 1
        return item

    def _messages(self, question: str) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ]

    async def collect_trajectories(self, item: dict[str, str]) -> tuple[dict[str, Any], list]:
        reference = reference_answer(item["answer"])
        group = await self.sample_group(
            self._messages(item["question"]),
            lambda completion: score(completion, reference),
            max_tokens=self.config.max_tokens,
            temperature=self.config.temperature,
        )
        return group, []

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        correct = 0
        for item in self.test:
            chat = await self.server.chat_completion(
                messages=self._messages(item["question"]),
                max_tokens=self.config.max_tokens,
                temperature=0.0,
                split="eval",
            )
            correct += score(
                chat.choices[0].message.content or "", reference_answer(item["answer"])
            )
        await self.evaluate_log({"eval/accuracy": correct / max(1, len(self.test))})


if __name__ == "__main__":
    GSM8KEnv.cli()
