"""Reading the repository's own source, for tests of its structure."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIBRARY_AND_USERS = ("atroposlib", "example_trainer", "environments", "benchmarks")


def imported_modules(path: Path) -> set[str]:
    """Absolute module names a file imports, and `module.name` for each from-import."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


SINGLE_TURN_SECTION = "## A single-turn task in 40 lines"


def documented_block(doc: str, section: str, language: str) -> str:
    """The first `language` code block under `section` of docs/`doc`, as a reader copies it."""
    text = (REPO / "docs" / doc).read_text().split(section, 1)[1]
    return text.split(f"```{language}\n", 1)[1].split("```", 1)[0]
