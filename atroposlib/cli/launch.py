"""`atropos-launch CONFIG.yaml`: API, environments, engine and trainer of a run in one command.

`--set KEY=VALUE` overrides any YAML key (as TRL's flags beat its config file);
`--resume RUN_DIR` continues a run that was interrupted or crashed, from its own
record (`launch/resume.py`). Every mistake that can be found before anything starts
is one line and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from atroposlib.launch.checks import preflight, print_dry_run
from atroposlib.launch.config import ConfigError, load_config
from atroposlib.launch.needs import Finding
from atroposlib.launch.plan import Plan, plan
from atroposlib.launch.resume import LaunchRecord, refuse_a_finished_run, resume_target


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="atropos-launch",
        description="Start a whole RL run (API, environments, engine, trainer) from a YAML, "
        "supervise it, and write a report. See docs/launch.md.",
    )
    parser.add_argument(
        "config", nargs="?", help="launch YAML (see configs/); with --resume, the run's own"
    )
    parser.add_argument("--run-dir", help="override run_dir from the YAML")
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one YAML key, e.g. --set trainer.args.lr=1e-5 or "
        "--set environments.0.env.group_size=4 (repeatable; the value is read as YAML)",
    )
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR (interrupted or crashed): its API store, its "
        "environments' state and its newest checkpoint, with one report for the whole run",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="check the config and print the commands only"
    )
    return parser


def resolve(args: argparse.Namespace) -> tuple[Plan, LaunchRecord, list[Finding]]:
    """The plan, its record and what the checks found; ConfigError names the problems."""
    if args.resume:
        if args.run_dir:
            raise ConfigError("--resume names the run directory; drop --run-dir")
        record = resume_target(Path(args.resume), args.config, args.sets)
    elif args.config is None:
        raise ConfigError("give a launch YAML (see configs/), or --resume RUN_DIR")
    else:
        record = LaunchRecord(config=str(Path(args.config).resolve()), sets=list(args.sets))
    config = load_config(record.config, record.sets)
    if args.resume or args.run_dir:
        config = config.model_copy(update={"run_dir": args.resume or args.run_dir})
    parent = record.parent  # a fork keeps its lineage: its trainer's first checkpoint
    resolved = plan(
        config,
        record.config,
        resume=bool(args.resume),
        start_from=Path(parent.checkpoint) if parent else None,
        start_step=parent.step if parent else 0,
    )
    if args.resume:
        refuse_a_finished_run(resolved)
    return resolved, record, preflight(resolved, dry_run=args.dry_run)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        resolved, record, findings = resolve(args)
    except ConfigError as exc:
        print(f"atropos-launch: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print_dry_run(resolved, findings)
        return 0
    from atroposlib.launch.supervisor import Launcher

    return Launcher(resolved, record).run()


if __name__ == "__main__":
    sys.exit(main())
