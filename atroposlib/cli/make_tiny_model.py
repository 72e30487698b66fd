"""`atropos-make-tiny-model [DIR]`: build the tiny test model and tokenizer into DIR.

Without DIR: the cached model that `model: tiny` runs on, built once if missing
(`scripts/quickstart.sh` calls it so that its figures show before the run starts).
`--vision`: the tiny vision-language model (`model: tiny-vl`) and its processor instead,
with its own build flags (`atroposlib/utils/tiny_vlm.py`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from atroposlib.utils.flags import add_model_flags, parse_settings
from atroposlib.utils.tiny_model import (
    TinyModelCheckFailed,
    TinyModelSpec,
    build_tiny_model,
    default_cache_dir,
    describe_tiny_model,
    ensure_tiny_model,
)
from atroposlib.utils.tiny_vlm import TinyVlmSpec, build_tiny_vlm, ensure_tiny_vlm


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    vision = "--vision" in argv  # which kit's build flags the parser offers
    kit = "tiny VLM" if vision else "tiny model"
    parser = argparse.ArgumentParser(
        prog="atropos-make-tiny-model",
        description="Build a tiny Llama model + byte-level BPE tokenizer (ChatML) from scratch, "
        "offline, for tests and CPU runs (--vision: the tiny Idefics3 VLM and its processor).",
    )
    parser.add_argument(
        "out_dir",
        nargs="?",
        help="directory to write the model and tokenizer into (default: the cached model "
        "that `model: tiny` (or `tiny-vl`) uses, built only if missing)",
    )
    parser.add_argument(
        "--vision", action="store_true", help="the tiny vision-language model (tiny-vl)"
    )
    spec_class: type[Any] = TinyVlmSpec if vision else TinyModelSpec
    add_model_flags(parser, spec_class)
    spec, args = parse_settings(parser, spec_class, argv)
    cached = default_cache_dir() / spec.cache_key()
    found = args.out_dir is None and (cached / "config.json").exists()
    if not found:
        where = args.out_dir or cached
        takes = "about two minutes" if vision else "about a minute"
        print(f"building the {kit} into {where} ({takes})...", flush=True)
    ensure, build = (
        (ensure_tiny_vlm, build_tiny_vlm) if vision else (ensure_tiny_model, build_tiny_model)
    )
    try:
        path = ensure(spec) if args.out_dir is None else build(args.out_dir, spec)
    except TinyModelCheckFailed as failure:
        print(f"atropos-make-tiny-model: error: {failure}", file=sys.stderr)
        return 1
    print(f"{kit} {'found' if found else 'built'}: {describe_tiny_model(path)}")
    print(f"  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
