#!/usr/bin/env bash
# Install atroposlib (dev + inference extras, CPU torch) into .venv, lint, and run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
pip install -q --disable-pip-version-check --upgrade pip
# torch first and pinned: the CPU build on local disk (an unpinned torch pulls a CUDA build)
pip install -q --disable-pip-version-check torch==2.13.0
pip install -q --disable-pip-version-check -e '.[dev,inference]'
ruff check .
python -m pytest -q "$@"
