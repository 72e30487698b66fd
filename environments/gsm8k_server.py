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

Offline, on the shipped sample and the tiny model (environments/README.md serves it). A
prompt here takes 300-390 of the tiny model's 512 tokens of context, so `max_tokens`
drops to 96; and as the tiny model knows only mod-10 arithmetic, the run checks the
pipeline (data, prompt, sampling, scoring, the groups file and its viewer), not the task:

    python environments/gsm8k_server.py process --env.total_steps 2 --env.group_size 2 \
        --env.max_tokens 96 --env.ensure_scores_are_not_same false --env.use_wandb false \
        --env.tokenizer_name ./tiny-model --openai.base_url http://127.0.0.1:9001/v1 \
        --openai.model_name tiny
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.data_source import DataSourceConfig, load_rows
from atroposlib.envs.reward_fns.math_think_reward import math_eval_fields, math_think_score
from atroposlib.envs.scored_data import ScoredDataGroup, length_penalized
from atroposlib.envs.single_turn import Sample, SingleTurnConfig, SingleTurnEnv

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


class GSM8KConfig(SingleTurnConfig, DataSourceConfig):
    """`SingleTurnConfig`, where the problems come from, and the reward settings."""

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
    eval_size: int = Field(200, ge=1, description="Test problems in the greedy evaluation.")


class GSM8KEnv(SingleTurnEnv):
    """GSM8K word problems; math-verify on the boxed answer, minus a think-format cost."""

    name = "gsm8k"
    env_config_cls = GSM8KConfig
    config: GSM8KConfig
    config_defaults = {
        "tokenizer_name": "Qwen/Qwen2.5-1.5B-Instruct",
        "group_size": 16,
        "max_token_length": 2048,
        "steps_per_eval": 50,
        "use_wandb": True,
    }

    async def setup(self) -> None:
        self.train_items = [item_from_row(r) for r in load_rows(self.config, "train", SAMPLE_DIR)]
        self.eval_items = [item_from_row(r) for r in load_rows(self.config, "test", SAMPLE_DIR)]
        self.shuffle_train_items()

    def messages_for(self, item: dict[str, str]) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.config.system_prompt},
            {"role": "user", "content": item["question"]},
        ]

    def score(self, completion: str, item: dict[str, str], truncated: bool = False) -> float:
        return math_think_score(
            completion, item["gold"], self.config.think_format_weight, truncated=truncated
        )

    def score_sample(self, sample: Sample, item: dict[str, str]) -> float:
        return self.score(sample.text, item, sample.truncated)

    def zero_truncated_advantage(self) -> bool:
        return True

    def finish_group(self, group: ScoredDataGroup, samples: list[Sample]) -> ScoredDataGroup:
        """The length penalty of an all-correct group (`length_penalty`)."""
        if self.config.length_penalty:
            lengths = [len(sample.tokens) for sample in samples]
            group["scores"] = length_penalized(group["scores"], lengths, self.config.max_tokens)
        return group

    async def eval_sample(self, item: dict[str, str], sample: Sample) -> dict[str, Any]:
        return {
            "question": item["question"],
            "gold_answer": item["gold"],
            **math_eval_fields(sample.text, sample.finish_reason, item["gold"]),
        }

    def eval_summary(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """Percent correct (upstream's key) and the think-format rate."""
        count = max(1, len(samples))
        return {
            "eval/percent_correct": sum(s["score"] for s in samples) / count,
            "eval/format_rate": sum(s["format_ok"] for s in samples) / count,
        }


if __name__ == "__main__":
    GSM8KEnv.cli()
