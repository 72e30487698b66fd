"""`replay`: post stored (or re-scored) groups into a running API as off-policy data.

Design: a replayed group is posted as its environment posted it, with its tokens,
masks, `inference_logprobs` and `weight_versions`, so the trainer's importance-sampling
correction weighs it by the policy that really sampled it and `--max-staleness` sees
how old its weights were. Versions are trainer steps and are compared as they are:
right for a replay into the same run, or into a fork of it for groups sampled before
the fork; a version ahead of the trainer's step (another run's later weights) counts
as of unknown age (the trainer's staleness rule). Each group goes with `replayed_from` (the
source run, its group id, the step that trained it, the reward that re-scored it) and
without `env_id` (the ids of the source's environments mean nothing to the target).

Every post carries an Idempotency-Key made from the source and the group, so a replay
that is interrupted and run again never queues a group twice. Posts go through the
shared wait (`poll_until`): an API that is down or busy is retried until `timeout_s`;
a group it refuses (4xx: over its token limit, a token it cannot embed) is counted
with the API's reason and the replay goes on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from atroposlib.delivery_ledger import DELIVERED_LEDGER, record_delivered
from atroposlib.protocol import GROUP_ID_FIELD
from atroposlib.rollouts.rescore import FAILED_FILE, MARK
from atroposlib.rollouts.store import StoredGroup, StoreError
from atroposlib.utils.waiting import WaitTimeout, poll_until
from atroposlib.viewer.jsonl2html import read_groups

REPLAYED_FROM = "replayed_from"
"""The key of a replayed group's provenance (the trainer ignores it, as unknown keys)."""
FILE_ONLY = ("item", MARK, "env_id")
"""Keys of a stored group that are not posted (what was written beside it)."""


@dataclass
class ReplayOutcome:
    posted: int = 0
    sequences: int = 0
    passes: int = 0
    refused: list[str] = field(default_factory=list)


def informative(groups: list[StoredGroup]) -> tuple[list[StoredGroup], int]:
    """The groups whose samples do not all score the same, and how many did: GRPO gets
    no advantage from such a group, only a smaller step (its tokens still count in the
    loss's normaliser), so it is left out, as `ensure_scores_are_not_same` does."""
    kept = [g for g in groups if len(set(g.scores)) > 1]
    return kept, len(groups) - len(kept)


def passes(groups: list[StoredGroup], fill: int | None) -> list[tuple[int, StoredGroup]]:
    """(pass, group) to post: the groups once, or pass after pass until `fill` sequences
    (a run that samples nothing needs its steps x its batch)."""
    if not fill:
        return [(0, g) for g in groups]
    if not any(g.scores for g in groups):
        raise StoreError("the chosen groups hold no sequences")
    chosen: list[tuple[int, StoredGroup]] = []
    count, rank = 0, 0
    while count < fill:
        for group in groups:
            if count >= fill:
                break
            chosen.append((rank, group))
            count += len(group.scores)
        rank += 1
    return chosen


def rescored_groups(folder: Path) -> list[StoredGroup]:
    """The groups `rescore` wrote to `folder`, each with the step that trained it."""
    files = sorted(p for p in folder.glob("*.jsonl") if p.name != FAILED_FILE)
    if not files:
        raise StoreError(
            f"{folder} holds no re-scored groups (atropos-rollouts rescore writes them)"
        )
    groups = []
    for path in files:
        found, _ = read_groups(path)
        for data in found:
            step = (data.get(MARK) or {}).get("step")
            groups.append(StoredGroup(path.stem, data, step if isinstance(step, int) else None))
    if not groups:
        raise StoreError(f"{folder} holds no re-scored groups")
    return groups


def ordered(groups: list[StoredGroup], steps: tuple[int, int] | None) -> list[StoredGroup]:
    """The groups in the order the source trained them (untrained ones last), within
    `steps` when given (then only trained ones)."""
    if steps is not None:
        low, high = steps
        groups = [g for g in groups if g.step is not None and low <= g.step <= high]
    return sorted(groups, key=lambda g: (g.step is None, g.step or 0))


def body(group: StoredGroup, source: Path, rank: int = 0) -> dict[str, Any]:
    """What is posted for `group` in pass `rank`: its wire fields and where it came from."""
    data = {k: v for k, v in group.data.items() if k not in FILE_ONLY}
    original = group.group_id
    mark = group.data.get(MARK) or {}
    digest = _digest(str(source.resolve()), original or "", mark, *([rank] if rank else []))
    data[GROUP_ID_FIELD] = "replay-" + digest[:24]
    data[REPLAYED_FROM] = {
        "run": str(source.resolve()),
        "env": group.env,
        "group_id": original,
        "step": group.step,
        "reward": mark.get("reward"),
        **({"pass": rank} if rank else {}),
    }
    return data


def replay(
    groups: list[tuple[int, StoredGroup]],
    source: Path,
    api_url: str,
    api_key: str | None,
    timeout_s: float = 300.0,
    say: Callable[[str], None] = print,
    client: httpx.Client | None = None,
    ledger: Path | None = None,
) -> ReplayOutcome:
    """Post each (pass, group) once; what was posted and refused (`client`: an API
    in-process).
    Each acknowledged group goes to `ledger` (a delivery ledger, as an environment's
    client writes), so a launched run's account counts the replayed groups too."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    outcome = ReplayOutcome()
    opened = (
        httpx.Client(base_url=api_url.rstrip("/"), headers=headers, timeout=30.0)
        if client is None
        else nullcontext(client)
    )
    with opened as http:
        for index, (rank, group) in enumerate(groups, start=1):
            outcome.passes = max(outcome.passes, rank + 1)
            data = body(group, source, rank)
            refusal = _post(http, data, timeout_s)
            if refusal:
                outcome.refused.append(f"group {group.group_id}: {refusal}")
            else:
                if ledger is not None:
                    record_delivered(ledger, data[GROUP_ID_FIELD], [data[GROUP_ID_FIELD]])
                outcome.posted += 1
                outcome.sequences += len(group.scores)
            if index % 200 == 0:
                say(f"replayed {index} of {len(groups)} groups")
    return outcome


def ledger_in(state_dir: str | None) -> Path | None:
    """The delivery ledger in a launched run's state directory for this process
    (`ATROPOS_ENV_STATE_DIR`), or None outside a launch."""
    if not state_dir:
        return None
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    return Path(state_dir) / DELIVERED_LEDGER


def _post(http: httpx.Client, data: dict[str, Any], timeout_s: float) -> str | None:
    """POST one group until the API answers; its reason when it refused the group."""
    key = data[GROUP_ID_FIELD]
    content = json.dumps(data).encode()
    headers = {"Content-Type": "application/json", "Idempotency-Key": key}

    def attempt() -> httpx.Response | None:
        try:
            response = http.post("/scored_data", content=content, headers=headers)
        except httpx.TransportError:
            return None
        if response.status_code >= 500 or response.status_code in (408, 429):
            return None
        return response

    try:
        response = poll_until(attempt, timeout_s, f"the API at {http.base_url}", 1.0)
    except WaitTimeout as error:
        raise StoreError(str(error)) from None
    if response.status_code in (401, 403):
        raise StoreError(
            f"the API at {http.base_url} refused the key (HTTP {response.status_code}): "
            "set ATROPOS_API_KEY to the run's key (RUN_DIR/api-key)"
        )
    if response.is_success:
        return None
    return f"HTTP {response.status_code}: {response.text[:300]}"


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
