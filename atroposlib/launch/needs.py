"""What a config needs from the model and from this machine, checked before a launch.

Design: a GPU config launched on a CPU machine used to start the API and the
environments, then die in the trainer with torch's "Torch not compiled with CUDA
enabled" and a hint to `--resume`; a `seq_len` over the model's context surfaced as
the engine's refusal of every request. Each need here is one line naming the key to
change. What needs this machine (CUDA, vLLM) is a `Finding` with `machine=True`: a
launch refuses it, a dry run (which may check a cluster's config on a laptop) reports
it. What needs the model's files is skipped where this machine does not hold them (a
hub model it has not downloaded): a launch downloads them, a dry run says it skipped.

The probes of another Python (the trainer's, the engine's) run as subprocesses, side by
side with the environments' checks (`launch/checks.py`); nothing is imported here.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atroposlib.utils.tiny_model import TINY_MODEL_NAMES

if TYPE_CHECKING:
    from atroposlib.launch.plan import Plan

CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""Where a model's config.json gives its context, in transformers' model families."""

CUDA_PROBE = (
    "import json, torch; "
    "print(json.dumps([torch.__version__, torch.cuda.device_count() if torch.cuda.is_available() "
    "else 0]))"
)
VLLM_PROBE = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('vllm') else 3)"


@dataclass(frozen=True)
class Finding:
    """One check's outcome: a problem (one line, the key to change), a skip (why it was
    not made), or neither (it passed)."""

    check: str
    problem: str | None = None
    skipped: str | None = None
    machine: bool = False
    """About this machine rather than the config: a dry run reports it, a launch refuses."""


def model_files(model: str) -> Path | None:
    """The directory holding the model's config.json here, or None (a hub model this
    machine has not downloaded)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on it
        return None
    found = try_to_load_from_cache(model, "config.json")
    return Path(found).parent if isinstance(found, str) else None


def model_is_here(model: str) -> bool:
    return model in TINY_MODEL_NAMES or model_files(model) is not None


def model_context(config: dict[str, Any]) -> int | None:
    """The longest sequence a model's config.json allows (a VLM's is its text model's)."""
    for source in (config, config.get("text_config") or {}):
        for key in CONTEXT_KEYS:
            value = source.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None


def context_finding(plan: Plan) -> Finding:
    """The run's token limit and the engine's context against the model's own."""
    check = "the model's context"
    where = model_files(plan.model)
    if where is None:
        return Finding(
            check, skipped=f"{plan.model} is not on this machine (a launch downloads it)"
        )
    try:
        config = json.loads((where / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return Finding(check, skipped=f"cannot read {where / 'config.json'}: {exc}")
    context = model_context(config) if isinstance(config, dict) else None
    if context is None:
        return Finding(check, skipped=f"{where / 'config.json'} gives no context length")
    for key, value in (
        (plan.engine_context_key, plan.engine_context),
        ("trainer.args.seq_len", plan.seq_len),
    ):
        if value > context:
            return Finding(
                check,
                problem=f"{key} {value} is over the model's context of {context} tokens "
                f"({where / 'config.json'}); lower it to {context} or less",
            )
    return Finding(check)


@dataclass
class Probe:
    """A need checked in another Python, started now and read by `finding()`."""

    check: str
    process: subprocess.Popen
    read: Any  # (returncode, stdout) -> Finding

    def finding(self, timeout_s: float) -> Finding:
        try:
            out, _ = self.process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            return Finding(self.check, skipped=f"its probe took over {timeout_s:.0f}s")
        return self.read(self.process.returncode, out)


def start_probes(plan: Plan) -> list[Probe]:
    """The machine's needs of this config: CUDA for a CUDA device, vLLM for its engine."""
    args = {k.replace("-", "_"): v for k, v in plan.config.trainer.args.items()}
    python = plan.config.python
    probes = []
    devices = [str(args.get("device", "")), str(args.get("engine_device", ""))]
    cuda_key = next(
        (
            f"trainer.args.{name}"
            for name, value in zip(("device", "engine_device"), devices, strict=True)
            if "cuda" in value
        ),
        None,
    )
    if cuda_key is not None:
        wanted = plan.config.trainer.nproc
        probes.append(
            _probe("CUDA", [python, "-c", CUDA_PROBE], _cuda_reader(cuda_key, wanted, python))
        )
    engine_key, engine_python = _vllm_need(plan, args)
    if engine_key is not None:
        probes.append(
            _probe(
                "vLLM", [engine_python, "-c", VLLM_PROBE], _vllm_reader(engine_key, engine_python)
            )
        )
    return probes


def _vllm_need(plan: Plan, args: dict[str, Any]) -> tuple[str | None, str]:
    """The key that asks for vLLM, and the Python that must import it."""
    if plan.config.engine is not None and plan.config.engine.engine == "vllm":
        return "engine.engine", plan.config.python
    if str(args.get("inference_engine", "")) == "vllm":
        return "trainer.args.inference_engine", str(
            args.get("inference_python") or plan.config.python
        )
    return None, plan.config.python


def _probe(check: str, command: list[str], read: Any) -> Probe:
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    return Probe(check, process, read)


def _cuda_reader(key: str, wanted: int, python: str) -> Any:
    def read(code: int, out: str) -> Finding:
        try:
            version, count = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError, TypeError):
            return Finding(
                "CUDA", problem=f"{key} cuda: {python} cannot import torch", machine=True
            )
        if count < 1:
            return Finding(
                "CUDA",
                problem=f"{key} cuda: torch {version} in {python} finds no CUDA device; run it "
                f"on a GPU machine, or set {key} cpu",
                machine=True,
            )
        if count < wanted:
            return Finding(
                "CUDA",
                problem=f"trainer.nproc {wanted}: torch finds {count} CUDA device(s); "
                f"lower it to {count}",
                machine=True,
            )
        return Finding("CUDA")

    return read


def _vllm_reader(key: str, python: str) -> Any:
    def read(code: int, out: str) -> Finding:
        if code == 0:
            return Finding("vLLM")
        return Finding(
            "vLLM",
            problem=f"{key} vllm: {python} cannot import vllm; install it with "
            "pip install '.[trainer,vllm]' (docs/gpu.md), or point trainer.args.inference_python "
            "at a Python that has it",
            machine=True,
        )

    return read
