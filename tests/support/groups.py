"""Trajectory API payloads for tests, and the calls that register a trainer or an env."""

from __future__ import annotations

from typing import Any

import httpx

REGISTRATION = {
    "wandb_group": "g",
    "wandb_project": "p",
    "batch_size": 8,
    "max_token_len": 64,
    "checkpoint_dir": "/tmp/ckpt",
    "save_checkpoint_interval": 10,
    "starting_step": 0,
    "num_steps": 100,
}


def make_group(
    size: int, tag: int = 0, env_id: int | None = None, length: int = 4
) -> dict[str, Any]:
    """A valid group whose first token of each sequence is `tag` (to identify it later)."""
    tokens = [[tag] + [i + 1] * (length - 1) for i in range(size)]
    return {
        "tokens": tokens,
        "masks": [[-100] + t[1:] for t in tokens],
        "scores": [float(i % 2) for i in range(size)],
        "env_id": env_id,
    }


def register(client: httpx.Client, **overrides: Any) -> dict[str, Any]:
    response = client.post("/register", json={**REGISTRATION, **overrides})
    assert response.status_code == 200, response.text
    return response.json()


def start_trainer(client: httpx.Client, **overrides: Any) -> None:
    """Register and make the first /batch call, which marks the trainer as started."""
    register(client, **overrides)
    client.get("/batch")


def register_env(client: httpx.Client, **overrides: Any) -> dict[str, Any]:
    body = {"max_token_length": 64, "desired_name": "env", "weight": 1.0, "group_size": 4}
    response = client.post("/register-env", json={**body, **overrides})
    assert response.status_code == 200, response.text
    return response.json()


def tags_of(batch: list[dict[str, Any]]) -> list[int]:
    return [group["tokens"][0][0] for group in batch]


def drain_batches(client: httpx.Client, most: int = 1000) -> list[list[dict[str, Any]]]:
    """Every batch /batch serves until it answers none; fails instead of looping forever."""
    batches = []
    for _ in range(most):
        batch = client.get("/batch").json()["batch"]
        if batch is None:
            return batches
        batches.append(batch)
    raise AssertionError(f"/batch still served batches after {most}")


class RecordingClient:
    """Stands in for an env's TrajectoryClient in-process: keeps what `send` was given."""

    def __init__(self) -> None:
        self.sent: list[list[dict]] = []

    def send(self, groups: list[dict]) -> None:
        self.sent.append(groups)
