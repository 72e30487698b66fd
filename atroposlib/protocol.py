"""The wire format of the trajectory API, defined once (docs/protocol.md).

Every side of the wire imports this module: the API validates posts with these
models, environments build their groups from the TypedDicts and registration
models, and the trainer reads `/batch` through `Batch`. It depends on pydantic
only, so the API stays free of the rest of the library.

Field names and types are the Atropos contract. `ScoredData` (validated) and
`ScoredDataGroup` (the plain-dict view environments build and upstream code
imports) list the same fields; a test keeps them equal. The rules that make a group
trainable, beyond its field types, are here too (`group_problems`): the API refuses a
group that breaks one at intake, and a trainer skips one that still reaches it.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, TypedDict

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter

from atroposlib.token_limit import exceeds_token_limit

STRICT_JSON = ConfigDict(strict=True)
"""Request models take JSON types as they are: a bool is not an int and a string is not
a number (a JSON integer still fills a float field), so `{"num_steps": false}` is a 422,
as the OpenAPI document says, instead of a run of 0 steps."""


def is_whole_float(value: Any) -> bool:
    return type(value) is float and value.is_integer()


def _whole_number(value: Any) -> Any:
    """JSON has one number type: `3.0` is the integer 3, as JSON Schema's "integer" says."""
    return int(value) if is_whole_float(value) else value


WholeInt = Annotated[int, BeforeValidator(_whole_number)]
"""A strict int field that also takes a whole JSON number written `3.0`."""
PositiveWholeInt = Annotated[int, Field(gt=0), BeforeValidator(_whole_number)]
NonNegativeWholeInt = Annotated[int, Field(ge=0), BeforeValidator(_whole_number)]
"""WholeInts with their bound where an optional field's JSON schema shows it: a bound
given after the validator, or on the `| None` union, is published as "ge"/"gt", which
JSON Schema does not know, so clients (and the fuzz test) took -1 for valid."""


MAX_NAME_LENGTH = 256
"""Longest name: an environment's, a wandb group's or project's. Names are stored, and an
environment's is rewritten with the env table on every later registration: a 30 MB
name made each one block the API for 0.8 s (API-6)."""
MAX_PATH_LENGTH = 4096
"""Linux's PATH_MAX: a longer checkpoint_dir names no directory."""
MAX_ENV_WEIGHT = 1e6
"""Weights are relative; an infinite one pushed every other env to the floor."""


class Registration(BaseModel):
    """What a trainer sends to `/register`."""

    model_config = STRICT_JSON

    wandb_group: str = Field(max_length=MAX_NAME_LENGTH)
    wandb_project: str = Field(max_length=MAX_NAME_LENGTH)
    batch_size: WholeInt = Field(gt=0)
    max_token_len: WholeInt
    """The token limit on the wire; `atroposlib.token_limit` holds its rule."""
    checkpoint_dir: str = Field(max_length=MAX_PATH_LENGTH)
    save_checkpoint_interval: WholeInt
    starting_step: WholeInt = Field(ge=0)
    num_steps: WholeInt
    vocab_size: PositiveWholeInt | None = None
    """Rows of the trainer's embedding: the API refuses a group with a token id at or
    above it. Not part of upstream's registration, which leaves it out (no check)."""
    max_staleness: NonNegativeWholeInt | None = None
    """The trainer's `--max-staleness K`: it drops a sequence sampled more than K steps
    before the step that trains it. `/status-env` tells environments K, so they admit no
    more work than can still arrive within it (`atroposlib.envs.admission`). None: no
    bound. Not part of upstream's registration; upstream's API ignores it."""


class RegisterEnv(BaseModel):
    """What an environment sends to `/register-env`."""

    model_config = STRICT_JSON

    max_token_length: WholeInt = Field(gt=0)
    """The environment's token limit (the same notion as `max_token_len`)."""
    desired_name: str = Field(min_length=1, max_length=MAX_NAME_LENGTH)
    weight: float = Field(1.0, ge=0.0, le=MAX_ENV_WEIGHT, allow_inf_nan=False)
    group_size: WholeInt = Field(gt=0)
    min_batch_allocation: float | None = Field(default=None, ge=0.0, le=1.0)


class EnvIdentifier(BaseModel):
    """Names a registered environment (`/disconnect-env`, `/status-env`)."""

    model_config = STRICT_JSON

    env_id: WholeInt = Field(ge=0)


