"""The report of a mixed run: each environment's own score and verdict, its
evaluations, the summary table, and every panel that was logged."""

from __future__ import annotations

import json

import pytest

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
