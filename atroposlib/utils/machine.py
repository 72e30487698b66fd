"""What a floating-point result depends on: the CPU, torch's kernels and the library versions.

A number measured on one machine (a tiny-model build, a quickstart score) is
only comparable with one from another machine when both say which CPU and
which kernel path produced it, so every such record carries these facts.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata
from typing import Any

VERSIONED = ("torch", "transformers", "tokenizers", "atroposlib")


def cpu_model_name() -> str:
    """The CPU's marketing name from /proc/cpuinfo, else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def torch_cpu_capability() -> str | None:
    """The vector kernels torch picked (AVX2, AVX512, DEFAULT, ...); None without torch."""
    try:
        import torch
    except ImportError:
        return None
    return str(torch.backends.cpu.get_cpu_capability())


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
