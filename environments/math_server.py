r"""MATH: competition mathematics with LaTeX answers, graded by math-verify.

Task: a competition problem (algebra, geometry, number theory...); the model reasons inside
`<think> </think>` and ends with its answer in `\boxed{}`. Answers are LaTeX, not just
numbers: `\frac{1}{2}`, `5\sqrt{2}`, `[2, \infty)`, `\begin{pmatrix} 3 \\ 1 \end{pmatrix}`,
`x = 5`, sets such as `-1, 0, 1`.

Reward ("math_think" from the reward registry, as in gsm8k):
`correct - think_format_weight * malformed`. math-verify compares the boxed answer(s)
after `</think>` with the gold symbolically, so `0.5`, `\frac12` and `1/2` are one answer,
`x=5` matches `5`, `(1, 2]` does not match `(1, 2)`, and a hedge (`\boxed{2}, \boxed{3}`
for gold 2) is wrong. Answers inside the reasoning are not graded. A completion cut off at
`max_tokens` scores as wrong and malformed and, with `mask_too_long_completions` (on, as
upstream), its advantage is zeroed so the trainer does not learn "stop early" from it.
Upstream's judge/RLAIF/self-correction side loops are not part of this env: they need a
second model, and the verifiable reward is the part every run uses.

Data: training rows from `zwhe99/DeepMath-103K` (split train; columns `question`,
`final_answer`, `difficulty`, `topic`, `r1_solution_1..3`), the dataset upstream's
math_server trains on. `evaluate` runs MATH-500 (`HuggingFaceH4/MATH-500`, split test;
columns `problem`, `solution`, `answer`, `subject`, `level`, `unique_id`). The row
converter also reads the original MATH columns (`problem` and a `solution` whose last
`\boxed{}` is the gold), so `--env.dataset_path` / `--env.eval_dataset_path` can point at
either format. Offline samples: `environments/data/math/train.jsonl` (40 authored rows in
DeepMath's columns) and `environments/data/math500/test.jsonl` (39 in MATH-500's).

Evaluate: greedy, `eval/math500_percent_correct` and `eval/overall_percent_correct`
(upstream's names), per subject and per level (`eval/math500_level_3_percent_correct`,
`eval/math500_number_theory_percent_correct`), `eval/format_rate`, one sample per problem.

Offline, on the shipped samples and the tiny model (environments/README.md serves it). A
prompt here takes 250-350 of the tiny model's 512 tokens of context, so `max_tokens`
drops to 96; and as the tiny model knows only mod-10 arithmetic, the run checks the
pipeline (data, prompt, sampling, scoring, the groups file and its viewer), not the task:

    python environments/math_server.py process --env.total_steps 2 --env.group_size 2 \
        --env.max_tokens 96 --env.ensure_scores_are_not_same false --env.use_wandb false \
        --env.tokenizer_name ./tiny-model --openai.base_url http://127.0.0.1:9001/v1 \
        --openai.model_name tiny
"""

from __future__ import annotations

import logging
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.data_source import DataSourceConfig, load_rows
from atroposlib.envs.reward_fns.math_think_reward import math_eval_fields, math_think_score
from atroposlib.envs.reward_fns.math_verify_reward import gold_from_solution
from atroposlib.envs.single_turn import Sample, SingleTurnConfig, SingleTurnEnv

logger = logging.getLogger(__name__)

DATA = Path(__file__).resolve().parent / "data"
SAMPLE_DIR = DATA / "math"
EVAL_SAMPLE_DIR = DATA / "math500"
SYSTEM_PROMPT = (
    "You are a strong competition mathematician. Reason carefully inside <think> </think> "
    "tags, then give a brief solution that ends with the final answer in simplest form as "
    "\\boxed{answer}, written in LaTeX. Only the boxed answer after </think> is graded."
)


def item_from_row(row: dict[str, Any]) -> dict[str, Any] | None:
    """A DeepMath, MATH-500 or MATH row as an item; None when it has no usable gold answer."""
    problem = row.get("question") or row.get("problem")
    gold = row.get("final_answer") or row.get("answer")
    if not gold and row.get("solution"):
        gold = gold_from_solution(row["solution"])
    if not problem or not isinstance(gold, str) or not gold.strip():
        logger.warning("skipping a row without problem or gold answer: %r", str(row)[:120])
        return None
    return {
        "problem": problem,
        "gold": gold.strip(),
        "subject": str(row.get("subject") or row.get("type") or row.get("topic") or ""),
        "level": row.get("level", row.get("difficulty")),
        "unique_id": row.get("unique_id", ""),
    }


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def accuracy_metrics(samples: list[dict[str, Any]], name: str) -> dict[str, float]:
    """Overall, per-subject and per-level accuracy of scored eval samples."""
    groups: dict[str, list[int]] = defaultdict(list)
    for sample in samples:
        groups[name].append(sample["score"])
        if sample["subject"]:
            groups[f"{name}_{_slug(sample['subject'])}"].append(sample["score"])
        if sample["level"] is not None:
            groups[f"{name}_level_{_slug(str(sample['level']))}"].append(sample["score"])
    metrics = {f"eval/{key}_percent_correct": sum(v) / len(v) for key, v in groups.items()}
    metrics["eval/overall_percent_correct"] = metrics.get(f"eval/{name}_percent_correct", 0.0)
    return metrics


