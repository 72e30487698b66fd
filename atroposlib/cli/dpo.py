"""`atropos-dpo-gen FILEPATH`: pull batches from run-api, or read a finished run's files
(--from-run), and write a DPO dataset (jsonl)."""

from __future__ import annotations

import sys

from atroposlib.cli.sft import finished_run_reader
from atroposlib.datagen.settings import DpoGenSettings, tool_main

PROG = "atropos-dpo-gen"
DESCRIPTION = (
    "Register with a running run-api as its trainer, or read a finished run's groups "
    "(--from-run), pair a higher- with a lower-scoring completion of the same prompt and "
    "write the pairs as jsonl for preference tuning (TRL's prompt/chosen/rejected format "
    "by default, as message lists when the groups carry messages)."
)


def main(argv: list[str] | None = None) -> int:
    settings, filepath = tool_main(PROG, DESCRIPTION, DpoGenSettings, argv)
    from atroposlib.datagen.records import dpo_rules
    from atroposlib.datagen.run import generate

    return generate(PROG, filepath, settings, dpo_rules(settings), "pair", finished_run_reader)


if __name__ == "__main__":
    sys.exit(main())
