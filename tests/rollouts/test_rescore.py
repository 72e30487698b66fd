"""`rescore`: every stored group scored again by another reward, sample by sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atroposlib.cli.rollouts import main
from atroposlib.envs.reward_spec import RewardSpecError, load_reward
from atroposlib.rollouts.rescore import rescore
from atroposlib.rollouts.store import read_store
from tests.support.stored_runs import REWARDS, write_stored_run


@pytest.fixture
def run_dir(tmp_path):
    return write_stored_run(tmp_path / "run")


def test_the_right_reward_changes_the_wrong_ones_scores_and_writes_a_dataset(run_dir, capsys):
    assert (
        main(["rescore", str(run_dir), "--env", "mod_arithmetic", "--reward", f"{REWARDS}:right"])
        == 0
    )
    out = capsys.readouterr().out
    folder = run_dir / "rescored" / "rewards_for_tests.py-right"
    summary = json.loads((folder / "summary.json").read_text())
    # per group: the right answer 0 -> 1, two "plus one" 1 -> 0, the wrong one stays 0
    assert summary["samples"] == 28 and summary["changed"] == 21
    assert summary["changed_share"] == pytest.approx(0.75)
    assert summary["old_mean"] == 0.5 and summary["new_mean"] == 0.25
    assert [r["step"] for r in summary["per_step"]] == [1, 2, 3, None]
    assert summary["failed_samples"] == 0 and (folder / "rescore.png").stat().st_size > 1000
    groups = [
        json.loads(line) for line in (folder / "mod_arithmetic.jsonl").read_text().splitlines()
    ]
    assert [g["scores"] for g in groups] == [[1.0, 0.0, 0.0, 0.0]] * 7
    assert groups[0]["rescored"]["old_scores"] == [0.0, 1.0, 1.0, 0.0]
    assert [g["rescored"]["step"] for g in groups] == [1, 1, 2, 2, 3, 3, None]
    assert "21 scores changed (75.0%)" in out and "7 groups now score all their samples" not in out
    assert f"wrote {folder}" in out


def test_a_reward_that_raises_on_some_samples_is_counted_never_scored_zero(run_dir, tmp_path):
    store = read_store(run_dir)
    fives = sum(
        any(m[-1]["content"].endswith("5") for m in g.data["messages"]) for g in store.groups
    )
    assert 0 < fives < len(store.groups)
    outcome = rescore(
        store, "mod_arithmetic", load_reward(f"{REWARDS}:raises_on_fives"), tmp_path / "out"
    )
    assert outcome.failed_groups == fives and outcome.groups == len(store.groups)
    assert all("ValueError: cannot grade a five" in e for e in outcome.errors)
    kept = (tmp_path / "out" / "mod_arithmetic.jsonl").read_text().splitlines()
    failed = (tmp_path / "out" / "failed.jsonl").read_text().splitlines()
    assert len(kept) == len(store.groups) - fives and len(failed) == fives
    assert all(0.0 not in json.loads(line)["scores"] for line in kept)
    errors = json.loads(failed[0])["rescored"]["errors"]
    assert errors and errors[0]["error"] == "ValueError: cannot grade a five"


def test_a_registered_reward_and_an_environment_file_score_too(run_dir, tmp_path, tiny_model_path):
    store = read_store(run_dir)
    repo = Path(__file__).resolve().parents[2]
    own = rescore(
        store,
        "mod_arithmetic",
        load_reward(str(repo / "environments/mod_arithmetic.py")),
        tmp_path / "env",
    )
    assert own.errors == [] and own.changed == 21  # the environment's own score is the right one
    registered = rescore(store, "mod_arithmetic", load_reward("repetition_penalty"), tmp_path / "r")
    assert registered.errors == [] and registered.samples == 28


def test_a_reward_that_cannot_load_or_returns_no_number_is_refused(run_dir, capsys):
    for spec, expected in (
        ("no_such_reward", "reward 'no_such_reward' is not registered"),
        (f"{REWARDS}:missing", "has no 'missing'"),
        ("/nowhere/file.py:f", "reward file /nowhere/file.py does not exist"),
        ("", "an empty reward"),
    ):
        with pytest.raises(RewardSpecError, match=expected):
            load_reward(spec)
    assert main(["rescore", str(run_dir), "--env", "mod_arithmetic", "--reward", "nope"]) == 2
    assert "is not registered" in capsys.readouterr().err
    outcome = rescore(
        read_store(run_dir),
        "mod_arithmetic",
        load_reward(f"{REWARDS}:not_a_number"),
        run_dir / "nan",
    )
    assert outcome.failed_groups == 7 and "returned str, not a number" in outcome.errors[0]
