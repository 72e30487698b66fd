"""Making written files survive a power loss, not only a killed process.

A rename is atomic against a crash of the writer, but until the data and the
directory entry reach the disk, a power loss can leave an empty file or none.
Anything that makes someone else delete data (a checkpoint that releases the API's
leases, a spool file that replaces an acknowledged post) is fsynced first.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a rename or a new name inside `path` durable (the entry is data too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root`, and `root` itself."""
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(Path(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(folder))
