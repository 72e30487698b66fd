"""Import boundaries: `atroposlib/cli/` holds console entry points that nothing else imports."""

from __future__ import annotations

from tests.support.source import LIBRARY_AND_USERS, REPO, imported_modules


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
