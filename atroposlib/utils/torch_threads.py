"""torch on one CPU thread for a block of small work.

On tiny inputs a second OpenMP thread only spins, and on a busy machine that spinning
can cost more CPU than the work: the tiny model's build and the reward comparisons with
upstream both run under this.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch on one thread inside the block, as many as before after it (nothing where
    torch is not installed)."""
    if importlib.util.find_spec("torch") is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
