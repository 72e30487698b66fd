"""`scripts/venv_matches.py`: a current venv skips pip; a changed input or drifted pin does not."""

from __future__ import annotations

import importlib.util
import sys
from importlib import metadata

import pytest

from tests.support.source import REPO


@pytest.fixture
def venv_matches(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "venv_matches", REPO / "scripts" / "venv_matches.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(f"# pins\npytest=={metadata.version('pytest')}\n")
    monkeypatch.setattr(module, "CONSTRAINTS", constraints)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))  # where the stamp lives
    for folder in ("reference", "axolotl-plugin"):  # the dev extra's own folders
        (tmp_path / folder).mkdir()
    monkeypatch.setattr(module, "LOCAL_VF_ENV", "pytest")  # an installed distribution
    return module


def test_no_stamp_means_install_then_the_stamp_means_current(venv_matches):
    assert venv_matches.main(["dev,inference"]) == 1
    assert venv_matches.main(["dev,inference", "--write"]) == 0
    assert venv_matches.main(["dev,inference"]) == 0


@pytest.mark.parametrize("folder", ["reference", "axolotl-plugin"])
def test_the_dev_extra_needs_its_own_folders(venv_matches, tmp_path, folder):
    for extras in ("dev", "inference"):
        venv_matches.main([extras, "--write"])
    (tmp_path / folder).rmdir()
    assert venv_matches.main(["dev"]) == 1
    assert venv_matches.main(["inference"]) == 0


def test_the_dev_extra_needs_the_local_verifiers_environment(venv_matches, capsys):
    for extras in ("dev", "inference"):
        venv_matches.main([extras, "--write"])
    venv_matches.LOCAL_VF_ENV = "no-such-distribution"
    assert venv_matches.main(["dev"]) == 1
    assert "venv lacks no-such-distribution" in capsys.readouterr().err
    assert venv_matches.main(["inference"]) == 0


def test_a_changed_pin_or_other_extras_need_an_install(venv_matches):
    venv_matches.main(["dev", "--write"])
    assert venv_matches.main(["dev,viewer"]) == 1  # another set of extras: its own stamp
    assert venv_matches.main(["dev"]) == 0
    venv_matches.CONSTRAINTS.write_text(venv_matches.CONSTRAINTS.read_text() + "zzz-new==1.0\n")
    assert venv_matches.main(["dev"]) == 1


def test_a_package_off_its_pin_is_named_and_reinstalled(venv_matches, capsys):
    venv_matches.CONSTRAINTS.write_text("pytest==0.0.1\nnot-installed-at-all==9.9\n")
    venv_matches.main(["dev", "--write"])
    assert venv_matches.main(["dev"]) == 1
    said = capsys.readouterr().err
    assert f"pytest installed {metadata.version('pytest')}, pinned 0.0.1" in said
    assert "not-installed-at-all" not in said  # only what is installed is compared


def test_a_local_build_tag_is_the_same_release(venv_matches):
    version = metadata.version("pytest")
    venv_matches.CONSTRAINTS.write_text(f"pytest=={version}+cpu\n")
    assert venv_matches.drifted_pins() == []


def test_without_extras_it_explains_itself(venv_matches, capsys):
    assert venv_matches.main([]) == 2
    assert "venv_matches.py EXTRAS" in capsys.readouterr().err
