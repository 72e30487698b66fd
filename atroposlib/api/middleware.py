"""run-api's guard as its OpenAPI document describes it.

The guard itself, shared with the proxy, is `atroposlib.utils.request_guard`.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from atroposlib.api.models import ErrorDetail

OPEN_PATHS = frozenset({"/", "/health"})


def document_guard(app: FastAPI, api_key_required: bool) -> None:
    """Add the guard's answers (and its bearer key) to every operation of `app`'s document.

    The guard answers before any route runs, so its codes hold for every path, present
    and future; documenting them here keeps the document true without each route
    repeating them.
    """
    build = app.openapi
    detail = {"application/json": {"schema": ErrorDetail.model_json_schema()}}
    answers: dict[str, dict[str, Any]] = {
        "400": {
            "description": "A gzip request body that does not inflate, or (without "
            "--api-key) a Host header that names neither localhost, an IP address nor one "
            "of --allowed-hosts.",
            "content": detail,
        },
        "403": {
            "description": "A request a browser made for another site's page "
            "(Sec-Fetch-Site: cross-site or same-site).",
            "content": detail,
        },
        "413": {
            "description": "A request body over --max-body-mb, or holding --max-body-values "
            "JSON values or more.",
            "content": detail,
        },
    }
    not_json = {
        "description": "A POST without 'Content-Type: application/json'.",
        "content": detail,
    }
    unauthorized = {
        "description": "Missing or wrong 'Authorization: Bearer <key>' (--api-key).",
        "headers": {
            "WWW-Authenticate": {"required": True, "schema": {"type": "string", "const": "Bearer"}}
        },
        "content": detail,
    }

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = build()
        if api_key_required:
            schemes = document.setdefault("components", {}).setdefault("securitySchemes", {})
            schemes["bearer"] = {"type": "http", "scheme": "bearer"}
        for path, operations in document["paths"].items():
            for method, operation in operations.items():
                responses = operation.setdefault("responses", {})
                for code, answer in answers.items():
                    responses.setdefault(code, answer)
                if method == "post":
                    responses.setdefault("415", not_json)
                if api_key_required and path not in OPEN_PATHS:
                    operation["security"] = [{"bearer": []}]
                    responses.setdefault("401", unauthorized)
        return document

    app.openapi = openapi  # type: ignore[method-assign]
