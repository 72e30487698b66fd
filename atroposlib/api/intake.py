"""Taking a post in: reading its bytes, the JSON kept for the trainer, and the plan of
which groups queue at once and which wait in a buffer.

Design: a group whose size differs from its env's `group_size` waits in that env's
buffer until buffered groups sum exactly to `group_size`; they then queue together,
in their original order. The plan is pure (nothing is written or changed here):
`RunState` hands it to the store and applies it only once the store has committed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from atroposlib.api.models import group_errors
from atroposlib.api.packing import find_subset_summing_to
from atroposlib.api.store import GroupRow, WriteSet
from atroposlib.protocol import GROUP_FIELDS, GROUPS, Registration, ScoredData, is_whole_float

_NULL_FIELDS = {name: f'"{name}":null,'.encode() for name in GROUP_FIELDS}


def read_groups_json(body: bytes, as_list: bool) -> tuple[list[ScoredData], bool]:
    """The posted group(s), and whether the posted JSON may be handed on verbatim.

    Groups are read strictly, in Rust. A token written `2.0` is the integer 2 in JSON
    (and in JSON Schema), so a post whose only faults are such whole numbers is read
    again leniently and must be re-serialised: the trainer then reads `2`, not `2.0`.
    """

    def read(strict: bool) -> list[ScoredData]:
        if as_list:
            return GROUPS.validate_json(body, strict=strict)
        return [ScoredData.model_validate_json(body, strict=strict)]

    try:
        return read(strict=True), True
    except ValidationError as exc:
        if not all(is_whole_float(error.get("input")) for error in exc.errors()):
            raise
        try:
            return read(strict=False), False
        except ValidationError:
            raise exc from None


def stored_json(group: ScoredData, raw: bytes | None = None) -> bytes:
    """The JSON handed to the trainer: the posted object with absent fields as null.

    Re-serialising a 100 KB group costs more than validating it, so when the raw posted
    object is at hand it is reused verbatim and only the missing keys are prepended.
    Without it (list posts) the model is serialised.
    """
    if raw is None:
        return group.model_dump_json().encode()
    missing = b"".join(
        _NULL_FIELDS[name] for name in GROUP_FIELDS if name not in group.model_fields_set
    )
    return b"{" + missing + raw.strip()[1:]


def plan_intake(
    groups: list[ScoredData],
    raw: bytes | None,
    current_buffers: dict[int | None, list[GroupRow]],
    next_id: int,
    group_size_of: Callable[[int], int],
) -> tuple[WriteSet, list[GroupRow], list[dict[str, Any]]]:
    """The store's change, the groups that queue now (in order), and each post's answer."""
    change = WriteSet(kv={})
    buffers = {env: list(rows) for env, rows in current_buffers.items()}
    pending: dict[int, int] = {}  # id -> index in change.inserts
    newly_queued: list[GroupRow] = []
    answers: list[dict[str, Any]] = []
    for group in groups:
        gid, next_id = next_id, next_id + 1
        size, env = len(group.tokens), group.env_id
        body = stored_json(group, raw if len(groups) == 1 else None)
        expected = group_size_of(env) if env is not None else size
        if size == expected:
            row = GroupRow(id=gid, env_id=env, size=size, order=gid, buffered=False)
            change.inserts.append((row, body))
            newly_queued.append(row)
            answers.append({"status": "received"})
            continue
        row = GroupRow(id=gid, env_id=env, size=size, order=gid, buffered=True)
        pending[gid] = len(change.inserts)
        change.inserts.append((row, body))
        buffer = buffers.setdefault(env, [])
        buffer.append(row)
        picked = find_subset_summing_to([r.size for r in buffer], expected)
        if picked:
            for position in picked:
                member = buffer[position]
                promoted = GroupRow(member.id, env, member.size, order=gid, buffered=False)
                if member.id in pending:
                    change.inserts[pending[member.id]] = (
                        promoted,
                        change.inserts[pending[member.id]][1],
                    )
                else:
                    change.promotions.append((member.id, gid))
                newly_queued.append(promoted)
            chosen = set(picked)
            buffers[env] = [r for i, r in enumerate(buffer) if i not in chosen]
        answers.append({"status": "buffered", "buffer_size": sum(r.size for r in buffers[env])})
    change.kv["next_id"] = next_id
    newly_queued.sort(key=lambda r: (r.order, r.id))
    return change, newly_queued, answers


def post_errors(
    groups: list[ScoredData],
    as_list: bool,
    registration: Registration | None,
    knows_env: Callable[[int], bool],
) -> list[dict[str, Any]]:
    """Every problem of a post's groups, in FastAPI's 422 shape: the wire rules
    (`models.group_errors`, against the trainer's token limit and vocabulary) and an
    `env_id` no environment registered."""
    max_len = registration.max_token_len if registration else -1
    vocab_size = registration.vocab_size if registration else None
    errors: list[dict[str, Any]] = []
    for index, group in enumerate(groups):
        loc = ("body", index) if as_list else ("body",)
        errors.extend(group_errors(group, loc, max_len, vocab_size))
        if group.env_id is not None and not knows_env(group.env_id):
            errors.append(
                {
                    "type": "value_error",
                    "loc": [*loc, "env_id"],
                    "msg": f"unknown env_id {group.env_id}; register with /register-env",
                }
            )
    return errors
