"""Where a library env's rows come from: the shipped sample, a local file, or the hub."""

from __future__ import annotations

import json
import sys
import types

import pytest

from atroposlib.envs.data_source import DataSourceConfig, DataSourceError, load_rows


def write_rows(path, rows) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.fixture
def sample_dir(tmp_path):
    folder = tmp_path / "sample"
    folder.mkdir()
    write_rows(folder / "train.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(5)])
    return folder


@pytest.fixture
def fake_hub(monkeypatch):
    """A `datasets` module whose load_dataset records its call (a hub download is mocked)."""
    calls = []

    def load_dataset(name, subset=None, split=None):
        calls.append((name, subset, split))
        return [{"question": "from the hub", "answer": "7"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    return calls


def test_the_sample_is_the_default_and_needs_no_network(sample_dir, fake_hub):
    rows = load_rows(DataSourceConfig(hub_dataset="openai/gsm8k"), "train", sample_dir)
    assert [row["question"] for row in rows] == ["q0", "q1", "q2", "q3", "q4"]
    assert fake_hub == []


def test_the_hub_is_read_when_asked_with_the_hub_split_name(sample_dir, fake_hub):
    config = DataSourceConfig(data_source="hub", hub_dataset="cais/mmlu", hub_subset="all")
    rows = load_rows(config, "train", sample_dir, hub_split="auxiliary_train")
    assert rows == [{"question": "from the hub", "answer": "7"}]
    assert fake_hub == [("cais/mmlu", "all", "auxiliary_train")]


def test_a_local_file_overrides_both_and_max_rows_caps(tmp_path, sample_dir, fake_hub):
    local = tmp_path / "mine.jsonl"
    write_rows(local, [{"question": "mine", "answer": str(i)} for i in range(4)])
    config = DataSourceConfig(data_source="hub", dataset_path=str(local), max_rows=2)
    assert [row["answer"] for row in load_rows(config, "test", sample_dir)] == ["0", "1"]
    assert fake_hub == []


def test_bad_input_gets_errors_that_say_what_to_fix(tmp_path, sample_dir, monkeypatch):
    with pytest.raises(DataSourceError, match="no such dataset file: .*test.jsonl"):
        load_rows(DataSourceConfig(), "test", sample_dir)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"ok": 1}\n{not json\n')
    with pytest.raises(DataSourceError, match="broken.jsonl:2: not JSON"):
        load_rows(DataSourceConfig(dataset_path=str(broken)), "train", sample_dir)
    broken.write_text("[1, 2]\n")
    with pytest.raises(DataSourceError, match="must be a JSON object"):
        load_rows(DataSourceConfig(dataset_path=str(broken)), "train", sample_dir)
    broken.write_text("\n")
    with pytest.raises(DataSourceError, match="has no rows"):
        load_rows(DataSourceConfig(dataset_path=str(broken)), "train", sample_dir)
    with pytest.raises(DataSourceError, match="hub_dataset is empty"):
        load_rows(DataSourceConfig(data_source="hub"), "train", sample_dir)


def test_a_hub_failure_names_the_dataset_and_the_offline_switch(sample_dir, monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("no route to huggingface.co")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    config = DataSourceConfig(data_source="hub", hub_dataset="openai/gsm8k", hub_subset="main")
    with pytest.raises(DataSourceError, match="'openai/gsm8k'.*--env.data_source sample"):
        load_rows(config, "train", sample_dir)
