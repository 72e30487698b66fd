"""Scripted "models" for the compat envs, and an independent replay of Blackjack-v1.

The policies answer through `PolicyChatServer`, so an env's parsing and scoring of
what the model said can be checked exactly: the hermes policy gives, per request,
a right call, a call with wrong arguments and prose with no call; the blackjack
policy gives, per turn, a "hit" reply and a longer "stick" reply, both thinking
first. The replay re-plays an episode with gymnasium itself, so a test checks
the env's scores against the game, not against the env's own code.
"""

from __future__ import annotations

import json
import re
from typing import Any

HIT, STICK = 1, 0

TOOL_ANSWERS = {
    "What's the weather in Paris, in celsius?": {
        "name": "get_weather",
        "arguments": {"city": "Paris", "unit": "celsius"},
    },
    "How much is 12 EUR in USD?": {
        "name": "convert_currency",
        "arguments": {"amount": 12, "source": "EUR", "target": "USD"},
    },
}


def hermes_reply(kind: str, question: str) -> str:
    """kind: 'right' (the expected call), 'wrong_args' (same tool), 'prose' (no call)."""
    call = json.loads(json.dumps(TOOL_ANSWERS[question]))
    if kind == "prose":
        return "I am not sure which tool to use, sorry."
    if kind == "wrong_args":
        first = next(iter(call["arguments"]))
        call["arguments"][first] = "WRONG"
    thought = f"<think>\nThe user needs {call['name']}.\n</think>\n"
    return f"{thought}<tool_call>\n{json.dumps(call)}\n</tool_call>"


HERMES_KINDS = ("right", "wrong_args", "prose")
HERMES_SCORES = {"right": 1.0, "wrong_args": 0.0, "prose": -1.0}


def hermes_policy(messages: list[dict[str, Any]], n: int) -> list[str]:
    question = messages[-1]["content"]
    return [hermes_reply(HERMES_KINDS[i % 3], question) for i in range(n)]


def blackjack_reply(action: int) -> str:
    if action == HIT:
        thought = "One more card should help here. " * 6
    else:
        thought = "I will stay with the cards I have now, no more. " * 6
    name = "hit" if action == HIT else "stick"
    call = {"arguments": {"action": name}, "name": "take_action"}
    return f"<think>\n{thought.strip()}\n</think>\n<tool_call>\n{json.dumps(call)}\n</tool_call>"


def blackjack_policy(messages: list[dict[str, Any]], n: int) -> list[str]:
    """Alternatives hit, stick, hit, ... (the hit reply is the shorter one)."""
    return [blackjack_reply(HIT if i % 2 == 0 else STICK) for i in range(n)]


def action_in(text: str) -> int:
    """The action a (possibly thinking-truncated) reply calls, -1 if none."""
    found = re.search(r'"action":\s*"(hit|stick)"', text)
    if not found:
        return -1
    return HIT if found.group(1) == "hit" else STICK


def replay(seed: int, actions: list[int]) -> tuple[float, bool]:
    """Reward and terminal flag of the last of `actions`, played on Blackjack-v1 from `seed`."""
    import gymnasium

    env = gymnasium.make("Blackjack-v1")
    try:
        env.reset(seed=seed)
        reward, done = 0.0, False
        for action in actions:
            _, reward, terminated, truncated, _ = env.step(action)
            done = bool(terminated or truncated)
        return float(reward), done
    finally:
        env.close()


def alternative_score(seed: int, history: list[int], action: int) -> float:
    """The score an alternative deserves: its reward if it ends the game, else 0."""
    reward, done = replay(seed, [*history, action])
    return reward if done else 0.0


def long_episode_seed(start: int = 0) -> int:
    """A seed whose first hand makes the env keep playing: hitting neither busts nor
    scores below sticking, so the best-of-n choice is "hit" and a second turn follows."""
    seed = start
    while True:
        hit = replay(seed, [HIT])
        stick = alternative_score(seed, [], STICK)
        if not hit[1] and stick <= 0.0:
            return seed
        seed += 1
