"""What a floating-point result depends on: the CPU, torch's kernels and the library versions.

A number measured on one machine (a tiny-model build, a quickstart score) is
only comparable with one from another machine when both say which CPU and
which kernel path produced it, so every such record carries these facts.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from atroposlib.utils.cache_dir import default_cache_dir

VERSIONED = ("torch", "transformers", "tokenizers", "atroposlib")


def _cpuinfo(*keys: str) -> str | None:
    """The first CPU's value of the first of `keys` /proc/cpuinfo has, if any."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() in keys:
                    return value.strip()
    except OSError:
        pass
    return None


def cpu_model_name() -> str:
    """The CPU's marketing name from /proc/cpuinfo, else what `platform` knows."""
    return _cpuinfo("model name", "Model", "Hardware") or platform.processor() or platform.machine()


def torch_cpu_capability() -> str | None:
    """The vector kernels torch picks here (AVX2, AVX512, DEFAULT, ...); None without torch.

    Asking torch means importing it, 2-3 s of CPU that a launcher, which runs no model,
    would pay for every run's report. So a process without torch loaded reads the
    answer from the cache, where the first asker left it under what decides it:
    torch's version, the CPU's flags and `ATEN_CPU_CAPABILITY`."""
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None
    deciding = (version, platform.machine(), _cpu_flags(), os.getenv("ATEN_CPU_CAPABILITY", ""))
    key = hashlib.sha256("\n".join(deciding).encode()).hexdigest()[:16]
    cached = default_cache_dir() / "machine" / f"torch-cpu-capability-{key}"
    if "torch" not in sys.modules:
        try:
            return cached.read_text().strip()
        except OSError:
            pass
    try:
        import torch
    except ImportError:
        return None
    capability = str(torch.backends.cpu.get_cpu_capability())
    _write_quietly(cached, capability)
    return capability


def _cpu_flags() -> str:
    """The instruction-set flags of the first CPU (x86 `flags`, Arm `Features`), else
    the CPU's name."""
    return _cpuinfo("flags", "Features") or cpu_model_name()


def _write_quietly(path: Path, text: str) -> None:
    """Write `path` whole (a reader sees the old file or the new one), or nothing: a
    cache that cannot be written is asked again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(text)
        os.replace(temporary, path)
    except OSError:
        pass


def machine_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {
        "cpu": cpu_model_name(),
        "architecture": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_cpu_capability": torch_cpu_capability(),
        "python": platform.python_version(),
    }
    for name in VERSIONED:
        try:
            facts[f"{name}_version"] = metadata.version(name)
        except metadata.PackageNotFoundError:
            facts[f"{name}_version"] = None
    return facts
