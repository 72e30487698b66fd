"""`atropos-dpo-gen FILEPATH`: pull batches from run-api and write a DPO dataset (jsonl)."""

from __future__ import annotations

import sys

from atroposlib.datagen.settings import DpoGenSettings, tool_main

PROG = "atropos-dpo-gen"
DESCRIPTION = (
    "Register with a running run-api as its trainer, pair a higher- with a "
    "lower-scoring completion of the same prompt and write the pairs as jsonl for "
    "preference tuning (TRL's prompt/chosen/rejected format by default)."
)


def main(argv: list[str] | None = None) -> int:
    settings, filepath = tool_main(PROG, DESCRIPTION, DpoGenSettings, argv)
    from atroposlib.datagen.run import dpo_rules, run

    return run(PROG, filepath, settings, dpo_rules(settings), unit="pair")


if __name__ == "__main__":
    sys.exit(main())
