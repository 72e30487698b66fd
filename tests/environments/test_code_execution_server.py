"""The code-execution env: the sandboxed harness against real and adversarial answers, the
hub path, and its rows of the env table (`process` and `evaluate` end to end:
tests/environments/test_env_table.py)."""

from __future__ import annotations

import asyncio
import json
import sys
import types

import pytest

from atroposlib.envs import sandbox, sandbox_isolation
from atroposlib.envs.base import APIServerConfig
from atroposlib.envs.data_source import read_jsonl
from atroposlib.envs.sandbox import SandboxLimits, SandboxUnavailable
from environments.code_execution_harness import (
    count_cases,
    extract_code,
    passed_cases,
    run_tests,
)
from environments.code_execution_server import (
    SAMPLE_DIR,
    CodeExecutionConfig,
    CodeExecutionEnv,
)
from tests.support.env_groups import assert_prompt_masked
from tests.support.env_table import EvaluateRow, ProcessRow, Run, chat, scripted
from tests.support.scripted_model import last_turn

ADD = {
    "task_id": "Test/0",
    "prompt": 'def add(a, b):\n    """Return a + b."""\n',
    "canonical_solution": "    return a + b\n",
    "test": "import math\n\n\ndef check(candidate):\n    assert candidate(1, 2) == 3\n"
    "    x = 5\n    assert candidate(x, 1) == 6\n    for i in range(3):\n"
    "        assert candidate(i, i) == 2 * i\n"
    "    assert math.isclose(abs(candidate(0.5, 0.25) - 0.75), 0.0, abs_tol=1e-9)\n",
    "entry_point": "add",
}
LIMITS = SandboxLimits(wall_time_s=10, cpu_time_s=5, memory_mb=512)


def fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}\n```"


RIGHT = fenced("def add(a, b):\n    return a + b")
ANSWERS = {
    "right": (RIGHT, 4),
    "body only": ("    return a + b\n", 4),
    "reasoning then fence": ("<think>try a - b?</think>" + RIGHT, 4),
    "last fence wins": (fenced("def add(a, b):\n    return 0") + "\nFixed:\n" + RIGHT, 4),
    "wrong answer": (fenced("def add(a, b):\n    return a - b"), 0),
    "partly right": (fenced("def add(a, b):\n    return a + b if a < 2 else 0"), 2),
    "exception": (fenced("def add(a, b):\n    raise ValueError('no')"), 0),
    "syntax error": (fenced("def add(a, b) return a + b"), 0),
    "infinite loop": (fenced("def add(a, b):\n    while True:\n        pass"), 0),
    "loop in one case": (
        fenced("def add(a, b):\n    while a == 5:\n        pass\n    return a + b"),
        3,
    ),
    "fake tally": (
        fenced(
            "for i in range(4):\n    print('PASS', i)\nprint('4/4 passed')\n"
            "def add(a, b):\n    return 0"
        ),
        0,
    ),
    "sys.exit(0) at import": (
        fenced("import sys\nsys.exit(0)\ndef add(a, b):\n    return a + b"),
        0,
    ),
    "os._exit(0) at import": (fenced("import os\nos._exit(0)"), 0),
    "os._exit(0) in a case": (fenced("import os\ndef add(a, b):\n    os._exit(0)"), 0),
    "exit in a case": (fenced("def add(a, b):\n    raise SystemExit(0)"), 0),
    "always-equal object": (
        fenced(
            "class Any:\n    def __eq__(self, other):\n        return True\n"
            "    def __sub__(self, other):\n        return 0\n"
            "def add(a, b):\n    return Any()"
        ),
        0,
    ),
    "patched builtins": (
        fenced(
            "import builtins\nbuiltins.abs = lambda x: 0\n"
            "def add(a, b):\n    return a + b if type(a) is int else 9"
        ),
        3,
    ),
    "swapped stdout": (
        fenced("import io, sys\nsys.stdout = io.StringIO()\ndef add(a, b):\n    return a + b"),
        4,
    ),
    "answer only in reasoning": ("<think>" + RIGHT, 0),
    "empty": ("", 0),
    "over-long": (fenced("def add(a, b):\n    return a + b\n" + "# pad\n" * 20000), 4),
    "endless printing": (fenced("def add(a, b):\n    while True:\n        print('x' * 1000)"), 0),
    "correct but prints 70k characters": (
        fenced("def add(a, b):\n    print('x' * 70000)\n    return a + b"),
        4,
    ),
    # The review's attacks (SBX-1, SBX-2): each used to score 1.0 or 0.85.
    "patched zip in the harness loop": (
        fenced(
            "import ast, builtins\nreal_zip = builtins.zip\n"
            "def fake_zip(*lists):\n    for statement, case in real_zip(*lists):\n"
            "        yield ast.parse('pass').body[0], case\n"
            "builtins.zip = fake_zip\ndef add(a, b):\n    return 0"
        ),
        0,
    ),
    "always-equal object behind patched dict": (
        fenced(
            "import builtins\nclass Anything:\n    def __eq__(self, other):\n        return True\n"
            "    def __sub__(self, other):\n        return 0\n"
            "    def items(self):\n        return []\n"
            "builtins.dict = Anything\ndef add(a, b):\n    return Anything()"
        ),
        0,
    ),
    "patched callable, isinstance and TypeError": (
        fenced(
            "import builtins\nbuiltins.callable = lambda value: True\n"
            "builtins.isinstance = lambda *args: True\nbuiltins.TypeError = KeyError\n"
            "def add(a, b):\n    return a - b"
        ),
        0,
    ),
    "tests read from the program, /proc and scratch dirs": (
        fenced(
            "import glob, os, re, sys\ntext = ''\n"
            "paths = [sys.argv[0], *glob.glob('/proc/*/fd/*'), *glob.glob('/proc/*/cmdline')]\n"
            "paths += glob.glob('/tmp/**', recursive=True) + glob.glob('/dev/shm/*')\n"
            "for path in paths:\n    try:\n"
            "        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)\n"
            "        text += os.read(fd, 1 << 20).decode('latin-1')\n    except OSError:\n"
            "        pass\n"
            "table = {(int(a), int(b)): int(c) for a, b, c in "
            "re.findall(r'candidate\\((\\d+), (\\d+)\\) == (\\d+)', text)}\n"
            "def add(a, b):\n    return table.get((a, b), -1)"
        ),
        0,
    ),
}


@pytest.fixture(params=["bubblewrap", "namespaces"])
def limits(request) -> SandboxLimits:
    """LIMITS in each sandbox mode this machine can run (CI runs both)."""
    problem = sandbox._mode_works(request.param)
    if problem is not None:
        pytest.skip(f"the {request.param} sandbox cannot run here: {problem}")
    return LIMITS.model_copy(update={"isolation": request.param})


@pytest.mark.integration
@pytest.mark.parametrize("name", list(ANSWERS))
def test_harness_counts_only_honest_passes(name, limits):
    completion, passed = ANSWERS[name]
    run = asyncio.run(run_tests(completion, ADD, limits, case_timeout_s=0.5))
    assert (run.passed, run.total) == (passed, 4), run.result


@pytest.mark.integration
def test_the_canonical_solution_on_disk_is_out_of_reach(limits):
    """SBX-2: the shipped dataset (and the hub cache) held each answer's canonical solution."""
    problem = read_jsonl(SAMPLE_DIR / "test.jsonl")[0]
    entry = problem["entry_point"]
    steal = fenced(
        "import glob, json\n"
        f"roots = [{str(SAMPLE_DIR)!r}, '/root/.cache', '/home']\n"
        "for root in roots:\n"
        "    for path in glob.glob(root + '/**/*.json*', recursive=True):\n"
        "        try:\n            rows = [json.loads(line) for line in open(path)]\n"
        "        except (OSError, ValueError):\n            continue\n"
        "        for row in rows:\n"
        f"            if isinstance(row, dict) and row.get('entry_point') == {entry!r}:\n"
        "                exec(row['prompt'] + row['canonical_solution'])\n"
    )
    canonical = problem["prompt"] + problem["canonical_solution"]
    honest = asyncio.run(run_tests(canonical, problem, limits))
    stolen = asyncio.run(run_tests(steal, problem, limits))
    assert honest.score == 1.0 and stolen.score == 0.0, stolen.result


@pytest.mark.integration
def test_a_dataset_outside_the_hidden_places_is_out_of_reach_too(limits, tmp_path):
    """SBX-B of the security review: in `namespaces` mode a dataset given as
    `--env.dataset_path` in a world-readable dir outside the project, the cwd and the
    homes (the review's was under /srv) was read by the answer, which scored 1.0 without
    solving anything. The env hides where its dataset and its outputs lie."""
    import os
    import shutil
    import tempfile

    base = "/srv" if os.access("/srv", os.W_OK) else None
    if base is None:
        pytest.skip("needs a writable /srv: a place no sandbox mode hides by itself")
    folder = tempfile.mkdtemp(prefix="atropos-sbx-b-", dir=base)
    try:
        os.chmod(folder, 0o755)
        dataset = os.path.join(folder, "test.jsonl")
        shutil.copy(SAMPLE_DIR / "test.jsonl", dataset)
        os.chmod(dataset, 0o644)
        config = types.SimpleNamespace(
            dataset_path=dataset,
            data_path_to_save_groups=str(tmp_path / "rollouts" / "code.jsonl"),
            data_dir_to_save_evals=str(tmp_path / "evals"),
        )
        hidden = CodeExecutionEnv.answers_on_disk(types.SimpleNamespace(config=config))
        assert folder in hidden and str(tmp_path / "rollouts") in hidden
        problem = read_jsonl(SAMPLE_DIR / "test.jsonl")[0]
        steal = fenced(
            "import json\n"
            f"for line in open({dataset!r}):\n"
            "    row = json.loads(line)\n"
            f"    if row['entry_point'] == {problem['entry_point']!r}:\n"
            "        exec(row['prompt'] + row['canonical_solution'])\n"
        )
        if limits.isolation == "namespaces":  # the attack works where nothing hides it
            assert asyncio.run(run_tests(steal, problem, limits)).score == 1.0
        hiding = limits.model_copy(update={"hidden_paths": hidden})
        assert asyncio.run(run_tests(steal, problem, hiding)).score == 0.0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.integration
def test_assert_true_lines_are_not_cases(limits):
    """SBX-10: HumanEval's `assert True, "..."` lines passed for any candidate."""
    problem = {
        **ADD,
        "test": "def check(candidate):\n    assert True, 'debugging aid'\n"
        "    assert candidate(1, 2) == 3\n    assert True\n    assert candidate(2, 2) == 4\n",
    }
    assert count_cases(problem["test"]) == 2
    run = asyncio.run(run_tests(fenced("def add(a, b):\n    pass"), problem, limits))
    assert (run.passed, run.total) == (0, 2)


def test_only_the_judges_distinct_pass_lines_count():
    assert passed_cases("PASS 0\nPASS 0\nPASS 1\nx PASS 2\nPASS 9\n", 4) == 2
    assert count_cases(ADD["test"]) == 4
    assert extract_code("```py\nx = 1\n```") == "x = 1"


@pytest.mark.integration
def test_every_shipped_canonical_solution_passes_its_tests():
    problems = [p for split in ("train", "test") for p in read_jsonl(SAMPLE_DIR / f"{split}.jsonl")]
    assert len(problems) == 20

    async def all_runs():
        return await asyncio.gather(
            *(run_tests(p["prompt"] + p["canonical_solution"], p, LIMITS) for p in problems)
        )

    for problem, run in zip(problems, asyncio.run(all_runs()), strict=True):
        assert run.passed == run.total >= 3, problem["task_id"]


SCRIPTED = [
    RIGHT,
    ANSWERS["partly right"][0],
    ANSWERS["sys.exit(0) at import"][0],
    ANSWERS["infinite loop"][0],
]


def write_problems(run: Run, *problems: dict) -> str:
    """A dataset of ADD and `problems` in the run's folder."""
    path = run.tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(problem) + "\n" for problem in (ADD, *problems)))
    return str(path)


def check_process(groups: list[dict], run: Run) -> None:
    (group,) = groups
    assert [m[-1]["content"] for m in group["messages"]] == SCRIPTED
    assert_prompt_masked(group, run.tokenizer)


SECOND = {
    **ADD,
    "task_id": "Test/1",
    "prompt": ADD["prompt"].replace("add", "plus"),
    "entry_point": "plus",
}


def eval_policy(messages: list[dict], n: int) -> list[str]:
    text = messages[-1]["content"]
    return [RIGHT if "def add(" in text else fenced("def plus(a, b):\n    return 3")] * n


def check_evaluate(results: dict, samples: list[dict], run: Run) -> None:
    assert results["eval/pass@1"] == 0.5
    assert results["eval/case_pass_rate"] == pytest.approx((1.0 + 0.25) / 2)
    by_id = {s["task_id"]: s for s in samples}
    assert (by_id["Test/1"]["passed_cases"], by_id["Test/1"]["total_cases"]) == (1, 4)


def check_offline(groups: list[dict]) -> None:
    """The documented command on the tiny model: its noise passes no case of the sample."""
    for group in groups:
        assert set(group["scores"]) == {0.0}
        assert "Complete this function" in group["messages"][0][1]["content"]


# The questions every env is asked (tests/environments/test_env_table.py).
PROCESS = ProcessRow(
    env=CodeExecutionEnv,
    model=scripted(
        lambda prompt, n: SCRIPTED[:n] if "def add(" in last_turn(prompt) else ["?"] * n
    ),
    group_size=4,
    steps=1,
    scores=lambda group: [1.0, 0.5, 0.0, 0.0],
    args=lambda run: [
        *("--env.dataset_path", write_problems(run), "--env.case_timeout_s", "0.5"),
        *("--env.max_token_length", "1024", "--env.max_tokens", "128"),
    ],
    check=check_process,
)
EVALUATE = EvaluateRow(
    env=CodeExecutionEnv,
    model=chat(eval_policy),
    samples=2,
    args=lambda run: ["--env.dataset_path", write_problems(run, SECOND)],
    check=check_evaluate,
)
OFFLINE = check_offline


@pytest.fixture
def problems_file(tmp_path):
    path = tmp_path / "problems.jsonl"
    path.write_text(json.dumps(ADD) + "\n")
    return path


def test_hub_rows_load_and_convert(monkeypatch, tiny_model_path):
    calls = []

    def load_dataset(name, subset=None, split=None):
        calls.append((name, subset, split))
        return [ADD]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    config = CodeExecutionConfig(
        data_source="hub", tokenizer_name=str(tiny_model_path), use_wandb=False
    )
    env = CodeExecutionEnv(config, APIServerConfig(model_name="tiny"), testing=True)
    asyncio.run(env.setup())
    assert calls == [("openai/openai_humaneval", None, "test")] * 2
    assert env.train_items[0]["entry_point"] == "add" and env.eval_items[0]["cases"] == 4
    run = asyncio.run(env.judge(RIGHT, env.train_items[0]))
    assert run.score == 1.0


def test_the_env_refuses_to_start_without_bubblewrap_unless_opted_in(
    monkeypatch, tiny_model_path, problems_file
):
    """SBX-4: the default used to fall back to weaker isolation with only a log line."""
    sandbox._mode_works.cache_clear()
    monkeypatch.setattr(sandbox_isolation, "bubblewrap_path", lambda: None)

    def env_with(**fields) -> CodeExecutionEnv:
        config = CodeExecutionConfig(
            dataset_path=str(problems_file),
            tokenizer_name=str(tiny_model_path),
            use_wandb=False,
            **fields,
        )
        return CodeExecutionEnv(config, APIServerConfig(model_name="tiny"), testing=True)

    try:
        with pytest.raises(SandboxUnavailable, match="bubblewrap is not installed"):
            asyncio.run(env_with().setup())
        if sandbox._mode_works("namespaces") is None:
            opted_in = env_with(sandbox="namespaces")
            asyncio.run(opted_in.setup())
            assert asyncio.run(opted_in.judge(RIGHT, opted_in.train_items[0])).score == 1.0
    finally:
        sandbox._mode_works.cache_clear()
