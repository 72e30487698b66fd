"""Command-line flags generated from a pydantic model: one configuration mechanism.

Each field becomes `--field-name` (or `--prefix.field_name`) with its description
and default in `--help`; booleans take an optional true/false value. A sectioned
config's leaves are flags of their own, flat (`--lr`, not `--optim.lr`), and a leaf's
other spellings (`AliasChoices`) are further names of its flag (`utils.sections`).
"""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from atroposlib.utils.sections import aliases, iter_leaves, leaf_fields

ModelT = TypeVar("ModelT", bound=BaseModel)


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _is_bool(annotation: Any) -> bool:
    if annotation is bool:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return bool in typing.get_args(annotation)
    return False


def _shown_default(field: FieldInfo) -> Any:
    """The default --help shows: a factory's product (None, saying nothing, when it is
    empty or needs the other fields), never pydantic's PydanticUndefined marker."""
    if field.default_factory is None:
        return field.default
    try:
        made = field.default_factory()  # type: ignore[call-arg]
    except TypeError:  # a factory of the validated data (pydantic 2.10+)
        return None
    return None if made in ([], {}, set(), ()) else made


def add_model_flags(
    parser: argparse.ArgumentParser,
    model: type[BaseModel],
    dash_names: bool = True,
    prefix: str = "",
    defaults: BaseModel | None = None,
) -> None:
    """Add one flag per field; values stay as strings for pydantic to validate.

    `prefix` ("env.") namespaces the flags and their dest; `defaults` (an
    instance) supplies the defaults shown in --help instead of the class's.
    """

    def spelled(name: str) -> str:
        return "--" + prefix + (name.replace("_", "-") if dash_names else name)

    for leaf in iter_leaves(model):
        name, field = leaf.name, leaf.field
        holder = defaults if leaf.section is None else getattr(defaults, leaf.section, None)
        default = getattr(holder, name) if holder is not None else _shown_default(field)
        if hasattr(default, "value"):  # enums
            default = default.value
        if field.is_required() and defaults is None:
            shown = " (required)"
        elif default is None or "default" in (field.description or "").lower():
            shown = ""  # None says nothing; a description that names its default says it better
        else:
            shown = f" (default: {default!r})"
        _add_flag(parser, spelled(name), prefix + name, field, f"{field.description or ''}{shown}")
        for alias in aliases(name, field):  # its own dest: a disagreement is then seen
            _add_flag(parser, spelled(alias), prefix + alias, field, f"Same as {spelled(name)}.")


def _add_flag(
    parser: argparse.ArgumentParser, flag: str, dest: str, field: FieldInfo, help_text: str
) -> None:
    if _is_bool(field.annotation):
        parser.add_argument(
            flag,
            dest=dest,
            nargs="?",
            const=True,
            type=parse_bool,
            default=argparse.SUPPRESS,
            metavar="BOOL",
            help=help_text,
        )
    else:
        parser.add_argument(flag, dest=dest, default=argparse.SUPPRESS, help=help_text)


def given_flags(args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    """The values given on the command line for flags under `prefix`."""
    return {k[len(prefix) :]: v for k, v in vars(args).items() if k.startswith(prefix)}


class FlagError(ValueError):
    """A flag value that the model rejects; the message names the flag."""


def model_from_args(
    model: type[ModelT], args: argparse.Namespace, dash_names: bool = True
) -> ModelT:
    spellings = leaf_fields(model)
    given = {name: value for name, value in vars(args).items() if name in spellings}
    try:
        return model.model_validate(given)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False):
            named = [part for part in error["loc"] if isinstance(part, str)]
            if not named or named[-1] not in spellings:  # a rule between flags names them
                problems.append(error["msg"].removeprefix("Value error, "))
                continue
            flag = "--" + (named[-1].replace("_", "-") if dash_names else named[-1])
            problems.append(f"{flag} {given.get(named[-1])!r}: {error['msg']}")
        raise FlagError("; ".join(problems)) from None


def parse_settings(
    parser: argparse.ArgumentParser, model: type[ModelT], argv: list[str] | None = None
) -> tuple[ModelT, argparse.Namespace]:
    """Parse argv into `model`; a bad value exits with status 2 and names the flag."""
    args = parser.parse_args(argv)
    try:
        return model_from_args(model, args), args
    except FlagError as exc:
        parser.exit(2, f"{parser.prog}: {exc}\n")
