"""The viewers' settings: upstream's four flags plus where the API and the page are.

One pydantic model per tool feeds both `--help` and validation (atroposlib.utils.flags);
`view-run RUN_DIR` (a finished run's files, no API) reuses the page's flags through
`RecordedViewSettings`, so both modes bind, guard and refuse alike.
The page binds to loopback unless told otherwise: it shows training data and lets anyone
who reaches it pull batches off the run (upstream shared it through a public Gradio link).
A non-loopback --host needs a token (--api-key) or --insecure, as every atroposlib
listener does (atroposlib.utils.exposure, docs/security.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, Field

from atroposlib.utils.exposure import ExposureRule

PAGE_KEY_ENV = "ATROPOS_VIEW_API_KEY"
"""The page's token when --api-key is not given (not the run-api key: ATROPOS_API_KEY)."""

DEFAULT_TOKENIZER = "NousResearch/DeepHermes-3-Llama-3-8B-Preview"
DEFAULT_MULTIMODAL_TOKENIZER = "Qwen/Qwen2-VL-2B-Instruct"
DEFAULT_PORT = 7860
"""Gradio's own default; upstream's viewer used 9001, where the inference engine listens."""
BATCHES_OF_GROUPS = 8
"""The viewer registers for batches of group_size * 8 sequences, as upstream does."""


class ViewRunSettings(ExposureRule, BaseModel):
    KEY_ENVIRONMENT: ClassVar[tuple[str, ...]] = (PAGE_KEY_ENV,)
    EXPOSURE_RISK: ClassVar[str] = "read the run's rollouts and pull batches off its queue"

    """Flags of `view-run`."""

    port: int = Field(
        DEFAULT_PORT,
        ge=1,
        le=65535,
        description="Port of the web page (Gradio's usual 7860: upstream's 9001 is the "
        "inference engine's).",
    )
    group_size: int = Field(
        2,
        gt=0,
        description="Sequences per group; the viewer asks the API for batches of "
        f"group_size * {BATCHES_OF_GROUPS} sequences.",
    )
    max_token_len: int = Field(
        2048, gt=0, description="Token limit sent to the API when registering."
    )
    tokenizer: str = Field(
        DEFAULT_TOKENIZER,
        description="Tokenizer (Hugging Face name or local path) that decodes the tokens.",
    )
    api_url: str = Field(
        "http://localhost:8000", description="URL of the running trajectory API (run-api)."
    )
    host: str = Field(
        "127.0.0.1",
        description="Address the page listens on; 0.0.0.0 shows it to the whole network "
        "and needs --api-key or --insecure.",
    )
    api_key: str | None = Field(
        None,
        description="Token the page requires: open it once as /?token=KEY (a cookie keeps it) "
        f"or send 'Authorization: Bearer KEY' (default: ${PAGE_KEY_ENV}). The key the "
        "viewer sends to run-api is $ATROPOS_API_KEY.",
    )
    insecure: bool = Field(False, description="Allow a non-loopback --host without --api-key.")

    @property
    def batch_size(self) -> int:
        """Sequences per batch the viewer registers for."""
        return self.group_size * BATCHES_OF_GROUPS


class MultimodalViewRunSettings(ViewRunSettings):
    """Flags of `view-run-multimodal`: the same, with a vision-language tokenizer."""

    tokenizer: str = Field(
        DEFAULT_MULTIMODAL_TOKENIZER,
        description="Tokenizer (Hugging Face name or local path) that decodes the tokens.",
    )


class RecordedViewSettings(ViewRunSettings):
    """`view-run RUN_DIR`: the same page over the groups a run wrote to its files.

    Nothing is pulled or registered, so the API's flags do nothing here; the page's
    flags (port, host, token) mean what they mean live. The groups are drawn from the
    messages their environment recorded unless --tokenizer is given, which decodes their
    tokens instead (the live default names a hub model that a local run never used).
    """

    EXPOSURE_RISK: ClassVar[str] = "read the run's rollouts"
    API_FLAGS: ClassVar[tuple[str, ...]] = ("group_size", "max_token_len", "api_url")

    run_dir: Path = Field(
        ..., description="A run's directory (its rollouts/*.jsonl) or one .jsonl file."
    )

    @classmethod
    def from_flags(cls, settings: ViewRunSettings, run_dir: str) -> RecordedViewSettings:
        """The flags the user gave (and only those: defaults stay unset) plus RUN_DIR."""
        given = settings.model_dump(exclude_unset=True)
        return cls.model_validate({**given, "run_dir": run_dir})

    @property
    def decode_with(self) -> str | None:
        """The tokenizer to decode tokens with: only one given by --tokenizer."""
        return self.tokenizer if "tokenizer" in self.model_fields_set else None

    def unused_flags(self) -> list[str]:
        """The API's flags the user gave, which a run's files do not need."""
        given = [name for name in self.API_FLAGS if name in self.model_fields_set]
        return ["--" + name.replace("_", "-") for name in given]


def add_run_dir_argument(parser: argparse.ArgumentParser) -> None:
    """The tools' optional RUN_DIR: a finished run's files instead of a live API."""
    parser.add_argument(
        "run_dir",
        nargs="?",
        default=None,
        metavar="RUN_DIR",
        help="Show the groups a finished run wrote (RUN_DIR/rollouts/*.jsonl, or one "
        ".jsonl file) instead of pulling from run-api: no API is needed and nothing is "
        "registered. They are drawn from the messages their environment recorded, or "
        "decoded from their tokens when --tokenizer is given.",
    )
