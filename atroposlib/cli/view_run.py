"""`view-run`: a web page showing the groups a running trajectory API serves (upstream's flags)."""

from __future__ import annotations

import argparse
import sys

from atroposlib.utils.flags import add_model_flags, parse_settings
from atroposlib.viewer.settings import ViewRunSettings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="view-run",
        description="Gradio page that pulls batches from run-api and shows each group's "
        "prompt, completions and scores. It registers as the run's trainer.",
    )
    add_model_flags(parser, ViewRunSettings)
    return parser


def main(argv: list[str] | None = None) -> int:
    settings, _ = parse_settings(build_parser(), ViewRunSettings, argv)
    from atroposlib.viewer.app import serve  # Gradio only when the tool runs

    return serve(settings, multimodal=False)


if __name__ == "__main__":
    sys.exit(main())
