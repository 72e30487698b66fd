"""A single-rollout environment in upstream Atropos's style.

It overrides only `collect_trajectory` (one sample, one ScoredDataItem) and leaves
`collect_trajectories` to the base class, which gathers `group_size` of them
into a group, as upstream's blackjack_env_no_thinking.py does. Sampling is a plain
`self.server.chat_completion(n=1)` and tokenization is `tokenize_for_trainer`.
The score is graded (a character-overlap ratio), so even a noisy model gives
differing scores.
"""

# upstream's typing style (typing.List/Dict/Optional) is kept on purpose
# ruff: noqa: UP006, UP035, UP045

import difflib
import random
from typing import List, Optional, Tuple

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataItem
from atroposlib.type_definitions import Item
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

WORDS = ["atropos", "gradient", "rollout", "tokenizer", "reward", "sampler", "trainer"]

system_prompt = "Reverse the word the user gives you. Reply with the reversed word only."


class WordReversalConfig(BaseEnvConfig):
    max_reply_tokens: int = 12


class WordReversalEnv(BaseEnv):
    name = "word_reversal"
    env_config_cls = WordReversalConfig

    def __init__(
        self,
        config: WordReversalConfig,
        server_configs: List[APIServerConfig],
        slurm: bool = True,
        testing: bool = False,
    ):
        super().__init__(config, server_configs, slurm, testing)
        self.config: WordReversalConfig = config
        self.scores_buffer: List[float] = []

    @classmethod
    def config_init(cls) -> Tuple[WordReversalConfig, List[APIServerConfig]]:
        env_config = WordReversalConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-3B-Preview",
            group_size=2,
            use_wandb=False,
            rollout_server_url="http://localhost:8000",
            max_token_length=512,
            wandb_name=cls.name,
            total_steps=2,
            steps_per_eval=100,
        )
        server_configs = [
            APIServerConfig(
                model_name="NousResearch/DeepHermes-3-Llama-3-3B-Preview",
                base_url="http://localhost:9001/v1",
                api_key="x",
                num_requests_for_eval=8,
            ),
        ]
        return env_config, server_configs

    async def setup(self):
        self.iter = 0

    async def get_next_item(self) -> Item:
        word = WORDS[self.iter % len(WORDS)]
        self.iter += 1
        return {"word": word}

    def _score(self, word: str, reply: str) -> float:
        target = word[::-1]
        return round(difflib.SequenceMatcher(None, target, reply.strip()).ratio(), 4)

    async def collect_trajectory(self, item: Item) -> Tuple[Optional[ScoredDataItem], List[Item]]:
        messages = [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": item["word"]},
        ]
        chat_completions = await self.server.chat_completion(
            messages=messages,
            n=1,
            max_tokens=self.config.max_reply_tokens,
            temperature=1.0,
        )
        reply = chat_completions.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": reply})
        score = self._score(item["word"], reply)
        self.scores_buffer.append(score)

        tokenization_result = tokenize_for_trainer(tokenizer=self.tokenizer, chat=messages)
        scored_data_item = ScoredDataItem(
            messages=messages if self.config.include_messages else None,
            tokens=tokenization_result["tokens"],
            masks=tokenization_result["masks"],
            scores=score,
        )
        return scored_data_item, []

    async def evaluate(self, *args, **kwargs):
        scores = []
        for word in random.sample(WORDS, 2):
            scored, _ = await self.collect_trajectory({"word": word})
            if scored is not None:
                scores.append(scored["scores"])
        await self.evaluate_log(metrics={"eval/mean_similarity": sum(scores) / max(len(scores), 1)})

    async def wandb_log(self, wandb_metrics=None):
        if wandb_metrics is None:
            wandb_metrics = {}
        if self.scores_buffer:
            wandb_metrics["train/mean_similarity"] = sum(self.scores_buffer) / len(
                self.scores_buffer
            )
        self.scores_buffer = []
        await super().wandb_log(wandb_metrics)


if __name__ == "__main__":
    WordReversalEnv.cli()
