"""`python my_env.py serve|process|evaluate`: one config-resolution path for all three.

Configuration is resolved once, the same way for every subcommand:
`config_init()` defaults < `--config X.yaml` (keys env, openai, slurm, testing)
< `--env.*` / `--openai.*` / `--slurm` / `--testing` flags. When config_init
returned a ServerBaseline and any openai setting is given, it becomes one
APIServerConfig; a YAML `openai:` list means several inference servers (CLI
`--openai.*` values then apply to each).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from atroposlib.envs.server_handling.server_baseline import APIServerConfig, ServerBaseline
from atroposlib.utils.flags import add_model_flags, given_flags, parse_bool
from atroposlib.utils.logging import configure_logging

logger = logging.getLogger("atroposlib.envs")

SUBCOMMANDS = ("serve", "process", "evaluate")


class ConfigError(ValueError):
    pass


@dataclass
class ResolvedConfig:
    env: Any
    servers: Any
    slurm: bool = False
    testing: bool = False


def build_parser(
    env_cls: type, env_defaults: BaseModel, server_defaults: Any
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"{Path(sys.argv[0]).name}", description=env_cls.__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,process,evaluate}")
    first_server = server_defaults[0] if isinstance(server_defaults, list) else server_defaults
    helps = {
        "serve": "run as a microservice against the trajectory API",
        "process": "no API: generate groups to jsonl and an HTML viewer",
        "evaluate": "setup(), then evaluate()",
    }
    for name in SUBCOMMANDS:
        command = sub.add_parser(name, help=helps[name], description=helps[name])
        command.add_argument(
            "--config", help="YAML with keys env, openai (dict or list), slurm, testing"
        )
        command.add_argument(
            "--slurm",
            type=parse_bool,
            metavar="BOOL",
            default=None,
            help="discover inference servers from SLURM (default: False)",
        )
        command.add_argument(
            "--testing",
            type=parse_bool,
            metavar="BOOL",
            default=None,
            help="canned inference, no network (default: False)",
        )
        add_model_flags(
            command, env_defaults.__class__, dash_names=False, prefix="env.", defaults=env_defaults
        )
        add_model_flags(
            command,
            APIServerConfig,
            dash_names=False,
            prefix="openai.",
            defaults=first_server if isinstance(first_server, APIServerConfig) else None,
        )
    return parser


def _unknown_flag_error(parser: argparse.ArgumentParser, unknown: list[str]) -> ConfigError:
    known = [
        opt
        for action in parser._subparsers._group_actions[0].choices["serve"]._actions
        for opt in action.option_strings
    ]
    flag = next((u for u in unknown if u.startswith("-")), unknown[0]).split("=")[0]
    close = difflib.get_close_matches(flag, known, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return ConfigError(f"unknown flag {flag}{hint}")


def _merge_servers(base: Any, overrides: dict[str, Any], yaml_servers: Any) -> Any:
    if yaml_servers is not None:
        if isinstance(yaml_servers, list):
            base = [APIServerConfig(**entry) for entry in yaml_servers]
        else:
            fields = base.model_dump() if isinstance(base, ServerBaseline) else {}
            base = APIServerConfig(**{**fields, **yaml_servers})
    if not overrides:
        return base
    if isinstance(base, list):
        return [APIServerConfig(**{**entry.model_dump(), **overrides}) for entry in base]
    return APIServerConfig(**{**base.model_dump(), **overrides})


def resolve_config(env_cls: type, command: str, args: argparse.Namespace) -> ResolvedConfig:
    env_defaults, server_defaults = env_cls.config_init()
    document: dict[str, Any] = {}
    if getattr(args, "config", None):
        path = Path(args.config)
        if not path.exists():
            raise ConfigError(f"--config {path}: no such file")
        document = yaml.safe_load(path.read_text()) or {}
        unknown = set(document) - {"env", "openai", "slurm", "testing"}
        if unknown:
            raise ConfigError(f"--config {path}: unknown top-level keys {sorted(unknown)}")
    env_values = {**env_defaults.model_dump(), **(document.get("env") or {})}
    explicit = set(document.get("env") or {}) | set(given_flags(args, "env."))
    env_values.update(given_flags(args, "env."))
    if command == "process":
        for key, value in (("ensure_scores_are_not_same", False), ("include_messages", True)):
            if key not in explicit:
                env_values[key] = value
        if not env_values.get("data_path_to_save_groups"):
            env_values["data_path_to_save_groups"] = (
                f"data/{env_cls.name or env_cls.__name__}.jsonl"
            )
    if command == "serve" and not env_values.get("wandb_name"):
        env_values["wandb_name"] = env_cls.name
    try:
        env_config = type(env_defaults).model_validate(env_values)
        servers = _merge_servers(
            server_defaults, given_flags(args, "openai."), document.get("openai")
        )
    except ValidationError as exc:
        section = "env" if "env_config" not in locals() else "openai"
        problems = "; ".join(
            f"--{section}.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(problems) from None
    slurm = args.slurm if args.slurm is not None else bool(document.get("slurm", False))
    testing = args.testing if args.testing is not None else bool(document.get("testing", False))
    return ResolvedConfig(env=env_config, servers=servers, slurm=slurm, testing=testing)


def run_cli(env_cls: type, argv: list[str] | None = None) -> None:
    env_defaults, server_defaults = env_cls.config_init()
    parser = build_parser(env_cls, env_defaults, server_defaults)
    args, unknown = parser.parse_known_args(argv)
    try:
        if unknown:
            raise _unknown_flag_error(parser, unknown)
        resolved = resolve_config(env_cls, args.command, args)
    except ConfigError as exc:
        print(f"{parser.prog} {args.command}: {exc}", file=sys.stderr)
        sys.exit(2)
    configure_logging("info")
    env = env_cls(resolved.env, resolved.servers, slurm=resolved.slurm, testing=resolved.testing)
    runner = {"serve": _serve, "process": _process, "evaluate": _evaluate}[args.command]
    asyncio.run(runner(env))


async def _serve(env: Any) -> None:
    from atroposlib.envs.runtime import EnvRuntime

    await EnvRuntime(env).run()


async def _process(env: Any) -> None:
    from tqdm import tqdm

    from atroposlib.frontend.jsonl2html import generate_html

    await env.setup()
    out = unused_path(env.config.data_path_to_save_groups)
    env.config.data_path_to_save_groups = str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.touch()
    written, attempts = 0, 0
    with tqdm(total=env.config.total_steps, desc=f"{env.name or type(env).__name__} groups") as bar:
        while written < env.config.total_steps:
            attempts += 1
            if attempts > 10 * env.config.total_steps:
                logger.warning("stopping: %d items gave only %d usable groups", attempts, written)
                break
            item = await env.get_next_item()
            if item is None:
                break
            try:
                groups, _ = await env.collect_trajectories(item)
                groups = await env.postprocess_histories(groups)
            except Exception:
                env.stats["rollout_errors"] += 1
                logger.exception("rollout of item %r failed", item)
                continue
            before = env.stats["groups_sent"]
            await env.handle_send_to_api(groups, item, do_send_to_api=False)
            bar.update(env.stats["groups_sent"] - before)
            written += env.stats["groups_sent"] - before
    page = generate_html(str(out))
    print(f"wrote {written} groups to {out} and the viewer {page}")


def unused_path(path: str | Path) -> Path:
    """`path`, or else `name_1.ext`, `name_2.ext`...: an earlier run's output is never truncated.

    Upstream's rule. Only `process` uses it: `serve` appends, so a supervised restart
    keeps adding to the one file of its env.
    """
    original = Path(path)
    candidate, counter = original, 1
    while candidate.exists():
        candidate = original.with_stem(f"{original.stem}_{counter}")
        counter += 1
    if candidate != original:
        logger.info("%s exists; writing groups to %s", original, candidate)
    return candidate


async def _evaluate(env: Any) -> None:
    await env.setup()
    await env.evaluate()
