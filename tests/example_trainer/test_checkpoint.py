"""Checkpoints reach the disk before the API is told it may delete what they replace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from example_trainer.checkpoint import save_checkpoint  # noqa: E402


def test_every_file_and_the_rename_are_fsynced(tiny_model_path, tmp_path, monkeypatch):
    """MISC (review of e6a9d2c): nothing was fsynced, yet `committed` released the leases,
    so a power loss after a step could lose both the checkpoint and the batches."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    target = save_checkpoint(str(tmp_path), 7, model, tokenizer, optimizer, scheduler)
    staging = str(tmp_path / ".step-7.partial")
    written = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert written and "trainer_state.pt" in written
    for name in written:
        assert os.path.join(staging, name) in synced, name
    assert synced.index(staging) < synced.index(str(tmp_path))  # the dir, then the rename
    assert synced[-1] == str(Path(tmp_path))
