r"""GSM8K: grade-school math word problems, answered as `<think>...</think> ... \boxed{N}`.

Task: a word problem from openai/gsm8k; the model reasons inside `<think> </think>` and
ends with the final number in `\boxed{}`. The GPU example of the project
(`configs/gsm8k_vllm.yaml`, Qwen2.5-1.5B-Instruct on vLLM) trains on it.

Reward ("math_think" from the reward registry, as a function):
`correct - think_format_weight * malformed`. `correct` is math-verify's verdict on the
boxed answer(s) after `</think>` against the number after "####" in the dataset's
`answer` (thousands separators dropped), so `\boxed{1,234}`, `\boxed{\$18}` and
`\boxed{18.0}` all count for 18 while a `\boxed{18}` left inside the reasoning, hedged
answers (`\boxed{16} or \boxed{18}`) and an unclosed `<think>` do not. `malformed` is 1
when the completion is not one non-empty `<think>` block followed by an answer
(upstream's gsm8k only grades after `</think>`; the small penalty makes the shape itself
learnable). A completion cut off at `max_tokens` scores `-think_format_weight` and its
advantage is zeroed. As upstream does, a group whose samples are all right gets a linear
length penalty past half of `max_tokens`, so it still teaches brevity instead of being
dropped for equal scores.

Data: `openai/gsm8k` (subset `main`, splits train/test, columns `question` and `answer`
with worked steps and a final `#### N`) with `--env.data_source hub`; by default the
authored sample in `environments/data/gsm8k/` (42 train, 30 test rows in those columns);
`--env.dataset_path` reads any jsonl in that format for both splits.

Evaluate: greedy answers to the first `eval_size` test problems; `eval/percent_correct`
(upstream's name) and `eval/format_rate`, with one sample per problem (question, gold,
response, score) in samples.jsonl.

Offline, on the sample:

    python environments/gsm8k_server.py process --env.total_steps 4 --env.use_wandb false \
        --env.tokenizer_name <model dir> --openai.base_url http://127.0.0.1:9001/v1 \
        --openai.model_name tiny --openai.server_type vllm
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig
from atroposlib.envs.data_source import DataSourceConfig, load_rows
from atroposlib.envs.reward_fns.math_think_reward import math_think_score
from atroposlib.envs.reward_fns.math_verify_reward import grade_answer
from atroposlib.envs.reward_fns.think_format_reward import think_format_ok
from atroposlib.envs.scored_data import group_from_chat

SAMPLE_DIR = Path(__file__).resolve().parent / "data" / "gsm8k"
SYSTEM_PROMPT = (
    "You are a careful math tutor. Think the problem through step by step inside "
    "<think> </think> tags, then write a short answer that ends with the final number "
    "in the form \\boxed{N}. Only the boxed number after </think> is graded."
)


def gold_answer(answer: str) -> str:
    """The number after GSM8K's final '####', without thousands separators."""
    return answer.split("####")[-1].strip().replace(",", "")


def item_from_row(row: dict[str, Any]) -> dict[str, str]:
    """A hub/sample row (`question`, `answer`) as an item with its gold number."""
    return {
        "question": row["question"],
        "answer": row["answer"],
        "gold": gold_answer(row["answer"]),
    }


def length_penalized(scores: list[float], lengths: list[int], max_tokens: int) -> list[float]:
    """Upstream's all-correct rule: 1.0 up to half of `max_tokens`, then linearly down to 0."""
    if not scores or any(score != 1.0 for score in scores):
        return scores
    threshold = max_tokens / 2
    return [
        1.0 if length <= threshold else 1.0 - min(1.0, (length - threshold) / threshold)
        for length in lengths
    ]


class GSM8KConfig(BaseEnvConfig, DataSourceConfig):
    """`BaseEnvConfig`, where the problems come from, the reward and sampling settings."""

    hub_dataset: str = Field("openai/gsm8k", description="Hub dataset read with data_source hub.")
    hub_subset: str | None = Field("main", description="Hub dataset configuration.")
    system_prompt: str = Field(SYSTEM_PROMPT, description="System message of every problem.")
    think_format_weight: float = Field(
        0.1, ge=0.0, le=1.0, description="Score taken off a malformed <think> block."
    )
    length_penalty: bool = Field(
        True, description="Penalise long completions in groups that are all correct."
    )
    max_tokens: int = Field(1024, ge=1, description="Most completion tokens per rollout.")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature for rollouts.")
    eval_size: int = Field(200, ge=1, description="Test problems in the greedy evaluation.")
    seed: int = Field(0, description="Shuffle seed for the training problems.")


