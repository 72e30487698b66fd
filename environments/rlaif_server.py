"""RLAIF: a judge model scores the policy's replies to real user prompts.

Task: answer the first user turn of a conversation (`allenai/WildChat`'s
`conversation` column with `--env.data_source hub`, as upstream's rlaif_server;
offline, 32 authored prompts in the same shape ship in `environments/data/rlaif_server/`).

Reward: a second model, any OpenAI-compatible server, is the judge. It is given with
`--judge.base_url`, `--judge.model_name`, `--judge.api_key`, `--judge.server_type`...
(or a `judge:` key in `--config` YAML) and runs in its own `ServerManager`.
`--env.judge_mode pairwise` (default) compares each reply with its neighbour in the
group in both orders and scores its share of wins; `rating` asks for 1-10 ratings,
scaled to [0, 1] (see `atroposlib/envs/judging.py`). A judge that cannot be reached
drops the group with a log line; an unreadable verdict counts as a tie.
`evaluate` reports the judge's mean rating of greedy replies to the test prompts.

    python environments/rlaif_server.py process --env.total_steps 4 \\
        --openai.base_url http://127.0.0.1:9001/v1 --openai.model_name <policy> \\
        --judge.base_url http://127.0.0.1:9002/v1 --judge.model_name <judge>

Both need real models: the judge asks for verdicts of up to 512 tokens, which leave no
room for a question in the tiny model's 512-token context. Offline, the tiny model
(environments/README.md) served with a longer context, in place of the 512-token one,
plays both parts and runs the pipeline (sampling, the judge's calls and parsing, the
groups file and its viewer); its replies and verdicts are noise:

    atropos-inference-server --model ./tiny-model --port 9001 --served-model-name tiny \\
        --max-model-len 4096 &
    python environments/rlaif_server.py process --env.total_steps 2 --env.group_size 2 \\
        --env.max_tokens 64 --env.ensure_scores_are_not_same false --env.use_wandb false \\
        --env.tokenizer_name ./tiny-model --openai.base_url http://127.0.0.1:9001/v1 \\
        --openai.model_name tiny --judge.base_url http://127.0.0.1:9001/v1 \\
        --judge.model_name tiny
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.cli import ServerNamespace
from atroposlib.envs.data_source import DataSourceConfig, load_rows
from atroposlib.envs.judging import GroupJudge, JudgeUnavailable
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.envs.single_turn import SingleTurnConfig, SingleTurnEnv

logger = logging.getLogger(__name__)
SAMPLE = Path(__file__).resolve().parent / "data" / "rlaif_server"
SYSTEM_PROMPT = "You are a helpful, honest and concise assistant."


def item_from_row(row: dict[str, Any]) -> dict[str, Any] | None:
    """The first user turn of a WildChat conversation (None without one)."""
    for turn in row.get("conversation") or []:
        if turn.get("role") == "user" and str(turn.get("content", "")).strip():
            return {"prompt": str(turn["content"]), "id": row.get("conversation_hash")}
    return None


class RLAIFConfig(SingleTurnConfig, DataSourceConfig):
    """Single-turn and data-source settings plus how the judge scores."""

    hub_dataset: str = Field("allenai/WildChat", description="Hub dataset id.")
    judge_mode: Literal["pairwise", "rating"] = Field(
        "pairwise", description="'pairwise': wins against neighbours; 'rating': 1-10 ratings."
    )
    judge_unavailable_s: float = Field(
        120.0, gt=0, description="How long judge calls wait for an unreachable judge."
    )


class RLAIFEnv(SingleTurnEnv):
    name = "rlaif"
    env_config_cls = RLAIFConfig
    config_defaults = {
        "tokenizer_name": "NousResearch/DeepHermes-3-Llama-3-3B-Preview",
        "group_size": 4,
        "max_token_length": 2048,
        "max_tokens": 1024,
        "eval_size": 50,
    }

    @classmethod
    def cli_server_namespaces(cls) -> dict[str, ServerNamespace]:
        """The judge's `--judge.*` flags and `judge:` YAML key."""
        return {"judge": ServerNamespace(init_kwarg="judge_server_configs")}

    def __init__(
        self,
        config: RLAIFConfig,
        server_configs: Any,
        judge_server_configs: Any = None,
        slurm: bool = False,
        testing: bool = False,
    ) -> None:
        super().__init__(config, server_configs, slurm=slurm, testing=testing)
        if judge_server_configs is None:
            raise ValueError("no judge: pass --judge.base_url and --judge.model_name")
        judges = ServerManager(
            judge_server_configs, unavailable_timeout_s=config.judge_unavailable_s
        )
        self.judge = GroupJudge(judges, config.judge_mode)

    async def setup(self) -> None:
        train = load_rows(self.config, "train", SAMPLE)
        self.train_items = [i for i in map(item_from_row, train) if i]
        self.eval_items = [
            i for i in map(item_from_row, load_rows(self.config, "test", SAMPLE)) if i
        ]
        self.shuffle_train_items()

    def messages_for(self, item: dict[str, Any]) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": item["prompt"]},
        ]

    def score(self, completion: str, item: dict[str, Any]) -> Any:
        return self.judge.rate(self.messages_for(item)[1:], completion)

    async def collect_trajectories(self, item: dict[str, Any]) -> tuple[Any, list]:
        messages = self.messages_for(item)
        group = await self.sample_group(
            messages,
            lambda completion: 0.0,  # replaced below: the judge scores the group together
            max_tokens=self.config.max_tokens,
            temperature=self.config.temperature,
        )
        replies = [conversation[-1]["content"] for conversation in group["messages"]]
        try:
            group["scores"] = await self.judge.score_group(messages[1:], replies)
        except JudgeUnavailable as error:
            logger.error("group dropped: %s", error)
            return None, []
        return group, []

    def eval_record(self, item: dict[str, Any]) -> dict[str, Any]:
        return dict(item)


if __name__ == "__main__":
    RLAIFEnv.cli()
