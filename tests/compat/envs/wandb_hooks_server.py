"""An environment that overrides upstream Atropos's logging and loop hooks.

Upstream envs customise wandb by overriding `add_rollouts_for_wandb` (wider rows),
`create_rollout_table` (their own wandb.Table), `wandb_log` (extra metrics, then
super) and `perf_stats`, and some read the loop state in `env_step_checks`
(`self.status_dict`), `register_env`, `get_server_info` and `setup_wandb`. Each
override here calls super and appends what it saw to the jsonl file named by
`--env.hook_log`, so a test can tell which hooks the base class called, and with
what.
"""

# upstream's typing style (typing.List/Dict/Optional) is kept on purpose
# ruff: noqa: UP006, UP007, UP035, UP045

import json
import time
from typing import Dict, List, Optional, Tuple, Union

import wandb

from atroposlib.envs.base import (
    APIServerConfig,
    BaseEnv,
    BaseEnvConfig,
    ScoredDataGroup,
)
from atroposlib.type_definitions import Item
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

PROMPTS = ["Name a colour.", "Name an animal.", "Name a fruit."]


class HookedConfig(BaseEnvConfig):
    hook_log: str = "hooks.jsonl"
    max_reply_tokens: int = 8


class WandbHooksEnv(BaseEnv):
    name = "wandb_hooks"
    env_config_cls = HookedConfig

    def __init__(
        self,
        config: HookedConfig,
        server_configs: List[APIServerConfig],
        slurm=True,
        testing=False,
    ):
        super().__init__(config, server_configs, slurm, testing)
        self.config: HookedConfig = config
        self.rollouts_for_wandb = []
        self.reply_lengths = []

    @classmethod
    def config_init(cls) -> Tuple[HookedConfig, List[APIServerConfig]]:
        env_config = HookedConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-3B-Preview",
            group_size=2,
            use_wandb=True,
            rollout_server_url="http://localhost:8000",
            total_steps=2,
            steps_per_eval=1000,
            max_token_length=512,
            wandb_name="wandb_hooks",
            num_rollouts_per_group_for_logging=2,
            min_items_sent_before_logging=1,
        )
        server_configs = [
            APIServerConfig(
                model_name="NousResearch/DeepHermes-3-Llama-3-3B-Preview",
                base_url="http://localhost:9001/v1",
                api_key="x",
            ),
        ]
        return env_config, server_configs

    def _record(self, hook: str, **seen) -> None:
        with open(self.config.hook_log, "a") as f:
            f.write(json.dumps({"hook": hook, "time": time.time(), **seen}, default=str) + "\n")

    async def setup(self):
        self.iter = 0

    async def setup_wandb(self):
        await super().setup_wandb()
        self._record("setup_wandb", project=self.wandb_project, group=self.wandb_group)

    async def register_env(self):
        await super().register_env()
        self._record(
            "register_env",
            env_id=self.env_id,
            curr_step=self.curr_step,
            wandb_prepend=self.wandb_prepend,
        )

    async def get_server_info(self):
        await super().get_server_info()
        self._record(
            "get_server_info", batch_size=self.config.batch_size, max_token_len=self.max_token_len
        )

    async def env_step_checks(self):
        self._record(
            "env_step_checks",
            curr_step=self.curr_step,
            status_dict=dict(self.status_dict),
        )
        await super().env_step_checks()

    async def get_next_item(self) -> Item:
        prompt = PROMPTS[self.iter % len(PROMPTS)]
        self.iter += 1
        return {"prompt": prompt}

    async def collect_trajectories(self, item: Item) -> Tuple[Optional[ScoredDataGroup], List]:
        prompt = [{"role": "user", "content": item["prompt"]}]
        completions = await self.server.chat_completion(
            messages=prompt,
            n=self.config.group_size,
            max_tokens=self.config.max_reply_tokens,
            temperature=1.0,
        )
        scores = ScoredDataGroup()
        scores["tokens"] = []
        scores["masks"] = []
        scores["scores"] = []
        for i, choice in enumerate(completions.choices):
            messages = prompt + [{"role": "assistant", "content": choice.message.content}]
            out = tokenize_for_trainer(self.tokenizer, messages)
            scores["tokens"].append(out["tokens"])
            scores["masks"].append(out["masks"])
            scores["scores"].append(float(i))  # distinct scores: every group is kept
            self.reply_lengths.append(len(choice.message.content or ""))
        return scores, []

    async def add_rollouts_for_wandb(
        self,
        scored_data: Union[ScoredDataGroup, List[ScoredDataGroup]],
        item: Item = None,
    ):
        self._record(
            "add_rollouts_for_wandb",
            item=item,
            num_sequences=len(scored_data["tokens"]),
            scores=scored_data["scores"],
        )
        num_keep = self.config.num_rollouts_per_group_for_logging
        if num_keep == -1:
            num_keep = self.config.group_size
        self.rollouts_for_wandb.append(
            [
                (
                    self.tokenizer.decode(scored_data["tokens"][i]),
                    scored_data["scores"][i],
                    item["prompt"] if item else "",
                )
                for i in range(min(num_keep, len(scored_data["tokens"])))
            ]
        )
        if len(self.rollouts_for_wandb) > self.config.num_rollouts_to_keep:
            self.rollouts_for_wandb.pop(0)

    async def create_rollout_table(self, wandb_metrics):
        rows = sum(len(group) for group in self.rollouts_for_wandb)
        self._record("create_rollout_table", rows=rows, keys=sorted(wandb_metrics))
        if len(self.rollouts_for_wandb) > 0:
            table = wandb.Table(columns=["text", "score", "prompt"])
            for group in self.rollouts_for_wandb:
                for item in group:
                    table.add_data(item[0], item[1], item[2])
            wandb_metrics["train/hooked_rollouts"] = table
        self.rollouts_for_wandb = []
        return wandb_metrics

    def perf_stats(self, metrics_dict):
        metrics_dict = super().perf_stats(metrics_dict)
        metrics_dict["train_perf/hooked_perf_stats"] = 1.0
        self._record("perf_stats", keys=sorted(metrics_dict))
        return metrics_dict

    async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
        if wandb_metrics is None:
            wandb_metrics = {}
        if self.reply_lengths:
            wandb_metrics["train/hooked_reply_chars"] = sum(self.reply_lengths) / len(
                self.reply_lengths
            )
        self.reply_lengths = []
        self._record("wandb_log", curr_step=self.curr_step, keys=sorted(wandb_metrics))
        await super().wandb_log(wandb_metrics)

    async def evaluate(self, *args, **kwargs):
        self._record("evaluate", curr_step=self.curr_step)


if __name__ == "__main__":
    WandbHooksEnv.cli()
