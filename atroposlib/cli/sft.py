"""`atropos-sft-gen FILEPATH`: pull batches from run-api and write an SFT dataset (jsonl)."""

from __future__ import annotations

import sys

from atroposlib.datagen.settings import SftGenSettings, tool_main

PROG = "atropos-sft-gen"
DESCRIPTION = (
    "Register with a running run-api as its trainer, keep the best-scoring "
    "sequences of each group and write them as jsonl for supervised fine-tuning "
    "(TRL's prompt/completion or messages format by default)."
)


def main(argv: list[str] | None = None) -> int:
    settings, filepath = tool_main(PROG, DESCRIPTION, SftGenSettings, argv)
    from atroposlib.datagen.run import run, sft_rules

    return run(PROG, filepath, settings, sft_rules(settings), unit="seq")


if __name__ == "__main__":
    sys.exit(main())
