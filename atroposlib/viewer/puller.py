"""The viewer's trainer-side client: register as the run's trainer, read `/batch`.

One `/batch` call per `next_batch` (the page asks on a click; a loop would hang it),
no `/reset_data` (a viewer must not wipe a run), and one error class, `PullError`,
whose `status` is the API's HTTP answer (None when it did not answer), so the page
can say what is wrong: unreachable, a token wanted (401/403), a run of another
trainer (409).
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from atroposlib.protocol import Batch, Registration, ScoredData


class PullError(RuntimeError):
    """The API cannot be used: `status` is its HTTP answer, None when it did not answer."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class BatchPuller:
    """Registers as the run's trainer and reads `/batch` (one call per `next_batch`)."""

    def __init__(
        self,
        api_url: str,
        batch_size: int,
        max_token_len: int,
        num_steps: int = 1_000_000,
        api_key: str | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.batch_size = batch_size
        self.max_token_len = max_token_len
        self.num_steps = num_steps
        key = api_key if api_key is not None else os.environ.get("ATROPOS_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(base_url=self.api_url, headers=headers, timeout=30)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as error:
            raise PullError(f"cannot reach the trajectory API at {self.api_url}: {error}") from None
        if response.status_code >= 400:
            raise PullError(
                f"{method} {path} answered HTTP {response.status_code}: {response.text[:300]}",
                response.status_code,
            )
        return response.json()

    def register(self) -> None:
        registration = Registration(
            wandb_group="atropos-view-run",
            wandb_project="atropos-view-run",
            batch_size=self.batch_size,
            max_token_len=self.max_token_len,
            checkpoint_dir="checkpoints",
            save_checkpoint_interval=0,
            starting_step=0,
            num_steps=self.num_steps,
        )
        self._call("POST", "/register", json=registration.model_dump())

    def next_batch(self) -> list[ScoredData] | None:
        answer = self._call("GET", "/batch")
        if isinstance(answer, dict) and answer.get("status") == "error":
            raise PullError(str(answer.get("message")), 409)
        return Batch.model_validate(answer).batch

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/status")

    def close(self) -> None:
        self._client.close()
