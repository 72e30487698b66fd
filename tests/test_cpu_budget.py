"""The CPU budget: its arithmetic, the repository's budget file, and a run it fails.

tests/support/tier_report.py fails a run whose tiers use more CPU than
tests/cpu_budget.toml allows; scripts/test.sh passes that file, so CI runs the check.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tier_report import CpuBudget, budget_verdicts

pytest_plugins = ["pytester"]

REPOSITORY_BUDGET = Path(__file__).resolve().parent / "cpu_budget.toml"
BUDGET = CpuBudget(seconds={"unit": 100, "integration+e2e": 1000}, tolerance=0.25)


def verdicts(**cpu: float) -> dict[str, tuple[float, bool]]:
    return {v.group: (v.used, v.exceeded) for v in budget_verdicts(cpu, BUDGET)}


def test_a_group_within_its_tolerance_passes_and_one_past_it_fails():
    assert verdicts(unit=125.0) == {"unit": (125.0, False)}
    assert verdicts(unit=125.1) == {"unit": (125.1, True)}
    assert verdicts(unit=40.0) == {"unit": (40.0, False)}


def test_a_group_of_tiers_is_judged_on_their_sum_and_only_when_one_of_them_ran():
    assert verdicts(integration=700.0, e2e=500.0) == {"integration+e2e": (1200.0, False)}
    assert verdicts(integration=700.0, e2e=600.0) == {"integration+e2e": (1300.0, True)}
    assert verdicts(e2e=1251.0) == {"integration+e2e": (1251.0, True)}
    assert verdicts(unit=1.0) == {"unit": (1.0, False)}


def test_the_verdict_line_says_the_share_and_an_overrun():
    (fine,) = budget_verdicts({"unit": 60.0}, BUDGET)
    assert fine.line() == "unit: CPU 60 s of a 100 s budget (60%)"
    (over,) = budget_verdicts({"unit": 130.0}, BUDGET)
    assert over.line() == "unit: CPU 130 s of a 100 s budget (130%): OVER BUDGET by more than 25%"


def test_the_repositorys_budget_names_each_group_a_run_makes():
    """scripts/test.sh runs the unit tier alone, then integration and e2e in one session."""
    budget = CpuBudget.read(REPOSITORY_BUDGET)
    assert set(budget.seconds) == {"unit", "integration+e2e"}
    assert budget.seconds["unit"] <= 120  # issue 45: the unit tier's budget
    assert budget.tolerance == 0.25


def test_a_budget_with_an_unknown_field_is_refused(tmp_path):
    path = tmp_path / "budget.toml"
    path.write_text("tolerance = 0.25\nslack = 1\n[seconds]\nunit = 1\n")
    with pytest.raises(ValueError, match="slack"):
        CpuBudget.read(path)


BURNING_TESTS = """
import time

def test_burns_cpu():
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass

def test_cheap():
    pass
"""

TIER_PROPERTY = """
def pytest_collection_modifyitems(items):
    for item in items:
        item.user_properties.append(("tier", "unit"))
"""


@pytest.mark.parametrize(("budget_s", "fails"), [(0.05, True), (100, False)])
def test_a_run_over_budget_fails_and_names_its_costliest_tests(pytester, budget_s, fails):
    pytester.makeconftest(TIER_PROPERTY)
    pytester.makepyfile(test_burning=BURNING_TESTS)
    budget = pytester.path / "budget.toml"
    budget.write_text(f"tolerance = 0.25\n[seconds]\nunit = {budget_s}\n")
    table, timeline = pytester.path / "tiers.md", pytester.path / "timeline.tsv"
    result = pytester.runpytest_inprocess(
        *("-p", "no:asyncio", "-p", "tests.support.tier_report"),
        *("--cpu-budget", str(budget), "--tier-table", str(table)),
        *("--tier-timeline", str(timeline)),
    )
    output = result.stdout.str()
    assert result.ret == (pytest.ExitCode.TESTS_FAILED if fails else pytest.ExitCode.OK), output
    result.assert_outcomes(passed=2)
    assert ("OVER BUDGET" in output) is fails
    if fails:
        costliest = output.split("unit: the 20 costliest tests by CPU:")[1].splitlines()
        assert "test_burning.py::test_burns_cpu" in costliest[1], output
        assert "tests/cpu_budget.toml" in output
    rows = table.read_text().splitlines()
    assert rows[0] == "| tier | tests | sum of test times | CPU |" and rows[2].startswith(
        "| unit | 2 |"
    )
    # the timeline: each test once, on this process, in the order run, the burner >= 0.3 s
    (burner, cheap) = [line.split("\t") for line in timeline.read_text().splitlines()]
    assert [burner[0], burner[3], burner[4]] == ["main", "unit", "test_burning.py::test_burns_cpu"]
    assert float(burner[1]) == 0.0 and float(burner[2]) >= 0.3
    assert cheap[4].endswith("::test_cheap") and float(cheap[1]) >= float(burner[2])
