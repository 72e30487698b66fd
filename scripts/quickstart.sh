#!/usr/bin/env bash
# The main job: install atroposlib (CPU torch) into .venv and run the whole RL
# loop on this CPU with `atropos-launch configs/quickstart_cpu.yaml`: the
# trajectory API, the mod-10 arithmetic environment, the CPU inference engine
# and the GRPO trainer on the project's tiny model (built locally if missing).
# Extra arguments go to atropos-launch (e.g. --run-dir runs/mine).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_venv.sh inference,trainer
. .venv/bin/activate
exec atropos-launch configs/quickstart_cpu.yaml "$@"
