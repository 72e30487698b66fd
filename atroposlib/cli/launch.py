"""`atropos-launch CONFIG.yaml`: API, environments, engine and trainer of a run in one command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from atroposlib.launch.config import ConfigError, load_config
from atroposlib.launch.plan import plan


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="atropos-launch",
        description="Start a whole RL run (API, environments, engine, trainer) from a YAML, "
        "supervise it, and write a report. See docs/launch.md.",
    )
    parser.add_argument("config", help="launch YAML (see configs/)")
    parser.add_argument("--run-dir", help="override run_dir from the YAML")
    parser.add_argument(
        "--dry-run", action="store_true", help="check the config and print the commands only"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config)
        if args.run_dir:
            config = config.model_copy(update={"run_dir": args.run_dir})
        resolved = plan(config, args.config)
    except ConfigError as exc:
        print(f"atropos-launch: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        for process in [resolved.api, resolved.engine, resolved.trainer, *resolved.environments]:
            if process is not None:
                print(f"{process.name}: {' '.join(process.command)}")
        return 0
    from atroposlib.launch.supervisor import Launcher

    return Launcher(resolved, Path(args.config).read_text()).run()


if __name__ == "__main__":
    sys.exit(main())