class GSM8KEnv(BaseEnv):
    """GSM8K word problems; math-verify on the boxed answer, minus a think-format cost."""

    name = "gsm8k"
    env_config_cls = GSM8KConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.percent_correct_buffer: list[float] = []

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

    async def setup(self) -> None:
        self.train = [item_from_row(r) for r in load_rows(self.config, "train", SAMPLE_DIR)]
        test = load_rows(self.config, "test", SAMPLE_DIR)
        self.test = [item_from_row(r) for r in test[: self.config.eval_size]]
        random.Random(self.config.seed).shuffle(self.train)
        self.position = 0

    async def get_next_item(self) -> dict[str, str]:
        item = self.train[self.position % len(self.train)]
        self.position += 1
        return item

    def save_checkpoint(self, step: int, data: dict | None = None) -> None:
        """Keeps the position in the shuffled training set across restarts."""
        super().save_checkpoint(step, {**(data or {}), "position": self.position})

    def messages_for(self, item: dict[str, str]) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.config.system_prompt},
            {"role": "user", "content": item["question"]},
        ]

    def score(self, completion: str, item: dict[str, str], truncated: bool = False) -> float:
        return math_think_score(
            completion, item["gold"], self.config.think_format_weight, truncated=truncated
        )

    async def collect_trajectories(self, item: dict[str, str]) -> tuple[dict[str, Any], list]:
        """One group of `group_size` samples; truncated samples get a zero advantage."""
        messages = self.messages_for(item)
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            chat = await managed.chat_completion(
                messages=messages,
                n=self.config.group_size,
                max_tokens=self.config.max_tokens,
                temperature=self.config.temperature,
            )
            nodes = managed.get_state()["nodes"]
        truncated = [choice.finish_reason == "length" for choice in chat.choices]
        scores = [
            self.score(choice.message.content or "", item, cut)
            for choice, cut in zip(chat.choices, truncated, strict=True)
        ]
        self.percent_correct_buffer.extend(float(s >= 1.0 - 1e-9) for s in scores)
        if self.config.length_penalty:
            lengths = [sum(1 for m in node.masked_tokens if m != -100) for node in nodes]
            scores = length_penalized(scores, lengths, self.config.max_tokens)
        group = group_from_chat(messages, chat.choices, nodes, scores)
        if any(truncated):
            group["overrides"] = [{"set_advantage_to_zero": True} if c else {} for c in truncated]
        return group, []

    async def wandb_log(self, wandb_metrics: dict | None = None) -> None:
        """Adds train/percent_correct: the share of sampled answers that were right."""
        metrics = dict(wandb_metrics or {})
        if self.percent_correct_buffer:
            buffer = self.percent_correct_buffer
            metrics["train/percent_correct"] = sum(buffer) / len(buffer)
            self.percent_correct_buffer = []
        await super().wandb_log(metrics)

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """Greedy answers to the test problems: percent correct and format rate, with samples."""
        started = time.time()

        async def one(item: dict[str, str]) -> dict[str, Any]:
            chat = await self.server.chat_completion(
                messages=self.messages_for(item),
                max_tokens=self.config.max_tokens,
                temperature=0.0,
                split="eval",
            )
            choice = chat.choices[0]
            response = choice.message.content or ""
            correct = choice.finish_reason != "length" and grade_answer(response, item["gold"])
            return {
                "question": item["question"],
                "gold_answer": item["gold"],
                "response": response,
                "score": int(correct),
                "correct": correct,
                "format_ok": think_format_ok(response),
                "finish_reason": choice.finish_reason,
            }

        samples = await asyncio.gather(*(one(item) for item in self.test))
        count = max(1, len(samples))
        metrics = {
            "eval/percent_correct": sum(s["score"] for s in samples) / count,
            "eval/format_rate": sum(s["format_ok"] for s in samples) / count,
        }
        await self.evaluate_log(
            metrics,
            samples=samples,
            start_time=started,
            end_time=time.time(),
            generation_parameters={"temperature": 0.0, "max_tokens": self.config.max_tokens},
        )


if __name__ == "__main__":
    GSM8KEnv.cli()
