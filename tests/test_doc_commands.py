"""The docs' commands and flag tables match the tools they name, so docs and CLIs cannot
drift: every `--flag` a documented command gives a console script (pyproject's
[project.scripts]) is one of that tool's flags, and each flag table lists exactly the
tool's flags, with the defaults its --help shows."""

from __future__ import annotations

import argparse
import re
import shlex
import tomllib
from collections.abc import Iterator
from importlib import import_module

import pytest

from tests.support.source import REPO

DOCS = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted(REPO.glob("*/README.md")),
]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
SEPARATORS = {"&", "&&", "||", "|", ";"}
TABLE_ROW = re.compile(r"^\| `(--[\w-]+)` \| ([^|]*) \|", re.M)
SHOWN_DEFAULT = re.compile(r"\(default: (.*)\)\s*$", re.S)
# (doc, its heading, the tools whose every flag that section's table lists)
FLAG_TABLES = [
    ("docs/api.md", "## Flags of `run-api`", ["run-api"]),
    ("docs/tools.md", "## view-run\n", ["view-run", "view-run-multimodal"]),
    ("docs/tools.md", "## atropos-sft-gen\n", ["atropos-sft-gen"]),
    ("docs/trainer.md", "## Flags\n", ["atropos-grpo"]),
]


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def tool_parser(entry_point: str) -> argparse.ArgumentParser:
    """The parser a console script's main() builds, caught as it starts parsing (so
    nothing else of the tool runs)."""
    module, function = entry_point.split(":")
    main = getattr(import_module(module), function)
    original = argparse.ArgumentParser.parse_known_args

    def caught(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Parsed(self)

    argparse.ArgumentParser.parse_known_args = caught  # type: ignore[method-assign,assignment]
    try:
        main(["--help"])
    except _Parsed as parsed:
        return parsed.parser
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]
    raise AssertionError(f"{entry_point} returned without parsing its arguments")


@pytest.fixture(scope="module")
def parsers() -> dict[str, argparse.ArgumentParser]:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    return {name: tool_parser(entry) for name, entry in scripts.items()}


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    """The parser's flags and its subcommands' (`atropos-rollouts list --json`)."""
    flags = {flag for action in parser._actions for flag in action.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                flags |= flags_of(subparser)
    return flags


def command_lines(text: str) -> Iterator[str]:
    """Shell lines of the doc's bash (or unlabelled) blocks, continuations joined, then
    its inline code spans."""
    for block in FENCE.finditer(text):
        if block.group(1) in ("bash", "sh", "shell", ""):
            yield from block.group(2).replace("\\\n", " ").splitlines()
    for span in INLINE.finditer(FENCE.sub("", text)):
        yield span.group(1)


def invocations(line: str, tools: set[str]) -> Iterator[tuple[str, list[str]]]:
    """(tool, its words) for each command of `line` that runs one of `tools`."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:  # prose in backticks, not a command
        return
    command: list[str] = []
    for word in [*words, ";"]:
        trailing = word[-1] if len(word) > 1 and word[-1] in "&;" else ""
        if word in SEPARATORS or trailing:
            if trailing:
                command.append(word[:-1])
            if command and command[0] in tools:
                yield command[0], command[1:]
            command = []
        else:
            command.append(word)


def unknown_flags(doc: str, text: str, known: dict[str, set[str]]) -> list[str]:
    """'doc: tool --flag' for every flag a command in `text` gives a tool that lacks it."""
    problems = []
    for line in command_lines(text):
        for tool, words in invocations(line, set(known)):
            for word in words:
                flag = word.split("=")[0]
                if flag.startswith("--") and len(flag) > 2 and flag not in known[tool]:
                    problems.append(f"{doc}: {tool} {flag}")
    return problems


def section(text: str, heading: str) -> str:
    rest = text[text.index(heading) + len(heading) :]
    end = re.search(r"^## ", rest, re.M)
    return rest[: end.start()] if end else rest


def shown_default(action: argparse.Action) -> str | None:
    found = SHOWN_DEFAULT.search(action.help or "")
    return found.group(1).strip("'\"") if found else None


def same_value(documented: str, shown: str) -> bool:
    try:
        return float(documented) == float(shown)
    except ValueError:
        return documented == shown


def test_every_documented_command_uses_flags_its_tool_has(parsers):
    known = {name: flags_of(parser) for name, parser in parsers.items()}
    checked = [
        flag
        for doc in DOCS
        for line in command_lines(doc.read_text())
        for _, words in invocations(line, set(known))
        for flag in words
        if flag.startswith("--")
    ]
    assert len(checked) > 50  # the scan finds the docs' commands
    problems = [
        problem for doc in DOCS for problem in unknown_flags(doc.name, doc.read_text(), known)
    ]
    assert problems == []


def test_a_flag_a_tool_lacks_is_found():
    known = {"view-run": {"--port", "--tokenizer"}, "run-api": {"--port"}}
    text = (
        "```bash\nrun-api --port 8001 --ephemral &   # a typo\n"
        "view-run --tokenizer ./tiny-model \\\n    --group-sise 8\n```\n"
        "and inline: `view-run --port=7861 --hots 0.0.0.0`, `python x.py --port 1`."
    )
    assert unknown_flags("probe.md", text, known) == [
        "probe.md: run-api --ephemral",
        "probe.md: view-run --group-sise",
        "probe.md: view-run --hots",
    ]


@pytest.mark.parametrize(("doc", "heading", "tools"), FLAG_TABLES)
def test_each_flag_table_lists_exactly_its_tools_flags(parsers, doc, heading, tools):
    rows = dict(TABLE_ROW.findall(section((REPO / doc).read_text(), heading)))
    for tool in tools:
        actions = {
            flag: action
            for action in parsers[tool]._actions
            for flag in action.option_strings
            if flag.startswith("--") and flag != "--help"
        }
        assert sorted(set(actions) - set(rows)) == [], f"{tool} flags missing from {doc}"
        assert sorted(set(rows) - set(actions)) == [], f"{doc} rows that {tool} lacks"
        for flag, cell in rows.items():
            literal = re.fullmatch(r"`([^`$]+)`", cell.strip())
            shown = shown_default(actions[flag])
            if literal and shown is not None:
                assert same_value(literal.group(1), shown), (doc, tool, flag, cell, shown)


def test_no_tool_shows_a_placeholder_for_a_default(parsers):
    for name, parser in parsers.items():
        assert "PydanticUndefined" not in parser.format_help(), name
