"""gym_blackjack: the action parser, the score, and whole episodes checked against the game.

Scripted policies play fixed strategies through a vLLM look-alike; every episode the
env wrote is re-played with gymnasium itself from its seed and the actions found in
its messages, so the scores are checked against the game, not the env's own code.
There is no dataset (items are generated seeds), so there is no hub path to test.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

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
    evaluate_in_process,
    make_env,
    played_actions,
    process,
    process_in_process,
)
from tests.support.compat_runs import serve_flags, serve_groups
from tests.support.processes import InferenceProcess
from tests.support.scripted_model import ScriptedModel, last_turn

gymnasium = pytest.importorskip("gymnasium")

SCRIPT = str(Path(__file__).resolve().parents[2] / "environments" / "gym_blackjack.py")
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


@pytest.fixture
def scripted(tiny_model_path):
    with ScriptedModel(mixed_policy, tiny_model_path) as server:
        yield server


def test_process_scores_equal_the_games_returns(scripted, tiny_model_path, tmp_path):
    env = make_env(GymBlackjackEnv, scripted, tiny_model_path, group_size=3, total_steps=4, seed=7)
    groups = process_in_process(env, tmp_path)
    assert len(groups) == 4
    turns = []
    for group in groups:
        assert len(group["tokens"]) == len(group["masks"]) == len(group["scores"]) == 3
        assert 0 <= group["seed"] < TRAIN_SEEDS
        for i, messages in enumerate(group["messages"]):
            actions = played_actions(messages)
            game_return, done, _ = replay(group["seed"], actions)
            assert done and group["actions"][i] == actions
            assert group["scores"][i] == group["returns"][i] == game_return
            check_sequence(group["tokens"][i], group["masks"][i], messages, env.tokenizer)
            turns.append(len(actions))
    assert max(turns) >= 2, f"no episode lasted several turns: {turns}"


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


# ---------------------------------------------------------------- the tiny model, serve, evaluate


@pytest.fixture(scope="module")
def long_context_tiny(tiny_model_path, tmp_path_factory):
    """The tiny model served with room for the tools prompt (~1300 tokens here; its
    trained 512 positions are too few, and RoPE positions beyond them only add noise)."""
    server = InferenceProcess(
        tiny_model_path, tmp_path_factory.mktemp("tiny"), "tiny", "--max-model-len", "2048"
    )
    yield server
    server.stop()


def test_process_on_the_tiny_model(long_context_tiny, tiny_model_path, tmp_path):
    groups = process(
        SCRIPT,
        tmp_path,
        *("--env.tokenizer_name", str(tiny_model_path), "--env.group_size", "2"),
        *("--env.total_steps", "1", "--env.max_tokens", "24"),
        *("--env.max_token_length", "2048"),
        *("--openai.base_url", f"{long_context_tiny.url}/v1", "--openai.model_name", "tiny"),
        *("--openai.server_type", "vllm", "--openai.api_key", "x"),
    )
    assert len(groups) == 1
    group = groups[0]
    assert len(group["tokens"]) == len(group["masks"]) == len(group["scores"]) == 2
    for tokens, masks, messages, score in zip(
        group["tokens"], group["masks"], group["messages"], group["scores"], strict=True
    ):
        assert len(tokens) == len(masks) <= 2048 and masks[0] == -100 and masks[-1] != -100
        if parse_action(messages[-1]["content"], ACTIONS).action is None:
            assert score == PENALTY  # noise is no action
        else:
            assert -1.0 <= score <= 1.0


def test_serve_sends_whole_episodes_to_the_api(api, scripted, tiny_model_path, tmp_path):
    args = [
        *("--env.tokenizer_name", str(tiny_model_path), *scripted.flags()),
        *serve_flags(api.url, "--env.ensure_scores_are_not_same", "false"),
        *("--env.group_size", "2", "--env.max_tokens", "128", "--env.use_wandb", "false"),
    ]
    groups, _ = serve_groups(
        api.url, SCRIPT, tmp_path / "serve", *args, batch_size=4, max_token_len=4096, batches=1
    )
    assert len(groups) == 2
    for group in groups:
        assert len(group["tokens"]) == len(group["scores"]) == 2
        for messages, score in zip(group["messages"], group["scores"], strict=True):
            assert score == replay(group["seed"], played_actions(messages))[0]


def test_evaluate_plays_the_eval_seeds_greedily(tiny_model_path, tmp_path):
    def policy(prompt: str, n: int) -> list[str]:
        return [threshold_reply(prompt, 17)] * n

    with ScriptedModel(policy, tiny_model_path) as model:
        env = make_env(GymBlackjackEnv, model, tiny_model_path, eval_episodes=6)
        metrics, samples = evaluate_in_process(env, tmp_path)
        assert {r["temperature"] for r in model.requests} == {0.0}
    assert sorted(s["seed"] for s in samples) == list(range(TRAIN_SEEDS, TRAIN_SEEDS + 6))
    returns = []
    for sample in samples:
        game_return, done, hands = replay(sample["seed"], sample["actions"])
        assert done and sample["return"] == sample["score"] == game_return
        # the strategy itself: hit below 17, then stick (unless the hit ended the hand)
        assert sample["actions"] == ["hit" if h < 17 else "stick" for h in hands]
        returns.append(game_return)
    assert metrics["eval/win_rate"] == pytest.approx(sum(r > 0 for r in returns) / 6)
    assert metrics["eval/mean_return"] == pytest.approx(sum(returns) / 6)
    assert metrics["eval/invalid_action_rate"] == 0.0
    assert json.dumps(samples)  # plain JSON
