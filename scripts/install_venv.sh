#!/usr/bin/env bash
# Install atroposlib with EXTRAS into .venv at the versions in scripts/constraints.txt,
# unless .venv already matches them (scripts/venv_matches.py). Used by quickstart.sh
# and test.sh.
#
#   bash scripts/install_venv.sh EXTRAS      # e.g. inference,trainer
#
# pip runs with --no-compile: compiling every installed module's bytecode took half of
# a 106 s install from an empty cache, and most of those modules never run. Python
# caches a module's bytecode the first time it is imported; the modules every run
# imports are imported once here, so that a shell with PYTHONDONTWRITEBYTECODE set
# does not compile them at each process start.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=${1:?usage: bash scripts/install_venv.sh EXTRAS}
[ -x .venv/bin/python ] || python3 -m venv .venv
PYTHON=.venv/bin/python
if "$PYTHON" scripts/venv_matches.py "$EXTRAS"; then
    echo "install_venv: .venv matches scripts/constraints.txt; no pip install"
    exit 0
fi
PIP=("$PYTHON" -m pip install -q --disable-pip-version-check --no-compile)
# exact versions from scripts/constraints.txt: what the README's numbers were measured with
PIN=(-c scripts/constraints.txt)
"${PIP[@]}" --upgrade pip "${PIN[@]}"
# torch first and pinned: the CPU build on local disk (an unpinned torch pulls a CUDA build)
"${PIP[@]}" torch==2.13.0 "${PIN[@]}"
"${PIP[@]}" -e ".[$EXTRAS]" "${PIN[@]}"
# The tests grade IFEval with lm-eval's own checkers (the `ifeval` extra). Its harness
# pulls scikit-learn and scipy, and with scipy installed every transformers model load
# imports scipy.optimize (1 s of CPU, in each of the suite's hundreds of processes). The
# IFEval modules need only these, so the dev venv takes them without their dependencies.
if [[ ",$EXTRAS," == *",dev,"* ]]; then
    "${PIP[@]}" --no-deps lm-eval langdetect immutabledict sacrebleu portalocker colorama \
        lxml tabulate "${PIN[@]}"
    # upstream Atropos's rewards, the reference for the upstream-named ones (see the file)
    rm -rf .venv/reference
    "${PIP[@]}" --no-deps --target .venv/reference -r scripts/constraints-reference.txt \
        "${PIN[@]}"
fi
env -u PYTHONDONTWRITEBYTECODE "$PYTHON" -c '
import importlib
for name in ("atroposlib.cli.launch", "atroposlib.cli.run_api", "atroposlib.envs.base",
             "atroposlib.cli.inference_server", "example_trainer.grpo",
             "transformers.models.llama.modeling_llama"):
    importlib.import_module(name)
'
"$PYTHON" scripts/venv_matches.py "$EXTRAS" --write
