"""The three classes the structure review found split by file rather than by part stay
small: each, with what it inherits from this project's own classes (a mixin's lines
count as its own), is under `LIMIT` lines. A class grows by holding another part."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from tests.support.source import REPO

LIMIT = 350
CLASSES = {
    "BaseEnv": "atroposlib/envs/base.py",
    "RunState": "atroposlib/api/state.py",
    "Trainer": "example_trainer/grpo.py",
}
ROOTS = ("atroposlib", "example_trainer")


@functools.cache
def project_classes() -> dict[str, ast.ClassDef]:
    found = {}
    for root in ROOTS:
        for path in (REPO / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, node)
    return found


def lines_with_bases(name: str, classes: dict[str, ast.ClassDef]) -> int:
    """The class's lines plus those of every base class this project defines."""
    node = classes[name]
    total = node.end_lineno - node.lineno + 1  # type: ignore[operator]
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in classes and base.id != name:
            total += lines_with_bases(base.id, classes)
    return total


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_the_class_with_its_project_bases_is_under_the_limit(name):
    classes = project_classes()
    assert Path(REPO / CLASSES[name]).exists()
    assert lines_with_bases(name, classes) < LIMIT, f"{name}: move a part out of it"


def test_a_mixins_lines_count_as_the_classs():
    source = "class A:\n    x = 1\n    y = 2\n\n\nclass B(A):\n    z = 3\n"
    classes = {n.name: n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)}
    assert lines_with_bases("B", classes) == 2 + 3
