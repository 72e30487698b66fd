"""`--from-run`: a finished run's groups from its files, turned into the same records.

Every environment of an `atropos-launch` run appends each group it sends to
`RUN_DIR/rollouts/<env>.jsonl`, so a run that has ended still holds every group; reading
them needs no API and takes nothing off a queue. The groups are read whole, so the group
size is theirs, and, with --num-seqs-to-save unset, every group is used. The records are
built by the live mode's rules (`records.Recorder`). The tokenizer, needed only for
decoded text, is the run's model from its `config.yaml` (`tiny` resolved to the local
build) unless --tokenizer names one. A run that cannot be read is one line and exit 2
(as `view-run RUN_DIR`); an unreadable line is skipped and counted.

The reader of a run's files is view-run's and the model names are the launcher's, and
this package may import neither (docs/architecture.md), so the commands hand them over
as a `RunReader`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from atroposlib.datagen.groups import Decoder, carries_messages
from atroposlib.datagen.records import Recorder, Rules, TokenizerError, form_line, load_tokenizer
from atroposlib.datagen.settings import GenSettings
from atroposlib.datagen.writer import JsonlWriter, OutputError, check_output

ROLLOUTS = "rollouts"
CONFIG = "config.yaml"


class RunInputError(ValueError):
    """The run cannot be used; one line for the user."""


class RecordedGroups(Protocol):
    """What the reader gives (view-run's `RecordedRun`)."""

    @property
    def groups(self) -> dict[str, list[dict[str, Any]]]: ...

    @property
    def skipped_count(self) -> int: ...


@dataclass(frozen=True)
class RunReader:
    """How to read a finished run, from the packages this one may not import."""

    read: Callable[[Path], RecordedGroups]
    """Every group under a path, by environment; a ValueError with one line if none."""
    notes: Callable[[Any], list[str]]
    """One sentence per file with unreadable lines."""
    resolve_model: Callable[[str], str]
    """A launch config's `model:` as a loadable name (`tiny` -> its cached build)."""


def run_config(source: Path) -> Path | None:
    """The config.yaml of the run `source` is part of: a run directory, its rollouts
    folder, or a file in that folder; None for groups outside a run directory."""
    if source.is_dir():
        folders = [source, source.parent] if source.name == ROLLOUTS else [source]
    else:
        folders = [source.parent.parent] if source.parent.name == ROLLOUTS else []
    return next((f / CONFIG for f in folders if (f / CONFIG).is_file()), None)


def run_model(config: Path) -> str:
    """The `model:` of a run's config.yaml."""
    import yaml

    try:
        data = yaml.safe_load(config.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise RunInputError(f"cannot read the model from {config}: {error}") from None
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, str) or not model:
        raise RunInputError(f"{config} names no model: pass --tokenizer")
    return model


def run_tokenizer(settings: GenSettings, source: Path, reader: RunReader) -> Decoder:
    """--tokenizer when given, else the run's model."""
    if "tokenizer" in settings.model_fields_set:
        return load_tokenizer(settings.tokenizer)
    config = run_config(source)
    if config is None:
        raise RunInputError(
            f"{source} is not in a run directory with a {CONFIG}, so the tokenizer that "
            "decodes its tokens is unknown: pass --tokenizer (the model its environments "
            "tokenized with)"
        )
    model = run_model(config)
    return load_tokenizer(reader.resolve_model(model), f"{config} (model: {model})")


def run_finished(
    tool: str, filepath: str, settings: GenSettings, rules: Rules, unit: str, reader: RunReader
) -> int:
    """Write the records of every group a finished run holds; the exit status."""
    source, path = Path(str(settings.from_run)), Path(filepath)

    def say(line: str) -> None:
        print(line, file=sys.stderr)

    try:
        recorded = reader.read(source)
    except ValueError as error:  # view-run's RecordedRunError: missing, empty, unreadable
        say(f"{tool}: error: {error}")
        return 2
    groups = [group for env_groups in recorded.groups.values() for group in env_groups]
    messages = settings.save_messages
    try:
        check_output(path, settings.append_to_previous)
        if unused := settings.unused_flags():
            say(f"{tool}: {', '.join(unused)} ignored: --from-run reads whole groups from files")
        for note in reader.notes(recorded):
            say(f"{tool}: {note}")
        if messages is None:
            messages = carries_messages(groups[0])
            say(form_line(tool, messages))
        tokenizer = None if messages else run_tokenizer(settings, source, reader)
        with JsonlWriter(path, settings.append_to_previous, settings.keep_duplicates) as writer:
            recorder = Recorder(tool, rules, writer, messages, tokenizer, settings.goal, say)
            for group in groups:
                if recorder.done:
                    break
                recorder.add(group)
    except RunInputError as error:
        say(f"{tool}: error: {error}")
        return 2
    except (OutputError, TokenizerError) as error:
        say(f"{tool}: error: {error}")
        return 1
    except KeyboardInterrupt:
        say(f"{tool}: stopped at once")
        return 130
    say(
        f"{tool}: wrote {writer.count} {unit}s to {path} from {recorder.groups} of "
        f"{_plural(len(groups), 'group')} in {source} "
        f"({_plural(len(recorded.groups), 'environment')}); {recorder.counts(unit)}; "
        f"{_plural(recorded.skipped_count, 'unreadable line')} skipped"
    )
    return 0


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")
