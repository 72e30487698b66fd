"""Multiple-choice reasoning with thinking, and the MMLU-style eval.

Task: a question with lettered options (MMLU's columns: `question`, `subject`,
`choices`, `answer` as an index). The policy reasons inside `<think>...</think>` and
then answers `<answer>B</answer>`. Data: `cais/mmlu` (subset `all`; training reads
`auxiliary_train`, evaluation `test`) with `--env.data_source hub`; offline, authored
rows in the same columns (30 train over 14 subjects, 40 test over 5) ship in
`environments/data/mcqa_thinking_env/`.

Reward (`choice_letter`): 1.0 for the right letter in the one `<answer>` after a
closed, non-empty think block. A letter only inside the reasoning, several letters,
a missing think block (unless `--env.require_thinking false`), empty or padded replies
score 0. `evaluate` is the MMLU-style eval: greedy answers to the test split, accuracy
overall and per subject, written as upstream's metrics.json and samples.jsonl.

    python environments/mcqa_thinking_env.py evaluate --env.data_dir_to_save_evals evals/ \\
        --openai.base_url http://127.0.0.1:9001/v1 --openai.model_name <model>

Offline, the same evaluation of four questions on the tiny model (environments/README.md
serves it). A prompt here takes up to 240 of the tiny model's 512 tokens of context, so
`max_tokens` drops from 2048 to 96; the tiny model knows only mod-10 arithmetic, so the
run checks the pipeline (data, prompt, answers, grading, metrics.json and samples.jsonl),
not the task:

    python environments/mcqa_thinking_env.py evaluate --env.eval_size 4 \\
        --env.max_tokens 96 --env.data_dir_to_save_evals evals/ --env.use_wandb false \\
        --env.tokenizer_name ./tiny-model --openai.base_url http://127.0.0.1:9001/v1 \\
        --openai.model_name tiny
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.data_source import DataSourceConfig, load_rows
from atroposlib.envs.reward_fns.choice_letter_reward import ChoiceLetterReward
from atroposlib.envs.single_turn import SingleTurnConfig, SingleTurnEnv

SAMPLE = Path(__file__).resolve().parent / "data" / "mcqa_thinking_env"
SYSTEM_PROMPT = (
    "Think step by step inside <think></think>, then give the letter of the one right "
    "option as <answer>X</answer>."
)


def item_from_row(row: dict[str, Any]) -> dict[str, Any] | None:
    """MMLU's row as an item: lettered options and the gold letter (None if malformed)."""
    choices, answer = row.get("choices"), row.get("answer")
    if not row.get("question") or not isinstance(choices, list) or not 2 <= len(choices) <= 26:
        return None
    if not isinstance(answer, int) or not 0 <= answer < len(choices):
        return None
    return {
        "question": row["question"],
        "subject": row.get("subject") or "unknown",
        "choices": [str(c) for c in choices],
        "gold": chr(ord("A") + answer),
    }


class MCQAConfig(SingleTurnConfig, DataSourceConfig):
    """Single-turn and data-source settings; MMLU's hub names by default."""

    hub_dataset: str = Field("cais/mmlu", description="Hub dataset id (MMLU's columns).")
    hub_subset: str | None = Field("all", description="Hub configuration.")
    hub_train_split: str = Field("auxiliary_train", description="Hub split used for training.")
    hub_eval_split: str = Field("test", description="Hub split used by evaluate.")
    require_thinking: bool = Field(True, description="Score 0 without a closed think block.")


class MCQAThinkingEnv(SingleTurnEnv):
    name = "mcqa_thinking"
    env_config_cls = MCQAConfig
    config_defaults = {
        "tokenizer_name": "NousResearch/DeepHermes-3-Llama-3-8B-Preview",
        "group_size": 8,
        "max_token_length": 4096,
        "max_tokens": 2048,
        "eval_size": 1000,
    }

    async def setup(self) -> None:
        config = self.config
        train = load_rows(config, "train", SAMPLE, hub_split=config.hub_train_split)
        test = load_rows(config, "test", SAMPLE, hub_split=config.hub_eval_split)
        self.train_items = [i for i in map(item_from_row, train) if i]
        self.eval_items = [i for i in map(item_from_row, test) if i]
        self.shuffle_train_items()

    def messages_for(self, item: dict[str, Any]) -> list[dict[str, str]]:
        options = "\n".join(f"{chr(ord('A') + i)}) {c}" for i, c in enumerate(item["choices"]))
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"{item['question']}\n\n{options}"},
        ]

    def score(self, completion: str, item: dict[str, Any]) -> float:
        reward = ChoiceLetterReward(len(item["choices"]), self.config.require_thinking)
        return reward.compute([completion], gold=item["gold"])[0]

    def eval_record(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"question": item["question"], "subject": item["subject"], "gold": item["gold"]}

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        by_subject: dict[str, list[float]] = defaultdict(list)
        for sample in samples:
            by_subject[sample["subject"]].append(sample["score"])
        return {f"eval/accuracy_{s}": sum(v) / len(v) for s, v in sorted(by_subject.items())}


if __name__ == "__main__":
    MCQAThinkingEnv.cli()
