"""The data tools' loop: check the output, load the tokenizer, register, pull, write, stop.

Design: everything that can be refused (output path, tokenizer) is checked before the
tool registers, so a mistake costs no batch. Batches are pulled one at a time; each
group is turned into records by the tool's rule (`Rules`), and writing stops at exactly
`--num-seqs-to-save` records. Ctrl-C or SIGTERM sets a flag: the batch already taken
off the queue is still written (it would be lost otherwise; that takes milliseconds),
then the tool prints its summary and exits 0; a second signal outside a write
stops it at once (exit 130). A group that cannot be used is skipped, counted and
warned about, never a crash.
"""

from __future__ import annotations

import random
import signal
import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atroposlib.datagen.dpo import dpo_record, pair_up
from atroposlib.datagen.groups import Decoder, GroupProblem, sequences
from atroposlib.datagen.pull import BatchPuller, PullError
from atroposlib.datagen.settings import DpoGenSettings, GenSettings, SftGenSettings
from atroposlib.datagen.sft import keep_best, sft_record
from atroposlib.datagen.writer import JsonlWriter, OutputError, check_output
from atroposlib.utils.tokenizers import TokenizerLoadError
from atroposlib.utils.tokenizers import load_tokenizer as load_named_tokenizer

POLL_S = 1.0
API_RETRY_S = 120.0
"""How long a tool keeps asking an API that stopped answering after it registered (a
run-api restart); before that, BatchPuller's own 10 s."""


class TokenizerError(ValueError):
    """The tokenizer named by --tokenizer cannot be loaded."""


Rules = Callable[[Any, Decoder | None], list[dict[str, Any]]]
"""Turns one group (and the tokenizer, None with --save-messages) into records."""


def sft_rules(settings: SftGenSettings) -> Rules:
    def records(group: Any, tokenizer: Decoder | None) -> list[dict[str, Any]]:
        kept = keep_best(
            sequences(group, tokenizer, settings.save_messages),
            settings.save_top_n_per_group,
            settings.allow_negative_scores,
            settings.minimum_score_diff_max_min,
        )
        return [sft_record(seq, settings.save_messages, settings.format) for seq in kept]

    return records


def dpo_rules(settings: DpoGenSettings) -> Rules:
    rng = random.Random(settings.seed)

    def records(group: Any, tokenizer: Decoder | None) -> list[dict[str, Any]]:
        pairs = pair_up(
            sequences(group, tokenizer, settings.save_messages),
            settings.save_n_pairs_per_group,
            settings.allow_negative_scores,
            settings.minimum_score_diff_max_min,
            rng,
        )
        return [dpo_record(c, r, settings.save_messages, settings.format) for c, r in pairs]

    return records


def load_tokenizer(name: str) -> Decoder:
    """A Hugging Face tokenizer, or TokenizerError naming --tokenizer."""
    try:
        return load_named_tokenizer(name, "--tokenizer")
    except TokenizerLoadError as error:
        raise TokenizerError(f"{error}, or use --save-messages") from None


class Stopper:
    """Signal handling: the first signal asks to stop, a second one outside a write stops."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.writer: JsonlWriter | None = None

    def handle(self, signum: int, frame: Any) -> None:
        if self.requested.is_set() and not (self.writer and self.writer.busy):
            raise KeyboardInterrupt
        self.requested.set()

    def install(self) -> None:
        signal.signal(signal.SIGINT, self.handle)
        signal.signal(signal.SIGTERM, self.handle)


@dataclass
class Tally:
    batches: int = 0
    groups: int = 0
    skipped: Counter | None = None

    def skip(self, why: str) -> None:
        self.skipped = self.skipped or Counter()
        self.skipped[why] += 1


def waiting_for(puller: BatchPuller) -> str:
    """What a tool with no batch waits for, as the progress bar's postfix."""
    status = puller.status()
    queued = status.get("queued_sequences", 0)
    return f"API holds {queued}/{puller.batch_size} sequences of the next batch"


def run(tool: str, filepath: str, settings: GenSettings, rules: Rules, unit: str) -> int:
    """Run one data tool to completion; the exit status."""
    from tqdm import tqdm

    path = Path(filepath)
    stopper = Stopper()
    stopper.install()
    tally = Tally()
    try:
        check_output(path, settings.append_to_previous)
        tokenizer = None if settings.save_messages else load_tokenizer(settings.tokenizer)
        if stopper.requested.is_set():
            print(f"{tool}: stopped before registering; nothing written", file=sys.stderr)
            return 0
        puller = BatchPuller(
            settings.api_url,
            settings.group_size * settings.tasks_per_step,  # type: ignore[attr-defined]
            settings.max_token_len,
            num_steps=settings.num_seqs_to_save * 2,
            tool=tool,
            on_retry=lambda said: print(f"{tool}: {said}", file=sys.stderr),
        )
        with puller:
            puller.register()  # an API that is not there at the start: a quick error
            puller.retry_s = API_RETRY_S  # one that goes away later: a restart, waited out
            with JsonlWriter(path, settings.append_to_previous) as writer:
                stopper.writer = writer
                goal = settings.num_seqs_to_save
                with tqdm(total=goal, desc=tool, unit=unit, file=sys.stderr) as bar:
                    while writer.count < goal and not stopper.requested.is_set():
                        registrations = puller.registrations
                        batch = puller.next_batch()
                        if puller.registrations > registrations:
                            bar.write(
                                f"{tool}: the API at {settings.api_url} had forgotten this "
                                "tool (restarted without its state); registered again",
                                file=sys.stderr,
                            )
                        if not batch:
                            if (waiting := waiting_for(puller)) != bar.postfix:
                                bar.set_postfix_str(waiting, refresh=True)
                            stopper.requested.wait(POLL_S)
                            continue
                        tally.batches += 1
                        for group in batch:
                            tally.groups += 1
                            try:
                                records = rules(group, tokenizer)
                            except GroupProblem as problem:
                                tally.skip(str(problem))
                                bar.write(f"{tool}: skipped a group: {problem}", file=sys.stderr)
                                continue
                            for record in records[: goal - writer.count]:
                                writer.write(record)
                                bar.update(1)
                written = writer.count
    except (OutputError, TokenizerError, PullError) as error:
        print(f"{tool}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{tool}: stopped at once", file=sys.stderr)
        return 130
    stopped = " (stopped early on request)" if stopper.requested.is_set() else ""
    skipped = sum(tally.skipped.values()) if tally.skipped else 0
    print(
        f"{tool}: wrote {written} {unit}s to {path}{stopped}, from {tally.groups} groups in "
        f"{tally.batches} batches; {skipped} groups skipped as unusable",
        file=sys.stderr,
    )
    return 0
