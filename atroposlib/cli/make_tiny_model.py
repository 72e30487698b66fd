"""`atropos-make-tiny-model [DIR]`: build the tiny test model and tokenizer into DIR.

Without DIR: the cached model that `model: tiny` runs on, built once if missing
(`scripts/quickstart.sh` calls it so that its figures show before the run starts).
"""

from __future__ import annotations

import argparse
import sys

from atroposlib.utils.flags import add_model_flags, parse_settings
from atroposlib.utils.tiny_model import (
    TinyModelCheckFailed,
    TinyModelSpec,
    build_tiny_model,
    default_cache_dir,
    describe_tiny_model,
    ensure_tiny_model,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="atropos-make-tiny-model",
        description="Build a tiny Llama model + byte-level BPE tokenizer (ChatML) from scratch, "
        "offline, for tests and CPU runs.",
    )
    parser.add_argument(
        "out_dir",
        nargs="?",
        help="directory to write the model and tokenizer into (default: the cached model "
        "that `model: tiny` uses, built only if missing)",
    )
    add_model_flags(parser, TinyModelSpec)
    spec, args = parse_settings(parser, TinyModelSpec, argv)
    cached = default_cache_dir() / spec.cache_key()
    found = args.out_dir is None and (cached / "config.json").exists()
    if not found:
        where = args.out_dir or cached
        print(f"building the tiny model into {where} (about a minute)...", flush=True)
    try:
        if args.out_dir is None:
            path = ensure_tiny_model(spec)
        else:
            path = build_tiny_model(args.out_dir, spec)
    except TinyModelCheckFailed as failure:
        print(f"atropos-make-tiny-model: error: {failure}", file=sys.stderr)
        return 1
    print(f"tiny model {'found' if found else 'built'}: {describe_tiny_model(path)}")
    print(f"  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