ENV_PROGRESS_FIELDS = ("groups_sent", "rollout_errors", "context_refusals")
"""An env's counters, sent in `/status-env`'s query (this API's addition; upstream's
ignores a query) and shown per env in `/status` as `env_progress`: the trainer's note
on a batch that does not come names an env whose rollouts all fail, and why."""


class ScoredData(BaseModel):
    """One group: the rollouts of one prompt.

    Strict types: a token must be a JSON integer and a score a JSON number, because
    the posted JSON itself is what the trainer receives (`atroposlib.api.intake`), so a
    coerced "5" would reach it as a string. Unknown keys are kept and handed on.
    `ser_json_inf_nan="constants"` writes NaN/Infinity like Python's json module.
    """

    model_config = ConfigDict(strict=True, extra="allow", ser_json_inf_nan="constants")

    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    advantages: list[list[float]] | None = None
    ref_logprobs: list[list[float]] | None = None
    messages: list[list[dict[str, Any]]] | None = None
    generation_params: dict[str, Any] | None = None
    inference_logprobs: list[list[float]] | None = None
    overrides: list[dict[str, Any]] | None = None
    group_overrides: dict[str, Any] | None = None
    images: Any | None = None
    env_id: int | None = Field(default=None, ge=0)
    distill_token_ids: list[list[list[int]]] | None = None
    distill_logprobs: list[list[list[float]]] | None = None


GROUP_FIELDS = tuple(ScoredData.model_fields)

PER_SEQUENCE_FIELDS = (
    "advantages",
    "ref_logprobs",
    "messages",
    "inference_logprobs",
    "overrides",
    "distill_token_ids",
    "distill_logprobs",
)
"""Optional fields that hold one entry per sequence."""

ITEM_FIELDS = ("tokens", "masks", *PER_SEQUENCE_FIELDS, "images")
"""Per-sequence fields a single rollout carries (`scores` is handled apart)."""

PER_TOKEN_FIELDS = ("advantages", "inference_logprobs", "ref_logprobs")
"""Per-sequence fields with one number per token, aligned with `tokens`."""
LOGPROB_FIELDS = ("inference_logprobs", "ref_logprobs")
LOGPROB_TOLERANCE = 1e-3
"""Largest value a log-probability may have where a token is trained: a probability is
at most 1, and 1.0 there is a prompt's placeholder that reached a trained token."""

IGNORED = -100
"""The mask value of a token that is not trained on (the prompt, padding)."""


Problem = tuple[tuple[str | int, ...], str]
"""Where in the group (field, sequence, position) and what is wrong."""


def sending_env(group: ScoredData) -> int | None:
    """The API's id of the environment that sent `group`, when it said (a trainer's
    per-environment figures; the field is spelled here, as every group field is)."""
    return group.env_id


def group_problems(
    group: ScoredData, max_token_len: int = -1, vocab_size: int | None = None
) -> list[Problem]:
    """What stops a trainer from training on `group`; [] when nothing does.

    Shapes that must agree, finite scores, messages with role and content, the token
    limit, and what crashed trainers on every restart (the correctness review's RUN-3):
    an empty sequence, a token id below 0 or at or above `vocab_size`, and a per-token
    value that is not finite where a token is trained. Untrained positions (the first
    token, and a mask of -100) may hold any placeholder: the loss never reads them.
    `messages: []` is upstream's "no conversation" and is accepted.
    """
    problems = _token_problems(group, max_token_len, vocab_size)
    mask_problems, trained = _mask_problems(group)
    return [
        *problems,
        *mask_problems,
        *_score_problems(group),
        *_per_sequence_problems(group, trained),
        *_distill_problems(group, trained, vocab_size),
        *_message_problems(group),
    ]


def _token_problems(group: ScoredData, max_token_len: int, vocab_size: int | None) -> list[Problem]:
    problems: list[Problem] = []
    if not group.tokens:
        problems.append((("tokens",), "a group needs at least one sequence"))
    limit = f"0 to {vocab_size - 1}, the trainer's vocabulary" if vocab_size else ">= 0"
    for i, toks in enumerate(group.tokens):
        if not toks:
            problems.append((("tokens", i), "a sequence needs at least one token"))
        bad = next((t for t in toks if t < 0 or (vocab_size and t >= vocab_size)), None)
        if bad is not None:
            problems.append((("tokens", i), f"token id {bad} is outside {limit}"))
        if max_token_len > 0 and exceeds_token_limit(len(toks), max_token_len):
            message = (
                f"sequence has {len(toks)} tokens, over the registered "
                f"max_token_len {max_token_len}"
            )
            problems.append((("tokens", i), message))
    return problems


