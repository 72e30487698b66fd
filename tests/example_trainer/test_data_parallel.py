"""`torchrun --nproc_per_node 2` on CPU (gloo) gives the single-process gradients."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.support.tolerances import GRADIENT_REL_TO_SCALE, assert_close_to_scale  # noqa: E402

WORKER = Path(__file__).with_name("dp_worker.py")


def run_worker(tiny_model_path, out: Path, processes: int, grad_accum: int) -> dict:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    prefix = (
        [sys.executable]
        if processes == 1
        else [torchrun, "--standalone", f"--nproc_per_node={processes}"]
    )
    done = subprocess.run(
        [*prefix, str(WORKER), str(tiny_model_path), str(out), str(grad_accum)],
        capture_output=True,
        text=True,
        timeout=240,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out)


def test_two_ranks_match_one_process(tiny_model_path, tmp_path):
    single = run_worker(tiny_model_path, tmp_path / "one.pt", 1, 1)
    double = run_worker(tiny_model_path, tmp_path / "two.pt", 2, 2)
    assert single["grads"].keys() == double["grads"].keys()
    assert any(g.abs().sum() > 0 for g in single["grads"].values())
    # the same sums in another order: equal up to float32 rounding (tests/support/tolerances.py)
    for name, grad in single["grads"].items():
        assert_close_to_scale(double["grads"][name], grad, GRADIENT_REL_TO_SCALE, name)
    # means of per-token terms of order 1 (log-ratios, fractions, scores): their scale is 1
    for key in ("loss", "pg_loss", "clip_fraction", "logprob_mismatch", "score_mean"):
        assert double["metrics"][key] == pytest.approx(
            single["metrics"][key], rel=GRADIENT_REL_TO_SCALE, abs=GRADIENT_REL_TO_SCALE
        ), key
    assert single["metrics"]["clip_fraction"] > 0, "the batch should exercise clipping"


@pytest.mark.parametrize("runner", ["torchrun", "local_ranks"])
def test_torchrun_trainer_pulls_from_the_api_on_rank_zero(
    runner, api, wire_client, tiny_model_path, tmp_path
):
    """The real `atropos-grpo` under torchrun, and under atropos-launch's loopback-only
    stand-in for it: batches flow, rank 0 checkpoints, all exit."""
    import json

    from tests.support.groups import make_group

    save = tmp_path / "ckpt"
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    local_ranks = [sys.executable, "-m", "atroposlib.launch.local_ranks", "--nproc", "2"]
    prefix = {
        "torchrun": [torchrun, "--standalone", "--nproc_per_node=2"],
        "local_ranks": [*local_ranks, "--", sys.executable],
    }[runner]
    trainer = subprocess.Popen(
        [
            *prefix,
            "-m",
            "example_trainer.grpo",
            *("--model-name", str(tiny_model_path), "--atropos-url", api.url),
            *("--training-steps", "2", "--batch-size", "4", "--seq-len", "32"),
            *("--inference-engine", "none", "--vllm-restart-interval", "2"),
            *("--save-path", str(save), "--device", "cpu", "--log-format", "text"),
        ],
        stdout=open(tmp_path / "trainer.log", "wb"),
        stderr=subprocess.STDOUT,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    try:
        for tag in range(4):
            assert wire_client.post(
                "/scored_data", json=make_group(2, tag=tag + 3, length=6)
            ).is_success
        assert trainer.wait(240) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    finally:
        if trainer.poll() is None:
            trainer.kill()
    steps = [json.loads(line)["step"] for line in (save / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2], "only rank 0 logs metrics"
    assert (save / "step-2" / "model.safetensors").exists()
    assert wire_client.get("/status").json()["current_step"] == 2
