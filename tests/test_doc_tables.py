"""The docs' generated tables match the code they come from (scripts/doc_tables.py),
and the variables table names every `ATROPOS_*` variable the code reads."""

from __future__ import annotations

import re
from pathlib import Path

from atroposlib.utils.variables import SUITE_VARIABLES, VARIABLES
from scripts import doc_tables

REPO = Path(__file__).resolve().parents[1]
LIBRARY = ("atroposlib", "example_trainer", "environments")
TABLE = "variables.py"  # the table itself, not a reader


def test_every_generated_table_is_current():
    assert [f"{path.relative_to(REPO)}: {name}" for path, name, _ in doc_tables.stale()] == [], (
        "run: python scripts/doc_tables.py"
    )


def test_a_stale_table_is_found_and_rewritten(tmp_path):
    text = f"before\n{doc_tables.begin('variables')}\n| old |\n{doc_tables.END}\nafter\n"
    new = doc_tables.rendered(text, "variables", doc_tables.variables())
    assert new.startswith("before\n") and new.endswith(f"{doc_tables.END}\nafter\n")
    assert "| old |" not in new and "`ATROPOS_API_KEY`" in new
    assert doc_tables.rendered(new, "variables", doc_tables.variables()) == new


def named_in(paths, pattern: str) -> set[str]:
    return {name for path in paths for name in re.findall(pattern, path.read_text())}


def test_every_atropos_variable_the_code_reads_is_in_the_table():
    library = named_in(
        [p for folder in LIBRARY for p in (REPO / folder).rglob("*.py") if p.name != TABLE],
        r"[\"'](ATROPOS_[A-Z_]+)[\"']",
    )
    assert len(library) >= 12  # the scan finds them
    listed = {v.name for v in VARIABLES}
    assert sorted(library - listed) == []
    assert sorted(listed - library) == [], "listed but never read"
    suite = named_in((REPO / "tests" / "support").rglob("*.py"), r"[\"'](ATROPOS_[A-Z_]+)[\"']")
    suite |= named_in((REPO / "tests").rglob("*.py"), r"environ\.get\([\"'](ATROPOS_[A-Z_]+)")
    suite |= named_in((REPO / "scripts").glob("*.sh"), r"\$\{?(ATROPOS_[A-Z_]+)")
    assert sorted(suite - listed - {v.name for v in SUITE_VARIABLES}) == []


def test_the_upstream_spellings_are_the_fields_aliases():
    table = doc_tables.upstream_spellings()
    for ours, theirs in [
        ("save-checkpoint-interval", "checkpoint-interval"),
        ("engine-port", "vllm-port"),
    ]:
        assert f"| `--{theirs}` | `--{ours}`" in table
