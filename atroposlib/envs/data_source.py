"""Where a library environment's items come from: its hub dataset or the sample it ships.

Design: each environment in `environments/` ships a small sample of its dataset *in the
hub's own row format* (same column names), under `environments/data/<env>/<split>.jsonl`.
The code that turns a row into an item is therefore the same on both paths, and the
offline tests exercise it. The default `data_source: sample` keeps `process`, the tests
and CI offline; `--env.data_source hub` loads the real dataset with
`datasets.load_dataset(hub_dataset, hub_subset, split=...)`, and `--env.dataset_path`
reads any local jsonl file in the hub's row format instead of either.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field


class DataSourceError(RuntimeError):
    """The configured rows cannot be read; the message says what to change."""


class DataSourceConfig(BaseModel):
    """Config fields shared by dataset-backed environments (mix into the env's config)."""

    data_source: Literal["sample", "hub"] = Field(
        "sample",
        description="'sample': the small offline sample shipped in environments/data/ "
        "(default; no download). 'hub': the real dataset from the Hugging Face hub "
        "through `datasets` (needs `pip install 'atroposlib[envs]'` and network).",
    )
    hub_dataset: str = Field("", description="Hub dataset id read when data_source is 'hub'.")
    hub_subset: str | None = Field(
        None, description="Hub dataset configuration name (e.g. 'main' for openai/gsm8k)."
    )
    dataset_path: str | None = Field(
        None,
        description="A local jsonl file in the hub's row format; overrides data_source "
        "for every split.",
    )
    max_rows: int | None = Field(
        None, ge=1, description="Keep at most this many rows per split (None: all)."
    )


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a jsonl file; a bad line is an error that names the file and line."""
    if not path.is_file():
        raise DataSourceError(f"no such dataset file: {path}")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataSourceError(f"{path}:{number}: not JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise DataSourceError(f"{path}:{number}: a row must be a JSON object")
        rows.append(row)
    return rows


def _hub_rows(config: DataSourceConfig, split: str) -> list[dict[str, Any]]:
    if not config.hub_dataset:
        raise DataSourceError("data_source is 'hub' but hub_dataset is empty")
    try:
        from datasets import load_dataset
    except ImportError:
        raise DataSourceError(
            "data_source 'hub' needs the datasets package: pip install 'atroposlib[envs]'"
        ) from None
    try:
        dataset = load_dataset(config.hub_dataset, config.hub_subset, split=split)
    except Exception as error:  # network, auth, unknown split: say where it came from
        raise DataSourceError(
            f"could not load {config.hub_dataset!r} (subset {config.hub_subset!r}, split "
            f"{split!r}) from the hub: {error}. Offline, use --env.data_source sample."
        ) from error
    return [dict(row) for row in dataset]


def load_rows(
    config: DataSourceConfig, split: str, sample_dir: Path, hub_split: str | None = None
) -> list[dict[str, Any]]:
    """The rows of `split`: from `dataset_path`, the hub, or `sample_dir/<split>.jsonl`.

    `hub_split` names the split on the hub when it differs from the sample's file name
    (MMLU's sample has `train.jsonl` for the hub's `auxiliary_train`, for example).
    """
    if config.dataset_path:
        rows = read_jsonl(Path(config.dataset_path))
    elif config.data_source == "hub":
        rows = _hub_rows(config, hub_split or split)
    else:
        rows = read_jsonl(sample_dir / f"{split}.jsonl")
    if not rows:
        raise DataSourceError(f"the {split!r} split has no rows")
    return rows[: config.max_rows] if config.max_rows else rows
