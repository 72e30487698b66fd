"""Which module a free xdist worker takes next (tests/support/scheduling.py)."""

from __future__ import annotations

from pathlib import Path

from tests.support.scheduling import (
    TABLE,
    ModuleCost,
    module_of,
    pick,
    read_table,
    table_from_junit,
)

TABLE_OF_A_RUN = {
    "tests/test_pure.py": ModuleCost("unit", 3.0),
    "tests/test_more_pure.py": ModuleCost("unit", 1.0),
    "tests/test_faults.py": ModuleCost("e2e", 300.0),
    "tests/test_learning.py": ModuleCost("e2e", 320.0),
    "tests/test_vllm.py": ModuleCost("e2e", 120.0),
    "tests/test_browser.py": ModuleCost("e2e", 20.0),
    "tests/test_env_table.py": ModuleCost("integration", 170.0),
    "tests/test_api.py": ModuleCost("integration", 30.0),
}


def waiting(*modules: str) -> dict[str, int]:
    return {module: 2 for module in modules}


def test_unit_modules_go_first_the_most_tests_first():
    left = waiting("tests/test_faults.py", "tests/test_pure.py", "tests/test_more_pure.py")
    left["tests/test_more_pure.py"] = 40
    assert pick(left, [], TABLE_OF_A_RUN) == "tests/test_more_pure.py"


def test_then_the_longest_module():
    left = waiting("tests/test_api.py", "tests/test_faults.py", "tests/test_learning.py")
    assert pick(left, [], TABLE_OF_A_RUN) == "tests/test_learning.py"
    assert pick(left, ["tests/test_learning.py"], TABLE_OF_A_RUN) == "tests/test_learning.py"


def test_no_third_whole_run_while_two_run_unless_only_whole_runs_are_left():
    two_runs = ["tests/test_learning.py", "tests/test_faults.py"]
    left = waiting("tests/test_vllm.py", "tests/test_env_table.py", "tests/test_browser.py")
    assert pick(left, two_runs, TABLE_OF_A_RUN) == "tests/test_env_table.py"
    assert pick(left, two_runs[:1], TABLE_OF_A_RUN) == "tests/test_env_table.py"  # longer
    del left["tests/test_env_table.py"]
    assert pick(left, two_runs[:1], TABLE_OF_A_RUN) == "tests/test_vllm.py"
    assert pick(left, two_runs, TABLE_OF_A_RUN) == "tests/test_browser.py"  # light e2e
    assert pick(waiting("tests/test_vllm.py"), two_runs, TABLE_OF_A_RUN) == "tests/test_vllm.py"


def test_a_module_the_table_does_not_know_counts_a_second_per_test():
    left = {"tests/test_new.py": 50, "tests/test_api.py": 3}
    assert pick(left, [], TABLE_OF_A_RUN) == "tests/test_new.py"
    left["tests/test_new.py"] = 10
    assert pick(left, [], TABLE_OF_A_RUN) == "tests/test_api.py"


def test_the_table_is_read_from_a_runs_junit_file(tmp_path: Path):
    junit = tmp_path / "run.xml"
    junit.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="tests.api.test_x" name="a" time="1.5">'
        '<properties><property name="tier" value="unit"/></properties></testcase>'
        '<testcase classname="tests.api.test_x.TestY" name="b" time="2.0">'
        '<properties><property name="tier" value="integration"/></properties></testcase>'
        '<testcase classname="tests.test_z" name="c" time="0.25"/>'
        "</testsuite></testsuites>"
    )
    assert table_from_junit(junit) == {
        "tests/api/test_x.py": {"tier": "integration", "seconds": 3.5},
        "tests/test_z.py": {"tier": "unit", "seconds": 0.2},
    }
    assert module_of("tests.launch.test_faults") == "tests/launch/test_faults.py"


def test_the_repositorys_table_names_modules_that_exist():
    table = read_table(TABLE)
    root = TABLE.parents[1]
    assert len(table) > 100
    missing = [module for module in table if not (root / module).exists()]
    assert missing == [], "rewrite it: python -m tests.support.scheduling JUNIT_XML"
