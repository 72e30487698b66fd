"""The environment library as a whole: its catalogue, its samples, and what each env offers.

The catalogue in environments/README.md is what users choose from, so it must list
exactly the env scripts there are; each script must be a runnable BaseEnv with its
own `evaluate`, and the samples that make everything run offline stay small.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from pathlib import Path

import pytest

from atroposlib.envs.base import BaseEnv
from atroposlib.envs.data_source import DataSourceConfig
from tests.support.library_envs import env_scripts

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "environments"
SAMPLE_LIMIT_BYTES = 1 << 20
COLUMNS = ["environment", "task", "reward", "turns", "tools", "data source", "offline sample"]


def catalogue() -> dict[str, list[str]]:
    """Rows of the README's catalogue table, keyed by script name."""
    lines = (LIBRARY / "README.md").read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| environment |"))
    assert [c.strip() for c in lines[header].strip("|").split("|")] == COLUMNS
    rows = {}
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[re.search(r"`(\w+\.py)`", cells[0]).group(1)] = cells
    return rows


def env_class(script: Path) -> type[BaseEnv]:
    spec = importlib.util.spec_from_file_location(f"library_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the config's annotations there
    spec.loader.exec_module(module)
    classes = [
        value
        for value in vars(module).values()
        if inspect.isclass(value)
        and issubclass(value, BaseEnv)
        and value.__module__ == module.__name__
    ]
    assert len(classes) == 1, f"{script.name}: one BaseEnv subclass expected, got {classes}"
    return classes[0]


def test_the_catalogue_lists_exactly_the_env_scripts():
    assert sorted(catalogue()) == [path.name for path in env_scripts()]
    for name, cells in catalogue().items():
        assert all(cells), f"{name}: every column of the catalogue is filled in"
        assert cells[COLUMNS.index("tools")] in {"yes", "no"}, name


@pytest.mark.integration
@pytest.mark.parametrize("script", env_scripts(), ids=lambda path: path.stem)
def test_each_env_is_a_runnable_base_env_with_its_own_evaluate(script):
    cls = env_class(script)
    assert "evaluate" in vars(cls) or any(
        "evaluate" in vars(base)
        for base in cls.__mro__[1:]
        if base.__module__ != BaseEnv.__module__
    ), f"{script.name} has no evaluate of its own"
    assert cls.name, f"{script.name}: set `name`"
    assert inspect.getdoc(sys.modules[cls.__module__]), "module docstring"
    config, servers = cls.config_init()
    if isinstance(config, DataSourceConfig):
        assert config.data_source == "sample", "offline by default"
        assert config.hub_dataset, f"{script.name}: name the real hub dataset"


def test_every_offline_sample_is_small():
    for folder in sorted((LIBRARY / "data").iterdir()):
        size = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
        assert 0 < size < SAMPLE_LIMIT_BYTES, f"{folder.name}: {size} bytes"
