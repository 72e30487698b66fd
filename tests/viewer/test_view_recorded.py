"""`view-run RUN_DIR` in-process: reading a run's files, stepping through its groups,
and every refusal before a socket (bad paths, an exposed page without a token).

All unit tier: the tools' `main` is called in-process, and each case here stops before
the port is bound. The page served over HTTP and in a browser is
test_view_recorded_browser.py.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from atroposlib.cli import view_run, view_run_multimodal
from atroposlib.viewer import browse
from atroposlib.viewer.browse import RecordedPage, target
from atroposlib.viewer.recorded import read_run
from atroposlib.viewer.render import NO_MESSAGES
from atroposlib.viewer.settings import PAGE_KEY_ENV, RecordedViewSettings, ViewRunSettings
from tests.support.recorded_runs import (
    ARITHMETIC,
    BAD_LINES,
    COUNTING,
    SYSTEM,
    ByteDecoder,
    write_run,
)

TOOLS = [(view_run, "view-run"), (view_run_multimodal, "view-run-multimodal")]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run(tmp_path / "run")


def _items(group_html: str) -> list[str]:
    """Each completion's box (the jsonl viewer's `.item`), in order."""
    return group_html.split('<div class="item')[1:]


def test_a_run_is_read_by_environment_in_send_order(run_dir):
    run = read_run(run_dir)
    assert list(run.groups) == ["mod_arithmetic", "multimodal_counting"]
    questions = [g["messages"][0][1]["content"] for g in run.groups["mod_arithmetic"]]
    assert questions == [question for question, _, _ in ARITHMETIC]
    assert (run.group_count, run.skipped_count) == (5, len(BAD_LINES))
    skipped = run.skipped["mod_arithmetic"]
    assert [number for number, _ in skipped] == [4, 5, 6]
    assert "utf-8" in skipped[1][1] and skipped[2][1] == "not an object"
    # the rollouts folder named directly, and one file, read the same groups
    assert read_run(run_dir / "rollouts").groups == run.groups
    alone = read_run(run_dir / "rollouts" / "multimodal_counting.jsonl")
    assert alone.groups == {"multimodal_counting": run.groups["multimodal_counting"]}


@pytest.mark.parametrize(("module", "tool"), TOOLS)
@pytest.mark.parametrize("case", ["missing", "no rollouts", "nothing readable"])
def test_bad_input_is_one_line_and_exit_2(module, tool, case, tmp_path, capsys):
    path = tmp_path / "run"
    said = {"missing": f"{path} does not exist"}
    if case == "no rollouts":
        (path / "logs").mkdir(parents=True)
        said[case] = f"{path} holds no rollouts: no rollouts/*.jsonl"
    if case == "nothing readable":
        (path / "rollouts").mkdir(parents=True)
        (path / "rollouts" / "env.jsonl").write_bytes(b"".join(BAD_LINES))
        said[case] = f"{path} holds no groups yet, 3 unreadable line(s) skipped"
    assert module.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{tool}: error: {said[case]}") and err.count("\n") == 1, err


def test_stepping_goes_first_to_last_and_stays_within(run_dir):
    page = RecordedPage(read_run(run_dir), None, multimodal=False)
    moves = [
        ("first", None, 1),
        ("next", 1, 2),
        ("last", 1, 3),
        ("next", 3, 3),
        ("previous", 3, 2),
        ("previous", 1, 1),
        ("go", 99, 3),
        ("go", 0, 1),
        ("go", "x", 1),
        ("go", float("nan"), 1),
    ]
    for action, position, expected in moves:
        number, status, _ = page.view("mod_arithmetic", position, action)
        assert number == expected, (action, position)
        assert f"Group {expected} of 3 in mod_arithmetic" in status
    # an environment the page does not know (a hand-made API call) is the first one
    assert page.view("<nope>", 2)[1] == page.view("mod_arithmetic", 2)[1]
    assert target("last", 1, 1) == 1


def test_the_prompt_once_then_each_reply_with_its_score(run_dir):
    page = RecordedPage(read_run(run_dir), None, multimodal=False)
    for number, (question, replies, scores) in enumerate(ARITHMETIC, start=1):
        group = page.view("mod_arithmetic", number)[2]
        assert group.startswith('<div class="atropos-view">')
        assert f'id="view-group-{number}"' in group and f"Group {number} &middot; 4" in group
        assert group.count(question) == 1 and group.count(SYSTEM) == 1
        shared = re.search(r'<div class="shared-prompt">.*?</div></div></div>', group).group(0)
        assert question in shared and "Shared by all 4 samples" in shared
        items = _items(group)
        assert len(items) == len(replies)
        for item, reply, score in zip(items, replies, scores, strict=True):
            assert f"score {score:.4g}<" in item
            assert f'Assistant:</span><div class="content">{reply}</div>' in item
            assert question not in item


def test_pictures_in_the_multimodal_page_and_a_note_in_the_plain_one(run_dir):
    run = read_run(run_dir)
    picture = run.groups["multimodal_counting"][1]["images"][0]
    shown = RecordedPage(run, None, multimodal=True).view("multimodal_counting", 2)[2]
    assert shown.count("<img") == 1  # the group's one picture, given per sample, once
    assert f'src="data:image/png;base64,{picture}"' in shown
    plain = RecordedPage(run, None, multimodal=False).view("multimodal_counting", 2)[2]
    assert "<img" not in plain
    assert "1 image(s) attached: view-run-multimodal shows them" in plain
    assert COUNTING[1][0] in plain


def test_a_given_tokenizer_decodes_the_tokens(run_dir):
    """--tokenizer: the tokens, split at the masked prompt (the live page's renderer)."""
    run = read_run(run_dir)
    group = RecordedPage(run, ByteDecoder(), multimodal=False).view("mod_arithmetic", 1)[2]
    prompt = re.search(r'<div class="prompt">.*?</div></div>', group, re.S).group(0)
    assert ARITHMETIC[0][0] in prompt and "&lt;assistant&gt;" in prompt
    items = _items(group)
    assert [i.split('<div class="content">')[1].split("<")[0] for i in items] == ARITHMETIC[0][1]
    # a group with no messages and no tokenizer says what to do
    del run.groups["mod_arithmetic"][0]["messages"]
    assert html.escape(NO_MESSAGES) in RecordedPage(run, None, False).view("mod_arithmetic", 1)[2]


def test_the_picker_and_the_summary_say_what_was_read(run_dir):
    page = RecordedPage(read_run(run_dir), None, multimodal=False)
    assert page.choices() == [
        ("mod_arithmetic (3 groups, 3 unreadable lines skipped)", "mod_arithmetic"),
        ("multimodal_counting (2 groups)", "multimodal_counting"),
    ]
    summary = page.summary()
    assert "notice-warning" in summary
    assert f"5 groups from 2 environments, read from {run_dir}" in summary
    assert "3 unreadable lines skipped" in summary and "nothing is pulled" in summary


def test_only_the_pages_flags_matter_with_a_run_dir():
    given = ViewRunSettings.model_validate({"port": "8000", "group_size": "4"})
    settings = RecordedViewSettings.from_flags(given, "runs/x")
    assert (settings.port, settings.run_dir, settings.decode_with) == (8000, Path("runs/x"), None)
    assert settings.unused_flags() == ["--group-size"]
    assert settings.host == "127.0.0.1" and settings.api_key is None  # the live defaults
    with_tokenizer = ViewRunSettings.model_validate({"tokenizer": "./tiny-model"})
    assert RecordedViewSettings.from_flags(with_tokenizer, "x").decode_with == "./tiny-model"
    assert "RUN_DIR" in view_run.build_parser().format_help()


@pytest.mark.parametrize(("module", "tool"), TOOLS)
def test_an_exposed_page_without_a_token_is_refused(module, tool, run_dir, capsys, monkeypatch):
    """The live page's rule, with what a finished run's page would expose."""
    monkeypatch.delenv(PAGE_KEY_ENV, raising=False)
    assert module.main([str(run_dir), "--host", "0.0.0.0", "--api-url", "http://x"]) == 2
    err = capsys.readouterr().err
    assert f"{tool}: --api-url ignored: RUN_DIR's groups come from its files" in err
    refusal = err.strip().splitlines()[-1]
    assert refusal.startswith(f"{tool}: refusing to bind 0.0.0.0 without an API key")
    assert "could read the run's rollouts. Pass --api-key KEY" in refusal


@pytest.mark.parametrize(("module", "multimodal"), [(view_run, False), (view_run_multimodal, True)])
def test_each_tool_serves_the_run_dir_or_the_live_api(module, multimodal, monkeypatch):
    called = []
    monkeypatch.setattr(browse, "serve_recorded", lambda s, m: called.append(("run", s, m)) or 0)
    monkeypatch.setattr("atroposlib.viewer.app.serve", lambda s, m: called.append(("api", s, m)))
    module.main(["runs/x", "--port", "7000"])
    module.main(["--port", "7000"])
    (mode, settings, shown), (live, live_settings, live_shown) = called
    assert (mode, settings.run_dir, settings.port, shown) == (
        "run",
        Path("runs/x"),
        7000,
        multimodal,
    )
    assert (live, type(live_settings) is not RecordedViewSettings, live_shown) == (
        "api",
        True,
        multimodal,
    )
