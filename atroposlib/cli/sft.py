"""`atropos-sft-gen FILEPATH`: pull batches from run-api, or read a finished run's files
(--from-run), and write an SFT dataset (jsonl)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from atroposlib.datagen.settings import SftGenSettings, tool_main

if TYPE_CHECKING:
    from atroposlib.datagen.finished import RunReader

PROG = "atropos-sft-gen"
DESCRIPTION = (
    "Register with a running run-api as its trainer, or read a finished run's groups "
    "(--from-run), keep the best-scoring sequences of each group and write them as jsonl "
    "for supervised fine-tuning (TRL's prompt/completion format by default, as message "
    "lists when the groups carry messages)."
)


def finished_run_reader() -> RunReader:
    """view-run's reader of a run's files and the launcher's tiny-model names, which
    atroposlib.datagen may not import (docs/architecture.md); imported only for
    --from-run."""
    from atroposlib.datagen.finished import RunReader
    from atroposlib.launch.resolving import resolve_model
    from atroposlib.viewer.recorded import read_run, skipped_lines

    return RunReader(read_run, skipped_lines, resolve_model)


def main(argv: list[str] | None = None) -> int:
    settings, filepath = tool_main(PROG, DESCRIPTION, SftGenSettings, argv)
    from atroposlib.datagen.records import sft_rules
    from atroposlib.datagen.run import generate

    return generate(PROG, filepath, settings, sft_rules(settings), "seq", finished_run_reader)


if __name__ == "__main__":
    sys.exit(main())
