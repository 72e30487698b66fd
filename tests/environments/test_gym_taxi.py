"""gym_taxi: the normalised return, and whole episodes checked against the game.

The scripted driver finds its way with its own breadth-first search over gymnasium's
map, reading the taxi, passenger and destination from the env's words; every
episode the env wrote is re-played with gymnasium from its seed and the actions in
its messages, and its score recomputed from the module doc's formula with the
driver's own optimum (`process`, `serve` and `evaluate` are rows of
tests/environments/test_env_table.py). There is no dataset (items are generated seeds), so no hub
path; the action parser's tests are in test_gym_blackjack.py (the games share it).
"""

from __future__ import annotations

import itertools
import re
from collections import deque

import pytest

from environments.gym_taxi import ACTIONS, GymTaxiEnv, describe_state, optimal_return, taxi_score
from environments.gym_tool_game import TRAIN_SEEDS, parse_action
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
from gymnasium.envs.toy_text.taxi import MAP  # noqa: E402

GAME_ID = "Taxi-v4" if "Taxi-v4" in gymnasium.registry else "Taxi-v3"
ACTION_IDS = {"south": 0, "north": 1, "east": 2, "west": 3, "pickup": 4, "dropoff": 5}
STAND = r"\w \(row (\d), column (\d)\)"

# ---------------------------------------------------------------- the driver


def moves(row: int, col: int) -> list[tuple[str, int, int]]:
    """The moves that leave (row, col) on gymnasium's map (walls are | between cells)."""
    out = []
    if row < 4:
        out.append(("south", row + 1, col))
    if row > 0:
        out.append(("north", row - 1, col))
    if col < 4 and MAP[row + 1][2 * col + 2] != "|":
        out.append(("east", row, col + 1))
    if col > 0 and MAP[row + 1][2 * col] != "|":
        out.append(("west", row, col - 1))
    return out


def route(start: tuple[int, int], goal: tuple[int, int]) -> list[str]:
    """The fewest moves from start to goal."""
    paths = {start: []}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            return paths[cell]
        for name, row, col in moves(*cell):
            if (row, col) not in paths:
                paths[(row, col)] = [*paths[cell], name]
                queue.append((row, col))
    raise AssertionError(f"no route {start} -> {goal}")


def best_action(observation: str) -> str:
    """The optimal action for the state the env describes."""
    taxi = tuple(
        int(x) for x in re.search(r"taxi is at row (\d), column (\d)", observation).groups()
    )
    waiting = re.search(rf"waiting at {STAND}", observation)
    goal = re.search(rf"destination is {STAND}", observation)
    target = (int(waiting[1]), int(waiting[2])) if waiting else (int(goal[1]), int(goal[2]))
    if taxi == target:
        return "pickup" if waiting else "dropoff"
    return route(taxi, target)[0]


def driver(prompt: str, n: int) -> list[str]:
    return [call(best_action(last_turn(prompt)), thought="Closer.")] * n


def plan_length(seed: int) -> int:
    """How many actions the optimal plan takes from `seed`: the test's own optimum."""
    game = gymnasium.make(GAME_ID)
    state, _ = game.reset(seed=seed)
    row, col, passenger, destination = game.unwrapped.decode(state)
    locs = game.unwrapped.locs
    game.close()
    pickup = locs[passenger]
    return len(route((row, col), pickup)) + 1 + len(route(pickup, locs[destination])) + 1


def replay(seed: int, actions: list[str]) -> tuple[float, bool]:
    """(return, delivered) of `actions` on Taxi itself."""
    game = gymnasium.make(GAME_ID)
    game.reset(seed=seed)
    total, done = 0.0, False
    for action in actions:
        assert not done, "an action after the delivery"
        _, reward, terminated, _, _ = game.step(ACTION_IDS[action])
        total, done = total + float(reward), bool(terminated)
    game.close()
    return total, done


def expected_score(seed: int, actions: list[str], horizon: int) -> float:
    """The module doc's formula from the replayed return and the driver's optimum."""
    game_return, delivered = replay(seed, actions)
    if not delivered:
        game_return -= horizon - len(actions)
    best = 21 - plan_length(seed)
    return max(-1.0, min(1.0, (game_return + horizon) / (best + horizon)))


# ---------------------------------------------------------------- units


def test_the_optimum_matches_the_drivers_plan():
    game = gymnasium.make(GAME_ID)
    for seed in range(12):
        state, _ = game.reset(seed=seed)
        assert optimal_return(int(state)) == 21 - plan_length(seed)
    game.close()


def test_the_normalised_return_spans_idle_to_optimal():
    state = 323  # taxi (3, 1), passenger at R, destination at B: encode(3, 1, 0, 3)
    best = optimal_return(state)
    assert taxi_score(state, best, 21 - int(best), True, 30) == 1.0
    assert taxi_score(state, -30.0, 30, False, 30) == 0.0  # moved all horizon, nothing done
    assert taxi_score(state, -3.0, 3, False, 30) == 0.0  # cut short: unplayed turns charged
    assert taxi_score(state, -12.0, 3, False, 30) < 0  # an illegal pickup costs
    assert taxi_score(state, -300.0, 30, False, 30) == -1.0  # clipped
    assert 0 < taxi_score(state, best - 4, 25 - int(best), True, 30) < 1  # a detour


