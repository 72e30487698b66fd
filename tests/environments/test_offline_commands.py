"""Each env's documented offline command runs as written on the tiny model.

The command is read from the env's docstring: the one `python environments/<script>
process|evaluate` line that names `--openai.model_name tiny`, with the
`atropos-inference-server` line of its block, if any, saying how the tiny model is served
(a longer `--max-model-len` where the prompts outgrow its 512 tokens). So the doc and this
test cannot drift. It runs in a scratch directory where `environments/` and `./tiny-model`
are links to the real ones, against a real server: only the doc's port 9001 is replaced.

This is each env's one run as a process (the CLI contract); its other runs are in-process
rows of test_env_table.py. The groups a `process` command writes are checked for the shape
every env's must have (`check_shape`), and by the env's own `OFFLINE` check where its test
module has one: the tiny model's noise must still score within the env's reward.
"""

from __future__ import annotations

import ast
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.compat_runs import env_vars, failure, read_jsonl
from tests.support.env_table import check_shape, offline_check
from tests.support.library_envs import LIBRARY, env_scripts
from tests.support.processes import InferenceProcess

pytestmark = pytest.mark.integration

DOC_ADDRESS = "127.0.0.1:9001"
PROGRAMS = {"python", "atropos-inference-server"}
SERVED = {"--model": "./tiny-model", "--port": "9001", "--served-model-name": "tiny"}


def doc_blocks(script: Path) -> list[list[list[str]]]:
    """The docstring's indented blocks, each a list of commands (argv lists)."""
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    blocks: list[list[str]] = [[]]
    for line in doc.splitlines():
        if line.startswith("    "):
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    commands = []
    for block in blocks:
        lines = "\n".join(block).replace("\\\n", " ").splitlines()
        commands.append([shlex.split(line) for line in lines if set(line.split()[:1]) & PROGRAMS])
    return commands


def offline_command(script: Path) -> tuple[list[str], list[str]]:
    """(the server's flags beyond the usual three, the env's argv) of the tiny-model block."""
    found = []
    for block in doc_blocks(script):
        for argv in block:
            if (
                argv[:2] == ["python", f"environments/{script.name}"]
                and argv[2] in {"process", "evaluate"}
                and "--openai.model_name tiny" in " ".join(argv)
            ):
                servers = [a for a in block if a[0] == "atropos-inference-server"]
                found.append((servers, argv))
    assert len(found) == 1, f"{script.name}: one offline command on the tiny model, got {found}"
    servers, argv = found[0]
    extra: list[str] = []
    for server in servers:
        flags = [a for a in server[1:] if a != "&"]
        pairs = dict(zip(flags[::2], flags[1::2], strict=True))
        assert {k: pairs.pop(k, None) for k in SERVED} == SERVED, server
        extra += [part for pair in sorted(pairs.items()) for part in pair]
    return extra, argv


@pytest.fixture(scope="module")
def tiny_servers(inference_server, tiny_model_path, tmp_path_factory) -> Iterator:
    """The tiny model served with the given extra flags: the session's server for none."""
    started: dict[tuple[str, ...], InferenceProcess] = {}

    def get(extra: list[str]) -> InferenceProcess:
        if not extra:
            return inference_server
        if tuple(extra) not in started:
            folder = tmp_path_factory.mktemp("offline-inference")
            started[tuple(extra)] = InferenceProcess(tiny_model_path, folder, "tiny", *extra)
        return started[tuple(extra)]

    yield get
    for server in started.values():
        server.stop()


def run_as_written(
    argv: list[str], server: InferenceProcess, model: Path, workdir: Path
) -> subprocess.CompletedProcess:
    """`argv` from the doc, in `workdir` beside links to the library and the tiny model."""
    (workdir / "environments").symlink_to(LIBRARY)
    (workdir / "tiny-model").symlink_to(model)
    address = server.url.removeprefix("http://")
    args = [arg.replace(DOC_ADDRESS, address) for arg in argv[1:]]
    return subprocess.run(
        [sys.executable, *args],
        cwd=workdir,
        env=env_vars(workdir),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("script", env_scripts(), ids=lambda path: path.stem)
def test_the_documented_offline_command_runs_as_written(
    script, tiny_servers, tiny_model_path, tmp_path
):
    extra, argv = offline_command(script)
    done = run_as_written(argv, tiny_servers(extra), tiny_model_path, tmp_path)
    assert done.returncode == 0, failure(done)
    assert "Traceback" not in done.stdout + done.stderr, failure(done)
    if argv[2] == "process":
        written = [p for p in (tmp_path / "data").glob("*.jsonl") if p.stat().st_size]
        assert written, f"no groups written: {failure(done)}"
        groups = [group for path in written for group in read_jsonl(path)]
        size = int(argv[argv.index("--env.group_size") + 1]) if "--env.group_size" in argv else 0
        for group in groups:
            check_shape(group, size or len(group["tokens"]))
        offline_check(script.stem)(groups)
    else:
        evals = argv[argv.index("--env.data_dir_to_save_evals") + 1]
        assert (tmp_path / evals / "metrics.json").is_file(), failure(done)


def without_flag(argv: list[str], flag: str) -> list[str]:
    at = argv.index(flag)
    return argv[:at] + argv[at + 2 :]


def test_a_context_refusal_is_one_line_for_the_env_not_one_per_item(
    inference_server, tiny_model_path, tmp_path
):
    """gsm8k's documented command with its default max_tokens (1024), which the tiny
    model's 512-token context cannot hold beside any prompt: every item is refused."""
    _, argv = offline_command(LIBRARY / "gsm8k_server.py")
    done = run_as_written(
        without_flag(argv, "--env.max_tokens"), inference_server, tiny_model_path, tmp_path
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, failure(done)
    assert "Traceback" not in output, failure(done)
    refusals = [line for line in output.splitlines() if "does not fit the model's context" in line]
    assert len(refusals) == 1, failure(done)
    assert "ERROR atroposlib.envs: gsm8k: a prompt of " in refusals[0]
    assert "plus max_tokens 1024 does not fit the model's context of 512 tokens" in refusals[0]
    assert "lower --env.max_tokens to " in refusals[0]
    summary = output.strip().splitlines()[-1]
    items = int(summary.split("no rollout was kept out of ")[1].split()[0])
    steps = int(argv[argv.index("--env.total_steps") + 1])
    assert items == 10 * steps and f"{items} failed, {items} of them refused" in summary, summary


def test_a_context_refusal_ends_evaluate_with_its_one_line(
    inference_server, tiny_model_path, tmp_path
):
    """The same command as `evaluate`: its evaluation fails on the first refused item, and
    the command ends on the refusal's line, not a traceback."""
    _, argv = offline_command(LIBRARY / "gsm8k_server.py")
    argv = without_flag(argv, "--env.max_tokens")
    argv[2] = "evaluate"
    done = run_as_written(argv, inference_server, tiny_model_path, tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 1, failure(done)
    assert "Traceback" not in output, failure(done)
    last = output.strip().splitlines()[-1]
    assert last.startswith("gsm8k_server.py evaluate: gsm8k: a prompt of "), failure(done)
    assert "plus max_tokens 1024 does not fit the model's context of 512 tokens" in last
    assert "lower --env.max_tokens to " in last
