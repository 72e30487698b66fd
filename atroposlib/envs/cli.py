"""`python my_env.py serve|process|evaluate`: one config-resolution path for all three.

Configuration is resolved once, the same way for every subcommand:
`config_init()` defaults < `--config X.yaml` (keys env, openai, slurm, testing)
< `--env.*` / `--openai.*` / `--slurm` / `--testing` flags. When config_init
returned a ServerBaseline and any openai setting is given, it becomes one
APIServerConfig; a YAML `openai:` list means several inference servers, each
taking config_init's (first) server for what its entry leaves out (CLI `--openai.*`
values then apply to each).

An env class that talks to more inference servers than its policy's (a
distillation teacher) declares them with a `cli_server_namespaces()` classmethod
returning `{namespace: ServerNamespace(...)}`: each namespace gets `--<ns>.*`
flags and a `<ns>:` YAML key resolved by the same rules as `openai`, and is
passed to the env's constructor under its keyword. cli.py knows no env by name.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ValidationError

from atroposlib.envs.api_client import APIRefusedError, StateDirInUse
from atroposlib.envs.constants import ENV_NAMESPACE, NAMESPACE_SEP, OPENAI_NAMESPACE
from atroposlib.envs.process import NothingProcessed, unused_path
from atroposlib.envs.reporting import keep_full_metrics
from atroposlib.envs.rollout_failures import ContextRefused, NoRolloutFits, refused_plainly
from atroposlib.envs.runtime import STATE_LOGGER
from atroposlib.envs.server_handling.server_baseline import (
    OUTAGE_LOGGER,
    APIServerConfig,
    ServerBaseline,
)
from atroposlib.utils.flags import add_model_flags, given_flags, parse_bool
from atroposlib.utils.logging import configure_logging, keep_debug_in_files
from atroposlib.utils.tokenizers import (
    CHECK_CONFIG_ENVIRONMENT,
    CHECK_MODES,
    CHECK_REPORT_KEY,
    TOKENIZER_FLAG,
    TokenizerLoadError,
    load_tokenizer,
)

if TYPE_CHECKING:
    from atroposlib.envs.base import BaseEnv

logger = logging.getLogger("atroposlib.envs")

SUBCOMMANDS = ("serve", "process", "evaluate")
ENV_PREFIX = f"{ENV_NAMESPACE}{NAMESPACE_SEP}"
OPENAI_PREFIX = f"{OPENAI_NAMESPACE}{NAMESPACE_SEP}"
TOP_LEVEL_KEYS = frozenset({ENV_NAMESPACE, OPENAI_NAMESPACE, "slurm", "testing"})

ServerSettings = ServerBaseline | APIServerConfig | list[APIServerConfig]


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ServerNamespace:
    """Extra inference servers an env takes: `--<namespace>.*` flags and a YAML key.

    `init_kwarg` is the constructor keyword they are passed under; `defaults` are
    the env's own (None: the keyword is passed only when a flag or YAML sets it).
    """

    init_kwarg: str
    defaults: ServerSettings | None = None


@dataclass
class ResolvedConfig:
    env: Any
    servers: Any
    slurm: bool = False
    testing: bool = False
    extra_servers: dict[str, Any] = field(default_factory=dict)


def server_namespaces(env_cls: type[BaseEnv]) -> dict[str, ServerNamespace]:
    """The extra server namespaces `env_cls` declares (`cli_server_namespaces()`), if any."""
    declare = getattr(env_cls, "cli_server_namespaces", None)
    namespaces = dict(declare()) if declare is not None else {}
    for name in namespaces:
        if name in TOP_LEVEL_KEYS or NAMESPACE_SEP in name:
            raise ValueError(f"{env_cls.__name__}: server namespace {name!r} is reserved")
    return namespaces


def _first_server(defaults: Any) -> APIServerConfig | None:
    first = defaults[0] if isinstance(defaults, list) and defaults else defaults
    return first if isinstance(first, APIServerConfig) else None


def build_parser(
    env_cls: type[BaseEnv], env_defaults: BaseModel, server_defaults: Any
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"{Path(sys.argv[0]).name}", description=env_cls.__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,process,evaluate}")
    namespaces = server_namespaces(env_cls)
    top_keys = ", ".join([ENV_NAMESPACE, f"{OPENAI_NAMESPACE} (dict or list)", *namespaces])
    helps = {
        "serve": "run as a microservice against the trajectory API",
        "process": "no API: generate groups to jsonl and an HTML viewer",
        "evaluate": "setup(), then evaluate()",
    }
    for name in SUBCOMMANDS:
        command = sub.add_parser(name, help=helps[name], description=helps[name])
        command.add_argument("--config", help=f"YAML with keys {top_keys}, slurm, testing")
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
            command,
            env_defaults.__class__,
            dash_names=False,
            prefix=ENV_PREFIX,
            defaults=env_defaults,
        )
        add_model_flags(
            command,
            APIServerConfig,
            dash_names=False,
            prefix=OPENAI_PREFIX,
            defaults=_first_server(server_defaults),
        )
        for name, spec in namespaces.items():
            add_model_flags(
                command,
                APIServerConfig,
                dash_names=False,
                prefix=f"{name}{NAMESPACE_SEP}",
                defaults=_first_server(spec.defaults),
            )
    return parser


def _unknown_flag_error(parser: argparse.ArgumentParser, unknown: list[str]) -> ConfigError:
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    known = [
        opt for action in subcommands.choices["serve"]._actions for opt in action.option_strings
    ]
    flag = next((u for u in unknown if u.startswith("-")), unknown[0]).split("=")[0]
    close = difflib.get_close_matches(flag, known, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return ConfigError(f"unknown flag {flag}{hint}")


def _merge_servers(base: Any, overrides: dict[str, Any], yaml_servers: Any) -> Any:
    if yaml_servers is not None:
        if isinstance(yaml_servers, list):  # each entry over the env's (first) defaults
            template = base[0] if isinstance(base, list) and base else base
            fields = (
                template.model_dump(exclude={"base_url"})
                if isinstance(template, ServerBaseline)
                else {}
            )
            base = [APIServerConfig(**{**fields, **entry}) for entry in yaml_servers]
        else:
            fields = base.model_dump() if isinstance(base, ServerBaseline) else {}
            base = APIServerConfig(**{**fields, **yaml_servers})
    if not overrides:
        return base
    if isinstance(base, list):
        return [APIServerConfig(**{**entry.model_dump(), **overrides}) for entry in base]
    return APIServerConfig(**{**base.model_dump(), **overrides})


def resolve_namespace_servers(
    defaults: ServerSettings | None, yaml_value: Any, flags: dict[str, Any]
) -> ServerSettings | None:
    """An extra namespace's servers: its defaults < its YAML value < its flags.

    None when the env has no defaults and neither YAML nor a flag names a server;
    otherwise resolved like `openai` (a ServerBaseline given any setting becomes an
    APIServerConfig, a YAML list means several servers).
    """
    if defaults is None and not flags and not yaml_value:
        return None
    base = APIServerConfig() if defaults is None else defaults
    return _merge_servers(base, flags, yaml_value or None)


def _problems(section: str, exc: ValidationError) -> str:
    return "; ".join(
        f"--{section}{NAMESPACE_SEP}{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
        for e in exc.errors()
    )


def resolve_config(
    env_cls: type[BaseEnv], command: str, args: argparse.Namespace
) -> ResolvedConfig:
    env_defaults, server_defaults = env_cls.config_init()
    namespaces = server_namespaces(env_cls)
    document: dict[str, Any] = {}
    if getattr(args, "config", None):
        path = Path(args.config)
        if not path.exists():
            raise ConfigError(f"--config {path}: no such file")
        document = yaml.safe_load(path.read_text()) or {}
        if not isinstance(document, dict):
            raise ConfigError(f"--config {path}: expected a mapping of sections, not {document!r}")
        unknown = set(document) - TOP_LEVEL_KEYS - set(namespaces)
        if unknown:
            raise ConfigError(f"--config {path}: unknown top-level keys {sorted(unknown)}")
    env_values = {**env_defaults.model_dump(), **(document.get(ENV_NAMESPACE) or {})}
    env_flags = given_flags(args, ENV_PREFIX)
    explicit = set(document.get(ENV_NAMESPACE) or {}) | set(env_flags)
    env_values.update(env_flags)
    if command == "process":
        for key, value in (("ensure_scores_are_not_same", False), ("include_messages", True)):
            if key not in explicit:
                env_values[key] = value
        if not env_values.get("data_path_to_save_groups"):
            env_values["data_path_to_save_groups"] = (
                f"data/{env_cls.name or env_cls.__name__}.jsonl"
            )
    if command == "evaluate" and not env_values.get("data_dir_to_save_evals"):
        # as `process` writes its groups by default: results are never only printed
        env_values["data_dir_to_save_evals"] = str(
            unused_path(f"evals/{env_cls.name or env_cls.__name__}")
        )
    if command == "serve" and not env_values.get("wandb_name"):
        env_values["wandb_name"] = env_cls.name
    section = ENV_NAMESPACE
    try:
        env_config = type(env_defaults).model_validate(env_values)
        section = OPENAI_NAMESPACE
        servers = _merge_servers(
            server_defaults, given_flags(args, OPENAI_PREFIX), document.get(OPENAI_NAMESPACE)
        )
        extra_servers = {}
        for name, spec in namespaces.items():
            section = name
            resolved = resolve_namespace_servers(
                spec.defaults, document.get(name), given_flags(args, f"{name}{NAMESPACE_SEP}")
            )
            if resolved is not None:
                extra_servers[spec.init_kwarg] = resolved
    except ValidationError as exc:
        raise ConfigError(_problems(section, exc)) from None
    except TypeError as exc:  # a YAML section that is not a mapping
        raise ConfigError(f"{section}: {exc}") from None
    slurm = args.slurm if args.slurm is not None else bool(document.get("slurm", False))
    testing = args.testing if args.testing is not None else bool(document.get("testing", False))
    return ResolvedConfig(
        env=env_config,
        servers=servers,
        slurm=slurm,
        testing=testing,
        extra_servers=extra_servers,
    )


def run_cli(env_cls: type[BaseEnv], argv: list[str] | None = None) -> None:
    env_defaults, server_defaults = env_cls.config_init()
    parser = build_parser(env_cls, env_defaults, server_defaults)
    args, unknown = parser.parse_known_args(argv)
    try:
        if unknown:
            raise _unknown_flag_error(parser, unknown)
        resolved = resolve_config(env_cls, args.command, args)
        check_mode = os.environ.get(CHECK_CONFIG_ENVIRONMENT)
        if check_mode in CHECK_MODES:
            check_only(resolved, load=check_mode == "1")
            return
    except (ConfigError, TokenizerLoadError) as exc:
        print(f"{parser.prog} {args.command}: {exc}", file=sys.stderr)
        sys.exit(2)
    configure_logging("info")
    keep_full_metrics()
    for details in (OUTAGE_LOGGER, STATE_LOGGER):  # a short line on the console, all in files
        keep_debug_in_files(details)
    if args.command == "evaluate":
        save_evaluate_config(resolved)
    try:
        env = env_cls(
            resolved.env,
            resolved.servers,
            slurm=resolved.slurm,
            testing=resolved.testing,
            **resolved.extra_servers,
        )
    except TokenizerLoadError as exc:  # the env's first load: a name, not a traceback
        print(f"{parser.prog} {args.command}: {exc}", file=sys.stderr)
        sys.exit(2)
    runner = {"serve": _serve, "process": _process, "evaluate": _evaluate}[args.command]
    try:
        asyncio.run(runner(env))
    except NoRolloutFits as exc:  # a setting to change: exit 2, which is not restarted
        print(f"{parser.prog} {args.command}: {exc}", file=sys.stderr)
        sys.exit(2)
    except (APIRefusedError, NothingProcessed, ContextRefused, StateDirInUse) as exc:
        # the message says it all; no traceback
        print(f"{parser.prog} {args.command}: {exc}", file=sys.stderr)
        sys.exit(1)


def check_only(resolved: ResolvedConfig, load: bool = True) -> None:
    """The launcher's check before it starts anything (launch/checks.py): the flags
    resolved above, and the tokenizer the env would load first (`load`; a dry run of a
    hub model this machine does not hold skips it). The lengths the launcher checks
    against the engine's context go to stdout as one JSON line."""
    name = getattr(resolved.env, "tokenizer_name", None)
    if name and load:
        load_tokenizer(name, TOKENIZER_FLAG)
    lengths = {
        key: value
        for key in ("max_tokens", "max_token_length")
        if isinstance(value := getattr(resolved.env, key, None), int)
    }
    print(json.dumps({CHECK_REPORT_KEY: lengths}))


