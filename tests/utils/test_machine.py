"""Machine facts: the torch kernel path comes from torch once, then from the cache."""

from __future__ import annotations

import sys

import pytest

from atroposlib.utils.machine import machine_facts, torch_cpu_capability

torch = pytest.importorskip("torch")


def cached_files(cache) -> list:
    return sorted((cache / "machine").glob("torch-cpu-capability-*"))


def test_torch_answers_once_and_a_process_without_torch_reads_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATROPOS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    answer = str(torch.backends.cpu.get_cpu_capability())
    assert torch_cpu_capability() == answer  # torch is loaded here: asked, and kept
    [kept] = cached_files(tmp_path)
    assert kept.read_text() == answer

    # a process that has not loaded torch (the launcher) reads what was kept: the file
    # says something torch would not, so an answer from torch would show
    kept.write_text("FROM-THE-CACHE")
    monkeypatch.delitem(sys.modules, "torch")
    assert torch_cpu_capability() == "FROM-THE-CACHE"
    assert machine_facts()["torch_cpu_capability"] == "FROM-THE-CACHE"


def test_what_decides_the_kernels_keys_the_cache(tmp_path, monkeypatch):
    """ATEN_CPU_CAPABILITY makes torch pick other kernels: it is another entry, not the
    first one's answer."""
    monkeypatch.setenv("ATROPOS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    torch_cpu_capability()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    torch_cpu_capability()
    assert len(cached_files(tmp_path)) == 2


def test_an_unwritable_cache_still_answers(tmp_path, monkeypatch):
    (tmp_path / "machine").write_text("a file where the cache's folder would be")
    monkeypatch.setenv("ATROPOS_CACHE_DIR", str(tmp_path))
    assert torch_cpu_capability() == str(torch.backends.cpu.get_cpu_capability())
