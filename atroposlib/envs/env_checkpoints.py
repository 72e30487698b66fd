"""An environment's checkpointed state: one JSON file per trainer checkpoint step,
<checkpoint_dir>/env_checkpoints/<wandb_name>/step-<step>.json, written atomically.

Only the file of the step the trainer resumed at is read back: a newer one belongs to
training the trainer has rolled back, and an older one to a different model.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger("atroposlib.envs")


def write_state(folder: Path, step: int, data: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step-{step}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)
    logger.info("saved env checkpoint %s", path)


def read_state(folder: Path, step: int) -> dict[str, Any] | None:
    path = folder / f"step-{step}.json"
    if not path.exists():
        # a stop between the trainer's checkpoints: the env goes on from its backlog
        logger.info("no env checkpoint at the trainer's step %d; starting from its backlog", step)
        logger.debug("no env checkpoint at %s", path)
        return None
    data = json.loads(path.read_text())
    logger.warning("restored env checkpoint %s (step %d): %s", path, step, sorted(data))
    return data
