"""The store reader and `list`/`show`: every stored group with the step that trained it."""

from __future__ import annotations

import json

import pytest

from atroposlib.cli.rollouts import main
from atroposlib.rollouts.listing import rows_json, show_text, step_rows
from atroposlib.rollouts.store import StoreError, iter_groups, parse_steps, read_store
from tests.support.stored_runs import GROUPS_PER_STEP, STEPS, UNTRAINED, write_stored_run


@pytest.fixture
def run_dir(tmp_path):
    return write_stored_run(tmp_path / "run")


def test_each_group_gets_the_step_that_trained_it_and_the_untrained_get_none(run_dir):
    store = read_store(run_dir)
    assert len(store.groups) == STEPS * GROUPS_PER_STEP + UNTRAINED
    assert [g.step for g in store.groups] == [1, 1, 2, 2, 3, 3, None]
    assert store.trained_steps == [1, 2, 3] and store.environments == ["mod_arithmetic"]
    first = store.groups[0]
    assert first.versions == [0] * 4 and first.staleness == [1] * 4
    assert first.data["item"] == {"a": 0, "b": 1}  # the item, recorded beside the group
    assert store.groups[-1].staleness == []
    assert [g.step for g in iter_groups(run_dir)] == [g.step for g in store.groups]


def test_a_step_trained_again_after_a_resume_counts_its_last_record(run_dir):
    from atroposlib.trainer_contract import RunRecords

    moved = read_store(run_dir).groups[0].group_id
    RunRecords(run_dir / "checkpoints").trained_groups(2, [moved])
    store = read_store(run_dir)
    assert [g.step for g in store.groups][:4] == [2, 1, None, None]


def test_a_line_cut_by_a_crash_is_skipped_and_counted(run_dir):
    with open(run_dir / "rollouts" / "mod_arithmetic.jsonl", "ab") as out:
        out.write(b'{"tokens": [[1, 2]], "sco\n')
    store = read_store(run_dir)
    assert store.skipped == {"mod_arithmetic": 1} and len(store.groups) == 7


def test_bad_input_is_one_clear_line(run_dir, tmp_path, capsys):
    cases = {
        ("list", str(tmp_path / "nope")): "is not a run directory (it does not exist)",
        ("list", str(tmp_path)): "holds no stored groups: no rollouts/*.jsonl",
        ("show", str(run_dir), "--step", "9"): "step 9 trained no group in",
        ("show", str(run_dir), "--step", "1", "--env", "gsm8k"): "has no environment 'gsm8k'",
        (
            "export",
            str(run_dir),
            "--format",
            "groups",
            "--out",
            str(tmp_path / "g.jsonl"),
            "--steps",
            "7:9",
        ): "no stored group was trained at steps 7:9",
    }
    for argv, expected in cases.items():
        assert main(list(argv)) == 2
        err = capsys.readouterr().err
        assert expected in err and err.count("\n") == 1, err
    for text in ("x", "3:1", "a:b"):
        with pytest.raises(StoreError):
            parse_steps(text)
    assert parse_steps("2:5") == (2, 5) and parse_steps("4") == (4, 4)
    assert parse_steps(":3") == (0, 3) and parse_steps("3:")[0] == 3


def test_list_counts_scores_spread_and_staleness_per_step(run_dir, capsys):
    rows = step_rows(read_store(run_dir))
    assert [(r.step, r.groups, r.sequences) for r in rows] == [
        (1, 2, 8),
        (2, 2, 8),
        (3, 2, 8),
        (None, 1, 4),
    ]
    assert rows[0].score_mean == 0.5 and rows[0].score_std == 0.5
    assert rows[0].staleness_mean == 1.0 and rows[0].staleness_max == 1
    assert main(["list", str(run_dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == json.loads(json.dumps(rows_json(read_store(run_dir))))
    assert data["groups"] == 7 and data["trained_groups"] == 6 and data["trained_steps"] == 3
    assert main(["list", str(run_dir)]) == 0
    table = capsys.readouterr().out
    assert "7 groups in 1 environment(s); 6 trained over 3 steps, 1 never trained" in table


def test_show_prints_the_prompt_once_and_each_reply_with_its_score(run_dir, capsys):
    assert main(["show", str(run_dir), "--step", "2", "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("user: What is 2 + 7 mod 10?") == 1
    assert "step 2 · mod_arithmetic · group" in out and "weights of step 1" in out
    assert "  [1.00] assistant: 0" in out and "  [0.00] assistant: 9" in out
    tokens_only = dict(read_store(run_dir).groups[0].data, messages=None)
    from atroposlib.rollouts.store import StoredGroup

    text = show_text([StoredGroup("e", tokens_only, 1)], lambda ids: bytes(ids).decode())
    assert "[0.00] 1" in text and "[1.00] 2" in text
