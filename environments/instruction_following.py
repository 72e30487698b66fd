"""Instruction following (IFEval-style): answer a request while obeying verifiable rules.

Task: a writing request with one or more checkable instructions ("answer in at least
120 words", "do not use any commas", "wrap the title in <<double angular brackets>>").

Reward: the "ifeval" reward of the registry (`atroposlib/envs/reward_fns/ifeval_reward.py`),
graded by lm-eval's own IFEval checkers: the fraction of the item's instructions the
response follows, judged on the text after the reasoning block (`</think>`).
`--env.all_or_nothing true` gives 1.0 only when every instruction holds;
`--env.all_met_bonus B` adds B when all hold. Partial credit is the default because a
group whose samples each miss a different instruction would otherwise
score all zeros and carry no signal.

Data: training rows in allenai/RLVR-IFeval's columns (`messages`, `ground_truth` JSON
with a verifier `func_name` and its arguments, `dataset`, `constraint_type`,
`constraint`), the dataset upstream's instruction_following_algorithm_environment trains
on; evaluation rows in google/IFEval's columns (`key`, `prompt`, `instruction_id_list`,
`kwargs`), the benchmark itself (its hub split is called "train"). Both shapes are
converted to the same item (a prompt plus (instruction id, kwargs) pairs), so either file
may hold either shape. Rows this grader cannot check (an instruction that needs nltk's
punkt data when it is not installed, or arguments lm-eval would replace with random
ones) are skipped, counted and explained in one log line.

Evaluate: IFEval's four numbers: prompt-level and instruction-level accuracy, strict
(the response as written) and loose (also accepted when a variant passes: the first or
last line dropped, or markdown asterisks removed), plus one sample per prompt.

Offline, on the shipped sample and the tiny model (environments/README.md serves it). A
prompt here takes 170-330 of the tiny model's 512 tokens of context, so `max_tokens`
drops to 96; and as the tiny model knows only mod-10 arithmetic, the run checks the
pipeline (data, prompt, sampling, scoring, the groups file and its viewer), not the task:

    python environments/instruction_following.py process --env.total_steps 2 \\
        --env.group_size 2 --env.max_tokens 96 --env.ensure_scores_are_not_same false \\
        --env.use_wandb false --env.tokenizer_name ./tiny-model \\
        --openai.base_url http://127.0.0.1:9001/v1 --openai.model_name tiny
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.data_source import DataSourceConfig, load_rows
from atroposlib.envs.reward_fns.ifeval_reward import (
    Check,
    UnsupportedInstruction,
    compile_constraints,
    constraints_of,
    ifeval_score,
    loose,
    response_text,
    strict,
)
from atroposlib.envs.single_turn import Sample, SingleTurnConfig, SingleTurnEnv

logger = logging.getLogger(__name__)

SAMPLE_DIR = Path(__file__).resolve().parent / "data" / "instruction_following"
SYSTEM_PROMPT = (
    "You are a careful assistant. Answer the user's request and follow every formatting, "
    "length and wording instruction in it exactly."
)


def item_from_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row of google/IFEval or allenai/RLVR-IFeval as an item.

    Raises `UnsupportedInstruction` (with the reason) for a row this grader cannot check.
    """
    if "instruction_id_list" in row:
        prompt = row.get("prompt") or ""
        constraints = constraints_of(row["instruction_id_list"], row.get("kwargs"))
    else:
        users = [m["content"] for m in row.get("messages") or [] if m.get("role") == "user"]
        if not users or not row.get("ground_truth"):
            raise UnsupportedInstruction("no user message or no ground_truth")
        prompt = users[-1]
        constraints = constraints_of(ground_truth=row["ground_truth"])
    if not prompt:
        raise UnsupportedInstruction("no prompt")
    compile_constraints(constraints, prompt)  # refuses what cannot be graded, now
    return {
        "key": str(row.get("key", "")),
        "prompt": prompt,
        "constraints": [list(c) for c in constraints],
    }


