"""Each question every library environment is asked, once, over a table of the envs.

The rows live in each env's own test module, beside its data and scripted policies
(`PROCESS`, `EVALUATE`, `SERVE`; tests/support/env_table.py says what a row holds);
each test here states the common part of its question and calls the row's `check` for
what is that env's own. The runs are in this process through `run_cli` (the same
argv the script gets), against real servers on 127.0.0.1: the scripted policy, a
judge, run-api. That each script runs as a process, as documented, is asked once per
env by test_offline_commands.py.
"""

from __future__ import annotations

import pytest

from tests.support.compat_runs import read_jsonl
from tests.support.env_table import (
    EvaluateRow,
    ProcessRow,
    ServeRow,
    check_shape,
    cli,
    evaluate_argv,
    groups_file,
    open_run,
    process_argv,
    read_evaluation,
    serve_groups,
    table,
)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("row", table("PROCESS"))
def test_process_scores_a_scripted_policy_exactly(
    row: ProcessRow, tiny_model_path, tmp_path, request
):
    with open_run(row, tmp_path, tiny_model_path, request) as run:
        cli(row.env, process_argv(row, run), run)
        out = groups_file(run)
        groups = read_jsonl(out)
        assert len(groups) == row.steps and out.with_suffix(".html").is_file()
        for group in groups:
            check_shape(group, row.group_size)
            if row.scores is not None:
                assert group["scores"] == pytest.approx(row.scores(group))
        row.check(groups, run)


@pytest.mark.parametrize("row", table("EVALUATE"))
def test_evaluate_writes_metrics_and_samples(row: EvaluateRow, tiny_model_path, tmp_path, request):
    with open_run(row, tmp_path, tiny_model_path, request) as run:
        cli(row.env, evaluate_argv(row, run), run)
        metrics, samples = read_evaluation(run)
        assert len(samples) == row.samples
        assert (tmp_path / "evals" / "evaluate_config.yaml").is_file()
        if row.greedy:
            assert {r.get("temperature") for r in run.model.requests} <= {0.0}
        row.check(metrics["results"]["all"], samples, run)


@pytest.mark.parametrize("row", table("SERVE"))
def test_serve_sends_scored_groups_to_a_real_api(
    row: ServeRow, api, tiny_model_path, tmp_path, request
):
    with open_run(row, tmp_path, tiny_model_path, request) as run:
        groups = serve_groups(row, run, api.url)
        assert len(groups) == row.groups
        for group in groups:
            check_shape(group, row.group_size)
            if row.scores is not None:
                assert group["scores"] == pytest.approx(row.scores(group))
        row.check(groups, run)
