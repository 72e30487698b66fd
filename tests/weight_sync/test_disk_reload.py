"""Hot weight reload on a real `atropos-inference-server` serving the tiny model.

One server process, guarded by both an API key and a weight sync key (both from the
environment, as the trainer hands them over), takes the reloads. That the reload is
off without a sync key, whether or not there is an API key, is the app's decision, not
the process's: the server's app in this process (`in_process`) shows it.
Checkpoints are built here: the tiny model with noise added, one of another hidden
size, and a truncated copy. Logprobs are checked against a transformers forward
pass on the checkpoint each answer says it came from.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from starlette.testclient import TestClient  # noqa: E402

from atroposlib.inference.launcher import EngineConfig, engine_command  # noqa: E402
from atroposlib.utils.ports import free_port  # noqa: E402
from atroposlib.utils.processes import log_tail, spawn, stop_group  # noqa: E402
from atroposlib.utils.waiting import answers_200  # noqa: E402
from tests.support.tolerances import SAME_LIBRARY_LOGPROB_REL, logprob_tolerance  # noqa: E402
from tests.support.waiting import wait_until, wait_until_async  # noqa: E402

API_KEY = "engine-key"
SYNC_KEY = "sync-key"
API = {"Authorization": f"Bearer {API_KEY}"}
SYNC = {"Authorization": f"Bearer {SYNC_KEY}"}
PROMPT = "<|im_start|>system\nAnswer with one digit.<|im_end|>\n<|im_start|>user\nWhat is 3"


# ------------------------------------------------------------------ checkpoints
def noisy_copy(base: Path, target: Path, seed: int) -> Path:
    """The base model with every weight moved by noise: same shapes, other answers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(base).save_pretrained(target)
    return target


