"""The loop the gymnasium game environments share: observe in words, act by a tool call.

`gym_blackjack.py` and `gym_taxi.py` each describe one game (`ToolGame`: its actions,
how a state reads in words, how an episode is scored); this module plays it.

One episode: the env resets the game from a seed, describes the state as the user
turn, and offers one hermes tool, `take_action(action)`. Each reply is parsed by
`parse_action`; a legal action steps the game and the next state comes back as a
`role: tool` turn, until the game ends, `max_turns` replies were made, or the next
reply would not fit in the token budget. All turns go through one `ManagedServer`,
so the whole episode is one trained sequence: every reply's tokens are trained on,
the prompt and every tool result are masked (-100). A group is `group_size`
episodes of the same seed, so GRPO compares different play from one deal.

Design decisions:
- What the model wrote is what is scored. The action is read from the reply's own
  tokens (the sequence node), not from the server's parse, and the reply is sent
  back verbatim as the assistant turn, so the re-rendered conversation always
  extends the same token sequence, whatever the reply looked like.
- A reply must hold exactly one `<tool_call>{"name": "take_action", "arguments":
  {"action": ...}}</tool_call>` outside `<think>` blocks, with an action the game
  knows. Anything else (no call, prose, a call only inside the thinking, another
  tool name, an unknown action, broken JSON, two calls, a reply cut off at
  `max_tokens`) is an invalid action: the episode ends there and scores
  `invalid_action_score` (-1.5 by default). Legal play scores within [-1, 1], so a
  broken reply is always worse than the worst game, and the policy learns the
  format before it learns the game. (Upstream's blackjack ends such an episode at
  -1.0, the same as a loss.)
- Items are game seeds: there is no dataset. Training seeds are drawn from
  [0, 1_000_000) by a generator seeded with `seed`; evaluation plays the fixed
  seeds `eval_first_seed`, `eval_first_seed + 1`, ... (1_000_000 up by default), so
  evaluation deals are never trained on and every evaluation sees the same deals.
- Evaluation is greedy (temperature 0) through the same loop, one episode per seed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.server_handling.chat_prompt import render_prompt, template_renders_tools

logger = logging.getLogger(__name__)

TOOL_NAME = "take_action"
TRAIN_SEEDS = 1_000_000
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
PROMPT_MARGIN = 8  # tokens: re-encoding the whole prompt may split a boundary differently


@dataclass(frozen=True)
class ParsedAction:
    """The action a reply takes, or why it takes none (`error`)."""

    action: str | None
    error: str | None = None


def visible_text(text: str) -> str:
    """`text` without its thinking: closed `<think>` blocks removed, an unopened
    `</think>` hides what precedes it (templates that open the block in the prompt),
    an unclosed `<think>` hides what follows it."""
    text = THINK_BLOCK.sub("", text)
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    if "<think>" in text:
        text = text.split("<think>", 1)[0]
    return text


def parse_action(text: str, actions: tuple[str, ...], finish_reason: str = "stop") -> ParsedAction:
    """The one legal `take_action` call in a reply, outside its thinking (see module doc)."""
    if finish_reason == "length":
        return ParsedAction(None, "reply cut off at max_tokens")
    blocks = TOOL_CALL.findall(visible_text(text))
    if not blocks:
        return ParsedAction(None, "no tool call outside the thinking")
    if len(blocks) > 1:
        return ParsedAction(None, f"{len(blocks)} tool calls; exactly one is allowed")
    try:
        call = json.loads(blocks[0])
    except json.JSONDecodeError:
        return ParsedAction(None, "the tool call is not valid JSON")
    if not isinstance(call, dict) or call.get("name") != TOOL_NAME:
        name = call.get("name") if isinstance(call, dict) else None
        return ParsedAction(None, f"unknown tool {name!r}")
    arguments = call.get("arguments")
    if isinstance(arguments, str):  # OpenAI's own shape: arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ParsedAction(None, "arguments are not valid JSON")
    action = arguments.get("action") if isinstance(arguments, dict) else None
    if not isinstance(action, str) or action.strip().lower() not in actions:
        return ParsedAction(None, f"invalid action {action!r}; one of {', '.join(actions)}")
    return ParsedAction(action.strip().lower())


def action_tool(actions: tuple[str, ...], description: str) -> dict[str, Any]:
    """The OpenAI tool schema of `take_action` for a game's actions."""
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {"action": {"type": "string", "enum": list(actions)}},
                "required": ["action"],
            },
        },
    }


