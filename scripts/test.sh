#!/usr/bin/env bash
# Install atroposlib with its dev extras into .venv, lint, and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
pip install -q --disable-pip-version-check --upgrade pip
pip install -q --disable-pip-version-check -e '.[dev]'
ruff check .
python -m pytest -q "$@"
