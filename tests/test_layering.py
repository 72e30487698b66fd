"""Import boundaries: `atroposlib/cli/` holds console entry points that nothing else imports."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIBRARY_AND_USERS = ("atroposlib", "example_trainer", "environments", "benchmarks")


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_nothing_outside_the_cli_package_imports_it():
    cli = REPO / "atroposlib" / "cli"
    offenders = []
    for folder in LIBRARY_AND_USERS:
        for path in (REPO / folder).rglob("*.py"):
            if cli in path.parents:
                continue
            bad = {m for m in imported_modules(path) if m.startswith("atroposlib.cli")}
            offenders += [f"{path.relative_to(REPO)} imports {m}" for m in sorted(bad)]
    assert offenders == []


def test_the_scan_sees_imports():
    """The check above can fail: it finds the cli's own imports of the library."""
    found = imported_modules(REPO / "atroposlib" / "cli" / "run_api.py")
    assert "atroposlib.utils.flags" in found
