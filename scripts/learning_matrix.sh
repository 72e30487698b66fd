#!/usr/bin/env bash
# The tests that assert a learning effect or a probability threshold of the tiny model
# (marker `learning`), each time with a tiny model built from an empty cache under one
# of torch's CPU kernel paths, and then under the lowest transformers pyproject.toml
# accepts. A threshold calibrated on one machine's floating-point path fails here.
#
#   bash scripts/learning_matrix.sh                  every kernel path this CPU has, then
#                                                    the lowest transformers (.venv-lowest)
#   bash scripts/learning_matrix.sh avx2             one kernel path, current venv only
#   LOWEST=0 bash scripts/learning_matrix.sh         skip the lowest-transformers venv
#   LOWEST=only bash scripts/learning_matrix.sh      only the lowest-transformers venv
#
# Run `bash scripts/test.sh unit` once first (it makes .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate

capabilities=("$@")
if [ "${#capabilities[@]}" -eq 0 ]; then
    capabilities=(default)
    grep -qw avx2 /proc/cpuinfo && capabilities+=(avx2)
    grep -qw avx512f /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo \
        && grep -qw avx512vl /proc/cpuinfo && capabilities+=(avx512)
fi

run() {  # PYTHON CAPABILITY [TEST PATHS...]
    echo "== learning tests: $("$1" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'), ATEN_CPU_CAPABILITY=$2"
    # a fresh cache per run (ATROPOS_TEST_CACHE_DIR unset): the model is built under $2
    env -u ATROPOS_TEST_CACHE_DIR ATEN_CPU_CAPABILITY="$2" \
        "$1" -m pytest -q -p no:cacheprovider -m learning -rA "${@:3}" \
        | grep -E "^(PASSED|FAILED|ERROR)|passed|failed"
}

if [ "${LOWEST:-1}" != only ]; then
    for capability in "${capabilities[@]}"; do
        run python "$capability"
    done
fi

if [ "${LOWEST:-1}" != 0 ] && [ "$#" -eq 0 ]; then
    # the lowest transformers the project accepts, with the hub, tokenizers and peft it
    # resolves to; only what the learning tests import (the dev extra's trl and datasets
    # need a newer transformers), and only their modules are collected
    lowest=$(python -c 'import re, tomllib; deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]; print(next(re.search(r">=([\d.]+)", d).group(1) for d in deps if d.startswith("transformers")))')
    [ -x .venv-lowest/bin/python ] || python -m venv .venv-lowest
    grep -viE '^(transformers|tokenizers|huggingface[-_]hub|trl|peft|accelerate|datasets)==' \
        scripts/constraints.txt > .venv-lowest/constraints.txt
    pip_lowest=(.venv-lowest/bin/pip install -q --disable-pip-version-check -c .venv-lowest/constraints.txt)
    "${pip_lowest[@]}" torch==2.13.0
    "${pip_lowest[@]}" -e '.[inference,trainer]' "transformers==$lowest" \
        pytest pytest-asyncio pytest-timeout pytest-xdist pyyaml
    mapfile -t modules < <(grep -rl "pytest.mark.learning" tests --include='test_*.py')
    run .venv-lowest/bin/python "${capabilities[-1]}" "${modules[@]}"
fi