class ToolGame(ABC):
    """One gymnasium game as the shared loop sees it."""

    actions: tuple[str, ...]  # tool argument values; the index is the gymnasium action
    tool_description: str
    system_prompt: str

    @abstractmethod
    def make(self) -> Any:
        """A fresh gymnasium env."""

    @abstractmethod
    def describe(self, game: Any, obs: Any) -> str:
        """The state in words (the first user turn)."""

    @abstractmethod
    def result(self, game: Any, action: str, obs: Any, reward: float) -> str:
        """The tool result after a step that did not end the game."""

    @abstractmethod
    def score(
        self, start_obs: Any, game_return: float, turns: int, finished: bool, horizon: int
    ) -> float:
        """An episode's score in [-1, 1] from the game's return."""

    @abstractmethod
    def won(self, game_return: float, finished: bool) -> bool:
        """Whether the episode counts as a win."""


@dataclass
class Episode:
    """One played episode: what was said, what was played, and how it scored."""

    seed: int
    messages: list[dict[str, Any]]
    actions: list[str] = field(default_factory=list)
    game_return: float = 0.0
    outcome: str = "turn_cap"  # finished | invalid | turn_cap | context_cap
    error: str | None = None
    score: float = 0.0
    won: bool = False
    node: Any = None

    def sample(self) -> dict[str, Any]:
        """The evaluation sample: seed, actions, return and score."""
        return {
            "seed": self.seed,
            "actions": self.actions,
            "return": self.game_return,
            "score": self.score,
            "won": self.won,
            "outcome": self.outcome,
            "error": self.error,
            "messages": self.messages,
        }


class GymToolGameConfig(BaseEnvConfig):
    """`BaseEnvConfig` plus the episode, sampling and evaluation settings of a game."""

    seed: int = Field(0, description="Seed for the stream of training game seeds.")
    max_turns: int = Field(10, ge=1, description="Most replies (actions) per episode.")
    max_tokens: int = Field(512, ge=1, description="Most tokens per reply.")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature for rollouts.")
    invalid_action_score: float = Field(
        -1.5, description="Score of an episode ended by a malformed or invalid action."
    )
    eval_episodes: int = Field(100, ge=1, description="Greedy episodes in the evaluation.")
    eval_first_seed: int = Field(
        TRAIN_SEEDS, description="Evaluation plays seeds eval_first_seed .. + eval_episodes - 1."
    )


