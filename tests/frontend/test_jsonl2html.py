"""Tests for the jsonl -> HTML rollout viewer, on real files in tmp_path."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from atroposlib.frontend.jsonl2html import (
    create_html_for_group,
    generate_html,
    get_score_class,
    shared_text_prefix,
)

CONVERSATION_GROUP = {
    "tokens": [[1, 2, 3], [4, 5, 6]],
    "masks": [[-100, 2, 3], [-100, 5, 6]],
    "scores": [1.0, -1.0],
    "messages": [
        [
            {"role": "system", "content": "Be helpful."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "It is 4.\nSecond line."},
        ],
        [
            {"role": "user", "content": [{"type": "text", "text": "Multi-part question"}]},
            {"role": "assistant", "content": "It is 5."},
        ],
    ],
}
STRING_GROUP = {"scores": [0.5, 0.25, 0.0], "messages": ["alpha text", "beta text", "gamma"]}


class TextCollector(HTMLParser):
    """Collects text and checks that every opened tag is closed in order."""

    VOID = {"meta", "br", "hr", "img", "link", "input"}

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.stack: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, f"unbalanced </{tag}>"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(page: str) -> str:
    collector = TextCollector()
    collector.feed(page)
    collector.close()
    assert collector.stack == []
    return "".join(collector.text)


def write_jsonl(path: Path, groups: list[Any]) -> Path:
    path.write_text("\n".join(json.dumps(group) for group in groups) + "\n", encoding="utf-8")
    return path


def test_default_output_path_and_all_content(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "rollouts.jsonl", [CONVERSATION_GROUP, STRING_GROUP])
    output = generate_html(source)
    assert Path(output) == tmp_path / "rollouts.html"
    page = Path(output).read_text(encoding="utf-8")
    assert "<script" not in page.lower()
    assert "http://" not in page and "https://" not in page
    text = parse(page)
    for conversation in CONVERSATION_GROUP["messages"]:
        for message in conversation:
            content = message["content"]
            expected = content if isinstance(content, str) else content[0]["text"]
            assert expected in text
    for message in STRING_GROUP["messages"]:
        assert message in text
    for label in ("System:", "User:", "Assistant:"):
        assert label in text
    assert "white-space: pre-wrap" in page


def test_explicit_output_path(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [STRING_GROUP])
    target = tmp_path / "sub_out.html"
    assert Path(generate_html(source, target)) == target
    assert target.exists()
    assert not (tmp_path / "in.html").exists()


def test_role_labels_capitalised() -> None:
    text = parse(create_html_for_group(CONVERSATION_GROUP, 0))
    assert "System:" in text and "User:" in text and "Assistant:" in text
    assert "system:" not in text and "assistant:" not in text


def test_header_shows_count_and_stats() -> None:
    text = parse(create_html_for_group(CONVERSATION_GROUP, 7))
    assert "Group 7" in text
    assert "2 sequences" in text
    assert "mean 0" in text and "min -1" in text and "max 1" in text


def test_truncates_to_shorter_of_messages_and_scores() -> None:
    group = {"messages": ["first", "second", "third"], "scores": [1.0, 0.0]}
    text = parse(create_html_for_group(group, 0))
    assert "first" in text and "second" in text and "third" not in text
    group = {"messages": ["only"], "scores": [1.0, 0.5, 0.0]}
    text = parse(create_html_for_group(group, 0))
    assert "only" in text and "1 sequences" in text


@pytest.mark.parametrize(
    "group",
    [{}, {"messages": [], "scores": []}, {"messages": ["a"], "scores": []}, {"scores": [1.0]}],
)
def test_empty_group_renders_empty_string(group: dict[str, Any]) -> None:
    assert create_html_for_group(group, 0) == ""


def test_content_is_escaped() -> None:
    group = {
        "messages": [[{"role": "user", "content": "<script>alert('x')</script> & more"}], "<b>"],
        "scores": [1.0, 0.0],
    }
    fragment = create_html_for_group(group, 0)
    assert "<script>" not in fragment and "<b>" not in fragment
    assert "&lt;script&gt;" in fragment and "&amp; more" in fragment and "&lt;b&gt;" in fragment
    assert "<script>alert('x')</script> & more" in parse(fragment)


def test_string_messages() -> None:
    text = parse(create_html_for_group(STRING_GROUP, 1))
    for message in STRING_GROUP["messages"]:
        assert message in text
    assert "User:" not in text


def test_scores_coloured_best_to_worst() -> None:
    fragment = create_html_for_group(STRING_GROUP, 0)
    assert "hsl(120," in fragment and "hsl(0," in fragment
    equal = create_html_for_group({"messages": ["a", "b"], "scores": [1.0, 1.0]}, 0)
    assert "hsl(120," not in equal and "hsl(0, 70%" not in equal


def test_missing_input_exits_with_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as excinfo:
        generate_html(tmp_path / "missing.jsonl")
    assert excinfo.value.code == 1
    assert "missing.jsonl" in capsys.readouterr().err


def test_bad_json_line_skipped_with_warning(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    source = tmp_path / "mixed.jsonl"
    source.write_text(
        json.dumps(STRING_GROUP) + "\n\n{not json\n" + json.dumps(CONVERSATION_GROUP) + "\n",
        encoding="utf-8",
    )
    output = generate_html(source)
    err = capsys.readouterr().err
    assert "line 3" in err
    text = parse(Path(output).read_text(encoding="utf-8"))
    assert "alpha text" in text and "It is 5." in text
    assert "Group 0" in text and "Group 1" in text


@pytest.mark.integration
def test_cli(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "cli.jsonl", [CONVERSATION_GROUP])
    result = subprocess.run(
        [sys.executable, "-m", "atroposlib.frontend.jsonl2html", str(source)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == str(tmp_path / "cli.html")
    assert "What is 2+2?" in parse((tmp_path / "cli.html").read_text(encoding="utf-8"))

    target = tmp_path / "custom.html"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "atroposlib.frontend.jsonl2html",
            str(source),
            "--output",
            str(target),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == str(target) and target.exists()

    missing = subprocess.run(
        [sys.executable, "-m", "atroposlib.frontend.jsonl2html", str(tmp_path / "nope.jsonl")],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 1 and "nope.jsonl" in missing.stderr


@pytest.mark.parametrize(
    ("score", "expected"),
    [
        (1.0, "reward-positive"),
        (0.001, "reward-positive"),
        ("2.5", "reward-positive"),
        (-1, "reward-negative"),
        ("-0.5", "reward-negative"),
        (0, "reward-zero"),
        (0.0, "reward-zero"),
        ("0", "reward-zero"),
        ("n/a", ""),
        (None, ""),
        ([1.0], ""),
    ],
)
def test_get_score_class(score: Any, expected: str) -> None:
    assert get_score_class(score) == expected


def test_items_carry_their_score_class() -> None:
    group = {"messages": ["good", "bad", "even", "odd"], "scores": [0.5, -0.5, 0, "?"]}
    fragment = create_html_for_group(group, 0)
    classes = re.findall(r'<div class="(item[^"]*)"', fragment)
    assert classes == [
        "item reward-positive",
        "item reward-negative",
        "item reward-zero",
        "item",
    ]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "atroposlib.frontend.jsonl2html", *args],
        capture_output=True,
        text=True,
    )


@pytest.mark.integration
def test_cli_positional_output_path(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "cli.jsonl", [CONVERSATION_GROUP])
    target = tmp_path / "new" / "dir" / "page.html"  # missing folders are created
    result = run_cli(str(source), str(target))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(target)
    assert "What is 2+2?" in parse(target.read_text(encoding="utf-8"))
    assert not (tmp_path / "cli.html").exists()


@pytest.mark.integration
def test_cli_output_option_spellings(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "cli.jsonl", [STRING_GROUP])
    for flag in ("-o", "--output-path", "--output_path"):
        target = tmp_path / f"out{flag.strip('-')}.html"
        result = run_cli(str(source), flag, str(target))
        assert result.returncode == 0, result.stderr
        assert target.exists()
    same = tmp_path / "same.html"
    assert run_cli(str(source), str(same), "--output", str(same)).returncode == 0


@pytest.mark.integration
def test_cli_rejects_two_different_output_paths(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "cli.jsonl", [STRING_GROUP])
    result = run_cli(str(source), str(tmp_path / "a.html"), "-o", str(tmp_path / "b.html"))
    assert result.returncode == 2
    assert "two different output paths" in result.stderr
    assert not (tmp_path / "a.html").exists() and not (tmp_path / "b.html").exists()


LONG_PROMPT = "Solve this carefully. " * 40 + "What is 17 * 23?"
CHAT_GROUP = {
    "scores": [1.0, 0.0, -1.0],
    "messages": [
        [
            {"role": "system", "content": "You are a careful calculator."},
            {"role": "user", "content": LONG_PROMPT},
            {"role": "assistant", "content": answer},
        ]
        for answer in ("It is 391.", "It is 390.", "No idea.")
    ],
}


def test_a_shared_prompt_is_drawn_once_above_the_completions() -> None:
    fragment = create_html_for_group(CHAT_GROUP, 3)
    text = parse(fragment)
    assert text.count(LONG_PROMPT) == 1 and text.count("You are a careful calculator.") == 1
    assert "Shared by all 3 samples:" in text
    assert fragment.index('class="shared-prompt"') < fragment.index('class="item')
    items = re.findall(r'<div class="item[^"]*".*?(?=<div class="item|</div></div>$)', fragment)
    assert len(items) == 3
    answers = ("It is 391.", "It is 390.", "No idea.")
    for item, answer, score in zip(items, answers, (1, 0, -1), strict=True):
        assert answer in item and f"score {score}" in item and LONG_PROMPT not in item
    assert re.findall(r'<div class="(item[^"]*)"', fragment) == [
        "item reward-positive",
        "item reward-zero",
        "item reward-negative",
    ]


def test_messages_that_differ_before_the_completion_stay_in_their_item() -> None:
    group = {
        "scores": [1.0, 0.5],
        "messages": [
            [
                {"role": "system", "content": "Shared system prompt."},
                {"role": "user", "content": "First question?"},
                {"role": "assistant", "content": "First answer."},
            ],
            [
                {"role": "system", "content": "Shared system prompt."},
                {"role": "user", "content": "Second question?"},
                {"role": "assistant", "content": "Second answer."},
            ],
        ],
    }
    fragment = create_html_for_group(group, 0)
    shared, _, items = fragment.partition('<div class="item')
    assert "Shared system prompt." in shared and "question?" not in shared
    assert parse(fragment).count("Shared system prompt.") == 1
    for word in ("First", "Second"):
        assert f"{word} question?" in items and f"{word} answer." in items


def test_identical_samples_keep_their_last_message_as_the_completion() -> None:
    same = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    fragment = create_html_for_group({"messages": [same, list(same)], "scores": [1, 1]}, 0)
    shared, _, items = fragment.partition('<div class="item')
    assert "Hi" in shared and "Hello" not in shared
    assert items.count("Hello") == 2


def test_decoded_token_texts_share_their_prompt_up_to_a_boundary() -> None:
    prompt = "<|user|>\n" + LONG_PROMPT + "\n<|assistant|>\n"
    completions = ["The answer is 391.", "The answer is 390.", "Thinking... 391"]
    group = {
        "scores": [1.0, 0.0, 0.5],
        "messages": [[{"role": "user", "content": prompt + c}] for c in completions],
    }
    fragment = create_html_for_group(group, 0)
    text = parse(fragment)
    assert text.count(LONG_PROMPT) == 1
    shared, _, items = fragment.partition('<div class="item')
    assert html.escape(prompt) in shared
    for completion in completions:
        assert completion in items
    # the common "The answer is 39" of two samples is no prompt of the group's
    two = {"scores": [1, 0], "messages": group["messages"][:2]}
    _, _, items = create_html_for_group(two, 0).partition('<div class="item')
    assert "The answer is 391." in items and "The answer is 390." in items


@pytest.mark.parametrize(
    ("texts", "expected"),
    [
        (["Question? Yes", "Question? Yet"], "Question? "),  # not into the word
        (["Q line\nA long answer", "Q line\nA longer one"], "Q line\n"),  # a near line break
        (
            ["Ask " + "x " * 60 + "\n" + "word " * 30 + "end1", "Ask " + "x " * 60 + "\nend2"],
            "Ask " + "x " * 60 + "\n",
        ),
        (
            ["Ask\n" + "word " * 30 + "end1", "Ask\n" + "word " * 30 + "end2"],
            "Ask\n" + "word " * 30,
        ),  # a line break far back: the last space instead
        (["Question?", "Question? Maybe"], "Question?"),  # one sample ends at the boundary
        (["abc", "abd"], ""),  # no boundary at all
        (["  x", "  y"], ""),  # only blanks in common
        (["alpha", "beta"], ""),
    ],
)
def test_shared_text_prefix(texts: list[str], expected: str) -> None:
    assert shared_text_prefix(texts) == expected


@pytest.mark.parametrize(
    "group",
    [
        STRING_GROUP,  # texts, as view-run passes completions: drawn whole
        CONVERSATION_GROUP,  # first messages differ
        {
            "messages": [[{"role": "user", "content": "abc"}], [{"role": "user", "content": "x"}]],
            "scores": [1, 0],
        },
        {"messages": [[{"role": "user", "content": "Same start A"}]], "scores": [1]},  # one
        {"messages": ["Same start A", "Same start B"], "scores": [1, 0]},  # bare strings
    ],
)
def test_nothing_shared_draws_each_sequence_whole(group: dict[str, Any]) -> None:
    fragment = create_html_for_group(group, 0)
    assert "shared-prompt" not in fragment
    items = fragment.split('<div class="item')[1:]
    assert len(items) == len(group["scores"])
    for item, sequence in zip(items, group["messages"], strict=True):
        first = sequence if isinstance(sequence, str) else sequence[0]["content"]
        first = first if isinstance(first, str) else first[0]["text"]
        assert html.escape(first) in item


def test_model_text_is_escaped_in_the_shared_layout() -> None:
    evil = "<img src=x onerror=alert(1)> & <script>alert('p')</script>"
    chat = {
        "scores": [1, 0],
        "messages": [
            [{"role": "user", "content": evil}, {"role": "assistant", "content": f"{evil} {i}"}]
            for i in range(2)
        ],
    }
    decoded = {
        "scores": [1, 0],
        "messages": [[{"role": "user", "content": f"{evil}\n</div>{i}<b>"}] for i in range(2)],
    }
    for group in (chat, decoded):
        fragment = create_html_for_group(group, 0)
        assert "shared-prompt" in fragment
        assert "<img" not in fragment and "<script" not in fragment and "<b>" not in fragment
        assert "&lt;img src=x onerror=alert(1)&gt; &amp; &lt;script&gt;" in fragment
        text = parse(fragment)  # balanced tags: no </div> from the model closed anything
        assert text.count(evil) == 1 + (group is chat) * 2
