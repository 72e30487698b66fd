"""`atropos-dpo-gen FILEPATH`: pull batches from run-api and write a DPO dataset (jsonl)."""

from __future__ import annotations

import argparse
import sys

from atroposlib.datagen.settings import DpoGenSettings, switches_first
from atroposlib.utils.flags import add_model_flags, parse_settings

PROG = "atropos-dpo-gen"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Register with a running run-api as its trainer, pair a higher- with a "
        "lower-scoring completion of the same prompt and write the pairs as jsonl for "
        "preference tuning (TRL's prompt/chosen/rejected format by default).",
    )
    parser.add_argument("filepath", help="Output jsonl file (its directory must exist).")
    add_model_flags(parser, DpoGenSettings)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = switches_first(
        sys.argv[1:] if argv is None else argv,
        {"--save-messages", "--allow-negative-scores", "--append-to-previous"},
    )
    settings, args = parse_settings(build_parser(), DpoGenSettings, argv)
    from atroposlib.datagen.run import dpo_rules, run

    return run(PROG, args.filepath, settings, dpo_rules(settings), unit="pair")


if __name__ == "__main__":
    sys.exit(main())
