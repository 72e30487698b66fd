"""Per-tier totals at the end of a run, and each tier's slowest tests.

`scripts/test.sh` runs the integration and e2e tiers in one pytest session, so that
neither waits for the other's last module on an idle core. pytest's own `--durations`
would then mix the tiers; `--tier-durations N` lists the N slowest tests of each tier
(setup, call and teardown together), which is what docs/testing.md tabulates. The tier
comes from the `tier` property that `tests/support/tiers.py` records on every test, so
it reaches this report from xdist workers and lands in the JUnit file as well.

Wall time hides what a test costs the other worker: the suite keeps both cores busy, so
a test that waits is cheap and one that starts processes is not. Each test also records
`cpu_s`, the CPU seconds of its worker and of the processes it started and reaped
(`getrusage`), from its setup to its teardown; the report gives each tier's total and
`--tier-durations` lists the costliest tests by CPU too.

That CPU is also what keeps the suite under its time goal: the 2-core machine runs out
of CPU, not of waiting. `--cpu-budget FILE` (tests/cpu_budget.toml, which scripts/test.sh
passes) compares each budgeted group of tiers with its budget, and fails the run, naming
the costliest tests, when a group goes over by more than the file's tolerance.
`--tier-table FILE` writes the per-tier figures as the markdown table docs/testing.md
shows.
"""

from __future__ import annotations

import resource
import tomllib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--tier-durations",
        type=int,
        default=0,
        metavar="N",
        help="after the run, list the N slowest tests of each tier (0: totals only)",
    )
    parser.addoption(
        "--cpu-budget",
        type=Path,
        default=None,
        metavar="FILE",
        help="fail the run when a group of tiers uses more CPU than FILE allows",
    )
    parser.addoption(
        "--tier-table",
        type=Path,
        default=None,
        metavar="FILE",
        help="write each tier's figures to FILE as a markdown table",
    )
    parser.addoption(
        "--tier-timeline",
        type=Path,
        default=None,
        metavar="FILE",
        help="write when each test ran, and on which worker, to FILE (tab-separated)",
    )


class CpuBudget(BaseModel):
    """tests/cpu_budget.toml: CPU seconds per group of tiers, and the overrun allowed."""

    model_config = ConfigDict(extra="forbid")
    seconds: dict[str, float] = Field(
        description="CPU seconds per group of tiers; a group is tier names joined by '+'"
    )
    tolerance: float = Field(ge=0, description="the share over budget that still passes")

    @classmethod
    def read(cls, path: Path) -> CpuBudget:
        return cls.model_validate(tomllib.loads(path.read_text(encoding="utf-8")))


class BudgetVerdict(BaseModel):
    group: str
    used: float
    budget: float
    tolerance: float

    @property
    def share(self) -> float:
        return self.used / self.budget

    @property
    def exceeded(self) -> bool:
        return self.used > self.budget * (1 + self.tolerance)

    def line(self) -> str:
        said = f"{self.group}: CPU {self.used:,.0f} s of a {self.budget:,.0f} s budget"
        said += f" ({self.share:.0%})"
        if self.exceeded:
            said += f": OVER BUDGET by more than {self.tolerance:.0%}"
        return said


def budget_verdicts(cpu_by_tier: dict[str, float], budget: CpuBudget) -> list[BudgetVerdict]:
    """One verdict per budgeted group of which at least one tier ran."""
    verdicts = []
    for group, seconds in budget.seconds.items():
        tiers = group.split("+")
        if any(tier in cpu_by_tier for tier in tiers):
            used = sum(cpu_by_tier.get(tier, 0.0) for tier in tiers)
            verdicts.append(
                BudgetVerdict(group=group, used=used, budget=seconds, tolerance=budget.tolerance)
            )
    return verdicts


def cpu_seconds() -> float:
    """This process's CPU time and that of every child it has reaped."""
    usage = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return sum(u.ru_utime + u.ru_stime for u in usage)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    item.stash[CPU_AT_SETUP] = cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield  # the teardown report, made after this, carries the property
    if CPU_AT_SETUP in item.stash:
        item.user_properties.append(("cpu_s", round(cpu_seconds() - item.stash[CPU_AT_SETUP], 2)))


CPU_AT_SETUP = pytest.StashKey[float]()


TIERS = ("unit", "integration", "e2e")


