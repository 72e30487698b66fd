"""`torchrun --nproc_per_node 2` on CPU (gloo) gives the single-process gradients, and an
FSDP checkpoint resumes on another number of ranks.

One 2-rank launch (`dp_worker.main`) runs every rank's part: DDP, FSDP and LoRA under
FSDP on one batch, an FSDP checkpoint, and its resumes. Each test compares that launch's
outputs with the same jobs run in this process (`one_process`): a rank's process costs
seconds of torch and transformers imports, so the ranks answer every question in one
launch, and the one-process side, whose reference is a plain process, needs none.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from tests.example_trainer import dp_worker  # noqa: E402
from tests.support.tolerances import GRADIENT_REL_TO_SCALE, assert_close_to_scale  # noqa: E402

WORKER = Path(dp_worker.__file__)
RANKS = 2


@contextlib.contextmanager
def one_process() -> Iterator[None]:
    """This process as a run of one rank: FSDP's group of one is torn down after, so the
    next FSDP trainer (and the next test in this worker) starts a group of its own."""
    import torch.distributed as dist

    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tiny_model_path, tmp_path_factory) -> SimpleNamespace:
    """`one`: the jobs in this process; `two`: rank 0's results of the 2-rank launch."""
    root, model = tmp_path_factory.mktemp("dp"), str(tiny_model_path)
    with one_process():
        one = {
            "plain": dp_worker.gradients(model, root / "one", 1),
            "lora": dp_worker.gradients(model, root / "one-lora", 1, lora=True),
            "lonely": dp_worker.gradients(model, root / "one-1", 1, batch=dp_worker.lonely_batch),
        }
    with one_process():
        one["saved"] = dp_worker.checkpoint(model, root / "one-ckpt")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    done = subprocess.run(
        [torchrun, "--standalone", f"--nproc_per_node={RANKS}", str(WORKER)]
        + [model, str(root / "two"), str(root / "one-ckpt")],
        capture_output=True,
        text=True,
        timeout=600,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    two = torch.load(root / "two" / "out.pt")
    with one_process():  # the 2-rank checkpoint, resumed by one
        one["resumed_from_two"] = dp_worker.resumed(model, root / "two" / "ckpt", root / "r1")
    return SimpleNamespace(root=root, one=one, two=two)


def test_two_ranks_match_one_process(runs):
    single, double = runs.one["plain"], runs.two["ddp"]
    assert single["grads"].keys() == double["grads"].keys()
    assert any(g.abs().sum() > 0 for g in single["grads"].values())
    # the same sums in another order: equal up to float32 rounding (tests/support/tolerances.py)
    for name, grad in single["grads"].items():
        assert_close_to_scale(double["grads"][name], grad, GRADIENT_REL_TO_SCALE, name)
    # means of per-token terms of order 1 (log-ratios, fractions, ratios): their scale is 1
    for key in ("loss", "pg_loss", "clip_fraction", "logprob_mismatch", "ratio_mean"):
        assert double["metrics"][key] == pytest.approx(
            single["metrics"][key], rel=GRADIENT_REL_TO_SCALE, abs=GRADIENT_REL_TO_SCALE
        ), key
    assert single["metrics"]["clip_fraction"] > 0, "the batch should exercise clipping"


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_a_rank_with_nothing_to_train_idles_and_the_gradient_is_one_processs(runs, parallelism):
    """DP-2 of the trainer review: fewer sequences than ranks (what --max-staleness may
    leave) raised, and raised again on every resume; the empty rank now runs an idle pass."""
    single, double = runs.one["lonely"], runs.two[f"{parallelism}_lonely"]
    assert any(g.abs().sum() > 0 for g in single["grads"].values())
    for name, grad in single["grads"].items():
        assert_close_to_scale(double["grads"][name], grad, GRADIENT_REL_TO_SCALE, name)
    assert double["metrics"]["sequences"] == 1.0


def test_fsdp_on_two_ranks_matches_one_process_with_half_the_bytes(runs):
    """FSDP2 (gloo, 2 ranks, fp32): the single-process gradients and update, while each
    rank holds about half of the parameters and optimizer state that DDP's ranks do."""
    single, ddp, fsdp = runs.one["plain"], runs.two["ddp"], runs.two["fsdp"]
    assert fsdp["grads"].keys() == single["grads"].keys()
    for name, grad in single["grads"].items():
        assert_close_to_scale(fsdp["grads"][name], grad, GRADIENT_REL_TO_SCALE, name)
    for key in ("loss", "pg_loss", "clip_fraction", "logprob_mismatch"):
        assert fsdp["metrics"][key] == pytest.approx(
            single["metrics"][key], rel=GRADIENT_REL_TO_SCALE, abs=GRADIENT_REL_TO_SCALE
        ), key
    # the sharded optimizer step is AdamW's step on those gradients: elementwise, so the
    # same whichever rank holds an entry. (Comparing with the single process's update
    # instead would amplify the gradients' rounding by lr / eps wherever |g| is near eps.)
    for name, update in fsdp["updates"].items():
        weight = fsdp["before"][name].clone().requires_grad_()
        weight.grad = fsdp["grads"][name].clone()
        torch.optim.AdamW([weight], lr=1e-5, weight_decay=0.0).step()
        expected = weight.detach() - fsdp["before"][name]
        assert_close_to_scale(update, expected, GRADIENT_REL_TO_SCALE, name)
    assert any(u.abs().max() > 0 for u in fsdp["updates"].values())
    for kind in ("parameters", "optimizer"):
        ratio = fsdp["bytes"][kind] / ddp["bytes"][kind]
        assert 0.45 <= ratio <= 0.55, (kind, fsdp["bytes"], ddp["bytes"])
    assert ddp["bytes"] == single["bytes"]  # every DDP rank holds the whole model


def test_lora_under_fsdp_on_two_ranks_matches_one_process_and_exports_it(runs):
    """LoRA adapters sharded by FSDP2 on 2 ranks train as in one process, and a hot push's
    exports (gathered, then merged by peft, or the adapter alone) hold those weights."""
    from peft import PeftConfig
    from safetensors.torch import load_file

    single, fsdp = runs.one["lora"], runs.two["fsdp_lora"]
    assert fsdp["grads"].keys() == single["grads"].keys()
    assert all("lora_" in name for name in single["grads"]), "only the adapters train"
    for name, grad in single["grads"].items():
        assert_close_to_scale(fsdp["grads"][name], grad, GRADIENT_REL_TO_SCALE, name)
    exports = [(runs.root / "one-lora", single), (runs.root / "two" / "fsdp-lora", fsdp)]
    merged = [load_file(folder / "merged" / "model.safetensors") for folder, _ in exports]
    assert merged[0].keys() == merged[1].keys()
    assert not any("lora" in name or "base_layer" in name for name in merged[1])
    moved = 0.0
    for name, weight in merged[0].items():
        # both sides merge W + s * B @ A from weights one AdamW step apart: that step's
        # rounding (the FSDP test above) bounds the difference, as a share of lr
        assert (merged[1][name] - weight).abs().max() <= 0.1 * 1e-5, name
    for folder, run in exports:
        # a checkpoint serves the same merged weights, and keeps the adapter to resume
        checkpoint = load_file(folder / "ckpt" / "step-1" / "model.safetensors")
        merged_export = load_file(folder / "merged" / "model.safetensors")
        assert checkpoint.keys() == merged_export.keys()
        assert all(torch.equal(checkpoint[n], merged_export[n]) for n in checkpoint)
        assert (folder / "ckpt" / "step-1" / "adapter" / "adapter_model.safetensors").is_file()
        adapter = load_file(folder / "adapter" / "adapter_model.safetensors")
        assert PeftConfig.from_pretrained(folder / "adapter").r == 16
        for name, weight in run["before"].items():  # the adapter's tensors, updated
            stored = adapter[name.replace(".default", "")]
            moved = max(moved, float((stored - weight).abs().max()))
            assert torch.allclose(stored, weight + run["updates"][name]), name
    assert moved > 0


def assert_same_state(got: dict, want: dict, where: str) -> None:
    """Weights and optimizer state equal entry for entry: loading moves bytes, no sums."""
    assert got["weights"].keys() == want["weights"].keys()
    for name, tensor in want["weights"].items():
        assert torch.equal(got["weights"][name], tensor), f"{where}: weight {name}"
    for name, state in want["optimizer"]["state"].items():
        for key, value in state.items():
            loaded = got["optimizer"]["state"][name][key]
            assert torch.equal(torch.as_tensor(loaded), torch.as_tensor(value)), (
                f"{where}: optimizer {name}.{key}"
            )


@pytest.mark.parametrize(("saved_by", "resumed_by"), [(2, (1, 2)), (1, (2,))])
def test_an_fsdp_checkpoint_resumes_on_another_number_of_ranks(saved_by, resumed_by, runs):
    """Saved by N ranks, resumed by M with exactly the saved weights and optimizer
    state, and the same next step. The checkpoint's weights load in plain
    transformers, as an engine loads them."""
    from transformers import AutoModelForCausalLM

    save, saved, resumes = {
        2: (
            runs.root / "two" / "ckpt",
            runs.two["saved"],
            {1: runs.one["resumed_from_two"], 2: runs.two["resumed"]},
        ),
        1: (runs.root / "one-ckpt", runs.one["saved"], {2: runs.two["resumed_from_one"]}),
    }[saved_by]
    served = AutoModelForCausalLM.from_pretrained(save / "step-1").state_dict()
    for name, tensor in saved["weights"].items():
        assert torch.equal(served[name], tensor), name
    assert (save / "step-1" / "optimizer").is_dir()
    nexts = []
    for ranks in resumed_by:
        resumed = resumes[ranks]
        assert resumed["step"] == 1
        assert_same_state(resumed["loaded"], saved, f"saved by {saved_by}, resumed by {ranks}")
        nexts.append(resumed["next"])
    assert any((w != saved["weights"][n]).any() for n, w in nexts[0].items())
    # one more AdamW step from the same state on 1 and on 2 ranks: the gradients differ
    # by float32 rounding (the test above), which AdamW's lr * m / (sqrt(v) + eps) turns
    # into a fraction of lr only for entries whose gradient is near eps; 10% of lr bounds
    # that, while a lost or doubled update is off by lr.
    for name, weight in nexts[-1].items():
        assert (weight - nexts[0][name]).abs().max() <= 0.1 * 1e-4, name


def test_torchrun_trainer_pulls_from_the_api_on_rank_zero(
    api, wire_client, tiny_model_path, tmp_path
):
    """The real `atropos-grpo` under torchrun: batches flow, rank 0 checkpoints, all exit.
    (Under atropos-launch's loopback-only stand-in for torchrun, the FSDP quickstart's
    launch asks the same: tests/launch/test_launch.py.)"""
    import json

    from tests.support.groups import make_group

    save = tmp_path / "ckpt"
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    prefix = [torchrun, "--standalone", "--nproc_per_node=2"]
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
