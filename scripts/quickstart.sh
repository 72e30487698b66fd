#!/usr/bin/env bash
# The main job: install atroposlib (CPU torch) into .venv and run the whole RL
# loop on this CPU with `atropos-launch configs/quickstart_cpu.yaml`: the
# trajectory API, the mod-10 arithmetic environment, the CPU inference engine
# and the GRPO trainer on the project's tiny model (built locally if missing).
# Extra arguments go to atropos-launch (e.g. --run-dir runs/mine).
# One line before each phase says what it is doing and about how long it takes.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "[quickstart] 1/3 install: atroposlib and the CPU build of torch into .venv"
bash scripts/install_venv.sh inference,trainer
. .venv/bin/activate
echo "[quickstart] 2/3 the tiny model (built once, in about a minute; then cached)"
atropos-make-tiny-model
echo "[quickstart] 3/3 atropos-launch configs/quickstart_cpu.yaml: 100 GRPO steps on this CPU"
exec atropos-launch configs/quickstart_cpu.yaml "$@"
