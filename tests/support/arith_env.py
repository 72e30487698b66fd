"""The test environment: the real `environments/mod_arithmetic.py`, plus failure knobs.

Runs as `python tests/support/arith_env.py serve|process|evaluate ...`. It changes only
what tests need: small groups, a short evaluation, and three ways to misbehave
(raise on the first items, sleep inside rollouts, or score everything the same).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from environments.mod_arithmetic import ModArithmeticConfig, ModArithmeticEnv


class ArithConfig(ModArithmeticConfig):
    fail_first_items: int = Field(0, description="Raise inside collect_trajectories this often.")
    rollout_delay_s: float = Field(0.0, description="Sleep this long inside every rollout.")
    fixed_score: float | None = Field(
        None, description="Score every sample this instead of grading it (a run that cannot learn)."
    )


class ArithEnv(ModArithmeticEnv):
    """mod_arithmetic with groups of 4, five evaluation problems and the knobs above."""

    name = "arith"
    env_config_cls = ArithConfig

    @classmethod
    def config_init(cls):
        config, server = super().config_init()
        config = ArithConfig(
            **{
                **config.model_dump(),
                "group_size": 4,
                "steps_per_eval": 1000,
                "eval_size": 5,
            }
        )
        return config, server.model_copy(update={"timeout": 60})

    async def get_next_item(self) -> dict[str, int]:
        item = await super().get_next_item()
        return {**item, "n": self.position}

    def score(self, completion: str, item: dict[str, int]) -> float:
        if self.config.fixed_score is not None:
            return self.config.fixed_score
        return super().score(completion, item)

    async def collect_trajectories(self, item: dict[str, int]) -> tuple[Any, list]:
        if item["n"] <= self.config.fail_first_items:
            raise RuntimeError(f"deliberate failure on item {item['n']}")
        await asyncio.sleep(self.config.rollout_delay_s)
        return await super().collect_trajectories(item)


if __name__ == "__main__":
    ArithEnv.cli()
