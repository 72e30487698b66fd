"""A multi-turn gymnasium game environment in upstream Atropos's style.

Modelled on upstream's game_environments/gymnasium/blackjack/blackjack_env_thinking.py:
each turn samples `group_size` alternative replies, parses each reply's hermes
tool call into an action with `parse_tool_call`, scores each alternative by
simulating its action on a replay of the episode, keeps the best one with
`best_of_n_selection.select_best_index` (ties: fewer tokens), puts it into the
history with its thinking cut by `message_history_utils.truncate_thinking`, and
steps the real episode with it. Every turn is one ScoredDataGroup (with the
episode's `seed` and the alternatives' `parsed_actions`), and the episode's turns
pass through `ensure_trajectory_token_limit` before they are returned.
"""

# upstream's typing style (typing.List/Dict/Optional) is kept on purpose
# ruff: noqa: UP006, UP035, UP045

import json
import logging
from typing import Dict, List, Optional, Tuple

import gymnasium

from atroposlib.envs.base import (
    APIServerConfig,
    BaseEnv,
    BaseEnvConfig,
    ScoredDataGroup,
)
from atroposlib.utils.best_of_n_selection import select_best_index
from atroposlib.utils.message_history_utils import (
    ensure_trajectory_token_limit,
    truncate_thinking,
)
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer
from atroposlib.utils.tool_call_parser import parse_tool_call

logger = logging.getLogger(__name__)

ACTION_STICK = 0
ACTION_HIT = 1


class BlackjackConfig(BaseEnvConfig):
    env_name: str = "Blackjack-v1"
    temperature: float = 0.7
    max_turns: int = 5
    first_seed: int = 0
    max_think_chars_history: int = 8
    max_trajectory_tokens: int = 4096


class BlackjackScoredDataGroup(ScoredDataGroup):
    seed: int
    parsed_actions: Optional[List[int]] = None


