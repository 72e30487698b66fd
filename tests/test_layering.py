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


def test_the_library_names_the_example_trainer_only_as_the_launchers_default():
    """The launcher reaches trainers through atroposlib.trainer_contract, not by name."""
    mentions = [
        f"{path.relative_to(REPO)}: {line.strip()}"
        for path in (REPO / "atroposlib").rglob("*.py")
        for line in path.read_text().splitlines()
        if "example_trainer" in line
    ]
    assert mentions == ['atroposlib/launch/config.py: DEFAULT_TRAINER = "example_trainer.grpo"']