class MathConfig(SingleTurnConfig, DataSourceConfig):
    """`SingleTurnConfig`, the training and eval datasets, the reward and sampling settings."""

    hub_dataset: str = Field("zwhe99/DeepMath-103K", description="Training dataset on the hub.")
    hub_split: str = Field("train", description="Hub split of the training rows.")
    eval_hub_dataset: str = Field(
        "HuggingFaceH4/MATH-500", description="Evaluation dataset on the hub."
    )
    eval_hub_split: str = Field("test", description="Hub split of the evaluation rows.")
    eval_dataset_path: str | None = Field(
        None, description="Local jsonl of evaluation rows (overrides the eval data source)."
    )
    eval_name: str = Field("math500", description="Name of the eval set in metric keys.")
    eval_size: int = Field(500, ge=1, description="Most evaluation problems.")
    system_prompt: str = Field(SYSTEM_PROMPT, description="System message of every problem.")
    think_format_weight: float = Field(
        0.1, ge=0.0, le=1.0, description="Score taken off a malformed <think> block."
    )
    mask_too_long_completions: bool = Field(
        True, description="Zero the advantage of completions cut off at max_tokens."
    )
    max_tokens: int = Field(3072, ge=1, description="Most completion tokens per rollout.")
    top_p: float = Field(0.95, gt=0.0, le=1.0, description="Nucleus sampling for rollouts.")
    seed: int = Field(42, description="Shuffle seed for the training problems.")


class MathEnv(SingleTurnEnv):
    """Competition math; math-verify on the boxed LaTeX answer, minus a think-format cost."""

    name = "math"
    env_config_cls = MathConfig
    config: MathConfig
    config_defaults = {
        "tokenizer_name": "Qwen/Qwen2.5-1.5B-Instruct",
        "group_size": 16,
        "max_token_length": 4096,
        "steps_per_eval": 25,
        "use_wandb": True,
    }
    server_defaults = {"num_requests_for_eval": 256}

    def _items(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        items = [item for item in map(item_from_row, rows) if item is not None]
        if not items:
            raise ValueError("no usable rows: every row lacks a problem or a gold answer")
        return items

    async def setup(self) -> None:
        config = self.config
        rows = load_rows(config, "train", SAMPLE_DIR, hub_split=config.hub_split)
        self.train_items = self._items(rows)
        eval_source = config.model_copy(
            update={
                "hub_dataset": config.eval_hub_dataset,
                "hub_subset": None,
                "dataset_path": config.eval_dataset_path or config.dataset_path,
            }
        )
        eval_rows = load_rows(eval_source, "test", EVAL_SAMPLE_DIR, hub_split=config.eval_hub_split)
        self.eval_items = self._items(eval_rows)
        self.shuffle_train_items()

    def messages_for(self, item: dict[str, Any]) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.config.system_prompt},
            {"role": "user", "content": item["problem"]},
        ]

    def score(self, completion: str, item: dict[str, Any], truncated: bool = False) -> float:
        return math_think_score(
            completion, item["gold"], self.config.think_format_weight, truncated=truncated
        )

    def score_sample(self, sample: Sample, item: dict[str, Any]) -> float:
        return self.score(sample.text, item, sample.truncated)

    def sampling_for(self, item: dict[str, Any], split: str) -> dict[str, Any]:
        return {"top_p": self.config.top_p} if split == "train" else {}

    def zero_truncated_advantage(self) -> bool:
        return self.config.mask_too_long_completions

    def train_metrics(self, groups: list[list[float]]) -> dict[str, float]:
        """Percent correct, and pass@group_size: the share of groups with a right answer."""
        right = [[score >= 1.0 - 1e-9 for score in group] for group in groups]
        return {
            **super().train_metrics(groups),
            "train/pass_at_groupsize": sum(map(any, right)) / len(right),
        }

    async def eval_sample(self, item: dict[str, Any], sample: Sample) -> dict[str, Any]:
        return {
            "unique_id": item["unique_id"],
            "question": item["problem"],
            "gold_answer": item["gold"],
            "subject": item["subject"],
            "level": item["level"],
            **math_eval_fields(sample.text, sample.finish_reason, item["gold"]),
        }

    def eval_summary(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """Accuracy overall, per subject and per level, and the think-format rate."""
        metrics = accuracy_metrics(samples, self.config.eval_name)
        metrics["eval/format_rate"] = sum(s["format_ok"] for s in samples) / max(1, len(samples))
        return metrics


if __name__ == "__main__":
    MathEnv.cli()
