"""Where atroposlib keeps what it builds or measures once per machine: the tiny model,
the torch kernel path. `ATROPOS_CACHE_DIR` moves it (the test suite points it at an
empty directory per run), else it follows XDG like pip's and Hugging Face's caches."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    base = os.environ.get("ATROPOS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "atroposlib"
    )
    return Path(base)
