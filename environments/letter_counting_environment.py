"""Letter counting: "How many times does the letter 'r' appear in 'strawberry'?"

Task: count one letter in one word. Items are generated from a seed over a word list
shipped with the project (`environments/data/letter_counting_environment/words.txt`:
3,027 lowercase words of 3-12 letters, every 20th entry of Debian's `wamerican`
list, from SCOWL, whose licence allows redistribution), so nothing is downloaded at
import (upstream calls `nltk.download`). A quarter of the questions ask for a letter
the word lacks: "0" must be learnt too. `--env.word_list_path` reads another list.

Reward (`answer_tag`): 1.0 when the one `<answer>N</answer>` after any thinking is
the count. `--env.answer_format bare` accepts the last integer of a short reply
instead; that is the setting for the project's tiny model, which answers with a bare
digit (`configs/mix_cpu.yaml`). Offline, on the tiny model (environments/README.md
serves it), with that format and its short replies (a prompt here takes up to 180 of
the tiny model's 512 tokens of context; the default `max_tokens` of 512 does not fit):

    python environments/letter_counting_environment.py process --env.total_steps 2 \\
        --env.group_size 2 --env.answer_format bare --env.max_tokens 4 \\
        --env.ensure_scores_are_not_same false --env.use_wandb false \\
        --env.tokenizer_name ./tiny-model --openai.base_url http://127.0.0.1:9001/v1 \\
        --openai.model_name tiny
"""

from __future__ import annotations

import random
import string
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.reward_fns import final_integer, tagged_answer
from atroposlib.envs.reward_fns.answer_tag_reward import same_answer
from atroposlib.envs.single_turn import SingleTurnConfig, SingleTurnEnv

WORDS = Path(__file__).resolve().parent / "data" / "letter_counting_environment" / "words.txt"
TAGGED_PROMPT = (
    "Count letters exactly. You may think inside <think></think> first; then give only "
    "the number as <answer>N</answer>."
)
BARE_PROMPT = "Answer with the number only."


def load_words(path: Path) -> list[str]:
    words = [w.strip().lower() for w in path.read_text().splitlines()]
    words = [w for w in words if w.isalpha() and w.isascii()]
    if not words:
        raise ValueError(f"{path}: no words (one lowercase word per line)")
    return words


def make_item(rng: random.Random, words: list[str]) -> dict[str, Any]:
    """A word and a letter: present three times in four, absent otherwise."""
    word = rng.choice(words)
    absent = sorted(set(string.ascii_lowercase) - set(word))
    letter = rng.choice(absent) if absent and rng.random() < 0.25 else rng.choice(word)
    return {"word": word, "letter": letter, "count": word.count(letter)}


def letter_count_score(completion: str, count: int, answer_format: str = "tagged") -> float:
    if answer_format == "bare":
        found = final_integer(completion)
        return float(found == count)
    return float(same_answer(tagged_answer(completion), count))


class LetterCountingConfig(SingleTurnConfig):
    """Single-turn settings plus the word list and the answer format."""

    word_list_path: str | None = Field(None, description="One word per line (default: shipped).")
    answer_format: Literal["tagged", "bare"] = Field(
        "tagged", description="'tagged': <answer>N</answer>; 'bare': the reply's last integer."
    )
    train_size: int = Field(10000, ge=1, description="Generated training questions.")


class LetterCountingEnv(SingleTurnEnv):
    name = "letter_counting"
    env_config_cls = LetterCountingConfig
    config_defaults = {
        "tokenizer_name": "NousResearch/DeepHermes-3-Llama-3-3B-Preview",
        "group_size": 8,
        "max_token_length": 1024,
        "max_tokens": 512,
        "eval_size": 100,
    }

    async def setup(self) -> None:
        words = load_words(Path(self.config.word_list_path or WORDS))
        rng = random.Random(self.config.seed)
        self.train_items = [make_item(rng, words) for _ in range(self.config.train_size)]
        held_out = random.Random(10_000 + self.config.seed)  # a fixed eval set per seed
        self.eval_items = [make_item(held_out, words) for _ in range(self.config.eval_size)]

    def messages_for(self, item: dict[str, Any]) -> list[dict[str, str]]:
        system = BARE_PROMPT if self.config.answer_format == "bare" else TAGGED_PROMPT
        question = f"How many times does the letter '{item['letter']}' appear in '{item['word']}'?"
        return [{"role": "system", "content": system}, {"role": "user", "content": question}]

    def score(self, completion: str, item: dict[str, Any]) -> float:
        return letter_count_score(completion, item["count"], self.config.answer_format)

    def eval_record(self, item: dict[str, Any]) -> dict[str, Any]:
        return dict(item)


if __name__ == "__main__":
    LetterCountingEnv.cli()
