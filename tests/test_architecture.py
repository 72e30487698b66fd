"""docs/architecture.md's import table is the package graph: every import is allowed by
its row, every unit has a row, and the allowed graph has no cycle."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.source import LIBRARY_AND_USERS, REPO, imported_modules

DOC = REPO / "docs" / "architecture.md"
ROW = re.compile(r"^\| `([a-z_][\w.]*)` \|[^|]*\|([^|]*)\|$")


def import_table(text: str) -> dict[str, set[str]]:
    """unit -> the units it may import, from the doc's table rows."""
    table = {}
    for line in text.splitlines():
        found = ROW.match(line.strip())
        if found:
            table[found.group(1)] = set(re.findall(r"`([\w.]+)`", found.group(2)))
    return table


def unit_of_module(name: str) -> str | None:
    """The table's unit for a module of this repository (None for third-party ones)."""
    parts = name.split(".")
    if parts[0] == "atroposlib":
        return ".".join(parts[:2]) if len(parts) > 1 else None
    return parts[0] if parts[0] in LIBRARY_AND_USERS else None


def unit_of_file(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    if parts == ("atroposlib", "__init__"):
        return "atroposlib"
    return unit_of_module(".".join(parts)) or parts[0]


def actual_imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for folder in LIBRARY_AND_USERS:
        for path in (REPO / folder).rglob("*.py"):
            unit = unit_of_file(path)
            targets = {unit_of_module(m) for m in imported_modules(path)}
            graph.setdefault(unit, set()).update(t for t in targets if t and t != unit)
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        for target in sorted(graph.get(node, ())):
            found = visit(target, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    return next((c for node in sorted(graph) if (c := visit(node, []))), None)


def test_every_import_between_units_is_in_the_table():
    table = import_table(DOC.read_text())
    graph = actual_imports()
    missing = sorted(set(graph) - set(table))
    assert missing == [], f"units without a row in docs/architecture.md: {missing}"
    unlisted = [
        f"{unit} imports {target}"
        for unit, targets in sorted(graph.items())
        for target in sorted(targets - table[unit])
    ]
    assert unlisted == []


def test_the_table_names_only_units_that_exist_and_has_no_cycle():
    table = import_table(DOC.read_text())
    assert len(table) >= 15
    named = set(table) | set().union(*table.values())
    stale = sorted(u for u in named if not resolves(u))
    assert stale == []
    assert cycle(table) is None


def resolves(unit: str) -> bool:
    path = REPO / unit.replace(".", "/")
    return path.is_dir() or path.with_suffix(".py").is_file()


def test_the_checks_can_fail():
    doc = "| `a.b` | x | `c.d`, `e` |\n| `c.d` | y | `a.b` |\n| `e` | z | |"
    assert import_table(doc) == {"a.b": {"c.d", "e"}, "c.d": {"a.b"}, "e": set()}
    assert cycle(import_table(doc)) == ["a.b", "c.d", "a.b"]
    assert unit_of_module("atroposlib.api.server") == "atroposlib.api"
    assert unit_of_module("environments.gsm8k_server") == "environments"
    assert unit_of_module("torch.nn") is None
    assert "atroposlib.protocol" in actual_imports()["atroposlib.api"]
