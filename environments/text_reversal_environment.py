"""Text reversal: write a text's characters in reverse order.

Task: upstream's text-reversal environment's, on its dataset
(`NousResearch/TextReversalDataset`, column `text`; `--env.data_source hub`). Offline,
30 authored rows in the same column ship in `environments/data/text_reversal_environment/`.

Reward (`reversal_similarity`): 1.0 for the exact reversal inside one
`<reversed_text>` block after any thinking; a near miss there earns
`partial_weight x similarity` (difflib's ratio), so a small model gets a signal before
it is ever exact; no block, an unclosed `<think>`, or an answer padded beyond twice the
target's length scores 0. `--env.answer_format bare` takes the whole reply after
thinking as the answer (for tiny and base models).

Offline, on the shipped sample and the tiny model (environments/README.md serves it), with
the bare answer format and the short replies of `configs/mix_cpu.yaml` (a prompt here
takes up to 200 of the tiny model's 512 tokens of context; the default `max_tokens` of
1024 does not fit):

    python environments/text_reversal_environment.py process --env.total_steps 2 \\
        --env.group_size 2 --env.answer_format bare --env.max_tokens 24 \\
        --env.ensure_scores_are_not_same false --env.use_wandb false \\
        --env.tokenizer_name ./tiny-model --openai.base_url http://127.0.0.1:9001/v1 \\
        --openai.model_name tiny
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.data_source import DataSourceConfig, load_rows
from atroposlib.envs.reward_fns.reversal_similarity_reward import reversal_score
from atroposlib.envs.single_turn import SingleTurnConfig, SingleTurnEnv

SAMPLE = Path(__file__).resolve().parent / "data" / "text_reversal_environment"
TAGGED_PROMPT = (
    "Reverse the characters of the text. You may think inside <think></think> first; "
    "then write the reversed text inside <reversed_text></reversed_text>."
)
BARE_PROMPT = "Reverse the characters of the text. Reply with the reversed text only."


class TextReversalConfig(SingleTurnConfig, DataSourceConfig):
    """Single-turn and data-source settings plus the answer format and partial credit."""

    hub_dataset: str = Field("NousResearch/TextReversalDataset", description="Hub dataset id.")
    answer_format: Literal["tagged", "bare"] = Field(
        "tagged", description="'tagged': inside <reversed_text>; 'bare': the whole reply."
    )
    partial_weight: float = Field(
        0.5, ge=0.0, lt=1.0, description="Most a near miss earns (times its similarity)."
    )


class TextReversalEnv(SingleTurnEnv):
    name = "text_reversal"
    env_config_cls = TextReversalConfig
    config_defaults = {
        "tokenizer_name": "NousResearch/DeepHermes-3-Llama-3-3B-Preview",
        "group_size": 8,
        "max_token_length": 2048,
        "max_tokens": 1024,
        "eval_size": 100,
    }

    async def setup(self) -> None:
        self.train_items = [r for r in load_rows(self.config, "train", SAMPLE) if r.get("text")]
        self.eval_items = [r for r in load_rows(self.config, "test", SAMPLE) if r.get("text")]
        self.shuffle_train_items()

    def messages_for(self, item: dict[str, Any]) -> list[dict[str, str]]:
        bare = self.config.answer_format == "bare"
        return [
            {"role": "system", "content": BARE_PROMPT if bare else TAGGED_PROMPT},
            {"role": "user", "content": item["text"]},
        ]

    def score(self, completion: str, item: dict[str, Any]) -> float:
        return reversal_score(
            completion, item["text"], self.config.answer_format, self.config.partial_weight
        )

    def eval_record(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"text": item["text"], "gold": item["text"][::-1]}


if __name__ == "__main__":
    TextReversalEnv.cli()
