"""`atropos-make-tiny-model DIR`: build the tiny test model and tokenizer into DIR."""

from __future__ import annotations

import argparse
import sys

from atroposlib.utils.flags import add_model_flags, parse_settings
from atroposlib.utils.tiny_model import TinyModelCheckFailed, TinyModelSpec, build_tiny_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="atropos-make-tiny-model",
        description="Build a tiny Llama model + byte-level BPE tokenizer (ChatML) from scratch, "
        "offline, for tests and CPU runs.",
    )
    parser.add_argument("out_dir", help="directory to write the model and tokenizer into")
    add_model_flags(parser, TinyModelSpec)
    spec, args = parse_settings(parser, TinyModelSpec, argv)
    try:
        path = build_tiny_model(args.out_dir, spec)
    except TinyModelCheckFailed as failure:
        print(f"atropos-make-tiny-model: error: {failure}", file=sys.stderr)
        return 1
    print(f"tiny model written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
