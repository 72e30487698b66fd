"""The environment's client of the trajectory API, with a local spool.

Every scored group gets an `Idempotency-Key` when it is produced and is written
to the spool directory (one file per group, named in production order) before
the first delivery attempt; the file is deleted only after the API answered.
So an API outage or restart, or a crash of the environment itself, loses
nothing: delivery resumes in order when the API answers again, and a group
that was delivered but not yet deleted is recognised by its key and not queued
twice. Bodies of 1 KB or more are gzip-compressed; `ATROPOS_API_KEY` is sent as
a bearer token when set. Connection errors, 5xx (503: queue full), 408 and 429
are retried with exponential back-off, for ever: an env outlives an API restart. The
log names the URL and what to check at the first failure, then at a slowing pace
(`atroposlib.utils.retry_notes`), and says when the API answers again. Any other 4xx
is final: retrying the same body cannot succeed, and holding it would block every
later group behind it. A refused record is therefore moved, with the API's answer,
to a dead-letter file beside the spool (`dead-letter.jsonl`) and logged as an
ERROR, so it can be inspected and re-posted by hand instead of vanishing.

Each group is stamped with a `group_id` (`atroposlib.protocol.GROUP_ID_FIELD`)
when it is spooled, and every post the API acknowledged is appended to a ledger
beside the spool (`atroposlib.delivery_ledger`: the key and its group ids) before the spool
file goes, so a run can count what was acknowledged against what was trained.

`newest_weight_version` is the highest weight version (`WEIGHT_VERSIONS_FIELD`) among
the groups sent so far: the newest weights this env's engine is known to sample with,
which the serve loop's admission control reads (`atroposlib.envs.admission`).

The plain calls speak both dialects: `/status-env` carries `env_id` in a JSON body
(what upstream's server reads) and in the query (which it ignores). Upstream's
server also ignores the `Idempotency-Key` header. A 4xx on a plain call raises
`APIRefusedError`, whose message names the call, the status and the API's answer.
"""

from __future__ import annotations

import asyncio
import fcntl
import gzip
import json
import logging
import os
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import httpx

from atroposlib.delivery_ledger import ledger_path, record_delivered
from atroposlib.protocol import GROUP_ID_FIELD, WEIGHT_VERSIONS_FIELD
from atroposlib.utils.durable import fsync_dir
from atroposlib.utils.retry_notes import RetryNotes
from atroposlib.weight_sync.versions import version_number

logger = logging.getLogger("atroposlib.envs")

GZIP_MIN_BYTES = 1024
OWNER_FILE = ".owner"
"""In the spool: locked by the process that owns it, and naming that process."""
RETRYABLE_4XX = {408, 429}  # timeouts and rate limits (a proxy's, say) pass with time
QUERY_REFUSALS = {400, 422}  # how a server that reads no query parameters may refuse one


class APIRefusedError(RuntimeError):
    """The API answered a plain call with a final 4xx (or not with JSON): asking again
    cannot help, so the caller stops with this message instead of retrying."""


class StateDirInUse(RuntimeError):
    """Another process holds this environment's spool: two copies would overwrite each
    other's spooled groups (DUR-2 of the security review)."""


class EnvUnknownError(APIRefusedError):
    """/status-env answered 404: the API lost this env (restarted without its state, or
    reset), so the env registers again instead of stopping."""


def own_spool(spool: Path) -> IO[str]:
    """An exclusive lock on `spool`, held while the returned file is open (the kernel
    drops it when the process dies, however it dies). Each process numbers its spool
    files from what it found at start, so a second owner would replace the first's."""
    owner = open(spool / OWNER_FILE, "a+")
    try:
        fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner.seek(0)
        holder = owner.read().strip() or "another process"
        owner.close()
        raise StateDirInUse(
            f"{spool} is in use by {holder}: two copies of one environment must not share "
            "a state dir, or they overwrite each other's undelivered groups. Give this one "
            "its own: ATROPOS_ENV_STATE_DIR=DIR, or another --env.wandb_name "
            "(atropos-launch gives each copy its own)"
        ) from None
    owner.seek(0)
    owner.truncate()
    owner.write(f"pid {os.getpid()}\n")
    owner.flush()
    return owner


