#!/usr/bin/env bash
# Install atroposlib with EXTRAS into .venv at the versions in scripts/constraints.txt,
# unless .venv already matches them (scripts/venv_matches.py). Used by quickstart.sh
# and test.sh.
#
#   bash scripts/install_venv.sh EXTRAS      # e.g. inference,trainer
#
# pip installs uv; uv installs torch (the CPU build from local disk where one lies there,
# as on the development machine) and the rest, at the same pins. From empty
# caches, test.sh's two installs (this venv and .venv-vllm, side by side) took 57-67 s,
# against 101 s and 119 s when pip installed everything.
# Neither compiles bytecode: compiling every installed module took half of a 106 s
# install, and most of those modules never run. Python caches a module's bytecode the
# first time it is imported; the modules every run imports are imported once here, so
# that a shell with PYTHONDONTWRITEBYTECODE set does not compile them at each process
# start.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=${1:?usage: bash scripts/install_venv.sh EXTRAS}
# pip runs quietly; one line before each phase says what the wait is for
say() { echo "[install] $*"; }
if [ ! -x .venv/bin/python ]; then
    say "creating .venv"
    python3 -m venv .venv
fi
PYTHON=.venv/bin/python
if "$PYTHON" scripts/venv_matches.py "$EXTRAS"; then
    say ".venv matches scripts/constraints.txt; nothing to install"
    exit 0
fi
SECONDS=0
say "installing into .venv (first run: about a minute)..."
PIP=("$PYTHON" -m pip install -q --disable-pip-version-check --no-compile)
# exact versions from scripts/constraints.txt: what the README's numbers were measured with
PIN=(-c scripts/constraints.txt)
say "uv, then torch 2.13.0, the CPU build (the largest download)"
"${PIP[@]}" uv "${PIN[@]}"
UV=(.venv/bin/uv pip install -q --python "$PYTHON")
# torch first and pinned: the CPU build on local disk (an unpinned torch pulls a CUDA
# build), found where pip finds it ($PIP_FIND_LINKS, which uv does not read itself).
# uv unpacks it in 4 s of wall time where pip took 18.
FIND_LINKS=()
for links in ${PIP_FIND_LINKS:-}; do FIND_LINKS+=(--find-links "$links"); done
"${UV[@]}" "${FIND_LINKS[@]}" torch==2.13.0 "${PIN[@]}"
say "atroposlib[$EXTRAS] and its dependencies"
"${UV[@]}" pip -e ".[$EXTRAS]" "${PIN[@]}"
# The tests grade IFEval with lm-eval's own checkers (the `ifeval` extra). Its harness
# pulls scikit-learn and scipy, and with scipy installed every transformers model load
# imports scipy.optimize (1 s of CPU, in each of the suite's hundreds of processes). The
# IFEval modules need only these, so the dev venv takes them without their dependencies.
if [[ ",$EXTRAS," == *",dev,"* ]]; then
    say "the dev extras: lm-eval's IFEval checkers, upstream's rewards in .venv/reference"
    "${UV[@]}" --no-deps lm-eval langdetect immutabledict sacrebleu portalocker colorama \
        lxml tabulate "${PIN[@]}"
    # upstream Atropos's rewards, the reference for the upstream-named ones (see the file)
    rm -rf .venv/reference
    "${UV[@]}" --no-deps --target .venv/reference -r scripts/constraints-reference.txt \
        "${PIN[@]}"
    # the Axolotl plugin's own code, whose calls tests/compat/test_axolotl_plugin.py makes
    # against run-api; without axolotl, vLLM and the torch 2.6 it pins
    rm -rf .venv/axolotl-plugin
    "${UV[@]}" --no-deps --target .venv/axolotl-plugin axolotl-plugin-atropos "${PIN[@]}"
    # the quickstart's task as a verifiers environment (tests/environments/
    # test_verifiers_server.py, configs/verifiers_cpu.yaml), editable: it is this repo's
    "${UV[@]}" --no-deps -e ./environments/vf_mod_arithmetic "${PIN[@]}"
fi
say "caching the bytecode of the modules every run imports"
env -u PYTHONDONTWRITEBYTECODE "$PYTHON" -c '
import importlib
for name in ("atroposlib.cli.launch", "atroposlib.cli.run_api", "atroposlib.envs.base",
             "atroposlib.cli.inference_server", "example_trainer.grpo",
             "transformers.models.llama.modeling_llama"):
    importlib.import_module(name)
'
"$PYTHON" scripts/venv_matches.py "$EXTRAS" --write
say "done in ${SECONDS}s"