class GymToolGameEnv(BaseEnv):
    """A `ToolGame` played over several tool-call turns; subclasses set `game`."""

    env_config_cls = GymToolGameConfig
    game: ToolGame

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recent: list[Episode] = []  # training episodes since the last log
        self.tools = [action_tool(self.game.actions, self.game.tool_description)]
        self._native_tools: bool | None = None

    async def setup(self) -> None:
        self.server.tool_parser = "hermes"
        self.rng = random.Random(self.config.seed)

    async def get_next_item(self) -> dict[str, int]:
        return {"seed": self.rng.randrange(TRAIN_SEEDS)}

    def _token_budget(self) -> int:
        """Longest sequence allowed: the config's, or the trainer's when that is smaller."""
        limit = self.config.max_token_length
        return min(limit, self.max_token_len) if self.max_token_len > 0 else limit

    def _prompt_tokens(self, messages: list[dict[str, Any]]) -> int:
        """About how many tokens the next prompt is (as ManagedServer renders it)."""
        if self._native_tools is None:
            self._native_tools = template_renders_tools(self.tokenizer)
        text = render_prompt(
            self.tokenizer, messages, tools=self.tools, native_tools=self._native_tools
        )
        ids = self.tokenizer.encode(text, add_special_tokens=True, verbose=False)
        return len(ids) + PROMPT_MARGIN

    def _reply_text(self, node: Any, prompt_len: int) -> str:
        """The reply exactly as written: its tokens after the prompt, less a final stop token."""
        ids = list(node.tokens[prompt_len:])
        special = set(getattr(self.tokenizer, "all_special_ids", None) or [])
        while ids and ids[-1] in special:
            ids.pop()
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    async def play(self, seed: int, temperature: float, split: str = "train") -> Episode:
        """One episode from `seed` (see the module doc for the rules)."""
        game = self.game.make()
        try:
            obs, _ = game.reset(seed=seed)
            start_obs = obs
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": self.game.system_prompt},
                {"role": "user", "content": self.game.describe(game, obs)},
            ]
            episode = Episode(seed=seed, messages=messages)
            finished = False
            async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
                for _ in range(self.config.max_turns):
                    room = self._token_budget() - self._prompt_tokens(messages)
                    if room < 1:
                        episode.outcome = "context_cap"
                        break
                    await managed.chat_completion(
                        messages=messages,
                        tools=self.tools,
                        n=1,
                        max_tokens=min(self.config.max_tokens, room),
                        temperature=temperature,
                        split=split,
                    )
                    nodes = managed.get_state()["nodes"]
                    if len(nodes) != 1:
                        logger.warning(
                            "seed %d: the conversation did not extend one sequence "
                            "(%d nodes); training on the last",
                            seed,
                            len(nodes),
                        )
                    node = nodes[-1]
                    prompt_len = len(node.tokens) - _completion_len(node)
                    episode.node = node
                    text = self._reply_text(node, prompt_len)
                    messages.append({"role": "assistant", "content": text})
                    finish = str(node.metadata.get("finish_reason", "stop"))
                    parsed = parse_action(text, self.game.actions, finish)
                    if parsed.action is None:
                        episode.outcome, episode.error = "invalid", parsed.error
                        break
                    episode.actions.append(parsed.action)
                    index = self.game.actions.index(parsed.action)
                    obs, reward, terminated, truncated, _ = game.step(index)
                    episode.game_return += float(reward)
                    if terminated or truncated:
                        episode.outcome, finished = "finished", bool(terminated)
                        break
                    messages.append(
                        {
                            "role": "tool",
                            "name": TOOL_NAME,
                            "content": self.game.result(game, parsed.action, obs, float(reward)),
                        }
                    )
        finally:
            game.close()
        if messages[-1]["role"] == "tool":  # the unanswered last result is not in the sequence
            messages.pop()
        if episode.outcome == "invalid":
            episode.score = self.config.invalid_action_score
        else:
            episode.score = self.game.score(
                start_obs,
                episode.game_return,
                len(episode.actions),
                finished,
                self.config.max_turns,
            )
            episode.won = self.game.won(episode.game_return, finished)
        return episode

    async def collect_trajectories(
        self, item: dict[str, int]
    ) -> tuple[dict[str, Any] | None, list]:
        """`group_size` episodes of one seed, each one whole sequence, scored by its play."""
        episodes = await asyncio.gather(
            *(
                self.play(item["seed"], self.config.temperature)
                for _ in range(self.config.group_size)
            )
        )
        if any(e.node is None for e in episodes):
            logger.error(
                "seed %d: the first prompt does not fit in %d tokens; no group",
                item["seed"],
                self._token_budget(),
            )
            return None, []
        self.recent.extend(episodes)
        group = {
            "tokens": [e.node.tokens for e in episodes],
            "masks": [e.node.masked_tokens for e in episodes],
            "scores": [e.score for e in episodes],
            "inference_logprobs": [e.node.logprobs for e in episodes],
            "messages": [e.messages for e in episodes],
            # kept beside the group (the API hands unknown keys on) to replay an episode
            "seed": item["seed"],
            "actions": [e.actions for e in episodes],
            "returns": [e.game_return for e in episodes],
        }
        return group, []

    @staticmethod
    def summary(episodes: list[Episode], prefix: str) -> dict[str, float]:
        """Win rate, mean return and score, invalid-action rate and mean turns."""
        count = max(1, len(episodes))
        return {
            f"{prefix}/win_rate": sum(e.won for e in episodes) / count,
            f"{prefix}/mean_return": sum(e.game_return for e in episodes) / count,
            f"{prefix}/mean_score": sum(e.score for e in episodes) / count,
            f"{prefix}/invalid_action_rate": sum(e.outcome == "invalid" for e in episodes) / count,
            f"{prefix}/mean_turns": sum(len(e.actions) for e in episodes) / count,
        }

    async def wandb_log(self, wandb_metrics: dict | None = None) -> None:
        """Adds the train/ summary of the episodes played since the last log."""
        metrics = dict(wandb_metrics or {})
        if self.recent:
            metrics.update(self.summary(self.recent, "train"))
            self.recent = []
        await super().wandb_log(metrics)

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """Greedy play of the fixed evaluation seeds: win rate, mean return, samples."""
        started = time.time()
        seeds = range(
            self.config.eval_first_seed, self.config.eval_first_seed + self.config.eval_episodes
        )
        episodes = await asyncio.gather(*(self.play(s, 0.0, split="eval") for s in seeds))
        await self.evaluate_log(
            self.summary(list(episodes), "eval"),
            start_time=started,
            end_time=time.time(),
            generation_parameters={
                "temperature": 0.0,
                "max_tokens": self.config.max_tokens,
                "max_turns": self.config.max_turns,
            },
            samples=[e.sample() for e in episodes],
        )


def _completion_len(node: Any) -> int:
    """Tokens of the node's last completion: the unmasked run at its end."""
    count = 0
    for mask in reversed(node.masked_tokens):
        if mask == -100:
            break
        count += 1
    return count
