"""The data tools' live loop: check the output, load the tokenizer, register, pull, write.

Design: everything that can be refused (output path, tokenizer) is checked before the
tool registers, so a mistake costs no batch. Batches are pulled one at a time; each
group is turned into records by the tool's rule (`records.Recorder`), and writing stops
at exactly `--num-seqs-to-save` records. Ctrl-C or SIGTERM sets a flag: the batch already
taken off the queue is still written (it would be lost otherwise; that takes
milliseconds), then the tool prints its summary and exits 0; a second signal outside a
write stops it at once (exit 130). A group that cannot be used is skipped, counted and
warned about, never a crash. `generate` sends --from-run to `finished` instead.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from atroposlib.datagen.finished import RunReader, run_finished
from atroposlib.datagen.pull import BatchPuller, PullError
from atroposlib.datagen.records import Recorder, Rules, TokenizerError, load_tokenizer
from atroposlib.datagen.settings import GenSettings
from atroposlib.datagen.writer import JsonlWriter, OutputError, check_output

POLL_S = 1.0
API_RETRY_S = 120.0
"""How long a tool keeps asking an API that stopped answering after it registered (a
run-api restart); before that, BatchPuller's own 10 s."""


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


def waiting_for(puller: BatchPuller) -> str:
    """What a tool with no batch waits for, as the progress bar's postfix."""
    status = puller.status()
    queued = status.get("queued_sequences", 0)
    return f"API holds {queued}/{puller.batch_size} sequences of the next batch"


def generate(
    tool: str,
    filepath: str,
    settings: GenSettings,
    rules: Rules,
    unit: str,
    reader: Callable[[], RunReader],
) -> int:
    """Run one data tool: on a finished run's files with --from-run (`reader` gives what
    reads them), else live on run-api; the exit status."""
    if settings.from_run is not None:
        return run_finished(tool, filepath, settings, rules, unit, reader())
    return run(tool, filepath, settings, rules, unit)


def run(tool: str, filepath: str, settings: GenSettings, rules: Rules, unit: str) -> int:
    """Run one data tool live, as run-api's trainer, to completion; the exit status."""
    from tqdm import tqdm

    path = Path(filepath)
    stopper = Stopper()
    stopper.install()
    batches = 0
    try:
        check_output(path, settings.append_to_previous)
        # unset --save-messages: text unless the groups carry messages, so the tokenizer
        # is checked now, before a batch is taken (as when the text form was the default)
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
            writer = JsonlWriter(path, settings.append_to_previous, settings.keep_duplicates)
            with writer:
                stopper.writer = writer
                goal = settings.num_seqs_to_save
                with tqdm(total=goal, desc=tool, unit=unit, file=sys.stderr) as bar:
                    recorder = Recorder(
                        tool,
                        rules,
                        writer,
                        settings.save_messages,
                        tokenizer,
                        goal,
                        say=lambda said: bar.write(said, file=sys.stderr),
                    )
                    while not recorder.done and not stopper.requested.is_set():
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
                        batches += 1
                        for group in batch:
                            if recorder.done:
                                break
                            bar.update(recorder.add(group))
    except (OutputError, TokenizerError, PullError) as error:
        print(f"{tool}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{tool}: stopped at once", file=sys.stderr)
        return 130
    stopped = " (stopped early on request)" if stopper.requested.is_set() else ""
    print(
        f"{tool}: wrote {writer.count} {unit}s to {path}{stopped}, from {recorder.groups} "
        f"groups in {batches} batches; {recorder.counts(unit)}",
        file=sys.stderr,
    )
    return 0