def items_from_rows(rows: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    """Convert rows, logging how many were skipped and the commonest reasons."""
    items, reasons = [], Counter()
    for row in rows:
        try:
            items.append(item_from_row(row))
        except ValueError as error:  # UnsupportedInstruction, or a ground truth not JSON
            reasons[str(error)] += 1
    if reasons:
        logger.warning(
            "%s: skipped %d of %d rows this grader cannot check; commonest: %s",
            split,
            len(rows) - len(items),
            len(rows),
            "; ".join(f"{n}x {reason}" for reason, n in reasons.most_common(3)),
        )
    if not items:
        raise ValueError(f"no gradable rows in the {split!r} split")
    return items


def item_checks(item: dict[str, Any]) -> list[Check]:
    return compile_constraints([(i, kw) for i, kw in item["constraints"]], item["prompt"])


def instruction_results(completion: str, checks: list[Check]) -> dict[str, list[bool]]:
    """Per instruction: followed in lm-eval's strict mode, and in its loose mode."""
    response = response_text(completion)
    return {"strict": strict(response, checks), "loose": loose(response, checks)}


class InstructionFollowingConfig(SingleTurnConfig, DataSourceConfig):
    """`SingleTurnConfig`, where the rows come from, and the reward settings."""

    hub_dataset: str = Field("allenai/RLVR-IFeval", description="Hub dataset for training.")
    eval_hub_dataset: str = Field(
        "google/IFEval", description="Hub dataset for `evaluate` (IFEval's columns)."
    )
    eval_hub_split: str = Field("train", description="Split of eval_hub_dataset to evaluate.")
    all_or_nothing: bool = Field(
        False, description="Score 1.0 only when every instruction holds (else the fraction)."
    )
    all_met_bonus: float = Field(0.0, ge=0.0, description="Added when every instruction holds.")
    max_tokens: int = Field(1024, ge=1, description="Most completion tokens per rollout.")
    eval_size: int = Field(541, ge=1, description="Most prompts in the greedy evaluation.")
    seed: int = Field(0, description="Shuffle seed for the training rows.")


class InstructionFollowingEnv(SingleTurnEnv):
    """Writing requests with verifiable instructions; reward = share of instructions met."""

    name = "instruction_following"
    env_config_cls = InstructionFollowingConfig
    config: InstructionFollowingConfig
    config_defaults = {
        "tokenizer_name": "Qwen/Qwen2.5-1.5B-Instruct",
        "group_size": 16,
        "max_token_length": 2048,
        "steps_per_eval": 50,
        "use_wandb": True,
    }

    async def setup(self) -> None:
        self.train_items = items_from_rows(load_rows(self.config, "train", SAMPLE_DIR), "train")
        eval_source = self.config.model_copy(
            update={"hub_dataset": self.config.eval_hub_dataset, "hub_subset": None}
        )
        test_rows = load_rows(eval_source, "test", SAMPLE_DIR, hub_split=self.config.eval_hub_split)
        self.eval_items = items_from_rows(test_rows, "test")
        self.shuffle_train_items()

    def messages_for(self, item: dict[str, Any]) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": item["prompt"]},
        ]

    def score(self, completion: str, item: dict[str, Any]) -> float:
        """The configured ifeval reward for one completion."""
        return ifeval_score(
            completion, item_checks(item), self.config.all_or_nothing, self.config.all_met_bonus
        )

    async def eval_sample(self, item: dict[str, Any], sample: Sample) -> dict[str, Any]:
        results = instruction_results(sample.text, item_checks(item))
        return {
            "key": item["key"],
            "prompt": item["prompt"],
            "instruction_id_list": [i for i, _ in item["constraints"]],
            "completion": sample.text,
            "follow_instruction_list": results["strict"],
            "follow_instruction_list_loose": results["loose"],
            "score": float(all(results["strict"])),
        }

    def eval_summary(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """IFEval's strict and loose, prompt- and instruction-level accuracy."""
        metrics = {}
        modes = (("strict", "follow_instruction_list"), ("loose", "follow_instruction_list_loose"))
        for mode, field in modes:
            flags = [s[field] for s in samples]
            every = [f for per_prompt in flags for f in per_prompt]
            metrics[f"eval/prompt_level_{mode}_acc"] = sum(map(all, flags)) / max(1, len(flags))
            metrics[f"eval/inst_level_{mode}_acc"] = sum(every) / max(1, len(every))
        return metrics


if __name__ == "__main__":
    InstructionFollowingEnv.cli()
