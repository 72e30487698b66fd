"""The two tools' command lines: upstream's flags, and clear errors before any page starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from atroposlib.cli import view_run, view_run_multimodal
from atroposlib.utils.ports import free_port
from atroposlib.viewer.settings import MultimodalViewRunSettings, ViewRunSettings

UPSTREAM_FLAGS = ("--port", "--group-size", "--max-token-len", "--tokenizer")


@pytest.mark.parametrize(
    ("module", "tokenizer"),
    [
        (view_run, "NousResearch/DeepHermes-3-Llama-3-8B-Preview"),
        (view_run_multimodal, "Qwen/Qwen2-VL-2B-Instruct"),
    ],
)
def test_help_lists_upstreams_flags_and_defaults(module, tokenizer):
    text = module.build_parser().format_help()
    for flag in (*UPSTREAM_FLAGS, "--api-url", "--host"):
        assert flag in text
    assert tokenizer in text and "7860" in text and "2048" in text and "'127.0.0.1'" in text


def test_defaults_match_upstream_but_the_port():
    """Upstream's page port, 9001, is the inference engine's: ours is Gradio's 7860."""
    settings = ViewRunSettings()
    assert (settings.port, settings.group_size, settings.max_token_len) == (7860, 2, 2048)
    assert settings.batch_size == 16 and settings.host == "127.0.0.1"
    assert settings.api_url == "http://localhost:8000"
    assert MultimodalViewRunSettings().tokenizer == "Qwen/Qwen2-VL-2B-Instruct"


def test_bad_flag_value_names_the_flag(capsys):
    with pytest.raises(SystemExit) as stop:
        view_run.main(["--group-size", "0"])
    assert stop.value.code == 2
    assert "--group-size" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.parametrize("module", ["view_run", "view_run_multimodal"])
def test_a_tokenizer_that_cannot_be_loaded_stops_the_tool(module, tmp_path):
    missing = tmp_path / "no-such-tokenizer"
    port = str(free_port())  # the page's port is bound first: 7860 may be taken here
    command = [sys.executable, "-m", f"atroposlib.cli.{module}", "--tokenizer", str(missing)]
    done = subprocess.run(
        [*command, "--port", port],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    tool = module.replace("_", "-")
    said = f"{tool}: error: cannot load the tokenizer '{missing}' given by --tokenizer ("
    assert done.stderr.startswith(said) and done.stderr.count("\n") == 1, done.stderr
