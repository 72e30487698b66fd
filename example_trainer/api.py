"""The trainer's side of the trajectory API: /register with retries, then /batch."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from atroposlib.protocol import Batch, Registration, ScoredData
from example_trainer.config import TrainingConfig

logger = logging.getLogger("example_trainer")


class TrajectoryAPI:
    """The trainer's side of the protocol: /register, then /batch."""

    def __init__(self, url: str) -> None:
        key = os.environ.get("ATROPOS_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=60)

    def register(self, config: TrainingConfig, starting_step: int) -> None:
        payload = Registration(
            wandb_group=config.wandb_group,
            wandb_project=config.wandb_project,
            batch_size=config.batch_size,
            max_token_len=config.seq_len,
            checkpoint_dir=str(Path(config.save_path).resolve()),
            save_checkpoint_interval=config.checkpoint_interval or config.vllm_restart_interval,
            starting_step=starting_step,
            num_steps=config.training_steps,
        ).model_dump()
        delay = 0.5
        while True:
            try:
                self.http.post("/register", json=payload).raise_for_status()
                return
            except httpx.HTTPError as exc:
                logger.warning("cannot register with the API (%s); retrying in %.0fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 10)

    def batch(self) -> list[ScoredData] | None:
        """The next step's groups, or None while the API has none (or cannot be read)."""
        try:
            response = self.http.get("/batch")
            response.raise_for_status()
            return Batch.model_validate_json(response.content).batch
        except httpx.HTTPError as exc:
            logger.warning("/batch failed: %s", exc)
        except ValidationError as exc:
            logger.error("/batch answered a malformed batch: %s", exc)
        return None

    def status(self) -> dict[str, Any] | str:
        """The API's /status, or why it could not be read (for "still waiting" notes)."""
        try:
            return self.http.get("/status").json()
        except (httpx.HTTPError, ValueError) as exc:
            return f"unreachable ({exc})"
