"""Runs each review finding's test against another commit's code: the reviewed one.

Why: a verdict's test must be able to fail, and the plainest proof is that it fails on
the code the review read. The tests are today's; only the library is the old commit's:
the commit is checked out in a temporary worktree, today's `tests/` and `pyproject.toml`
are laid over it, and pytest runs there with that worktree first on PYTHONPATH (so every
subprocess a test starts runs the old code too), with a tiny-model cache of its own.

    python scripts/verdict_tests.py docs/security.md 356844e
    python scripts/verdict_tests.py docs/security.md 356844e --ids PRX-1,SBX-A

The findings and their tests are read from the page's verdict table: a row whose first
cell is a review id (`PRX-1`), whose last cell names tests as `path.py::name`, `::name`
(in the file named before it) or a whole `path.py`, relative to `tests/`. A `[*]` suffix runs every
parameter. Each test runs in a pytest process of its own; the table it prints says,
per test, `failed` (an assertion), `error` (it could not even run: a missing module or
name), `passed` (the test cannot tell the two commits apart: a bad test) or `skipped`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FINDING_ID = re.compile(r"^[A-Z]{2,4}-[0-9A-Z]+$")
TEST_NAME = re.compile(r"`((?:[\w./-]*test_\w+\.py)?(?:::[\w.,*-]+(?:\[[^\]`]*\])?)?)`")
OVERLAID = ("tests", "pyproject.toml")
PER_TEST_TIMEOUT_S = 900


@dataclass
class Finding:
    finding_id: str
    tests: list[str]


@dataclass
class Outcome:
    test: str
    result: str
    reason: str


def findings_of(page: Path) -> list[Finding]:
    """The verdict table's rows that name a review id and at least one test."""
    found = []
    for line in page.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not FINDING_ID.match(cells[0]):
            continue
        tests, last_file = [], ""
        for name in TEST_NAME.findall(cells[-1]):
            path, _, test = name.partition("::")
            last_file = path or last_file
            test = test.removesuffix("[*]")
            tests.append(f"tests/{last_file}" + (f"::{test}" if test else ""))
        if tests:
            found.append(Finding(cells[0], tests))
    return found


def worktree_at(commit: str, into: Path) -> Path:
    """`commit`'s files with today's tests laid over them."""
    tree = into / "tree"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree), commit],
        check=True,
    )
    for name in OVERLAID:
        target = tree / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    return tree


def run_test(test: str, tree: Path, scratch: Path) -> list[Outcome]:
    """One test (its own pytest, so that one file that cannot be imported on the old
    code hides no other test)."""
    report = scratch / "report.xml"
    report.unlink(missing_ok=True)
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(":"),
        "ATROPOS_TEST_CACHE_DIR": str(scratch / "cache"),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    vllm = REPO / ".venv-vllm" / "bin" / "python"  # the tests look beside the old code
    if "ATROPOS_VLLM_PYTHON" not in environment and vllm.exists():
        environment["ATROPOS_VLLM_PYTHON"] = str(vllm)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += [f"--junitxml={report}", test]
    try:
        subprocess.run(
            command,
            cwd=tree,
            env=environment,
            capture_output=True,
            timeout=PER_TEST_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return [Outcome(test, "timed out", f"{PER_TEST_TIMEOUT_S} s")]
    if not report.exists():
        return [Outcome(test, "error", "pytest wrote no report")]
    return outcomes_of(report, test)


def outcomes_of(report: Path, test: str) -> list[Outcome]:
    outcomes = []
    for case in ElementTree.parse(report).iter("testcase"):
        name = case.get("name") or ""
        result, reason = "passed", ""
        for kind in ("failure", "error", "skipped"):
            element = case.find(kind)
            if element is not None:
                result = {"failure": "failed"}.get(kind, kind)
                reason = why(element.get("message") or "", element.text or "")
                break
        outcomes.append(Outcome(name if "::" in test else f"{test}: {name}", result, reason))
    return outcomes


def why(message: str, text: str) -> str:
    """The failure's first `E` line (the assertion, the exception), else its message."""
    errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    line = errors[0] if errors else message.strip().splitlines()[0] if message.strip() else ""
    return line[:200].replace("|", "/")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path, help="the page with the verdict table")
    parser.add_argument("commit", help="the reviewed commit, whose code the tests run on")
    parser.add_argument("--ids", default="", help="only these findings (comma-separated)")
    args = parser.parse_args()
    wanted = {name.strip() for name in args.ids.split(",") if name.strip()}
    findings = [f for f in findings_of(args.page) if not wanted or f.finding_id in wanted]
    if not findings:
        parser.error(f"no finding with tests in {args.page}'s verdict table")
    scratch = Path(tempfile.mkdtemp(prefix="verdict-tests-"))
    tree = worktree_at(args.commit, scratch)
    print(f"| id | test | on {args.commit} | why |\n|---|---|---|---|", flush=True)
    passing = 0
    try:
        for finding in findings:
            outcomes = [o for test in finding.tests for o in run_test(test, tree, scratch)]
            for outcome in outcomes:
                passing += outcome.result == "passed"
                print(
                    f"| {finding.finding_id} | `{outcome.test}` | {outcome.result} "
                    f"| {outcome.reason} |",
                    flush=True,
                )
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)])
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\n{passing} test(s) passed on {args.commit}: they cannot tell it from today's code")
    return 1 if passing else 0


if __name__ == "__main__":
    sys.exit(main())
