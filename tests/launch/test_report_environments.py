"""The report of a mixed run: each environment's own score and verdict, its
evaluations, the summary table, and every panel that was logged."""

from __future__ import annotations

import json

import pytest

from atroposlib.launch.plan import SCORES_DIR
from atroposlib.launch.report import environment_line, run_numbers, write_report
from atroposlib.launch.report_data import run_environment_scores
from atroposlib.launch.report_html import environments_table, summary_table
from tests.support.report_runs import STEPS, learning_score, made_up_run


def test_each_environment_scores_from_the_groups_each_step_trained(tmp_path):
    plan = made_up_run(tmp_path)
    scores = run_environment_scores(plan)
    assert sorted(scores) == ["flat<b>", "learns"]  # the copies of `learns` count as one
    assert scores["flat<b>"] == {step: 0.5 for step in range(1, STEPS + 1)}
    expected = {s: round(learning_score(s) * 4) / 4 for s in range(1, STEPS + 1)}
    assert scores["learns"] == pytest.approx(expected)


def test_a_mixed_run_gets_a_verdict_per_environment_and_its_evaluations(tmp_path):
    plan = made_up_run(tmp_path)
    numbers = run_numbers(plan)
    learns, flat = numbers["environments"]["learns"], numbers["environments"]["flat<b>"]
    assert learns["learned"] is True and learns["steps"] == STEPS
    assert flat["learned"] is False and "THE SCORE DID NOT RISE" in flat["verdict"]
    assert learns["last_evaluation"] == {"step": 20, "accuracy": 1.0}
    assert learns["evaluations"] == 2 and "evaluations" not in flat


def test_the_panel_gives_each_environment_one_short_line(tmp_path):
    environments = run_numbers(made_up_run(tmp_path))["environments"]
    assert environment_line(environments["flat<b>"]) == "0.500 -> 0.500 over 20 steps: did not rise"
    assert environment_line(environments["learns"]).endswith("over 20 steps: rose")
    assert environment_line({"steps": 0}) == "no groups trained"


def test_the_tables_say_it_in_words_and_escape_what_the_run_wrote(tmp_path):
    numbers = run_numbers(made_up_run(tmp_path))
    numbers["resume_command"] = "atropos-launch --resume runs/x"
    summary = summary_table(numbers)
    assert "Steps trained" in summary and "Continue this run" in summary
    assert "atropos-launch --resume runs/x" in summary
    assert "first_10_mean_score" not in summary  # words, not summary.json's keys
    table = environments_table(numbers["environments"])
    assert "flat&lt;b&gt;" in table and "flat<b>" not in table
    assert "step 20: accuracy 1.000" in table


def test_summary_json_keeps_every_environments_numbers(tmp_path):
    plan = made_up_run(tmp_path)
    write_report(plan, "model: tiny\n")
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert set(saved["environments"]) == {"learns", "flat<b>"}
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_the_verdict_counts_every_scored_group_and_says_why_groups_were_dropped(tmp_path):
    """The review's custom env: the trainer saw 0.33 -> 0.58 on the groups the env kept,
    while every group it scored went 0.21 -> 0.49: the report gives both, and the drops."""
    plan = made_up_run(tmp_path)
    scores = tmp_path / SCORES_DIR
    scores.mkdir()
    with open(scores / "flat<b>.jsonl", "w") as out:
        for step in range(STEPS):
            kept = {"step": step, "scores": [1.0, 0.0, 1.0, 0.0], "dropped": None}
            same = {"step": step, "scores": [0.0] * 4, "dropped": "same_scores"}
            out.write(json.dumps(kept) + "\n" + json.dumps(same) + "\n")
        out.write('{"step": 3, "scores": [1.0')  # a line cut by a crash
    numbers = run_numbers(plan)
    assert "scored" not in numbers  # it needs every environment's record

    for copy in ("learns-1", "learns-2"):
        records = [{"step": step, "scores": [0.0] * 4, "dropped": None} for step in range(STEPS)]
        (scores / f"{copy}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    numbers = run_numbers(plan)
    assert numbers["learned"] is True  # the trainer's verdict, on the groups it trained
    scored = numbers["scored"]
    assert scored["verdict"].startswith("THE SCORE DID NOT RISE")
    assert scored["first_10_mean_score"] == scored["last_10_mean_score"] == 0.125
    assert scored["groups"] == 4 * STEPS and scored["steps"] == STEPS  # steps 0 to 19
    assert scored["dropped"] == {"same_scores": STEPS}
    assert numbers["scored_line"] == (
        f"every scored group, kept or dropped: 0.125 -> 0.125 over {STEPS} steps: did not rise"
    )
    assert numbers["dropped_line"] == (
        f"{STEPS} of {4 * STEPS} scored groups dropped: {STEPS} because all its samples "
        "scored the same (ensure_scores_are_not_same: false keeps such groups)"
    )
    table = summary_table(numbers)
    assert "Groups the environments dropped" in table and "Every scored group" in table
