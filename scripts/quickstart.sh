#!/usr/bin/env bash
# The main job: install atroposlib (CPU torch) into .venv and run the whole RL
# loop on this CPU with `atropos-launch configs/quickstart_cpu.yaml`: the
# trajectory API, the mod-10 arithmetic environment, the CPU inference engine
# and the GRPO trainer on the project's tiny model (built locally if missing).
# Extra arguments go to atropos-launch (e.g. --run-dir runs/mine).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
EXTRAS=inference,trainer
# pip runs only when .venv does not match scripts/constraints.txt (scripts/venv_matches.py)
if ! python scripts/venv_matches.py "$EXTRAS"; then
    # exact versions from scripts/constraints.txt: what the README's numbers were measured with
    PIN=(-c scripts/constraints.txt)
    pip install -q --disable-pip-version-check --upgrade pip "${PIN[@]}"
    # torch first and pinned: the CPU build on local disk (an unpinned torch pulls a CUDA build)
    pip install -q --disable-pip-version-check torch==2.13.0 "${PIN[@]}"
    pip install -q --disable-pip-version-check -e ".[$EXTRAS]" "${PIN[@]}"
    python scripts/venv_matches.py "$EXTRAS" --write
fi
exec atropos-launch configs/quickstart_cpu.yaml "$@"
