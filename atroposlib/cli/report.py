"""`atropos-report RUN_DIR`: write a run's report again from its directory alone;
`atropos-report RUN_A RUN_B ... --out FILE`: one page comparing several runs.

The report is the one the launcher writes at the end of a run (summary.json,
report.png, report.html: `launch/rebuild.py`), so a report that a Ctrl-C skipped, or
one of an earlier version, is one command away. A directory that holds no run is one
line and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from atroposlib.launch.compare import write_comparison
from atroposlib.launch.rebuild import NotARun, rebuild_report

DEFAULT_COMPARISON = "compare.html"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="atropos-report",
        description="Write a run's report (summary.json, report.png, report.html) again from "
        "its run directory, or compare several runs on one page. See docs/launch.md.",
    )
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories")
    parser.add_argument(
        "--out",
        help="write one page comparing the runs here (default with several runs: "
        f"{DEFAULT_COMPARISON} in the current directory)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runs = [Path(run) for run in args.runs]
    try:
        if args.out is None and len(runs) == 1:
            print(f"report: {rebuild_report(runs[0])}")
        else:
            out = Path(args.out or DEFAULT_COMPARISON)
            print(f"comparison of {len(runs)} runs: {write_comparison(runs, out)}")
    except NotARun as exc:
        print(f"atropos-report: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"atropos-report: cannot write the report: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("atropos-report: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
