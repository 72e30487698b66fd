#!/usr/bin/env bash
# docs/rollouts.md's walk-through, from an empty directory, on this CPU (about 8 min):
#   1. the quickstart with a deliberately wrong reward (it pays for the answer plus one);
#   2. atropos-rollouts rescore with the right reward;
#   3. a fresh run trained only on the re-scored groups (no sampling of its own), with the
#      importance-sampling correction on; its greedy evaluation at step 0 and at the end;
#   4. the same on the groups as the wrong reward scored them, as the control;
#   5. a fork of the first run from step 50, with the reward fixed and --loss-type gspo.
# The figures docs/rollouts.md quotes are the last lines this prints.
#   bash scripts/rollouts_walkthrough.sh [WORK_DIR]     (.venv from scripts/quickstart.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
WORK=$(realpath -m "${1:-$(mktemp -d /tmp/rollouts-walkthrough.XXXXXX)}")
mkdir -p "$WORK"
[[ -d .venv ]] && . .venv/bin/activate
REWARDS="$REPO/environments/mod_arithmetic_rewards.py"
WRONG="$WORK/wrong"
RIGHT="$WRONG/rescored/mod_arithmetic_rewards.py-right"
step() { echo "[walkthrough] $*"; }

step "1/5 the quickstart with a wrong reward (pays for the answer plus one)"
atropos-launch configs/quickstart_cpu.yaml --run-dir "$WRONG" \
  --set "environments.0.env.reward=$REWARDS:plus_one" > "$WORK/wrong.log" 2>&1
step "2/5 rescore its groups with the right reward"
atropos-rollouts rescore "$WRONG" --env mod_arithmetic --reward "$REWARDS:right" | tee "$WORK/rescore.log"
step "3/5 a fresh run on the re-scored groups, no sampling of its own"
atropos-launch configs/replay_cpu.yaml --run-dir "$WORK/replay-right" \
  --set "replay.run=$WRONG" --set "replay.rescored=$RIGHT" > "$WORK/replay-right.log" 2>&1
step "4/5 the control: the same groups as the wrong reward scored them"
atropos-launch configs/replay_cpu.yaml --run-dir "$WORK/replay-wrong" \
  --set "replay.run=$WRONG" > "$WORK/replay-wrong.log" 2>&1
step "5/5 fork the first run from step 50: the reward fixed, --loss-type gspo"
atropos-rollouts fork "$WRONG" --from-step 50 --loss-type gspo --run-dir "$WORK/fork" \
  --set environments.0.env.reward=null > "$WORK/fork.log" 2>&1

python - "$WORK" <<'PY'
import json, sys
from pathlib import Path

work = Path(sys.argv[1])
def evals(run):
    path = work / run / "evals" / "mod_arithmetic" / "history.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [(r["step"], r["metrics"]["eval/accuracy"]) for r in rows]
rescore = json.loads(next((work / "wrong" / "rescored").glob("*/summary.json")).read_text())
print(f"wrong-reward run: greedy accuracy {evals('wrong')[0][1]:.2f} -> {evals('wrong')[-1][1]:.2f}")
print(f"rescore: {rescore['changed']} of {rescore['samples']} scores changed "
      f"({rescore['changed_share']:.1%}); mean score {rescore['old_mean']:.3f} -> {rescore['new_mean']:.3f}")
for run in ("replay-right", "replay-wrong"):
    points = evals(run)
    print(f"{run}: greedy accuracy {points[0][1]:.2f} at step {points[0][0]} -> "
          f"{points[-1][1]:.2f} at step {points[-1][0]} ({points[-1][1] - points[0][1]:+.2f})")
fork = json.loads((work / "fork" / "summary.json").read_text())
print(f"fork: {fork.get('forked_from')}, {fork['steps']} steps, {fork['verdict']}")
PY
