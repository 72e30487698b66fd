"""gym_blackjack: the action parser, the score, and whole episodes checked against the game.

Scripted policies play fixed strategies through a vLLM look-alike; every episode the
env wrote is re-played with gymnasium itself from its seed and the actions found in
its messages, so the scores are checked against the game, not the env's own code
(`process`, `serve` and `evaluate` are rows of tests/environments/test_env_table.py).
There is no dataset (items are generated seeds), so there is no hub path to test.
"""

from __future__ import annotations

import itertools
import json
import re

import pytest

from environments.gym_blackjack import (
    ACTIONS,
    BlackjackGame,
    GymBlackjackEnv,
    describe_hand,
)
from environments.gym_tool_game import TRAIN_SEEDS, parse_action, visible_text
from tests.environments.gym_tool_game_checks import (
    PENALTY,
    call,
    check_sequence,
    collect,
    make_env,
    played_actions,
)
from tests.support.env_table import EvaluateRow, ProcessRow, Run, ServeRow, scripted
from tests.support.scripted_model import ScriptedModel, last_turn

gymnasium = pytest.importorskip("gymnasium")

MULTI_TURN_SEED = 3  # a 7 against a 10: a hit gives 17, the hand goes on

# ---------------------------------------------------------------- the parser


@pytest.mark.parametrize(
    "text",
    [
        call("hit"),
        call("stick", thought="I have 20."),
        "Sticking at 20.\n" + call("stick"),  # prose around one call is fine
        '<tool_call>{"name": "take_action", "arguments": {"action": " HIT "}}</tool_call>',
        '<tool_call>{"name": "take_action", "arguments": "{\\"action\\": \\"hit\\"}"}</tool_call>',
        "deciding... hit is best</think>\n" + call("hit"),  # the template opened <think>
        "<think>maybe stick?</think>" + call("hit") + "<think>done</think>",
    ],
)
def test_a_valid_call_is_parsed(text):
    parsed = parse_action(text, ACTIONS)
    assert parsed.error is None and parsed.action in ACTIONS
    assert parsed.action == ("stick" if '"stick"' in text else "hit")


@pytest.mark.parametrize(
    ("text", "finish", "error"),
    [
        (call("hit").replace("take_action", "play"), "stop", "unknown tool 'play'"),
        (call("double"), "stop", "invalid action 'double'"),
        ('<tool_call>{"name": "take_action", "arguments": {}}</tool_call>', "stop", "None"),
        ("<think>" + call("hit") + "</think>I will not say.", "stop", "no tool call"),
        ("<think>let me call " + call("hit"), "stop", "no tool call"),  # never closed
        ("I would hit here, the dealer shows a 10.", "stop", "no tool call"),
        ("", "stop", "no tool call"),
        (call("hit") + call("stick"), "stop", "2 tool calls"),
        (
            '<tool_call>{"name": "take_action", "arguments": {"action": "hit"}</tool_call>',
            "stop",
            "not valid JSON",
        ),
        (
            '<tool_call>{"name": "take_action", "arguments": {"action": "hit"}}',
            "stop",
            "no tool call",
        ),  # cut before the closing tag
        ("<think>" + "hmm " * 500, "length", "cut off"),
        (call("hit"), "length", "cut off"),  # a reply stopped by max_tokens never counts
    ],
)
def test_a_broken_reply_is_no_action(text, finish, error):
    parsed = parse_action(text, ACTIONS, finish)
    assert parsed.action is None and error in parsed.error


def test_visible_text_drops_every_kind_of_thinking():
    assert visible_text("<think>a</think>b<think>c</think>d") == "bd"
    assert visible_text("a</think>b") == "b"
    assert visible_text("a<think>b") == "a"


def test_score_is_the_return_and_a_hand_reads_in_words():
    game = BlackjackGame()
    assert [game.score(None, r, 1, True, 8) for r in (1.0, 0.0, -1.0, 1.5)] == [1, 0, -1, 1]
    assert game.won(1.0, True) and not game.won(0.0, True)
    assert describe_hand((13, 1, 1)) == (
        "Your hand totals 13 (with a usable ace counted as 11). The dealer shows an ace. "
        "Hit or stick?"
    )


# ---------------------------------------------------------------- replaying the game


def replay(seed: int, actions: list[str]) -> tuple[float, bool, list[int]]:
    """(return, game over, the hand total before each action) on Blackjack-v1 itself."""
    game = gymnasium.make("Blackjack-v1")
    obs, _ = game.reset(seed=seed)
    total, done, hands = 0.0, False, []
    for action in actions:
        assert not done, "an action after the game ended"
        hands.append(int(obs[0]))
        obs, reward, terminated, truncated, _ = game.step({"stick": 0, "hit": 1}[action])
        total, done = total + float(reward), bool(terminated or truncated)
    game.close()
    return total, done, hands


def threshold_reply(prompt: str, threshold: int) -> str:
    total = int(re.search(r"Your hand totals (\d+)", last_turn(prompt)).group(1))
    return call("hit" if total < threshold else "stick", thought=f"I hold {total}.")


THRESHOLDS = itertools.cycle([12, 17, 20])  # a different cautiousness on each call


def mixed_policy(prompt: str, n: int) -> list[str]:
    return [threshold_reply(prompt, next(THRESHOLDS)) for _ in range(n)]


# ---------------------------------------------------------------- episodes in-process


MALFORMED = [
    call("hit").replace("take_action", "hit_me"),  # wrong tool name
    call("split"),  # an action the game does not have
    "<think>" + call("hit") + "</think>",  # the call only inside the thinking
    "Hit me, please.",  # prose
    "",  # nothing
]