def _mask_problems(group: ScoredData) -> tuple[list[Problem], list[list[bool] | None]]:
    """The mask problems, and per sequence which positions are trained (None: unknown)."""
    n = len(group.tokens)
    trained: list[list[bool] | None] = [None] * n
    if len(group.masks) != n:
        return [(("masks",), f"masks has {len(group.masks)} sequences, tokens has {n}")], trained
    problems: list[Problem] = []
    for i, (toks, mask) in enumerate(zip(group.tokens, group.masks, strict=True)):
        if len(toks) != len(mask):
            message = f"mask length {len(mask)} differs from token length {len(toks)}"
            problems.append((("masks", i), message))
        else:
            trained[i] = [j > 0 and m != IGNORED for j, m in enumerate(mask)]
    return problems, trained


def _score_problems(group: ScoredData) -> list[Problem]:
    n = len(group.tokens)
    problems: list[Problem] = []
    if len(group.scores) != n:
        problems.append((("scores",), f"scores has {len(group.scores)} entries for {n} sequences"))
    for i, score in enumerate(group.scores):
        if not math.isfinite(score):
            problems.append((("scores", i), f"score must be finite, got {score}"))
    return problems


def _per_sequence_problems(group: ScoredData, trained: list[list[bool] | None]) -> list[Problem]:
    n = len(group.tokens)
    problems: list[Problem] = []
    for field in PER_SEQUENCE_FIELDS:
        value = getattr(group, field)
        if value is None or (field == "messages" and value == []):
            continue
        if len(value) != n:
            problems.append(((field,), f"{field} has {len(value)} entries for {n} sequences"))
        elif field in PER_TOKEN_FIELDS:
            problems += _per_token_problems(field, group.tokens, value, trained)
    return problems


def _per_token_problems(
    field: str,
    tokens: list[list[int]],
    rows: list[list[float]],
    trained: list[list[bool] | None],
) -> list[Problem]:
    """The trainer reads these position by position beside the tokens: another length
    would be broadcast or fail deep inside its loss, and a non-finite value where a
    token is trained poisons the step."""
    problems: list[Problem] = []
    for i, (toks, row) in enumerate(zip(tokens, rows, strict=True)):
        if len(row) != len(toks):
            problems.append(
                ((field, i), f"{field}[{i}] has {len(row)} values for {len(toks)} tokens")
            )
            continue
        positions = trained[i] or []
        ceiling = LOGPROB_TOLERANCE if field in LOGPROB_FIELDS else math.inf
        j = next(
            (j for j, t in enumerate(positions) if t and not (-math.inf < row[j] <= ceiling)),
            None,
        )
        if j is None:
            continue
        message = f"{field}[{i}][{j}] is {row[j]} at a trained position"
        if math.isfinite(row[j]):
            message += " (a log-probability above 0)"
        problems.append(((field, i, j), message))
    return problems


def _distill_problems(
    group: ScoredData, trained: list[list[bool] | None], vocab_size: int | None
) -> list[Problem]:
    """The teacher's arrays, read beside the tokens: `distill_token_ids[i][t]` and
    `distill_logprobs[i][t]` are the teacher's top-k at position t of sequence i (its
    distribution over token t given the tokens before it), so each sequence needs one
    row per token, each position as many logprobs as ids, every id inside the
    vocabulary, and a log-probability (at most 0, not NaN) wherever a token is trained.
    The first problem of each sequence is reported: the rest follow from it. Checked
    only when both arrays are given."""
    ids, logprobs = group.distill_token_ids, group.distill_logprobs
    if ids is None or logprobs is None:
        return []  # one alone teaches nothing: a trainer ignores it (upstream's API keeps it)
    if len(ids) != len(group.tokens) or len(logprobs) != len(group.tokens):
        return []  # the per-sequence count is reported with the other fields
    problems: list[Problem] = []
    for i, toks in enumerate(group.tokens):
        problem = _distill_sequence_problem(i, toks, ids[i], logprobs[i], trained[i], vocab_size)
        if problem is not None:
            problems.append(problem)
    return problems


