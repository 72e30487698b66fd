"""`atropos-rollouts`: a run's stored groups as a store to list, show, re-score, export,
replay and fork from (docs/rollouts.md).

Every subcommand reads the run directory's files (`atroposlib.rollouts.store`), never
the API, so it works on a finished run as on one still going. A mistake (an unknown
run directory, step, environment or reward) is one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from atroposlib.rollouts.store import RunStore, StoreError, parse_steps, read_store

PROG = "atropos-rollouts"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="A run's stored groups (RUN_DIR/rollouts, joined with the steps that "
        "trained them): list, show, re-score, export, replay into a running API, or fork "
        "a new run from a checkpoint. See docs/rollouts.md.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    listing = commands.add_parser("list", help="groups, sequences, scores and staleness per step")
    listing.add_argument("run_dir", metavar="RUN_DIR")
    listing.add_argument("--json", action="store_true", help="the rows as JSON, for scripts")

    show = commands.add_parser("show", help="the samples one step trained, with their scores")
    show.add_argument("run_dir", metavar="RUN_DIR")
    show.add_argument("--step", type=int, required=True, help="a trained step")
    show.add_argument("--env", help="only this environment")
    show.add_argument("--limit", type=int, default=0, help="show at most this many groups")

    rescore = commands.add_parser("rescore", help="score stored groups again with another reward")
    rescore.add_argument("run_dir", metavar="RUN_DIR")
    rescore.add_argument("--env", required=True, help="the environment whose groups to score")
    rescore.add_argument(
        "--reward",
        required=True,
        metavar="SPEC",
        help="a registered reward name, module:function, path/to/file.py:function, or an "
        "environment file (path/to/env.py[:Class]) whose score_sample to use",
    )
    rescore.add_argument("--out", help="where to write (default RUN_DIR/rescored/<reward>)")

    export = commands.add_parser("export", help="stored groups as an SFT or DPO dataset")
    export.add_argument("run_dir", metavar="RUN_DIR")
    export.add_argument("--format", choices=("sft", "dpo", "groups"), required=True)
    export.add_argument("--out", required=True, help="the jsonl file to write (must not exist)")
    export.add_argument("--env", help="only this environment")
    export.add_argument("--steps", help="only groups trained at steps A:B")
    export.add_argument("--rescored", help="a rescore folder: its groups and new scores")
    export.add_argument("--num-seqs-to-save", type=int, help="stop after this many records")
    export.add_argument("--tokenizer", help="decodes tokens (default: the run's model)")
    export.add_argument(
        "--save-messages",
        choices=("true", "false"),
        help="messages (TRL's conversational records) or decoded text; default: messages "
        "when the groups carry them",
    )

    replay = commands.add_parser("replay", help="post stored groups into a running API")
    replay.add_argument("run_dir", metavar="RUN_DIR")
    replay.add_argument("--into", required=True, metavar="API_URL", help="the run-api to feed")
    replay.add_argument("--rescored", help="a rescore folder: post its groups and new scores")
    replay.add_argument("--steps", help="only groups trained at steps A:B")
    replay.add_argument(
        "--keep-uniform",
        action="store_true",
        help="also post groups whose samples all scored the same (no GRPO advantage)",
    )
    replay.add_argument(
        "--fill",
        type=int,
        metavar="SEQUENCES",
        help="post the groups pass after pass until this many sequences (a run that "
        "samples nothing: its remaining steps x its batch size; the launcher sets it)",
    )
    replay.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to keep retrying an API that is down"
    )

    fork = commands.add_parser(
        "fork",
        help="a new run from a checkpoint of this one",
        usage="%(prog)s RUN_DIR --from-step N [CONFIG.yaml] [options]",
    )
    # one list of paths, with `main` adding a CONFIG given after the options: argparse
    # matches positionals only in runs, so `RUN --from-step N CONFIG` leaves CONFIG over
    fork.add_argument(
        "paths",
        nargs="+",
        metavar="RUN_DIR [CONFIG.yaml]",
        help="the run to fork, then a launch YAML (default: the parent's own)",
    )
    fork.add_argument("--from-step", type=int, required=True, help="a step with a checkpoint")
    fork.add_argument("--run-dir", dest="new_run_dir", help="the fork's run directory")
    fork.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    fork.add_argument("--loss-type", help="shorthand for --set trainer.args.loss_type=...")
    fork.add_argument("--dry-run", action="store_true", help="print the fork's commands only")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "fork" and extra and not any(e.startswith("-") for e in extra):
        args.paths += extra  # CONFIG.yaml after --from-step N (see build_parser)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return COMMANDS[args.command](args)
    except StoreError as error:
        print(f"{PROG} {args.command}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: stopped", file=sys.stderr)
        return 130


def _list(args: argparse.Namespace) -> int:
    from atroposlib.rollouts.listing import rows_json, rows_table

    store = read_store(args.run_dir)
    print(json.dumps(rows_json(store), indent=2) if args.json else rows_table(store))
    return 0


def _show(args: argparse.Namespace) -> int:
    from atroposlib.rollouts.listing import show_text

    store = read_store(args.run_dir)
    groups = store.at_step(args.step, args.env)
    if args.limit > 0:
        groups = groups[: args.limit]
    needs_tokens = any(not g.data.get("messages") for g in groups)
    print(show_text(groups, _decoder(store) if needs_tokens else None))
    return 0


def _rescore(args: argparse.Namespace) -> int:
    from atroposlib.envs.reward_spec import RewardSpecError, load_reward
    from atroposlib.rollouts.rescore import default_out, rescore, summary_lines

    store = read_store(args.run_dir)
    store.select(args.env)  # an unknown environment is refused before the reward loads
    try:
        reward = load_reward(args.reward)
    except RewardSpecError as error:
        raise StoreError(str(error)) from None
    out = Path(args.out) if args.out else default_out(store, reward)
    needs_tokens = any(not g.data.get("messages") for g in store.select(args.env))
    outcome = rescore(store, args.env, reward, out, _decoder(store) if needs_tokens else None)
    for line in summary_lines(outcome, out):
        print(line)
    return 0


def _chosen(args: argparse.Namespace, store: RunStore) -> list:
    from atroposlib.rollouts.replay import ordered, rescored_groups

    steps = parse_steps(args.steps) if args.steps else None
    groups = rescored_groups(Path(args.rescored)) if args.rescored else store.groups
    if getattr(args, "env", None):
        store.select(args.env)
        groups = [g for g in groups if g.env == args.env]
    chosen = ordered(groups, steps)
    if not chosen:
        raise StoreError(f"no stored group was trained at steps {args.steps}")
    return chosen


def _export(args: argparse.Namespace) -> int:
    from atroposlib.launch.resolving import resolve_model
    from atroposlib.rollouts.export import export

    store = read_store(args.run_dir)
    groups = _chosen(args, store)
    return export(
        groups,
        store.run_dir,
        args.format,
        Path(args.out),
        resolve_model,
        args.num_seqs_to_save,
        args.tokenizer,
        None if args.save_messages is None else args.save_messages == "true",
    )


def _replay(args: argparse.Namespace) -> int:
    from atroposlib.rollouts.replay import informative, ledger_in, passes, replay
    from atroposlib.utils.exposure import API_KEY_ENVIRONMENT

    store = read_store(args.run_dir)
    groups = _chosen(args, store)
    source = "re-scored " if args.rescored else ""
    if not args.keep_uniform:
        groups, uniform = informative(groups)
        if uniform:
            print(
                f"left out {uniform} groups whose samples all scored the same (no GRPO "
                "advantage; --keep-uniform posts them)"
            )
        if not groups:
            raise StoreError("every chosen group scores all its samples the same")
    plan = passes(groups, args.fill)
    rounds = plan[-1][0] + 1
    over = f" in {rounds} passes, to fill {args.fill} sequences" if rounds > 1 else ""
    print(f"replaying {len(groups)} {source}groups of {store.run_dir} into {args.into}{over}")
    key = os.environ.get(API_KEY_ENVIRONMENT) or None
    ledger = ledger_in(os.environ.get("ATROPOS_ENV_STATE_DIR"))
    outcome = replay(plan, store.run_dir, args.into, key, args.timeout, ledger=ledger)
    refused = outcome.refused
    print(
        f"replayed {outcome.posted} groups ({outcome.sequences} sequences) into {args.into}"
        + (f"; the API refused {len(refused)}: {refused[0]}" if refused else "")
    )
    return 1 if refused and not outcome.posted else 0


def _fork(args: argparse.Namespace) -> int:
    from atroposlib.launch.lineage import fork_run

    if len(args.paths) > 2:
        raise StoreError(f"fork takes RUN_DIR and at most one CONFIG.yaml, not {args.paths}")
    run_dir, config = args.paths[0], (args.paths[1] if len(args.paths) == 2 else None)
    sets = list(args.sets)
    if args.loss_type:
        sets.append(f"trainer.args.loss_type={args.loss_type}")
    return fork_run(Path(run_dir), args.from_step, config, sets, args.new_run_dir, args.dry_run)


def _decoder(store: RunStore) -> Callable[[list[int]], str]:
    """The run's model's tokenizer (`tiny` resolved to its local build)."""
    from atroposlib.datagen.finished import RunInputError, run_config, run_model
    from atroposlib.datagen.records import TokenizerError, load_tokenizer
    from atroposlib.launch.resolving import resolve_model

    config = run_config(store.run_dir)
    if config is None:
        raise StoreError(f"{store.run_dir} has no config.yaml naming the model to decode with")
    try:
        model = run_model(config)
        tokenizer = load_tokenizer(resolve_model(model), f"{config} (model: {model})")
    except (RunInputError, TokenizerError) as error:
        raise StoreError(str(error)) from None
    return tokenizer.decode


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "list": _list,
    "show": _show,
    "rescore": _rescore,
    "export": _export,
    "replay": _replay,
    "fork": _fork,
}


if __name__ == "__main__":
    sys.exit(main())
