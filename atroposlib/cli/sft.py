"""`atropos-sft-gen FILEPATH`: pull batches from run-api and write an SFT dataset (jsonl)."""

from __future__ import annotations

import argparse
import sys

from atroposlib.datagen.settings import SftGenSettings, switches_first
from atroposlib.utils.flags import add_model_flags, parse_settings

PROG = "atropos-sft-gen"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Register with a running run-api as its trainer, keep the best-scoring "
        "sequences of each group and write them as jsonl for supervised fine-tuning "
        "(TRL's prompt/completion or messages format by default).",
    )
    parser.add_argument("filepath", help="Output jsonl file (its directory must exist).")
    add_model_flags(parser, SftGenSettings)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = switches_first(
        sys.argv[1:] if argv is None else argv,
        {"--save-messages", "--allow-negative-scores", "--append-to-previous"},
    )
    settings, args = parse_settings(build_parser(), SftGenSettings, argv)
    from atroposlib.datagen.run import run, sft_rules

    return run(PROG, args.filepath, settings, sft_rules(settings), unit="seq")


if __name__ == "__main__":
    sys.exit(main())
