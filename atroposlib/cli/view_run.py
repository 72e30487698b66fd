"""`view-run`: a web page of the groups a running trajectory API serves (upstream's flags),
or, given RUN_DIR, of the groups a finished run wrote to its files."""

from __future__ import annotations

import argparse
import sys

from atroposlib.utils.flags import add_model_flags, parse_settings
from atroposlib.viewer.settings import ViewRunSettings, add_run_dir_argument


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="view-run",
        description="Gradio page that pulls batches from run-api and shows each group's "
        "prompt, completions and scores. It registers as the run's trainer. With RUN_DIR it "
        "shows a finished run's groups from its files instead: no API, nothing registered.",
    )
    add_run_dir_argument(parser)
    add_model_flags(parser, ViewRunSettings)
    return parser


def main(argv: list[str] | None = None) -> int:
    settings, args = parse_settings(build_parser(), ViewRunSettings, argv)
    from atroposlib.viewer.app import serve_view  # Gradio only when the tool runs

    return serve_view(settings, args.run_dir, multimodal=False)


if __name__ == "__main__":
    sys.exit(main())