def save_evaluate_config(resolved: ResolvedConfig) -> None:
    """`evaluate_config.yaml` beside the results, as upstream: what produced these numbers.

    Unlike upstream, API keys are redacted: results get shared, keys must not be.
    """
    folder = resolved.env.data_dir_to_save_evals
    if not folder:
        return

    def dump(server: Any) -> dict[str, Any]:
        fields = server.model_dump(mode="json")
        if fields.get("api_key"):
            fields["api_key"] = "<redacted>"
        return fields

    def dump_all(servers: Any) -> Any:
        return [dump(s) for s in servers] if isinstance(servers, list) else dump(servers)

    document = {
        "env": resolved.env.model_dump(mode="json"),
        "openai": dump_all(resolved.servers),
        "slurm": resolved.slurm,
        "testing": resolved.testing,
        # extra server namespaces (a teacher...), under their constructor keywords
        **{kwarg: dump_all(servers) for kwarg, servers in resolved.extra_servers.items()},
    }
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / "evaluate_config.yaml").write_text(yaml.safe_dump(document, sort_keys=False))


async def _serve(env: Any) -> None:
    await env.env_manager()


async def _process(env: Any) -> None:
    await env.process_manager()


async def _evaluate(env: Any) -> None:
    try:
        await env._run_evaluate()
    except Exception as error:
        refused = refused_plainly(error, env)
        if refused is None:
            raise
        raise refused from None
