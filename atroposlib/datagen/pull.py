"""The trainer-side client of the data tools: register with a running `run-api`, read `/batch`.

Design: one small synchronous client (httpx) shared by every tool that takes batches
without training on them. A tool joins the run at the API's current step (it keeps no
checkpoints), so stopping it and starting it again on the same API resumes instead of
being refused as a fresh trainer. It never calls `/reset_data`: pulling data must not
wipe queued groups. Transport errors and 5xx answers are asked again with exponential
back-off for `retry_s` seconds (run-api may be starting or restarting; `on_retry` hears
of the first failed try of each outage, so a tool can say what it waits for); a 4xx is
final. An API that answers that no trainer registered (restarted without its state)
gets this tool's registration again, with its batch size, and the pull goes on.
(No tenacity: it is not a core dependency, and the data tools run on a plain install.) Every failure
is one `PullError` whose message says what to do, and whose `status` is the API's HTTP
answer (None when it did not answer).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import httpx
from pydantic import ValidationError

from atroposlib.protocol import Batch, Registration, ScoredData

KEY_HINT = "set ATROPOS_API_KEY to the key run-api was started with"


class PullError(RuntimeError):
    """The API cannot be used; `status` is its HTTP answer, None when it did not answer."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class _Transient(Exception):
    """A failure worth asking again (no answer, or a 5xx)."""


def _refusal(api_url: str, method: str, path: str, response: httpx.Response) -> PullError:
    code = response.status_code
    said = response.text[:500]
    if code in (401, 403):
        why = f"the API at {api_url} wants a token ({method} {path}: HTTP {code}): {KEY_HINT}"
    elif code == 409:
        why = f"the API at {api_url} belongs to another run and refused this tool: {said}"
    else:
        why = f"{method} {path} at {api_url} was refused with HTTP {code}: {said}"
    return PullError(why, code)


class BatchPuller:
    """Registers as the run's trainer and reads `/batch` (one call per `next_batch`)."""

    def __init__(
        self,
        api_url: str,
        batch_size: int,
        max_token_len: int,
        num_steps: int = 1_000_000,
        api_key: str | None = None,
        *,
        tool: str = "atropos-datagen",
        retry_s: float = 10.0,
        timeout_s: float = 30.0,
        on_retry: Callable[[str], None] | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.batch_size = batch_size
        self.max_token_len = max_token_len
        self.num_steps = num_steps
        self.tool = tool
        self.retry_s = retry_s
        self.on_retry = on_retry
        self.registrations = 0
        """How often this tool registered: more than once after an API forgot it."""
        key = api_key if api_key is not None else os.environ.get("ATROPOS_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(base_url=self.api_url, headers=headers, timeout=timeout_s)

    def __enter__(self) -> BatchPuller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _once(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as error:
            raise _Transient(f"no answer ({error})") from None
        if response.status_code >= 500:
            raise _Transient(f"HTTP {response.status_code}: {response.text[:200]}")
        return response

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request, retried while the API is unreachable or answers 5xx; JSON back."""
        deadline = time.monotonic() + self.retry_s
        delay = 0.25
        while True:
            try:
                response = self._once(method, path, **kwargs)
                break
            except _Transient as error:
                if delay == 0.25 and self.on_retry is not None:
                    self.on_retry(
                        f"the trajectory API at {self.api_url} does not answer ({method} "
                        f"{path}: {error}); asking again for up to {self.retry_s:.0f} s"
                    )
                if time.monotonic() + delay > deadline:
                    raise PullError(
                        f"cannot use the trajectory API at {self.api_url}: is run-api running "
                        f"at {self.api_url}? ({method} {path}: {error})"
                    ) from None
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
        if response.status_code >= 400:
            raise _refusal(self.api_url, method, path, response)
        try:
            return response.json()
        except ValueError:
            raise PullError(
                f"{method} {path} at {self.api_url} did not answer JSON: {response.text[:200]!r}"
                " (is that URL a run-api?)",
                response.status_code,
            ) from None

    def status(self) -> dict[str, Any]:
        """The API's `/status` (current_step, queue_size, queued_sequences, ...)."""
        answer = self._call("GET", "/status")
        if not isinstance(answer, dict):
            raise PullError(f"/status at {self.api_url} answered {answer!r}, not an object")
        return answer

    def register(self) -> None:
        """POST /register as the run's trainer, joining at the API's current step."""
        step = self.status().get("current_step", 0)
        registration = Registration(
            wandb_group=self.tool,
            wandb_project=self.tool,
            batch_size=self.batch_size,
            max_token_len=self.max_token_len,
            checkpoint_dir="checkpoints",
            save_checkpoint_interval=0,
            starting_step=step if isinstance(step, int) and step >= 0 else 0,
            num_steps=self.num_steps,
        )
        self._call("POST", "/register", json=registration.model_dump())
        self.registrations += 1

    def next_batch(self) -> list[ScoredData] | None:
        """The groups of one batch, or None while the API has no batch ready."""
        answer = self._call("GET", "/batch")
        if isinstance(answer, dict) and answer.get("status") == "error":
            # the only error /batch answers: no trainer registered, so run-api was
            # restarted without its state; its queue starts empty, this tool goes on
            self.register()
            return None
        try:
            return Batch.model_validate(answer).batch
        except ValidationError as error:
            raise PullError(
                f"/batch at {self.api_url} answered a malformed batch: {error}"
            ) from None

    def close(self) -> None:
        self._client.close()
