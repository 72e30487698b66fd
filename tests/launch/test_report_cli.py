"""`atropos-report`: a run's report rebuilt from its directory alone, the launcher's
closing panel when a Ctrl-C lands while the report is written, the final model named
in both, and the page that compares runs. Every run here is a made-up run directory
(tests/support/report_runs.py) that the launcher's own `_finish` reports on in-process;
that a launched run rebuilds alike is test_launch.py's question, on its short run."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from atroposlib.cli.report import main as report
from atroposlib.launch import supervisor
from atroposlib.launch.compare import (
    comparison_figure,
    config_table,
    differing_keys,
    flatten,
    read_runs,
)
from atroposlib.launch.plan import Plan
from atroposlib.launch.report_data import final_checkpoint
from atroposlib.launch.report_html import loading_lines
from atroposlib.launch.report_plots import pyplot
from atroposlib.launch.resume import LaunchRecord
from atroposlib.launch.supervisor import Launcher, Outcome
from atroposlib.trainer_contract import EventKind, RunRecords, read_events
from tests.support.report_runs import STEPS, launched_run, made_up_config

pytestmark = pytest.mark.unit


def finished_by_the_launcher(plan: Plan, outcome: Outcome) -> str:
    """What the launcher prints at the end of `plan`'s run (its `_finish`, in-process:
    the processes are gone by then); the report it writes is in the run directory."""
    out = io.StringIO()
    launcher = Launcher(plan, LaunchRecord(config=str(plan.run_dir / "config.yaml")))
    launcher.console = Console(file=out, width=80)
    launcher.trainer.restarts = 1  # the trainer crashed once: only the launcher knows
    try:
        launcher._finish(outcome, 30.0)
    finally:
        launcher.status.close()
    return out.getvalue()


def unwrapped(text: str) -> str:
    """The console's text with the panel's borders and line breaks read as spaces."""
    return re.sub(r"[│\s]+", " ", text)


def test_the_rebuilt_report_is_the_one_the_launcher_wrote_and_names_the_final_model(
    tmp_path, capsys
):
    plan = launched_run(tmp_path / "run")
    printed = finished_by_the_launcher(plan, Outcome(0, "the trainer finished; stopping the run"))
    final = plan.checkpoints / f"step-{STEPS}"
    assert "final model: checkpoints/step-20 (Hugging Face format; loading it: below)" in (
        unwrapped(printed)
    )
    snippet = "\n".join(loading_lines(str(final)))
    assert f"[launch] final model: {final}\n{snippet}\n" in printed  # whole, to copy
    assert snippet.endswith(f'model = AutoModelForCausalLM.from_pretrained("{final}")')
    summary, page = plan.run_dir / "summary.json", plan.run_dir / "report.html"
    launched = json.loads(summary.read_text())
    assert launched["final_model"] == str(final) and "resume_command" not in launched
    written = page.read_text()
    assert "AutoModelForCausalLM.from_pretrained(&quot;" in written

    page.unlink()
    (plan.run_dir / "report.png").unlink()
    assert report([str(plan.run_dir)]) == 0
    assert capsys.readouterr().out == f"report: {page}\n"
    assert json.loads(summary.read_text()) == launched  # the restarts kept, too
    assert page.read_text() == written
    assert (plan.run_dir / "report.png").read_bytes()[:4] == b"\x89PNG"


def test_a_ctrl_c_while_the_report_is_written_skips_it_in_one_line(tmp_path, monkeypatch, capsys):
    """A second Ctrl-C (while matplotlib imports, say): one line naming the command that
    writes the report later, the closing panel as always, and the run's own ending: the
    launcher returns its outcome's exit code (130) once `_finish` returns."""
    plan = launched_run(tmp_path / "run", training_steps=2 * STEPS)  # stopped half way

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # what a Ctrl-C raises in the launcher at that moment

    monkeypatch.setattr(supervisor, "write_report", interrupted)
    printed = finished_by_the_launcher(plan, Outcome(130, "interrupted; stopping every process"))
    skipped = f"[launch] report skipped (interrupted); rebuild it: atropos-report {plan.run_dir}"
    assert skipped in printed.splitlines()
    assert "Traceback" not in printed and "KeyboardInterrupt" not in printed
    panel = unwrapped(printed)
    assert "interrupted; stopping every process after 30s" in panel
    assert "steps trained: 20;" in panel and "continue it with the command below" in panel
    assert f"[launch] continue this run: atropos-launch --resume {plan.run_dir}" in printed
    assert f"[launch] final model: {plan.checkpoints / 'step-20'}" in printed
    assert not (plan.run_dir / "report.html").exists()

    monkeypatch.undo()
    assert report([str(plan.run_dir)]) == 0  # the command it named
    assert capsys.readouterr().out == f"report: {plan.run_dir / 'report.html'}\n"
    rebuilt = json.loads((plan.run_dir / "summary.json").read_text())
    assert rebuilt["resume_command"] == f"atropos-launch --resume {plan.run_dir}"


