"""An upstream-style multi-turn gymnasium env (Blackjack-v1, best-of-n per turn).

A scripted model offers "hit" and "stick" each turn; the env parses them with
`parse_tool_call`, scores each by simulating it, keeps the best with
`select_best_index` and shortens its thinking with `truncate_thinking`. The
test re-plays every scored alternative on gymnasium itself, so the scores are
checked against the game. Its `serve` is a row of tests/environments/test_env_table.py.
"""

from __future__ import annotations

import pytest

from tests.support.compat_policies import (
    HIT,
    STICK,
    action_in,
    alternative_score,
    blackjack_policy,
    blackjack_reply,
    long_episode_seed,
)
from tests.support.compat_runs import process_groups, tiny_flags
from tests.support.env_table import Run, ServeRow, chat, compat_env
from tests.support.policy_server import policy_fixture

pytest.importorskip("torch")
pytest.importorskip("gymnasium")

SCRIPT = "blackjack_best_of_n.py"


model = policy_fixture(blackjack_policy)


def history_actions(messages: list[dict]) -> list[int]:
    """The actions already played: the assistant turns before the scored reply."""
    return [action_in(m["content"]) for m in messages[:-1] if m["role"] == "assistant"]


def check_history(messages: list[dict]) -> None:
    """Earlier replies are in the history with their thinking cut, their call intact."""
    for message in messages[:-1]:
        if message["role"] != "assistant":
            continue
        action = action_in(message["content"])
        assert action in (HIT, STICK)
        assert message["content"].startswith("<think>\n... "), message["content"]
        assert len(message["content"]) < len(blackjack_reply(action))
        assert message["content"].rstrip().endswith("</tool_call>")


def test_process_plays_several_turns_scored_by_the_game(model, tiny_model_path, tmp_path):
    seed = long_episode_seed()
    groups = process_groups(
        SCRIPT,
        tmp_path,
        *tiny_flags(tiny_model_path, model.url),
        *("--env.total_steps", "2", "--env.first_seed", str(seed)),
        groups_file="game.jsonl",
    )
    first_episode = [g for g in groups if g["seed"] == seed]
    assert len(first_episode) >= 2, "the first episode should last several turns"
    for turn, group in enumerate(first_episode):
        assert len(history_actions(group["messages"][0])) == turn
    for group in groups:
        assert len(group["tokens"]) == 2 and group["parsed_actions"] == [HIT, STICK]
        for i, messages in enumerate(group["messages"]):
            check_history(messages)
            played = history_actions(messages)
            assert action_in(messages[-1]["content"]) == group["parsed_actions"][i]
            expected = alternative_score(group["seed"], played, group["parsed_actions"][i])
            assert group["scores"][i] == expected, (group["seed"], played, i)
    # upstream's process counts items (episodes), not the groups each one returned
    assert sorted({g["seed"] for g in groups}) == [seed, seed + 1]


def check_serve(groups: list[dict], run: Run) -> None:
    for group in groups:
        for messages, score in zip(group["messages"], group["scores"], strict=True):
            check_history(messages)
            assert action_in(messages[-1]["content"]) in (HIT, STICK)
            assert score in (-1.0, 0.0, 1.0)
    turns = [len(history_actions(g["messages"][0])) for g in groups]
    assert max(turns) >= 1, f"no group came from a second turn: {turns}"


# Its row of the env table (tests/environments/test_env_table.py): `serve` sends every
# turn as a group.
SERVE = ServeRow(
    env=compat_env(SCRIPT, "BlackjackBestOfNEnv"),
    model=chat(blackjack_policy),
    group_size=2,
    batch_size=4,
    max_token_len=4096,
    groups=4,
    args=lambda run: [
        *("--env.first_seed", str(long_episode_seed()), "--env.max_num_workers", "1"),
        *("--env.ensure_scores_are_not_same", "false"),
    ],
    check=check_serve,
)
