"""The docs cite only files that are in this repository: every relative link resolves, every
repository path in backticks exists, and nothing points outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.source import REPO

DOCS = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted(REPO.glob("*/README.md")),
]
TOP_DIRS = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")}
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
CODE_PATH = re.compile(
    r"`((?:\.\./)*[A-Za-z_][\w./-]*\.(?:py|md|yaml|yml|json|jsonl|toml|sh|txt|png))(?:::[^`]*)?`"
)
OUTSIDE = re.compile(r"\.\./shared|`shared/")


def _inside(path: Path) -> bool:
    return path.resolve().is_relative_to(REPO.resolve())


def missing_citations(doc: Path, text: str) -> list[str]:
    """The paths `text` (the doc at `doc`) cites that are not files of this repository."""
    problems = [f"{doc.name}: cites {m.group(0)!r}" for m in OUTSIDE.finditer(text)]
    for match in LINK.finditer(text):
        target = match.group(1)
        if target.startswith(("http:", "https:", "mailto:")):
            continue
        path = doc.parent / target
        if not path.exists() or not _inside(path):
            problems.append(f"{doc.name}: link to {target}")
    for match in CODE_PATH.finditer(text):
        cited = match.group(1)
        if cited.startswith("../"):
            path = doc.parent / cited
            if not path.exists() or not _inside(path):
                problems.append(f"{doc.name}: `{cited}`")
            continue
        if cited.split("/")[0] not in TOP_DIRS:
            continue  # a run's own file, or another project's
        if "upstream" in text[max(0, match.start() - 40) : match.start()].lower():
            continue  # "upstream's `example_trainer/...`" names upstream's file
        if not (REPO / cited).exists() and not (REPO / "tests" / cited).exists():
            problems.append(f"{doc.name}: `{cited}`")
    return problems


def test_the_docs_cite_only_files_in_the_repository():
    assert len(DOCS) > 10
    problems = [problem for doc in DOCS for problem in missing_citations(doc, doc.read_text())]
    assert problems == []


def test_a_citation_of_a_missing_or_outside_file_is_found():
    doc = REPO / "docs" / "probe.md"
    text = (
        "See [the spec](../../shared/spec/PROTOCOL.md), `../shared/spec/` and "
        "`shared/reviews/correctness.md`; `atroposlib/no_such_module.py`, "
        "`api/test_leases.py` (under tests/), upstream's `example_trainer/vllm_api_server.py` "
        "and [protocol](protocol.md)."
    )
    assert missing_citations(doc, text) == [
        f"{doc.name}: cites '../shared'",  # the link's
        f"{doc.name}: cites '../shared'",  # the backticked one's
        f"{doc.name}: cites '`shared/'",
        f"{doc.name}: link to ../../shared/spec/PROTOCOL.md",
        f"{doc.name}: `atroposlib/no_such_module.py`",
    ]