def _distill_sequence_problem(
    i: int,
    tokens: list[int],
    ids: list[list[int]],
    logprobs: list[list[float]],
    trained: list[bool] | None,
    vocab_size: int | None,
) -> Problem | None:
    if len(ids) != len(tokens) or len(logprobs) != len(tokens):
        return (
            ("distill_token_ids", i),
            f"distill arrays of sequence {i} have {len(ids)} id rows and {len(logprobs)} "
            f"logprob rows for {len(tokens)} tokens (one row per position)",
        )
    limit = vocab_size if vocab_size else None
    for t, (row_ids, row_lps) in enumerate(zip(ids, logprobs, strict=True)):
        if len(row_ids) != len(row_lps):
            return (
                ("distill_token_ids", i, t),
                f"position {t} of sequence {i} has {len(row_ids)} teacher ids but "
                f"{len(row_lps)} logprobs",
            )
        bad = next((x for x in row_ids if x < 0 or (limit is not None and x >= limit)), None)
        if bad is not None:
            where = f"0 to {limit - 1}, the trainer's vocabulary" if limit else ">= 0"
            return (
                ("distill_token_ids", i, t),
                f"teacher id {bad} at position {t} of sequence {i} is outside {where} "
                "(distillation needs the teacher's ids in the student's vocabulary)",
            )
        if trained and trained[t]:
            value = next((v for v in row_lps if not v <= LOGPROB_TOLERANCE), None)
            if value is not None:
                return (
                    ("distill_logprobs", i, t),
                    f"distill_logprobs[{i}][{t}] holds {value} at a trained position "
                    "(a log-probability is at most 0)",
                )
    return None


def _message_problems(group: ScoredData) -> list[Problem]:
    return [
        (("messages", i, j), "every message needs 'role' and 'content'")
        for i, conversation in enumerate(group.messages or [])
        for j, message in enumerate(conversation)
        if "role" not in message or "content" not in message
    ]


class Batch(BaseModel):
    """What `/batch` answers: the groups of one step, or null while none is ready."""

    batch: list[ScoredData] | None


GROUPS = TypeAdapter(list[ScoredData])
"""Validates a list of groups, given as dicts or as `ScoredData`."""


EMPTY_EXAMPLE: dict[str, list] = {
    key: []
    for key in (
        "tokens",
        "masks",
        "scores",
        "advantages",
        "ref_logprobs",
        "generation_params",
        "inference_logprobs",
        "messages",
        "images",
    )
}
"""What `/latest_example` answers before any group arrived (upstream's shape)."""


class ScoredDataGroup(TypedDict, total=False):
    """A group as a plain dict: what environments build and hand to the API client."""

    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    advantages: list[list[float]] | None
    ref_logprobs: list[list[float]] | None
    messages: list[Any] | None
    generation_params: dict[str, Any] | None
    inference_logprobs: list[list[float]] | None
    overrides: list[dict[str, Any]] | None
    group_overrides: dict[str, Any] | None
    images: Any
    env_id: int | None
    distill_token_ids: list[list[list[int]]] | None
    distill_logprobs: list[list[list[float]]] | None


class ScoredDataItem(TypedDict, total=False):
    """One scored rollout; `stack_items` turns several into a group."""

    tokens: list[int]
    masks: list[int]
    scores: float
    advantages: list[float] | None
    ref_logprobs: list[float] | None
    messages: Any
    inference_logprobs: list[float] | None
    group_overrides: dict[str, Any] | None
    overrides: dict[str, Any] | None
    images: Any
    distill_token_ids: list[list[int]] | None
    distill_logprobs: list[list[float]] | None


GROUP_ID_FIELD = "group_id"
"""An optional extra key of a group: a unique id its environment's client stamps on it
when it is produced (before spooling), so the group can be traced from the env's
ledger of acknowledged posts to the trainer's ledger of trained groups. Upstream's
server and trainers ignore unknown keys, so it rides along unchanged."""


WEIGHT_VERSIONS_FIELD = "weight_versions"
"""An optional extra key of a group: per sequence, the label (the trainer step) of the
weights that sampled it, or None where the engine gave none, so a trainer can tell how
stale its data is. Upstream ignores it, as it ignores every extra key."""


TEACHER_LATENCY_FIELD = "teacher_latency_s"
"""An optional extra key of a distilled group: the seconds its environment waited for the
teacher's logprobs, which the trainer reports per step. Upstream ignores it."""


def group_id_of(group: ScoredData | dict[str, Any]) -> str | None:
    """The group's `group_id`, if its environment stamped one."""
    if isinstance(group, ScoredData):
        value = (group.model_extra or {}).get(GROUP_ID_FIELD)
    else:
        value = group.get(GROUP_ID_FIELD)
    return value if isinstance(value, str) else None