class Timeline:
    """When each test ran and on which worker: where a run's wall time went (a module
    that ran on alone at the end, a worker that idled) is read off it, not guessed."""

    def __init__(self) -> None:
        self.rows: dict[str, list] = {}

    def add(self, report: pytest.TestReport, tier: str) -> None:
        node = getattr(report, "node", None)  # the xdist worker that ran it, if any
        worker = node.gateway.id if node is not None else "main"
        row = self.rows.setdefault(report.nodeid, [worker, report.start, report.stop, tier])
        row[1], row[2] = min(row[1], report.start), max(row[2], report.stop)

    def tsv(self) -> str:
        """worker, start and stop (seconds after the first test's start), tier, test."""
        if not self.rows:
            return ""
        zero = min(row[1] for row in self.rows.values())
        ordered = sorted(self.rows.items(), key=lambda item: (item[1][0], item[1][1]))
        return "".join(
            f"{worker}\t{start - zero:.1f}\t{stop - zero:.1f}\t{tier}\t{nodeid}\n"
            for nodeid, (worker, start, stop, tier) in ordered
        )


class TierReport:
    def __init__(
        self,
        slowest: int,
        budget: CpuBudget | None,
        table: Path | None,
        timeline: Path | None = None,
    ) -> None:
        self.slowest = slowest
        self.budget = budget
        self.table = table
        self.timeline = Timeline() if timeline is not None else None
        self.timeline_path = timeline
        self.session: pytest.Session | None = None
        self.seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.outcomes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.cpu: dict[str, dict[str, float]] = defaultdict(dict)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        properties = dict(report.user_properties)
        tier = properties.get("tier")
        if tier is None:
            return
        self.seconds[tier][report.nodeid] += report.duration
        if self.timeline is not None:
            self.timeline.add(report, tier)
        if report.when == "teardown" and "cpu_s" in properties:
            self.cpu[tier][report.nodeid] = float(properties["cpu_s"])
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.outcomes[tier][report.outcome] += 1
        elif report.when == "teardown" and report.failed:
            self.outcomes[tier]["error"] += 1

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session

    def ran(self) -> list[str]:
        return [tier for tier in TIERS if tier in self.seconds]

    def summary(self, tier: str) -> str:
        outcomes = sorted(self.outcomes[tier].items())
        counts = ", ".join(f"{n} {outcome}" for outcome, n in outcomes)
        total = sum(self.seconds[tier].values())
        return (
            f"{tier}: {len(self.seconds[tier])} tests ({counts}), sum of test times "
            f"{total:.0f} s, CPU {sum(self.cpu[tier].values()):.0f} s"
        )

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.seconds:
            return
        write = terminalreporter.write_line
        terminalreporter.section("tiers")
        for tier in self.ran():
            times, cpu = self.seconds[tier], self.cpu[tier]
            write(self.summary(tier))
            for nodeid, seconds in sorted(times.items(), key=lambda kv: -kv[1])[: self.slowest]:
                write(f"  {seconds:7.1f} s  {nodeid}")
            if self.slowest and cpu:
                write(f"{tier}, the costliest by CPU (the worker and the processes it reaped):")
            for nodeid, seconds in sorted(cpu.items(), key=lambda kv: -kv[1])[: self.slowest]:
                write(f"  {seconds:7.1f} s CPU  {nodeid}")
        if self.table is not None:
            self.table.write_text(self.markdown(), encoding="utf-8")
        if self.timeline is not None and self.timeline_path is not None:
            self.timeline_path.write_text(self.timeline.tsv(), encoding="utf-8")
        if self.budget is not None:
            self.check_budget(write, self.budget)

    def check_budget(self, write, budget: CpuBudget) -> None:
        """A line per budgeted group; over budget, the costliest tests and a failed run."""
        cpu_by_tier = {tier: sum(self.cpu[tier].values()) for tier in self.ran()}
        for verdict in budget_verdicts(cpu_by_tier, budget):
            write(verdict.line(), red=verdict.exceeded, bold=verdict.exceeded)
            if not verdict.exceeded:
                continue
            tiers = verdict.group.split("+")
            costs = [(s, n) for tier in tiers for n, s in self.cpu.get(tier, {}).items()]
            write(f"{verdict.group}: the 20 costliest tests by CPU:", red=True)
            for seconds, nodeid in sorted(costs, reverse=True)[:20]:
                write(f"  {seconds:7.1f} s CPU  {nodeid}")
            write(
                "Cut what these cost, or raise the budget in tests/cpu_budget.toml in the "
                "same commit, with the reason in its message.",
                red=True,
            )
            if self.session is not None:
                self.session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def markdown(self) -> str:
        """The per-tier figures as docs/testing.md tabulates them."""
        rows = ["| tier | tests | sum of test times | CPU |", "|---|---:|---:|---:|"]
        for tier in self.ran():
            rows.append(
                f"| {tier} | {len(self.seconds[tier])} | "
                f"{sum(self.seconds[tier].values()):,.0f} s | "
                f"{sum(self.cpu[tier].values()):,.0f} s |"
            )
        return "\n".join(rows) + "\n"


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("cpu_budget")
    report = TierReport(
        config.getoption("tier_durations"),
        CpuBudget.read(path) if path is not None else None,
        config.getoption("tier_table"),
        config.getoption("tier_timeline"),
    )
    config.pluginmanager.register(report, "tier-report")
