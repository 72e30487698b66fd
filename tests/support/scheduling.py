"""The order in which pytest-xdist's workers get the test modules: longest first, and
no more than two whole-run modules at once.

Why: xdist's `loadfile` hands out the modules with the most tests first, so the e2e
modules of one to three long tests (the fault runs, the learning runs, the LoRA and
IPC vLLM runs: a minute to five each) all came last. In the fresh-clone run of
`ac87274` the last 5% of the tests took the last 27% of the session (327 of 1,208 s),
three whole runs contending for the two cores and then one running on alone.

So each free worker takes, of the modules left:
1. the unit-only modules first: they need nothing built, and run while the tiny model
   builds;
2. then the longest module, by the seconds it took in a measured run
   (`tests/module_seconds.json`); a module not in that table counts a second per test;
3. but not a third *heavy* module (e2e, over `HEAVY_S`) while two run: the longest
   other one instead, so whole runs do not starve each other of the cores. A worker
   takes a heavy one anyway when only heavy ones are left.

`python -m tests.support.scheduling JUNIT_XML` rewrites the table from a run's JUnit
file (scripts/test.sh writes `.test-logs/*.xml`); a stale table only costs order.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.tiers import TIERS

TABLE = Path(__file__).resolve().parents[1] / "module_seconds.json"
HEAVY_S = 60.0
"""An e2e module that took longer (a whole run, or several) is heavy."""
MAX_HEAVY = 2
"""Heavy modules running at once: on 2 cores, a third only slows the other two."""


class ModuleCost:
    """What the table says of one module: its tier (the costliest of its tests') and
    the seconds its tests took."""

    def __init__(self, tier: str, seconds: float) -> None:
        self.tier, self.seconds = tier, seconds

    @property
    def heavy(self) -> bool:
        """A whole run (or several): an e2e module over `HEAVY_S`."""
        return self.tier == "e2e" and self.seconds > HEAVY_S


def read_table(path: Path = TABLE) -> dict[str, ModuleCost]:
    if not path.exists():
        return {}
    table = json.loads(path.read_text())
    return {module: ModuleCost(row["tier"], row["seconds"]) for module, row in table.items()}


def cost_of(module: str, tests: int, table: Mapping[str, ModuleCost]) -> ModuleCost:
    return table.get(module) or ModuleCost("integration", float(tests))


def pick(
    waiting: Mapping[str, int], running: Sequence[str], table: Mapping[str, ModuleCost]
) -> str:
    """The module a free worker takes: `waiting` maps each module left to its number of
    tests, `running` lists the modules the workers have started and not finished."""
    costs = {module: cost_of(module, tests, table) for module, tests in waiting.items()}
    unit = [module for module, cost in costs.items() if cost.tier == "unit"]
    if unit:
        return max(unit, key=lambda module: waiting[module])
    heavy_running = sum(cost_of(module, 1, table).heavy for module in running)
    allowed = [m for m, cost in costs.items() if not cost.heavy or heavy_running < MAX_HEAVY]
    return max(allowed or list(costs), key=lambda module: costs[module].seconds)


def module_of(classname: str) -> str:
    """`tests.api.test_x.TestY` (JUnit's classname) -> `tests/api/test_x.py`."""
    parts = classname.split(".")
    last = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
    return "/".join(parts[: last + 1]) + ".py"


def table_from_junit(path: Path) -> dict[str, dict[str, Any]]:
    """Each module's tier and the seconds of its tests, from a JUnit file whose test
    cases carry the `tier` property (tests/support/tiers.py adds it)."""
    rows: dict[str, dict[str, Any]] = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        module = module_of(case.get("classname", ""))
        tiers = [p.get("value") for p in case.iter("property") if p.get("name") == "tier"]
        row = rows.setdefault(module, {"tier": "unit", "seconds": 0.0})
        row["seconds"] += float(case.get("time", 0))
        if tiers and TIERS.index(tiers[0]) > TIERS.index(row["tier"]):
            row["tier"] = tiers[0]
    return {
        module: {**row, "seconds": round(row["seconds"], 1)} for module, row in sorted(rows.items())
    }


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadFileScheduling

    class LongestFirstScheduling(LoadFileScheduling):
        table = read_table()

        def _running(self) -> list[str]:
            """The module each worker is on: the first of its assigned ones not done."""
            running = []
            for assigned in self.assigned_work.values():
                for module, tests in assigned.items():
                    if not all(tests.values()):
                        running.append(module)
                        break
            return running

        def _assign_work_unit(self, node: Any) -> None:
            waiting = {module: len(tests) for module, tests in self.workqueue.items()}
            module = pick(waiting, self._running(), self.table)
            # the base class pops the queue's first unit: put the chosen one there
            self.workqueue.move_to_end(module, last=False)
            super()._assign_work_unit(node)

    return LongestFirstScheduling(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist", None) != "loadfile":
        return None
    return make_scheduler(config, log)


if __name__ == "__main__":
    table = table_from_junit(Path(sys.argv[1]))
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{TABLE}: {len(table)} modules, {sum(r['seconds'] for r in table.values()):.0f} s")