def other_shape(base: Path, target: Path) -> Path:
    """A model of the same family and vocabulary with another hidden size."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(base)
    config.hidden_size, config.head_dim = 48, 16
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(target)
    return target


def altered(source: Path, target: Path, change) -> Path:
    """A copy of `source` whose first weight matrix is `change(tensor)` (ENG-2's cases)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    weights = target / "model.safetensors"
    tensors = load_file(weights)
    name = next(n for n, t in tensors.items() if t.dim() == 2)
    tensors[name] = change(tensors[name])
    save_file(tensors, weights, metadata={"format": "pt"})
    return target


def with_a_nan(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.clone()
    tensor[0, 0] = float("nan")
    return tensor


def truncated(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    weights = target / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    return target


@pytest.fixture(scope="module")
def checkpoints(tiny_model_path, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    noisy = noisy_copy(Path(tiny_model_path), root / "noisy", seed=1)
    return {
        "base": Path(tiny_model_path),
        "noisy": noisy,
        "other": noisy_copy(Path(tiny_model_path), root / "other-noise", seed=2),
        "shape": other_shape(Path(tiny_model_path), root / "shape"),
        "truncated": truncated(noisy, root / "truncated"),
        "nan": altered(noisy, root / "nan", with_a_nan),
        "integers": altered(noisy, root / "integers", lambda t: t.round().to(torch.int64)),
    }


@pytest.fixture(scope="module")
def reference(checkpoints):
    """Transformers models of the checkpoints, loaded once each."""
    from transformers import AutoModelForCausalLM

    loaded: dict[Path, torch.nn.Module] = {}

    def model(path: Path) -> torch.nn.Module:
        if path not in loaded:
            loaded[path] = AutoModelForCausalLM.from_pretrained(path).eval()
        return loaded[path]

    return model


# ------------------------------------------------------------------ servers
NO_KEYS = {
    name: "" for name in ("ATROPOS_WEIGHT_SYNC_KEY", "ATROPOS_ENGINE_API_KEY", "VLLM_API_KEY")
}
"""Empty values count as unset: a developer's keys must not guard the unguarded servers."""


class Server:
    """An `atropos-inference-server` process (spawned from the main thread: the child dies
    with the thread that spawned it)."""

    def __init__(self, model: Path, log: Path, env: dict[str, str]) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        config = EngineConfig(
            engine="transformers",
            served_model_name="tiny",
            port=int(self.url.rsplit(":", 1)[1]),
            extra_args=["--num-threads", "1"],
        )
        self.log = log
        with open(log, "ab") as out:
            self.proc = spawn(
                engine_command(config, "transformers", str(model)), out, {**os.environ, **env}
            )

    def healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the server exited:\n{log_tail(self.log)}")
        return answers_200(f"{self.url}/health")

    def stop(self) -> None:
        stop_group(self.proc, 10)


@pytest.fixture(scope="module")
def engine(tiny_model_path, tmp_path_factory) -> Iterator[Server]:
    """The server that takes the reloads: its keys and first version come from the
    environment, as the trainer sets them (argv is public)."""
    env = {
        **NO_KEYS,
        "ATROPOS_ENGINE_API_KEY": API_KEY,
        "ATROPOS_WEIGHT_SYNC_KEY": SYNC_KEY,
        "ATROPOS_WEIGHT_VERSION": "base",
    }
    log = tmp_path_factory.mktemp("engines") / "synced.log"
    server = Server(Path(tiny_model_path), log, env)
    try:
        wait_until(server.healthy, 120, "the synced server did not come up")
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def in_process(model: Path, api_key: str | None) -> Iterator[TestClient]:
    """atropos-inference-server's app on `model` in this process, with no sync key."""
    from atroposlib.inference.sampler import TransformersSampler
    from atroposlib.inference.server import create_inference_app

    app = create_inference_app(TransformersSampler.load(str(model)), "tiny", api_key=api_key)
    # runs the lifespan (the batch scheduler); a local Host, as the guard asks of a keyless one
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client


def reload(engine: Server, path, version: str | None, headers=SYNC) -> httpx.Response:
    body = {"model_path": str(path), "weight_version": version}
    return httpx.post(
        f"{engine.url}/update_weights_from_disk", json=body, headers=headers, timeout=60
    )


def prompt_ids(engine: Server) -> list[int]:
    answer = httpx.post(f"{engine.url}/tokenize", json={"prompt": PROMPT}, headers=API, timeout=30)
    return answer.json()["tokens"]


def greedy(engine: Server, ids: list[int], max_tokens: int = 8, **extra) -> dict:
    """A greedy completion from token ids, answered with token ids and their logprobs."""
    body = {
        "model": "tiny",
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "ignore_eos": True,
        **extra,
    }
    answer = httpx.post(f"{engine.url}/v1/completions", json=body, headers=API, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()


def generated(choice: dict) -> list[int]:
    return [int(t.split(":", 1)[1]) for t in choice["logprobs"]["tokens"]]


def assert_logprobs_of(model: torch.nn.Module, ids: list[int], choice: dict) -> None:
    """The choice's tokens and logprobs are what `model` gives them (greedy: its argmax)."""
    tokens = generated(choice)
    with torch.no_grad():
        logits = model(torch.tensor([ids + tokens])).logits[0].float()
    reference = torch.log_softmax(logits, -1)
    tolerance = logprob_tolerance(logits, SAME_LIBRARY_LOGPROB_REL)
    for k, token in enumerate(tokens):
        row = reference[len(ids) - 1 + k]
        assert abs(row[token].item() - choice["logprobs"]["token_logprobs"][k]) <= tolerance
        assert row[token].item() >= row.max().item() - tolerance, "not the greedy token"


def spans(version: str, tokens: int) -> list[dict]:
    return [{"version": version, "start": 0, "end": tokens}]


def weight_version(engine: Server) -> str | None:
    answer = httpx.get(f"{engine.url}/weight_info", headers=API, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["weight_version"]


# ------------------------------------------------------------------ tests
def test_the_version_from_the_environment_labels_every_answer(engine):
    assert weight_version(engine) == "base"
    choice = greedy(engine, prompt_ids(engine), 4)["choices"][0]
    assert choice["weight_versions"] == spans("base", 4)


def test_a_reload_serves_the_new_weights_under_the_same_name(engine, checkpoints, reference):
    ids = prompt_ids(engine)
    assert reload(engine, checkpoints["base"], "0").status_code == 200
    before = greedy(engine, ids)["choices"][0]
    assert_logprobs_of(reference(checkpoints["base"]), ids, before)

    answer = reload(engine, checkpoints["noisy"], "7")
    assert answer.status_code == 200, answer.text
    assert answer.json()["success"] is True and answer.json()["weight_version"] == "7"
    assert weight_version(engine) == "7"

    completion = greedy(engine, ids)
    after = completion["choices"][0]
    assert_logprobs_of(reference(checkpoints["noisy"]), ids, after)
    assert after["logprobs"]["token_logprobs"] != before["logprobs"]["token_logprobs"]
    assert after["weight_versions"] == spans("7", 8)
    assert completion["model"] == "tiny"
    models = httpx.get(f"{engine.url}/v1/models", headers=API, timeout=30).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]

    chat = httpx.post(
        f"{engine.url}/v1/chat/completions",
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "What is 2 + 2?"}],
            "max_tokens": 5,
            "n": 3,
            "temperature": 1.0,
            "seed": 3,
            "logprobs": True,
        },
        headers=API,
        timeout=60,
    ).json()
    assert chat["model"] == "tiny" and len(chat["choices"]) == 3
    for choice in chat["choices"]:
        assert choice["weight_versions"] == spans("7", len(choice["logprobs"]["content"]))

    sampled = httpx.post(
        f"{engine.url}/generate",
        json={"prompt": {"prompt_token_ids": ids}, "max_tokens": 5, "n": 2, "temperature": 1.0},
        headers=API,
        timeout=60,
    ).json()
    assert len(sampled["weight_versions"]) == 2
    for tokens, versions in zip(sampled["token_ids"], sampled["weight_versions"], strict=True):
        assert versions == spans("7", len(tokens))


def test_requests_in_flight_finish_on_one_version(engine, checkpoints, reference):
    """A reload waits for the round in flight; requests queued behind it get the new weights."""
    assert reload(engine, checkpoints["noisy"], "a").status_code == 200
    ids = prompt_ids(engine)
    metrics_url = f"{engine.url}/metrics"

    def requests_taken() -> int:
        text = httpx.get(metrics_url, headers=API, timeout=30).text
        line = next(
            x for x in text.splitlines() if x.startswith("atropos_inference_requests_total")
        )
        return int(line.split()[1])

    async def scenario() -> tuple[list[httpx.Response], httpx.Response, list[httpx.Response]]:
        body = {
            "model": "tiny",
            "max_tokens": 300,
            "temperature": 0,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "ignore_eos": True,
        }
        async with httpx.AsyncClient(base_url=engine.url, headers=API, timeout=120) as client:
            taken = requests_taken()
            first = [
                asyncio.create_task(
                    client.post("/v1/completions", json={**body, "prompt": ids[:n]})
                )
                for n in range(len(ids) - 4, len(ids) + 1)
            ]
            await wait_until_async(lambda: requests_taken() > taken, 30, "no round started")
            swap = asyncio.create_task(
                client.post(
                    "/update_weights_from_disk",
                    json={"model_path": str(checkpoints["other"]), "weight_version": "b"},
                    headers=SYNC,
                )
            )
            beside = [
                asyncio.create_task(
                    client.post("/v1/completions", json={**body, "prompt": ids, "max_tokens": 20})
                )
                for _ in range(3)
            ]
            swapped = await swap
            later = [
                await client.post("/v1/completions", json={**body, "prompt": ids, "max_tokens": 10})
            ]
            return await asyncio.gather(*first, *beside), swapped, later

    during, swapped, after = asyncio.run(scenario())
    assert swapped.status_code == 200, swapped.text
    models = {"a": checkpoints["noisy"], "b": checkpoints["other"]}
    seen = []
    for response in during + after:
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        (span,) = choice["weight_versions"]
        assert span["start"] == 0 and span["end"] == len(generated(choice))
        sent = json.loads(response.request.content)["prompt"]
        assert_logprobs_of(reference(models[span["version"]]), sent, choice)
        seen.append(span["version"])
    assert "a" in seen[: len(during)], "the round in flight did not finish on the old weights"
    assert seen[len(during) :] == ["b"], "a request after the reload got the old weights"


def test_the_reload_needs_the_sync_key(engine, checkpoints):
    assert reload(engine, checkpoints["base"], "k").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, API):
        refused = reload(engine, checkpoints["noisy"], "stolen", headers)
        assert refused.status_code == 401 and "key" in refused.text, refused.text
    assert weight_version(engine) == "k"
    # the sync key is for the reload only: every other route still wants the API key
    for headers in ({}, SYNC):
        assert httpx.get(f"{engine.url}/weight_info", headers=headers).status_code == 401


@pytest.mark.parametrize(
    ("checkpoint", "message"),
    [
        ("missing", "no such checkpoint"),
        ("empty", "holds no"),
        ("shape", "shapes differ"),
        ("truncated", "unreadable"),
        ("nan", "hold NaN or infinity"),  # ENG-2: taken, then every request failed
        ("integers", "dtypes differ in kind"),  # ENG-2: cast silently
    ],
)
def test_a_bad_checkpoint_is_refused_and_the_old_weights_serve(
    engine, checkpoints, tmp_path, checkpoint, message
):
    assert reload(engine, checkpoints["noisy"], "good").status_code == 200
    ids = prompt_ids(engine)
    before = greedy(engine, ids)["choices"][0]
    path = {
        "missing": tmp_path / "nowhere",
        "empty": tmp_path,
        **checkpoints,
    }[checkpoint]
    refused = reload(engine, path, "bad")
    assert refused.status_code == 400, refused.text
    assert refused.json()["success"] is False
    assert (
        message in refused.json()["message"] and "old ones still serve" in refused.json()["message"]
    )
    assert "Traceback" not in refused.text
    assert weight_version(engine) == "good"
    after = greedy(engine, ids)["choices"][0]
    assert after["logprobs"] == before["logprobs"]
    assert after["weight_versions"] == spans("good", 8)


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        b"{}",
        b'{"model_path": ""}',
        b'{"model_path": 5}',
        b'{"model_path": "/x", "weight_version": ["1"]}',
        b'{"model_path": "/x", "surprise": 1}',
        b'{"model_path": "/x", "abort_all_requests": true}',
    ],
)
def test_a_malformed_body_is_a_400(engine, body):
    answer = httpx.post(
        f"{engine.url}/update_weights_from_disk",
        content=body,
        headers={**SYNC, "content-type": "application/json"},
        timeout=30,
    )
    assert answer.status_code == 400, answer.text
    assert "Traceback" not in answer.text
    # without the key the answer is 401 before the body is read: the caller learns
    # nothing of the route's schema (it was a 400 naming the fields)
    stranger = httpx.post(
        f"{engine.url}/update_weights_from_disk",
        content=body,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert stranger.status_code == 401, stranger.text


def test_without_any_key_the_reload_is_off(tiny_model_path, tmp_path):
    with in_process(Path(tiny_model_path), api_key=None) as server:
        refused = server.post(
            "/update_weights_from_disk",
            json={"model_path": str(tmp_path / "nowhere"), "weight_version": "x"},
        )
        assert refused.status_code == 403, refused.text
        assert "--weight-sync-key" in refused.json()["message"]
        assert server.get("/weight_info").json() == {"weight_version": None}
        choice = server.post(
            "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}
        ).json()["choices"][0]
        assert "weight_versions" not in choice, "no version given, so none is claimed"


def test_the_api_key_alone_never_opens_the_reload(tiny_model_path, checkpoints):
    """ENG-A of the security review, on the CPU engine: with no sync key the engine's API
    key, which every environment holds to sample, opened the reload."""
    with in_process(Path(tiny_model_path), api_key=API_KEY) as server:
        body = {"model_path": str(checkpoints["noisy"]), "weight_version": "3"}
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            refused = server.post("/update_weights_from_disk", json=body, headers=headers)
            assert refused.status_code == 401, refused.text
        refused = server.post("/update_weights_from_disk", json=body, headers=API)
        assert refused.status_code == 403 and "--weight-sync-key" in refused.text, refused.text
        assert server.get("/weight_info", headers=API).json() == {"weight_version": None}
