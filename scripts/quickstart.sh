#!/usr/bin/env bash
# Install atroposlib into .venv and start the main job.
# Today the main job is the trajectory API; the whole CPU RL loop replaces it
# once `atropos-launch` exists.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
pip install -q -e .
exec run-api "$@"
