"""The Axolotl plugin's calls against run-api, made by the plugin's own code.

`axolotl-plugin-atropos` (0.0.2, PyPI) registers the trainer with `POST /register` when
Axolotl creates its trainer, and pulls `GET /batch` through its dataset's worker
thread, splitting each group into prompt and completion. Its code is installed without
its dependencies (`scripts/install_venv.sh`, dev: `.venv/axolotl-plugin`); Axolotl itself,
which pins torch 2.6 and vLLM 0.8, cannot run here, so the three names the plugin
imports from it are stand-ins: a base class, a dict with attribute access (Axolotl's
`DictDefault`), and a tokenizer loader.
"""

from __future__ import annotations

import sys
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.groups import make_group
from tests.support.source import REPO

PLUGIN = REPO / ".venv" / "axolotl-plugin"
pytestmark = pytest.mark.integration


class DictDefault(dict):
    """Axolotl's config: keys read as attributes, a missing one as None."""

    def __getattr__(self, name: str):
        return self.get(name)


@pytest.fixture
def plugin(monkeypatch):
    if not (PLUGIN / "plugin_atropos").is_dir():
        pytest.skip("the plugin is installed by scripts/install_venv.sh (the dev extra)")
    pytest.importorskip("datasets")
    pytest.importorskip("tenacity")
    stand_ins = {
        "axolotl": {},
        "axolotl.integrations": {},
        "axolotl.integrations.base": {"BasePlugin": object},
        "axolotl.utils": {},
        "axolotl.utils.dict": {"DictDefault": DictDefault},
        "axolotl.utils.models": {"load_tokenizer": lambda cfg: SimpleNamespace(pad_token_id=0)},
    }
    for name, members in stand_ins.items():
        module = types.ModuleType(name)
        module.__dict__.update(members)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.syspath_prepend(str(PLUGIN))
    for name in [m for m in sys.modules if m.startswith("plugin_atropos")]:
        monkeypatch.delitem(sys.modules, name)
    import plugin_atropos.datasets
    import plugin_atropos.plugin

    return SimpleNamespace(plugin=plugin_atropos.plugin, datasets=plugin_atropos.datasets)


def config(api_url: str, tmp_path: Path) -> DictDefault:
    host, port = api_url.rsplit(":", 1)
    return DictDefault(
        atropos_server_host=host,  # with its scheme: the dataset's /batch call adds none
        atropos_server_port=int(port),
        atropos_starting_step=0,
        wandb_run_group="axolotl",
        wandb_project="plugin-check",
        trl=DictDefault(num_generations=2),
        gradient_accumulation_steps=1,
        world_size=1,
        micro_batch_size=1,
        sequence_len=32,
        output_dir=str(tmp_path / "out"),
        save_steps=10,
        max_steps=3,
    )


def test_the_plugin_registers_and_pulls_a_batch_it_can_split(plugin, api, wire_client, tmp_path):
    cfg = config(api.url, tmp_path)
    plugin.plugin.AtroposPlugin().post_trainer_create(cfg, trainer=None)
    assert wire_client.get("/info").json() == {"batch_size": 2, "max_token_len": 32}
    assert wire_client.get("/wandb_info").json() == {"group": "axolotl", "project": "plugin-check"}

    group = make_group(2, tag=7)
    assert wire_client.post("/scored_data", json=group).status_code == 200
    dataset = plugin.datasets.get_dataset(cfg, pad_token_id=0)
    provider = dataset._ex_iterable.generate_examples_fn.__self__  # to stop its thread
    try:  # the plugin's worker thread asks /batch, retrying for ever on an error
        with ThreadPoolExecutor(1) as pool:
            example = pool.submit(next, iter(dataset)).result(timeout=60)
    finally:
        provider.stop()  # its thread ends now, not at the interpreter's exit
    # one example is the group, a row per sequence: its prompt, and its completion padded
    rows = []
    for prompt, ids, mask in zip(
        example["prompt_ids"], example["completion_ids"], example["completion_mask"], strict=True
    ):
        completion = [int(t) for t, kept in zip(ids, mask, strict=True) if kept]
        rows.append([int(t) for t in prompt] + completion)
    assert rows == group["tokens"]
    # the plugin centres and scales each group's scores itself: 0 and 1 become -1 and 1
    scores = group["scores"]
    mean = sum(scores) / len(scores)
    spread = (sum((x - mean) ** 2 for x in scores) / len(scores)) ** 0.5
    expected = [(x - mean) / spread for x in scores]
    assert example["advantages"].flatten().tolist() == pytest.approx(expected, abs=1e-4)
    assert wire_client.get("/status").json()["queue_size"] == 0, "the batch was served"