def test_a_run_that_never_trained_a_step_gets_no_resume_hint(tmp_path):
    """Stopped by its configuration (an env that exits 2) before step 1: launching it
    again is the way, not `--resume`."""
    plan = launched_run(tmp_path / "run", training_steps=2 * STEPS)
    plan.metrics_path.unlink()
    printed = finished_by_the_launcher(plan, Outcome(1, "arith_env exited with code 2"))
    assert "arith_env exited with code 2 after 30s" in unwrapped(printed)
    assert "--resume" not in printed and "continue" not in printed


def test_a_directory_without_a_run_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.yaml").write_text("name: not a launch config\n")
    launched_run(tmp_path / "run")
    cases = [
        ([tmp_path / "missing"], "no such run directory"),
        ([tmp_path / "a-file"], "is a file, not a run directory"),
        ([tmp_path / "empty"], "is not a run directory: it has no config.yaml"),
        ([tmp_path / "other"], "is not a run directory of this launcher"),
        ([tmp_path / "run", tmp_path / "empty"], "is not a run directory"),  # compared
    ]
    for paths, why in cases:
        assert report([str(path) for path in paths]) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1, err
        assert err.startswith(f"atropos-report: {paths[-1]}") and why in err
    assert not (tmp_path / "run" / "report.html").exists()


def test_the_final_model_is_the_newest_checkpoint_a_from_pretrained_loads(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    records = RunRecords(checkpoints)

    def saved(step: int, hugging_face: bool = True) -> Path:
        path = checkpoints / f"step-{step}"
        path.mkdir(parents=True)
        (path / ("config.json" if hugging_face else "state.json")).write_text("{}")
        records.event(EventKind.CHECKPOINT_SAVED, step, path=str(path))
        return path

    assert final_checkpoint(checkpoints, []) is None
    saved(2, hugging_face=False)  # a trainer whose checkpoints are its own
    assert final_checkpoint(checkpoints, read_events(records.events_path)) is None
    four, six = saved(4), saved(6)
    records.event(EventKind.ENGINE_RESTARTED, 6, reason="new weights")
    assert final_checkpoint(checkpoints, read_events(records.events_path)) == six
    (six / "config.json").unlink()  # pruned since
    assert final_checkpoint(checkpoints, read_events(records.events_path)) == four
    moved = tmp_path / "moved"
    checkpoints.rename(moved)  # the run directory moved: found by its name
    assert final_checkpoint(moved, read_events(moved / "events.jsonl")) == moved / "step-4"


def test_config_keys_are_flattened_as_set_names_them_and_any_change_differs():
    data = {"trainer": {"args": {"lr": 1e-5, "tags": []}}, "environments": [{"env": {"g": 4}}]}
    assert flatten(data) == {
        "trainer.args.lr": 1e-5,
        "trainer.args.tags": [],
        "environments.0.env.g": 4,
    }
    same, other = {"a": 1, "b": "x"}, {"a": 1, "b": "x"}
    assert differing_keys([same, other]) == []
    assert differing_keys([same, {"a": True, "b": "x"}]) == ["a"]  # 1 is not true
    assert differing_keys([same, {"b": "x"}, {"a": 1, "b": "x", "c": None}]) == ["a", "c"]


def test_the_comparison_page_puts_runs_side_by_side(tmp_path, capsys):
    first = launched_run(tmp_path / "first")
    data = made_up_config()
    data["trainer"] = {"args": {"lr": 1e-4}}
    data["environments"][0]["env"] = {"group_size": 8}
    second = launched_run(tmp_path / "second", data, training_steps=2 * STEPS)
    out = tmp_path / "compare.html"
    assert report([str(first.run_dir), str(second.run_dir), "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"comparison of 2 runs: {out}\n"
    page = out.read_text()
    encoded = re.search(r'src="data:image/png;base64,([^"]+)"', page)
    assert encoded and base64.b64decode(encoded.group(1))[:4] == b"\x89PNG"
    keys = re.findall(r"<tr><td><code>([^<]+)</code></td>(.*?)</tr>", page)
    assert keys == [  # in the order of the YAML that has them
        ("environments.0.env.group_size", "<td>(not set)</td><td>8</td>"),
        ("trainer.args.lr", "<td>(not set)</td><td>0.0001</td>"),
    ]
    rows = re.findall(r'<tr class="run ok"><td>(.*?)</td>(.*?)</tr>', page)
    assert [label for label, _ in rows] == ["first", "second"]  # neither has a report.html
    assert "0.400 -&gt; 0.600 over 20 steps: rose" in rows[0][1]
    assert "learns @ step 20: accuracy 1.000" in rows[1][1]
    assert f"<td>{second.checkpoints / 'step-20'}</td>" in rows[1][1]

    runs = read_runs([first.run_dir, first.run_dir])  # the same name twice: by path
    assert [run.label for run in runs] == [str(first.run_dir)] * 2
    assert config_table(runs) == "<p>Their configs are the same.</p>"
    figure = comparison_figure(read_runs([first.run_dir, second.run_dir]))
    try:
        shown = [axis for axis in figure.axes if axis.get_visible()]
        assert [axis.get_title() for axis in shown][1:] == ["loss", "evaluation: accuracy"]
        for axis in shown:  # every run on every axis, under its name
            labels = [text.get_text() for text in axis.get_legend().get_texts()]
            assert labels == ["first", "second"]
    finally:
        pyplot().close(figure)