def _refused(method: str, path: str, response: httpx.Response) -> APIRefusedError:
    hint = ""
    if response.status_code in (401, 403):
        hint = " (set ATROPOS_API_KEY to the key run-api was started with)"
    elif path == "/status-env" and response.status_code == 404:
        hint = " (the API no longer knows this env: was it reset, or restarted on a new state?)"
    kind = (
        EnvUnknownError
        if path == "/status-env" and response.status_code == 404
        else (APIRefusedError)
    )
    return kind(
        f"{method} {path} was refused by the trajectory API at {response.url.host}:"
        f"{response.url.port} with HTTP {response.status_code}: {response.text[:500]}{hint}"
    )


class TrajectoryClient:
    def __init__(
        self,
        base_url: str,
        spool_dir: str | os.PathLike[str],
        api_key: str | None = None,
        timeout_s: float = 60.0,
        max_backoff_s: float = 10.0,
        dead_letter_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        api_key = api_key if api_key is not None else os.environ.get("ATROPOS_API_KEY")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout_s)
        self.spool = Path(spool_dir)
        self.spool.mkdir(parents=True, exist_ok=True)
        self._owner = own_spool(self.spool)
        self.dead_letter = Path(dead_letter_path or self.spool.parent / "dead-letter.jsonl")
        self.ledger = ledger_path(self.spool)
        self.max_backoff_s = max_backoff_s
        self.counters: Counter[str] = Counter()
        self.records_delivered = 0  # posts answered, accepted or refused
        self.newest_weight_version: int | None = None
        """The highest numeric weight version in the groups sent; None before any."""
        existing = sorted(self.spool.glob("*.json"))
        self._next = int(existing[-1].stem) + 1 if existing else 0
        self._queued: list[Path] = existing
        """The spool's files, oldest first: those found at start, then each one sent."""
        self._held: dict[Path, tuple[dict[str, Any], bytes]] = {}
        """Records this process spooled, with their payload's JSON: delivered without
        reading the file back or encoding the payload a second time."""
        self._wake = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._flusher: asyncio.Task | None = None
        self._status_query = True  # False once the API refused /status-env?env_id=
        self._status_hold: tuple[int, float] | None = None
        self.holds_status = True
        """Whether the API held a /status-env asked to wait (see `hold_next_status`)."""
        self._retry_notes: dict[str, RetryNotes] = {}
        if existing:
            # a spool left by an earlier run is sent to whatever trainer is there now
            logger.warning(
                "resuming %d undelivered records from an earlier run in %s; "
                "they are sent before anything new",
                len(existing),
                self.spool,
            )

    # -- plain calls, retried until the API answers -------------------------
    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        notes = self._notes(method, path)
        delay = 0.5
        while True:
            try:
                response = await self.http.request(method, path, **kwargs)
                if response.status_code < 500 and response.status_code not in RETRYABLE_4XX:
                    notes.answered()
                    return response
                notes.failed(
                    f"HTTP {response.status_code}: {response.text[:200]}",
                    "the API is up but cannot take it yet, as its answer says",
                )
            except httpx.TransportError as exc:
                timed_out = isinstance(exc, httpx.TimeoutException)
                notes.failed(
                    "timed out" if timed_out else str(exc) or type(exc).__name__,
                    f"check that run-api is running at {self.base_url} and that "
                    "--env.rollout_server_url names it",
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_backoff_s)

    def _notes(self, method: str, path: str) -> RetryNotes:
        """The retry log of one call (an outage of another call is logged apart)."""
        key = f"{method} {path}"
        if key not in self._retry_notes:
            where = f"{key} to the trajectory API at {self.base_url}"
            self._retry_notes[key] = RetryNotes(logger, where)
        return self._retry_notes[key]

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON answer of a plain call; `APIRefusedError` for a 4xx or a non-JSON one."""
        return await self._answer(method, path, await self._request(method, path, **kwargs))

    async def _answer(self, method: str, path: str, response: httpx.Response) -> Any:
        if not response.is_success:
            raise _refused(method, path, response)
        try:
            return response.json()
        except ValueError:
            raise APIRefusedError(
                f"{method} {path} answered HTTP {response.status_code} with something that "
                f"is not JSON: {response.text[:200]!r} (is {self.base_url} a trajectory API?)"
            ) from None

    async def get_json(self, path: str, **kwargs: Any) -> Any:
        return await self._json("GET", path, **kwargs)

    async def post_json(self, path: str, payload: Any) -> Any:
        return await self._json("POST", path, json=payload)

    async def _until_trainer(self, ask: Callable[[], Awaitable[Any]]) -> Any:
        """`ask()` every second until it answers (not None): the trainer has not started."""
        announced = False
        while (answer := await ask()) is None:
            if not announced:
                logger.info("waiting for the trainer to start")
                announced = True
            await asyncio.sleep(1.0)
        return answer

    async def register_env(self, registration: dict[str, Any]) -> dict[str, Any]:
        """Register, waiting while the trainer has not started."""

        async def ask() -> dict[str, Any] | None:
            answer = await self.post_json("/register-env", registration)
            if not isinstance(answer, dict):
                raise APIRefusedError(f"POST /register-env answered {answer!r}, not an object")
            return answer if answer.get("status") == "success" else None

        return await self._until_trainer(ask)

    async def wandb_info(self) -> dict[str, Any]:
        """The trainer's wandb project and group, once a trainer has registered (upstream
        waits for a project; a trainer that registered without one gets None here)."""

        async def ask() -> dict[str, Any] | None:
            info = await self.get_json("/wandb_info")
            if info.get("project") is not None:
                return info
            trainer = await self.get_json("/info")
            return info if trainer.get("batch_size", -1) != -1 else None

        return await self._until_trainer(ask)

    def hold_next_status(self, after_step: int, seconds: float) -> None:
        """Let the next /status-env wait until the trainer has taken a batch past
        `after_step`, or `seconds` (`atroposlib.api.long_poll`). An API that answers it
        at once (upstream's) turns `holds_status` False, and the caller polls instead."""
        self._status_hold = (after_step, seconds)

    async def status_env(
        self, env_id: int, progress: Mapping[str, int] | None = None
    ) -> dict[str, Any]:
        """This env's /status-env: `env_id` goes in a JSON body, as upstream's env sends it
        (its server reads nothing else), and in the query, which that server ignores. A
        server that refuses the query (400/422) is asked with the body alone from then on.
        `progress` (`protocol.ENV_PROGRESS_FIELDS`) rides in the query too: the trainer's note on a
        batch that does not come names an env whose rollouts all fail."""
        body = {"env_id": env_id}
        hold, self._status_hold = self._status_hold, None
        if hold is not None and not self._status_query:
            self.holds_status = False  # a server that refuses queries cannot be asked to hold
        if self._status_query:
            params: dict[str, Any] = {"env_id": env_id, **(progress or {})}
            headers = {}
            if hold is not None:
                params["after_step"] = hold[0]
                headers["Prefer"] = f"wait={hold[1]:g}"
            response = await self._request(
                "GET", "/status-env", json=body, params=params, headers=headers
            )
            if response.status_code not in QUERY_REFUSALS:
                if hold is not None:
                    self.holds_status = "preference-applied" in response.headers
                return await self._answer("GET", "/status-env", response)
            self._status_query = False
            logger.warning(
                "the API refused /status-env?env_id= (HTTP %d: %s); sending env_id in the "
                "JSON body only from now on",
                response.status_code,
                response.text[:200],
            )
        return await self.get_json("/status-env", json=body)

    # -- scored groups: spooled, delivered in order -------------------------
    def send(self, groups: Sequence[Mapping[str, Any]]) -> None:
        """Queue groups for delivery (one post, as the protocol prescribes); never blocks."""
        path = "/scored_data" if len(groups) == 1 else "/scored_data_list"
        groups = [
            group if GROUP_ID_FIELD in group else {**group, GROUP_ID_FIELD: uuid.uuid4().hex}
            for group in groups
        ]
        self._note_weight_versions(groups)
        payload = groups[0] if len(groups) == 1 else groups
        record = {"path": path, "key": uuid.uuid4().hex, "payload": payload}
        body = json.dumps(payload)
        target = self.spool / f"{self._next:012d}.json"
        self._next += 1
        tmp = target.with_suffix(".tmp")
        with open(tmp, "w") as out:  # on disk before it is named: a power loss leaves
            # either the whole record or none of it (the JSON of `record`, its payload
            # encoded once for the file and the post)
            out.write(f'{{"path": {json.dumps(path)}, "key": "{record["key"]}", "payload": ')
            out.write(body + "}")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
        fsync_dir(self.spool)  # and the name itself
        self._queued.append(target)
        self._held[target] = (record, body.encode())
        self._wake.set()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_forever())

    def _note_weight_versions(self, groups: Sequence[Mapping[str, Any]]) -> None:
        """Raise `newest_weight_version` to the groups' newest numeric version label
        (a digit string, as the trainer reads them); None and other labels are ignored."""
        for group in groups:
            versions = group.get(WEIGHT_VERSIONS_FIELD)
            if not isinstance(versions, list):
                continue
            for label in versions:
                version = version_number(label)
                if version is not None:
                    if self.newest_weight_version is None or version > self.newest_weight_version:
                        self.newest_weight_version = version

    def pending(self) -> int:
        return len(self._queued)

    async def _flush_forever(self) -> None:
        while True:
            await self.flush()
            self._wake.clear()
            if self.pending() == 0:
                await self._wake.wait()

    async def flush(self) -> None:
        """Deliver every spooled record, oldest first; returns when the spool is empty.

        One flush at a time (the background flusher and `close` both call it), so
        no record is delivered twice or unlinked by the other.
        """
        async with self._flush_lock:
            while self._queued:
                path = self._queued[0]
                held: tuple[dict[str, Any], bytes | None] | None = self._held.get(path)
                if held is None:  # spooled by an earlier run: read back
                    try:
                        held = json.loads(path.read_text()), None
                    except (OSError, ValueError) as unreadable:
                        # a file a crash cut short (ENV-1): it used to stop every later
                        # delivery; it goes to the dead-letter file and the spool goes on
                        self._dead_letter_unreadable(path, unreadable)
                        await self._spooled_file_done(path)
                        continue
                await self._deliver(*held)
                await self._spooled_file_done(path)
                self.records_delivered += 1

    async def _spooled_file_done(self, path: Path) -> None:
        """Forget a delivered record. The unlink waits for the file system's journal
        (milliseconds after an fsync), so a worker thread does it, not the event loop; a
        crash before it leaves a file whose key the API answers again without queueing."""
        self._queued.remove(path)
        self._held.pop(path, None)
        await asyncio.to_thread(path.unlink, missing_ok=True)

    async def _deliver(self, record: dict[str, Any], body: bytes | None = None) -> None:
        """POST a spooled record; `body`: its payload's JSON, when already encoded."""
        if body is None:
            body = json.dumps(record["payload"]).encode()
        headers = {"Content-Type": "application/json", "Idempotency-Key": record["key"]}
        if len(body) >= GZIP_MIN_BYTES:
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        response = await self._request("POST", record["path"], content=body, headers=headers)
        if response.is_success:
            self.counters["groups_delivered"] += 1
            self._note_delivered(record)
            return
        self.counters[f"rejected_{response.status_code}"] += 1
        self._dead_letter(record, response)
        logger.error(
            "the API refused %s (%d): %s; kept in %s",
            record["path"],
            response.status_code,
            response.text[:2000],
            self.dead_letter,
        )

    def _note_delivered(self, record: dict[str, Any]) -> None:
        """Ledger line of an acknowledged post (a replayed key may appear twice)."""
        payload = record["payload"]
        groups = payload if isinstance(payload, list) else [payload]
        ids = [g.get(GROUP_ID_FIELD) for g in groups if isinstance(g, dict)]
        record_delivered(self.ledger, record["key"], ids)

    def _dead_letter(self, record: dict[str, Any], response: httpx.Response) -> None:
        """Append the refused record durably: the spool file is deleted right after."""
        self._append_dead_letter(
            {
                "time": time.time(),
                "path": record["path"],
                "key": record["key"],
                "status": response.status_code,
                "answer": response.text,
                "payload": record["payload"],
            }
        )

    def _dead_letter_unreadable(self, path: Path, error: Exception) -> None:
        raw = path.read_bytes() if path.exists() else b""
        self.counters["unreadable_spool_files"] += 1
        logger.error("spool file %s cannot be read (%s); kept in %s", path, error, self.dead_letter)
        self._append_dead_letter(
            {
                "time": time.time(),
                "spool_file": path.name,
                "error": f"unreadable spool file: {error}",
                "raw": raw.decode("utf-8", errors="replace"),
            }
        )

    def _append_dead_letter(self, entry: dict[str, Any]) -> None:
        self.dead_letter.parent.mkdir(parents=True, exist_ok=True)
        with open(self.dead_letter, "a") as out:
            out.write(json.dumps(entry) + "\n")
            out.flush()
            os.fsync(out.fileno())

    async def close(self, flush_timeout_s: float = 30.0) -> None:
        try:
            await asyncio.wait_for(self.flush(), flush_timeout_s)
        except TimeoutError:
            logger.warning("%d groups stay in %s for the next run", self.pending(), self.spool)
        if self._flusher is not None:
            self._flusher.cancel()
        await self.http.aclose()
        self._owner.close()  # the spool is free for the next process
