"""A small real environment for tests: one-digit modular arithmetic on the tiny model.

Runs as `python tests/envs/arith_env.py serve|process|evaluate ...`.
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig  # noqa: E402
from atroposlib.envs.scored_data import group_from_chat  # noqa: E402
from atroposlib.utils.tiny_model import ensure_tiny_model  # noqa: E402

SYSTEM = "Answer with one digit."


class ArithConfig(BaseEnvConfig):
    fail_first_items: int = Field(0, description="Raise inside collect_trajectories this often.")
    rollout_delay_s: float = Field(0.0, description="Sleep this long inside every rollout.")
    fixed_score: float | None = Field(
        None, description="Score every sample this instead of grading it (a run that cannot learn)."
    )


class ArithEnv(BaseEnv):
    """(a + b) mod 10, scored 1 for the right digit."""

    name = "arith"
    env_config_cls = ArithConfig

    @classmethod
    def config_init(cls):
        config = ArithConfig(
            tokenizer_name=str(ensure_tiny_model()),
            group_size=4,
            use_wandb=False,
            max_token_length=128,
            steps_per_eval=1000,
        )
        server = APIServerConfig(
            model_name="tiny", base_url="http://127.0.0.1:9001/v1", server_type="vllm", timeout=60
        )
        return config, server

    async def setup(self) -> None:
        self.rng = random.Random(0)
        self.items_served = 0

    async def get_next_item(self):
        self.items_served += 1
        return {"a": self.rng.randrange(10), "b": self.rng.randrange(10), "n": self.items_served}

    async def collect_trajectories(self, item):
        if item["n"] <= self.config.fail_first_items:
            raise RuntimeError(f"deliberate failure on item {item['n']}")
        await asyncio.sleep(self.config.rollout_delay_s)
        question = f"What is {item['a']} + {item['b']} mod 10?"
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            chat = await managed.chat_completion(
                messages=messages, n=self.config.group_size, max_tokens=4, temperature=1.0
            )
            nodes = managed.get_state()["nodes"]
        answer = str((item["a"] + item["b"]) % 10)
        group = group_from_chat(
            messages,
            chat.choices,
            nodes,
            [
                float(c.message.content.strip() == answer)
                if self.config.fixed_score is None
                else self.config.fixed_score
                for c in chat.choices
            ],
        )
        return group, []

    async def evaluate(self, *args, **kwargs):
        correct = 0
        for a in range(5):
            answer = await self.server.chat_completion(
                messages=[{"role": "user", "content": f"What is {a} + 1 mod 10?"}],
                max_tokens=3,
                temperature=0,
                split="eval",
            )
            correct += answer.choices[0].message.content.strip() == str((a + 1) % 10)
        self.evaluate_log({"eval/accuracy": correct / 5}, samples=[{"correct": correct}])


if __name__ == "__main__":
    ArithEnv.cli()
