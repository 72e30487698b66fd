"""The README's two commands install the measured versions; the library keeps its ranges."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")
from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# what scripts/test.sh installs (via dev)
EXTRAS_INSTALLED = (
    *(
        "dev",
        "inference",
        "trainer",
        "wandb",
        "optim",
        "envs",
        "viewer",
        "ifeval",
        "verifiers",
        "trackio",
    ),
)


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            found[canonicalize_name(name)] = version
    return found


def direct_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    listed = list(project["dependencies"])
    for extra in EXTRAS_INSTALLED:
        listed += project["optional-dependencies"][extra]
    return [r for r in map(Requirement, listed) if canonicalize_name(r.name) != "atroposlib"]


def test_every_direct_dependency_is_pinned_within_its_range():
    pinned = pins(REPO / "scripts" / "constraints.txt")
    for requirement in direct_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{name} is not in scripts/constraints.txt"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"{name}=={pinned[name]} is outside pyproject's range {requirement.specifier}"
        )
    assert pinned["torch"] == "2.13.0"


def test_the_library_itself_keeps_ranges():
    assert all(not str(r.specifier).startswith("==") for r in direct_requirements())


@pytest.mark.parametrize("script", ["quickstart.sh", "test.sh"])
def test_the_readme_scripts_install_only_through_the_pinned_installer(script):
    text = (REPO / "scripts" / script).read_text()
    assert "bash scripts/install_venv.sh " in text
    assert not re.search(r"^\s*pip install", text, re.MULTILINE), "install through install_venv.sh"
    assert f"bash scripts/{script}" in (REPO / "README.md").read_text()


def test_the_installer_pins_every_install():
    text = (REPO / "scripts" / "install_venv.sh").read_text().replace("\\\n", " ")
    installs = [
        line.strip()
        for line in text.splitlines()
        if line.strip().startswith(('"${PIP[@]}"', '"${UV[@]}"'))
    ]
    # uv (pip), torch, the project with its extras and pip, lm-eval's IFEval modules for
    # dev, upstream's rewards into .venv/reference for dev, the Axolotl plugin into
    # .venv/axolotl-plugin for dev, the local verifiers environment for dev (uv)
    assert len(installs) == 7
    assert all(line.endswith('"${PIN[@]}"') for line in installs), installs
    assert "PIN=(-c scripts/constraints.txt)" in text
    pinned = pins(REPO / "scripts" / "constraints.txt")
    assert "uv" in pinned and "pip" in pinned, "the installers themselves are pinned"
