"""Import boundaries: `atroposlib/cli/` holds console entry points that nothing else imports,
and tests share helpers through `tests/support/`, never through test modules or conftest files."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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
    """The launcher reaches trainers through atroposlib.trainer_contract, not by name
    (but for where its default trainer's flags' model is read without torch)."""
    mentions = [
        f"{path.relative_to(REPO)}: {line.strip()}"
        for path in (REPO / "atroposlib").rglob("*.py")
        for line in path.read_text().splitlines()
        if "example_trainer" in line
    ]
    assert mentions == [
        'atroposlib/launch/config.py: DEFAULT_TRAINER = "example_trainer.grpo"',
        'atroposlib/launch/config.py: DEFAULT_TRAINER_FLAGS = "example_trainer.config"',
    ]


def is_test_module(module: str) -> bool:
    """`tests.x.test_y`, `tests.conftest`, `test_y`, `conftest` (and names inside them)."""
    parts = module.split(".")
    if parts[0] != "tests" and parts[0] != "conftest" and not parts[0].startswith("test_"):
        return False
    return any(part == "conftest" or part.startswith("test_") for part in parts)


def relative_imports(path: Path, root: Path) -> set[str]:
    """`from .x import y` in `path`, resolved against its package under `root`."""
    package = list(path.relative_to(root).parent.parts)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            base = package[: len(package) - (node.level - 1)] + (node.module or "").split(".")
            module = ".".join(part for part in base if part)
            found |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return found


def imported_test_modules(path: Path, root: Path = REPO) -> list[str]:
    modules = imported_modules(path) | relative_imports(path, root)
    return sorted(m for m in modules if is_test_module(m))


def test_no_test_file_imports_a_test_module_or_a_conftest():
    """Shared helpers live in tests/support/; conftest files hold fixtures, test files tests."""
    offenders = [
        f"{path.relative_to(REPO)} imports {module}"
        for path in sorted((REPO / "tests").rglob("*.py"))
        for module in imported_test_modules(path)
    ]
    assert offenders == []


@pytest.mark.parametrize(
    "source",
    [
        *(
            f"from {module} import {name}\n"
            for module, name in [
                ("tests.envs.test_serve", "EnvProcess"),
                ("tests.conftest", "free_port"),
                ("tests.launch.conftest", "launch_config"),
                ("tests.example_trainer", "test_lora"),
                (".test_lora", "batch"),
                (".", "conftest"),
            ]
        ),
        "import tests.example_trainer.test_lora\n",
        "def f():\n    import tests.inference.test_vllm\n",
    ],
)
def test_the_test_import_scan_sees_each_spelling(tmp_path, source):
    """The check above can fail: each of these imports is reported."""
    path = tmp_path / "tests" / "example_trainer" / "test_x.py"
    path.parent.mkdir(parents=True)
    path.write_text(source)
    assert imported_test_modules(path, tmp_path) != []


def test_the_test_import_scan_passes_support_modules(tmp_path):
    path = tmp_path / "tests" / "envs" / "test_x.py"
    path.parent.mkdir(parents=True)
    path.write_text(
        "from tests.support.groups import make_group\n"
        "from tests.support.tolerances import logprob_tolerance\n"
        "from tests.support.arith_env import ArithEnv\n"
        "import pytest\n"
    )
    assert imported_test_modules(path, tmp_path) == []


STORE_INTERNALS = {
    f"atroposlib.api.store.{name}"
    for name in ("open_store", "SQLiteStore", "MemoryStore", "GroupStore")
}


def store_and_ledger_offenders(paths: list[Path], root: Path = REPO) -> list[str]:
    """Files that open the API's store outside the API, or spell the delivery ledger's
    file name outside its contract module."""
    api = root / "atroposlib" / "api"
    contract = root / "atroposlib" / "delivery_ledger.py"
    offenders = []
    for path in paths:
        if api not in path.parents:
            bad = sorted(imported_modules(path) & STORE_INTERNALS)
            offenders += [f"{path.relative_to(root)} imports {m}" for m in bad]
        if path != contract and "delivered.jsonl" in path.read_text():
            offenders.append(f"{path.relative_to(root)} names delivered.jsonl")
    return offenders


def test_another_processs_records_are_read_through_their_owner():
    """The launcher reads the API's store through `queued_group_ids` and the env clients'
    ledger through `atroposlib.delivery_ledger`, never by opening their files itself."""
    paths = [p for folder in LIBRARY_AND_USERS for p in (REPO / folder).rglob("*.py")]
    assert store_and_ledger_offenders(paths) == []


def test_the_owner_check_can_fail(tmp_path):
    reader = tmp_path / "atroposlib" / "launch" / "reader.py"
    reader.parent.mkdir(parents=True)
    reader.write_text("from atroposlib.api.store import open_store\nLEDGER = 'delivered.jsonl'\n")
    own = tmp_path / "atroposlib" / "api" / "store.py"
    own.parent.mkdir(parents=True)
    own.write_text("from atroposlib.api.store import SQLiteStore\n")
    assert store_and_ledger_offenders([reader, own], root=tmp_path) == [
        "atroposlib/launch/reader.py imports atroposlib.api.store.open_store",
        "atroposlib/launch/reader.py names delivered.jsonl",
    ]


def test_nothing_outside_the_rewards_imports_their_private_modules():
    """Environments and the library read answers through `atroposlib.envs.reward_fns`
    and the public reward modules; the underscore modules can change freely."""
    rewards = REPO / "atroposlib" / "envs" / "reward_fns"
    offenders = []
    for folder in LIBRARY_AND_USERS:
        for path in (REPO / folder).rglob("*.py"):
            if rewards in path.parents:
                continue
            private = {
                m for m in imported_modules(path) if m.startswith("atroposlib.envs.reward_fns._")
            }
            offenders += [f"{path.relative_to(REPO)} imports {m}" for m in sorted(private)]
    assert offenders == []