def test_every_malformed_reply_ends_the_episode_with_the_penalty(tiny_model_path):
    kinds = itertools.cycle(MALFORMED)
    with ScriptedModel(lambda prompt, n: [next(kinds) for _ in range(n)], tiny_model_path) as m:
        env = make_env(GymBlackjackEnv, m, tiny_model_path, group_size=len(MALFORMED))
        group = collect(env, MULTI_TURN_SEED)
    assert group["scores"] == [PENALTY] * len(MALFORMED)
    assert group["actions"] == [[]] * len(MALFORMED)
    replies = sorted(messages[-1]["content"] for messages in group["messages"])
    assert replies == sorted(MALFORMED)
    assert all(len(messages) == 3 for messages in group["messages"])


def test_a_broken_second_reply_is_penalised_after_a_legal_first(tiny_model_path):
    def policy(prompt: str, n: int) -> list[str]:
        return ["I think I'll stop now."] * n if "You drew" in last_turn(prompt) else [call("hit")]

    with ScriptedModel(policy, tiny_model_path) as model:
        env = make_env(GymBlackjackEnv, model, tiny_model_path)
        group = collect(env, MULTI_TURN_SEED)
    assert replay(MULTI_TURN_SEED, ["hit"])[1] is False  # the hand was still going
    assert group["scores"] == [PENALTY] and group["actions"] == [["hit"]]
    roles = [m["role"] for m in group["messages"][0]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    check_sequence(group["tokens"][0], group["masks"][0], group["messages"][0], env.tokenizer)


def test_the_turn_cap_scores_what_the_game_paid_so_far(tiny_model_path):
    with ScriptedModel(lambda prompt, n: [call("hit")] * n, tiny_model_path) as model:
        env = make_env(GymBlackjackEnv, model, tiny_model_path, max_turns=1)
        group = collect(env, MULTI_TURN_SEED)
    assert group["scores"] == [0.0] and group["actions"] == [["hit"]]
    assert [m["role"] for m in group["messages"][0]][-1] == "assistant"


# ---------------------------------------------------------------- the env table's rows


def game_returns(group: dict) -> list[float]:
    """What Blackjack-v1 itself pays for each episode's actions, from the group's seed."""
    return [replay(group["seed"], played_actions(messages))[0] for messages in group["messages"]]


def check_process(groups: list[dict], run: Run) -> None:
    turns = []
    for group in groups:
        assert 0 <= group["seed"] < TRAIN_SEEDS
        for i, messages in enumerate(group["messages"]):
            actions = played_actions(messages)
            assert replay(group["seed"], actions)[1] and group["actions"][i] == actions
            assert group["scores"][i] == group["returns"][i]
            check_sequence(group["tokens"][i], group["masks"][i], messages, run.tokenizer)
            turns.append(len(actions))
    assert max(turns) >= 2, f"no episode lasted several turns: {turns}"


def check_evaluate(results: dict, samples: list[dict], run: Run) -> None:
    assert sorted(s["seed"] for s in samples) == list(range(TRAIN_SEEDS, TRAIN_SEEDS + 6))
    returns = []
    for sample in samples:
        game_return, done, hands = replay(sample["seed"], sample["actions"])
        assert done and sample["return"] == sample["score"] == game_return
        # the strategy itself: hit below 17, then stick (unless the hit ended the hand)
        assert sample["actions"] == ["hit" if h < 17 else "stick" for h in hands]
        returns.append(game_return)
    assert results["eval/win_rate"] == pytest.approx(sum(r > 0 for r in returns) / 6)
    assert results["eval/mean_return"] == pytest.approx(sum(returns) / 6)
    assert results["eval/invalid_action_rate"] == 0.0
    assert json.dumps(samples)  # plain JSON


def check_offline(groups: list[dict]) -> None:
    """The documented command on the tiny model: its noise is no action, and penalised."""
    budget = GymBlackjackEnv.config_init()[0].max_token_length
    for group in groups:
        for tokens, masks, messages, score in zip(
            group["tokens"], group["masks"], group["messages"], group["scores"], strict=True
        ):
            assert len(tokens) <= budget and masks[-1] != -100
            if parse_action(messages[-1]["content"], ACTIONS).action is None:
                assert score == PENALTY
            else:
                assert -1.0 <= score <= 1.0


# The questions every env is asked (tests/environments/test_env_table.py): whole
# episodes in `process` and `serve`, scored as the game pays; greedy `evaluate`.
MIXED = scripted(mixed_policy)
PROCESS = ProcessRow(
    env=GymBlackjackEnv,
    model=MIXED,
    group_size=3,
    steps=4,
    scores=game_returns,
    args=lambda run: [
        *("--env.seed", "7", "--env.max_tokens", "128", "--env.max_token_length", "4096"),
    ],
    check=check_process,
)
SERVE = ServeRow(
    env=GymBlackjackEnv,
    model=MIXED,
    group_size=2,
    batch_size=4,
    max_token_len=4096,
    groups=2,
    batches=1,
    scores=game_returns,
    args=lambda run: ["--env.max_tokens", "128", "--env.ensure_scores_are_not_same", "false"],
)
EVALUATE = EvaluateRow(
    env=GymBlackjackEnv,
    model=scripted(lambda prompt, n: [threshold_reply(prompt, 17)] * n),
    samples=6,
    args=lambda run: [
        *("--env.eval_episodes", "6", "--env.max_tokens", "128"),
        *("--env.max_token_length", "4096"),
    ],
    check=check_evaluate,
)
OFFLINE = check_offline
