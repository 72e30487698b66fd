"""The data tools' flags: upstream's names and defaults, as pydantic models.

One model per tool feeds `--help` and validation (atroposlib.utils.flags). FILEPATH stays
a positional argument outside the models. Upstream's booleans were `store_true`
switches, so `--save-messages out.jsonl` must keep working although our flags take an
optional true/false value: `switches_first` rewrites such a switch to `--flag=true`.
"""

from __future__ import annotations

from typing import ClassVar, Literal, TypeVar

from pydantic import BaseModel, Field

DEFAULT_TOKENIZER = "NousResearch/DeepHermes-3-Llama-3-8B-Preview"
BOOL_WORDS = frozenset({"true", "false", "1", "0", "yes", "no", "on", "off"})


class GenSettings(BaseModel):
    """Flags shared by both tools."""

    API_FLAGS: ClassVar[tuple[str, ...]] = (
        "api_url",
        "group_size",
        "tasks_per_step",
        "max_token_len",
    )
    """What only a live API needs: --from-run reads whole groups from files."""

    from_run: str | None = Field(
        None,
        description="Read a finished run's groups instead of pulling from run-api: an "
        "atropos-launch run directory (its rollouts/*.jsonl), that rollouts folder, or one "
        ".jsonl file of groups. No API is used; the tokenizer is the run's model (its "
        "config.yaml) unless --tokenizer is given; every group is used unless "
        "--num-seqs-to-save is given.",
    )
    api_url: str = Field("http://localhost:8000", description="URL of the running run-api.")
    group_size: int = Field(2, gt=0, description="Sequences per group the environments send.")
    max_token_len: int = Field(
        2048, gt=0, description="Token limit sent to the API when registering."
    )
    tokenizer: str = Field(
        DEFAULT_TOKENIZER,
        description="Tokenizer (Hugging Face name or local path) that decodes the tokens; "
        "not loaded with --save-messages.",
    )
    save_messages: bool | None = Field(
        None,
        description="Write the groups' chat messages (TRL's conversational records) "
        "instead of decoded text. Unset: messages when the first group carries them "
        "(an atropos-launch run's always do), else text; false: decoded text "
        "(the chat template's tokens included) whatever the groups carry.",
    )
    num_seqs_to_save: int = Field(100, gt=0, description="Stop after writing this many records.")
    allow_negative_scores: bool = Field(False, description="Also keep sequences scored 0 or below.")
    append_to_previous: bool = Field(
        False,
        description="Append to FILEPATH if it exists (without it, an existing file is "
        "refused, never overwritten).",
    )
    keep_duplicates: bool = Field(
        False,
        description="Write identical records again (by default a record equal to one "
        "already in FILEPATH, its score aside, is dropped and counted).",
    )
    format: Literal["trl", "atropos"] = Field(
        "trl",
        description="Record keys: 'trl' writes what TRL's trainers read; 'atropos' writes "
        "upstream Atropos's keys (with the score).",
    )

    def unused_flags(self) -> list[str]:
        """The live API's flags the user gave, which --from-run does not need."""
        given = [name for name in self.API_FLAGS if name in self.model_fields_set]
        return ["--" + name.replace("_", "-") for name in given]

    @property
    def goal(self) -> int | None:
        """How many records to write: --num-seqs-to-save, or every one --from-run yields
        when the flag is not given (a finished run's file is used whole)."""
        if self.from_run and "num_seqs_to_save" not in self.model_fields_set:
            return None
        return self.num_seqs_to_save


class SftGenSettings(GenSettings):
    """Flags of `atropos-sft-gen`."""

    save_top_n_per_group: int = Field(
        3, ge=0, description="Keep at most this many of the best sequences of each group."
    )
    minimum_score_diff_max_min: float = Field(
        0.0,
        description="When above 0, keep only sequences scoring more than this above the "
        "group's lowest score.",
    )
    tasks_per_step: int = Field(
        64,
        gt=0,
        description="Groups per batch: the tool registers for batches of "
        "group_size * tasks_per_step sequences.",
    )


class DpoGenSettings(GenSettings):
    """Flags of `atropos-dpo-gen` (`--num-seqs-to-save` counts pairs)."""

    save_n_pairs_per_group: int = Field(
        3, ge=0, description="Write at most this many chosen/rejected pairs per group."
    )
    minimum_score_diff_max_min: float = Field(
        0.5, description="A pair's chosen score must exceed its rejected score by more than this."
    )
    tasks_per_step: int = Field(
        8,
        gt=0,
        description="Groups per batch: the tool registers for batches of "
        "group_size * tasks_per_step sequences (upstream's dpo tool used 8).",
    )
    seed: int | None = Field(
        None, description="Seed for choosing among a group's rejected candidates (random if unset)."
    )


def switches_first(argv: list[str], switches: set[str]) -> list[str]:
    """`--switch VALUE` becomes `--switch=true VALUE` unless VALUE is a true/false word."""
    out: list[str] = []
    for index, arg in enumerate(argv):
        following = argv[index + 1] if index + 1 < len(argv) else None
        if (
            arg in switches
            and following is not None
            and not following.startswith("-")
            and following.lower() not in BOOL_WORDS
        ):
            arg = f"{arg}=true"
        out.append(arg)
    return out


SettingsT = TypeVar("SettingsT", bound="GenSettings")


def tool_main(
    prog: str, description: str, settings_cls: type[SettingsT], argv: list[str] | None
) -> tuple[SettingsT, str]:
    """The two generators' command line: FILEPATH plus the settings' flags (one parser)."""
    import argparse
    import sys

    from atroposlib.utils.flags import add_model_flags, parse_settings

    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("filepath", help="Output jsonl file (its directory must exist).")
    add_model_flags(parser, settings_cls)
    argv = switches_first(
        sys.argv[1:] if argv is None else argv,
        {
            "--save-messages",
            "--allow-negative-scores",
            "--append-to-previous",
            "--keep-duplicates",
        },
    )
    settings, args = parse_settings(parser, settings_cls, argv)
    return settings, args.filepath