def test_a_state_reads_in_words():
    game = gymnasium.make(GAME_ID)
    assert game.unwrapped.encode(3, 1, 0, 3) == 323
    assert describe_state(game, 323) == (
        "The taxi is at row 3, column 1. The passenger is waiting at R (row 0, column 0). "
        "The destination is B (row 4, column 3)."
    )
    assert "passenger is in the taxi" in describe_state(game, game.unwrapped.encode(0, 0, 4, 1))
    game.close()
    assert parse_action(call("dropoff"), ACTIONS).action == "dropoff"
    assert parse_action(call("0"), ACTIONS).error.startswith("invalid action '0'")


# ---------------------------------------------------------------- episodes


MIXED = itertools.cycle(["best", "best", "west"])  # the driver, now and then a wrong turn


def mixed(prompt: str, n: int) -> list[str]:
    return [
        call(best_action(last_turn(prompt)) if next(MIXED) == "best" else "west") for _ in range(n)
    ]


def test_optimal_driving_scores_one_and_idling_zero(tiny_model_path):
    with ScriptedModel(driver, tiny_model_path) as model:
        env = make_env(GymTaxiEnv, model, tiny_model_path, max_turns=20, max_token_length=8192)
        group = collect(env, 5)
    assert group["scores"] == [1.0] and len(group["actions"][0]) == plan_length(5)
    with ScriptedModel(lambda prompt, n: [call("north")] * n, tiny_model_path) as model:
        group = collect(make_env(GymTaxiEnv, model, tiny_model_path, max_turns=4), 5)
    assert group["returns"] == [-4.0] and group["scores"] == [0.0]
    with ScriptedModel(lambda prompt, n: [call("go")] * n, tiny_model_path) as model:
        group = collect(make_env(GymTaxiEnv, model, tiny_model_path, max_turns=4), 5)
    assert group["scores"] == [PENALTY] and group["actions"] == [[]]


def test_running_out_of_tokens_charges_the_unplayed_turns(tiny_model_path):
    with ScriptedModel(driver, tiny_model_path) as model:
        one_turn = collect(make_env(GymTaxiEnv, model, tiny_model_path, max_turns=1), 5)
        budget = len(one_turn["tokens"][0]) + 20  # no room for a tool result and a reply
        env = make_env(GymTaxiEnv, model, tiny_model_path, max_turns=10, max_token_length=budget)
        group = collect(env, 5)
    assert group["actions"] == one_turn["actions"] and len(group["tokens"][0]) <= budget
    # one move played (-1) and 9 unplayed turns charged -1 each: as idle as the horizon allows
    # (uncharged it would score (-1 + 10) / (best + 10) > 0: running out of room would pay)
    assert group["returns"] == [-1.0] and group["scores"] == [0.0]


# ---------------------------------------------------------------- the env table's rows


def expected_scores(horizon: int):
    """Each episode's score by the module doc's formula, from the game and the driver."""

    def scores(group: dict) -> list[float]:
        return [
            expected_score(group["seed"], played_actions(messages), horizon)
            for messages in group["messages"]
        ]

    return scores


def check_process(groups: list[dict], run: Run) -> None:
    delivered = 0
    for group in groups:
        for i, messages in enumerate(group["messages"]):
            actions = played_actions(messages)
            assert group["actions"][i] == actions and len(actions) <= 20
            game_return, done = replay(group["seed"], actions)
            assert group["returns"][i] == game_return
            check_sequence(group["tokens"][i], group["masks"][i], messages, run.tokenizer)
            delivered += done
    assert delivered >= 1, "the driver should deliver someone"


def check_evaluate(results: dict, samples: list[dict], run: Run) -> None:
    assert sorted(s["seed"] for s in samples) == [TRAIN_SEEDS, TRAIN_SEEDS + 1, TRAIN_SEEDS + 2]
    for sample in samples:
        assert replay(sample["seed"], sample["actions"]) == (sample["return"], True)
        assert sample["score"] == 1.0 and len(sample["actions"]) == plan_length(sample["seed"])
    assert results["eval/win_rate"] == 1.0
    assert results["eval/mean_return"] == pytest.approx(sum(s["return"] for s in samples) / 3)
    assert results["eval/mean_score"] == 1.0


# The questions every env is asked (tests/environments/test_env_table.py): whole
# episodes in `process` and `serve`, scored by the normalised return; greedy `evaluate`.
PROCESS = ProcessRow(
    env=GymTaxiEnv,
    model=scripted(mixed),
    group_size=2,
    steps=2,
    scores=expected_scores(20),
    args=lambda run: [
        *("--env.max_turns", "20", "--env.max_tokens", "128"),
        *("--env.max_token_length", "8192"),
    ],
    check=check_process,
)
SERVE = ServeRow(
    env=GymTaxiEnv,
    model=scripted(mixed),
    group_size=2,
    batch_size=4,
    max_token_len=8192,
    groups=2,
    batches=1,
    scores=expected_scores(6),
    args=lambda run: [
        *("--env.max_tokens", "128", "--env.max_turns", "6"),
        *("--env.ensure_scores_are_not_same", "false"),
    ],
)
EVALUATE = EvaluateRow(
    env=GymTaxiEnv,
    model=scripted(driver),
    samples=3,
    args=lambda run: [
        *("--env.eval_episodes", "3", "--env.max_turns", "20", "--env.max_tokens", "128"),
        *("--env.max_token_length", "8192"),
    ],
    check=check_evaluate,
)
