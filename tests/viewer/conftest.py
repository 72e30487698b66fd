"""Fixtures the viewer modules share: each module gets its own browser and tokenizer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import headless_chromium


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with headless_chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path: Any) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)
