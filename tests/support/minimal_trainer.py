"""The smallest trainer that keeps `atroposlib.trainer_contract`: it proves the launcher's seam.

It takes the contract's flags (and `--batch-size`), registers with the API,
pulls `training_steps` batches, and for each writes a metrics row (the mean
score, a zero loss: it learns nothing), the ids of the groups it consumed, and a
checkpoint of its step counter, recorded as an event. A SIGINT or SIGTERM stops it
between steps, never between taking a batch and recording it, and it exits 0, as
the contract asks of a trainer stopped from outside. It also prints the log line the
example trainer's engine launcher prints, to show that the launcher counts events,
not log text.
It declares no `LAUNCH_CONFIG`, so the launcher passes its flags unchecked. It sends
the run's key from `$ATROPOS_API_KEY`, as the contract asks.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import httpx

from atroposlib.protocol import Batch, Registration, group_id_of
from atroposlib.trainer_contract import EventKind, LaunchSettings, RunRecords
from atroposlib.utils.exposure import API_KEY_ENVIRONMENT

POLL_S = 0.2
BATCH_TIMEOUT_S = 240


def parse(argv: list[str] | None) -> tuple[LaunchSettings, int, int]:
    parser = argparse.ArgumentParser(prog="minimal-trainer")
    for name in LaunchSettings.model_fields:
        parser.add_argument(f"--{name.replace('_', '-')}")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--resume", help="a checkpoint of this trainer: continue after its step")
    args = vars(parser.parse_args(argv))
    batch_size = args.pop("batch_size")
    resume = args.pop("resume")
    first = json.loads((Path(resume) / "state.json").read_text())["step"] + 1 if resume else 1
    settings = LaunchSettings.model_validate({k: v for k, v in args.items() if v is not None})
    return settings, batch_size, first


class Stop:
    """Set by SIGINT or SIGTERM; the loop looks at it between steps and polls."""

    asked = False

    @classmethod
    def ask(cls, signum: int, frame: object) -> None:
        cls.asked = True


def main(argv: list[str] | None = None) -> int:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, Stop.ask)
    settings, batch_size, first_step = parse(argv)
    records = RunRecords(settings.save_path)
    print("starting cpu engine: (not really; this line must not count)", flush=True)
    key = os.environ.get(API_KEY_ENVIRONMENT)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    http = httpx.Client(base_url=settings.atropos_url, timeout=30, headers=headers)
    registration = Registration(
        wandb_group="minimal",
        wandb_project="minimal",
        batch_size=batch_size,
        max_token_len=settings.seq_len,
        checkpoint_dir=settings.save_path,
        save_checkpoint_interval=1,
        starting_step=first_step - 1,
        num_steps=settings.training_steps,
    )
    http.post("/register", json=registration.model_dump()).raise_for_status()
    for step in range(first_step, settings.training_steps + 1):
        groups, deadline = None, time.monotonic() + BATCH_TIMEOUT_S
        while not groups:
            if Stop.asked:
                print(f"stopped before step {step}", flush=True)
                return 0
            try:
                groups = Batch.model_validate_json(http.get("/batch").content).batch
            except httpx.TransportError:  # the API restarting: ask again, as a trainer would
                groups = None
            if not groups and time.monotonic() > deadline:
                print(f"no batch for step {step} in {BATCH_TIMEOUT_S}s", file=sys.stderr)
                return 1
            time.sleep(0 if groups else POLL_S)
        scores = [score for group in groups for score in group.scores]
        records.trained_groups(step, [group_id_of(group) for group in groups])
        row = records.metrics(step, {"score_mean": statistics.fmean(scores), "loss": 0.0})
        checkpoint = Path(settings.save_path) / f"step-{step}"
        checkpoint.mkdir(parents=True, exist_ok=True)
        (checkpoint / "state.json").write_text(json.dumps({"step": step}))
        records.event(EventKind.CHECKPOINT_SAVED, step, path=str(checkpoint))
        print(f"step {step}: {len(scores)} sequences, mean score {row.score_mean:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