class BlackjackBestOfNEnv(BaseEnv):
    name = "blackjack_best_of_n"
    env_config_cls = BlackjackConfig

    def __init__(
        self,
        config: BlackjackConfig,
        server_configs: List[APIServerConfig],
        slurm: bool = True,
        testing: bool = False,
    ):
        super().__init__(config, server_configs, slurm, testing)
        self.config: BlackjackConfig = config
        self.completed_episode_metrics_buffer: List[Dict[str, float]] = []
        self.tools = [
            {
                "type": "function",
                "function": {
                    "name": "take_action",
                    "description": "Choose to 'hit' or 'stick' in Blackjack.",
                    "parameters": {"action": {"type": "string", "enum": ["hit", "stick"]}},
                },
            }
        ]
        self.system_prompt = (
            "You are an AI agent playing Blackjack. Think inside <think> </think> tags, then "
            "call the take_action function.\n\n"
            f"<tools>\n{json.dumps(self.tools)}\n</tools>\n\n"
            "Return the call within <tool_call> </tool_call> tags:\n"
            '<tool_call>\n{"arguments": {"action": "hit"}, "name": "take_action"}\n</tool_call>'
        )

    @classmethod
    def config_init(cls) -> Tuple[BlackjackConfig, List[APIServerConfig]]:
        env_config = BlackjackConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
            group_size=2,
            use_wandb=False,
            rollout_server_url="http://localhost:8000",
            max_token_length=4096,
            wandb_name=cls.name,
            steps_per_eval=100,
            total_steps=4,
        )
        server_configs = [
            APIServerConfig(
                model_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
                base_url="http://localhost:9001/v1",
                api_key="x",
                num_requests_for_eval=8,
            ),
        ]
        return env_config, server_configs

    def _format_observation(self, obs: Tuple[int, int, int]) -> str:
        player_sum, dealer_card, usable_ace = obs
        return (
            f"Your current hand sum is {player_sum}. "
            f"The dealer is showing a {dealer_card}. "
            f"You have a usable ace: {'yes' if usable_ace else 'no'}."
        )

    def _parse_action(self, response: str) -> int:
        name, args, is_error = parse_tool_call(response, self.tools, ["tool_call"])
        if is_error or name != "take_action":
            return -1
        action = str(args.get("action", "")).lower()
        return {"hit": ACTION_HIT, "stick": ACTION_STICK}.get(action, -1)

    def _simulate(self, seed: int, actions: List[int], action: int) -> Tuple[float, bool]:
        """Replay the episode's actions from its seed, then try `action`."""
        sim = gymnasium.make(self.config.env_name)
        try:
            sim.reset(seed=seed)
            for past in actions:
                sim.step(past)
            _, reward, terminated, truncated, _ = sim.step(action)
            return float(reward), bool(terminated or truncated)
        finally:
            sim.close()

    async def collect_trajectories(
        self, item: Tuple[int, int]
    ) -> Tuple[List[BlackjackScoredDataGroup], List[Tuple[int, int]]]:
        seed, _ = item
        env = gymnasium.make(self.config.env_name)
        obs, _ = env.reset(seed=seed)
        history = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self._format_observation(obs)},
        ]
        actions: List[int] = []
        total_reward = 0.0
        trajectory: List[BlackjackScoredDataGroup] = []
        try:
            for _turn in range(self.config.max_turns):
                completions = await self.server.chat_completion(
                    messages=history,
                    n=self.config.group_size,
                    max_tokens=256,
                    temperature=self.config.temperature,
                )
                responses = [choice.message.content for choice in completions.choices]
                alt_tokens, alt_masks, alt_scores, alt_messages, alt_actions = [], [], [], [], []
                for response in responses:
                    action = self._parse_action(response)
                    if action == -1:
                        score = -1.0
                    else:
                        reward, terminal = self._simulate(seed, actions, action)
                        score = reward if terminal else 0.0
                    messages = history + [{"role": "assistant", "content": response}]
                    tokenized = tokenize_for_trainer(self.tokenizer, messages)
                    alt_tokens.append(tokenized["tokens"])
                    alt_masks.append(tokenized["masks"])
                    alt_scores.append(score)
                    alt_messages.append(messages)
                    alt_actions.append(action)

                trajectory.append(
                    BlackjackScoredDataGroup(
                        seed=seed,
                        tokens=alt_tokens,
                        masks=alt_masks,
                        scores=alt_scores,
                        messages=alt_messages,
                        parsed_actions=alt_actions,
                    )
                )
                best = select_best_index(
                    primary_scores=alt_scores,
                    secondary_scores=[len(t) for t in alt_tokens],
                    primary_higher_is_better=True,
                    secondary_lower_is_better=True,
                )
                chosen_action = alt_actions[best] if alt_actions[best] != -1 else ACTION_STICK
                history.append(
                    {
                        "role": "assistant",
                        "content": truncate_thinking(
                            responses[best], self.tokenizer, self.config.max_think_chars_history
                        ),
                    }
                )
                obs, reward, terminated, truncated, _ = env.step(chosen_action)
                actions.append(chosen_action)
                total_reward += float(reward)
                if terminated or truncated:
                    break
                history.append({"role": "user", "content": self._format_observation(obs)})
        finally:
            env.close()

        self.completed_episode_metrics_buffer.append(
            {"seed": seed, "total_reward": total_reward, "num_steps": len(actions)}
        )
        limited = ensure_trajectory_token_limit(
            trajectory, self.tokenizer, self.config.max_trajectory_tokens
        )
        return limited, []

    async def setup(self):
        self.iter = 0

    async def get_next_item(self) -> Tuple[int, int]:
        seed = self.config.first_seed + self.iter
        self.iter += 1
        return (seed, 0)

    async def evaluate(self, *args, **kwargs):
        rewards = []
        for offset in range(2):
            trajectory, _ = await self.collect_trajectories((10_000 + offset, 0))
            rewards.append(self.completed_episode_metrics_buffer[-1]["total_reward"])
        await self.evaluate_log(metrics={"eval/avg_reward": sum(rewards) / len(rewards)})

    async def wandb_log(self, wandb_metrics: Optional[Dict[str, float]] = None):
        if wandb_metrics is None:
            wandb_metrics = {}
        if self.completed_episode_metrics_buffer:
            episodes = self.completed_episode_metrics_buffer
            wandb_metrics[f"{self.name}_train/avg_episode_reward"] = sum(
                e["total_reward"] for e in episodes
            ) / len(episodes)
            wandb_metrics[f"{self.name}_train/avg_episode_turns"] = sum(
                e["num_steps"] for e in episodes
            ) / len(episodes)
        self.completed_episode_metrics_buffer = []
        await super().wandb_log(wandb_metrics)


if __name__ == "__main__":
    BlackjackBestOfNEnv.cli()
