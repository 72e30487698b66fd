"""The wire format is defined once (`atroposlib.protocol`) and every side reads it."""

from __future__ import annotations

import re
from typing import get_type_hints

from atroposlib.api.intake import stored_json
from atroposlib.protocol import (
    GROUP_FIELDS,
    ITEM_FIELDS,
    Batch,
    ScoredData,
    ScoredDataGroup,
    ScoredDataItem,
)
from tests.support.source import LIBRARY_AND_USERS, REPO, imported_modules


def test_the_dict_view_lists_exactly_the_models_fields():
    assert set(get_type_hints(ScoredDataGroup)) == set(ScoredData.model_fields)
    item_keys = set(get_type_hints(ScoredDataItem))
    assert item_keys == {*ITEM_FIELDS, "scores", "group_overrides"}
    assert item_keys <= set(GROUP_FIELDS)


def test_only_the_protocol_module_spells_the_group_out():
    """A module naming more than half the fields is a second definition in disguise."""
    spelled = {}
    for folder in LIBRARY_AND_USERS:
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text()
            named = {f for f in GROUP_FIELDS if re.search(rf"\b{f}\b", text)}
            if len(named) > len(GROUP_FIELDS) // 2:
                spelled[str(path.relative_to(REPO))] = len(named)
    assert spelled == {"atroposlib/protocol.py": len(GROUP_FIELDS)}


def test_the_protocol_depends_on_pydantic_only():
    """Beside pydantic and the standard library, only the token limit's rule, which
    imports nothing itself."""
    allowed = (
        *("__future__", "math", "sys", "typing", "typing_extensions", "pydantic"),
        "atroposlib.token_limit",
    )
    found = imported_modules(REPO / "atroposlib" / "protocol.py")
    assert {m for m in found if not m.startswith(allowed)} == set()


# the wire format, the token limit, and the bind rule and request guard listeners share
API_MAY_IMPORT = (
    "atroposlib.api",
    "atroposlib.protocol",
    "atroposlib.token_limit",
    "atroposlib.utils.exposure",
    "atroposlib.utils.request_guard",
    "atroposlib.utils.durable",
)


def test_the_api_depends_only_on_the_protocol_and_the_shared_rules():
    outside = set()
    for path in (REPO / "atroposlib" / "api").glob("*.py"):
        outside |= {
            m
            for m in imported_modules(path)
            if m.startswith(("atroposlib", "example_trainer")) and not m.startswith(API_MAY_IMPORT)
        }
    assert outside == set()


def test_a_batch_answer_reads_as_groups_with_absent_fields_null():
    posted = b'{"tokens": [[1, 2]], "masks": [[-100, 2]], "scores": [1.0], "note": "kept"}'
    stored = stored_json(ScoredData.model_validate_json(posted), posted)
    batch = Batch.model_validate_json(b'{"batch": [' + stored + b"]}").batch
    assert batch is not None and len(batch) == 1
    group = batch[0]
    assert (group.tokens, group.masks, group.scores) == ([[1, 2]], [[-100, 2]], [1.0])
    assert group.advantages is None and group.inference_logprobs is None
    assert group.model_extra == {"note": "kept"}
    assert Batch.model_validate_json(b'{"batch": null}').batch is None


def test_a_group_that_breaks_the_types_is_refused_by_the_reader_too():
    import pydantic
    import pytest

    with pytest.raises(pydantic.ValidationError, match="tokens"):
        Batch.model_validate_json(
            b'{"batch": [{"tokens": [["5"]], "masks": [[1]], "scores": [1.0]}]}'
        )


def test_every_bound_is_published_in_json_schemas_own_words():
    """pydantic writes a bound it cannot map as "ge"/"gt", which JSON Schema ignores, so
    clients (and the fuzz test) took max_staleness -1 for valid and got a 422."""
    import json

    from pydantic import BaseModel

    from atroposlib import protocol

    models = [
        value
        for value in vars(protocol).values()
        if isinstance(value, type) and issubclass(value, BaseModel) and value is not BaseModel
    ]
    assert any(m.__name__ == "Registration" for m in models)
    for model in models:
        text = json.dumps(model.model_json_schema())
        for keyword in ('"ge"', '"gt"', '"le"', '"lt"'):
            assert keyword not in text, f"{model.__name__} publishes {keyword}"
