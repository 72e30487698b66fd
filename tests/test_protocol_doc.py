"""docs/protocol.md against the code: each model's table lists exactly its fields, with
the right ones required, and the endpoint table lists exactly the app's routes."""

from __future__ import annotations

import re

from atroposlib import protocol
from atroposlib.api.routes import ROUTERS
from atroposlib.api.service import ApiService
from atroposlib.api.settings import APISettings
from tests.support.source import REPO

DOC = REPO / "docs" / "protocol.md"
MODELS = ("Registration", "RegisterEnv", "EnvIdentifier", "ScoredData", "Batch")


def sections(text: str) -> dict[str, str]:
    """'### `Name`' heading -> the text up to the next heading."""
    parts = re.split(r"^#{2,3} ", text, flags=re.MULTILINE)
    return {part.split("\n", 1)[0].strip().strip("`"): part for part in parts}


def table_rows(section: str) -> list[list[str]]:
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if (
            line.startswith("|")
            and not set(cells[0]) <= {"-"}
            and cells[0] not in ("field", "method")
        ):
            rows.append(cells)
    return rows


def documented_fields(text: str, model: str) -> dict[str, bool]:
    """field -> required, from the model's table."""
    return {row[0].strip("`"): row[2] == "yes" for row in table_rows(sections(text)[model])}


def documented_routes(text: str) -> set[tuple[str, str]]:
    return {(row[0], row[1].strip("`")) for row in table_rows(sections(text)["Endpoints"])}


def test_each_models_table_lists_its_fields_and_which_are_required():
    text = DOC.read_text()
    for name in MODELS:
        model = getattr(protocol, name)
        actual = {field: info.is_required() for field, info in model.model_fields.items()}
        assert documented_fields(text, name) == actual, name


def test_the_endpoint_table_lists_exactly_the_apps_routes():
    service = ApiService(APISettings().resolved())  # routers are built, nothing opens
    routes = [route for make in ROUTERS for route in make(service).routes]
    actual = {(method, route.path) for route in routes for method in route.methods}
    assert documented_routes(DOC.read_text()) == actual


def test_the_checks_read_what_they_check():
    doc = "## Models\n### `M`\n| field | type | required | meaning |\n|---|---|---|---|\n"
    doc += "| `a` | int | yes | x |\n| `b` | int | no | y |\n## Endpoints\n"
    doc += "| method | path | body | answer |\n|---|---|---|---|\n| GET | `/x` | none | z |\n"
    assert documented_fields(doc, "M") == {"a": True, "b": False}
    assert documented_routes(doc) == {("GET", "/x")}
