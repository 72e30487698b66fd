#!/usr/bin/env bash
# Every GPU path one GPU allows, in one prepared command; one table at the end.
#
#   bash scripts/gpu_check.sh --dry-run   # list each check, what it needs, its command
#   bash scripts/gpu_check.sh             # run them (about 8 minutes on one H200)
#
# Made for the lent GPU machine (docs/trainer.md, "What has run on a GPU"): it has torch
# with CUDA, transformers, peft, safetensors and pytest, no package registry, and not
# the project's web stack. Wheels for what it lacks travel in .device-wheels/ (git
# ignores it; docs/trainer.md, "What has run on a GPU", says which) and are
# installed first. The project runs from this checkout (PYTHONPATH), not installed.
# Each check has its own time limit; a check whose need is missing says so and is
# skipped. Paste the table, with the date and commit, into docs/trainer.md.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DRY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1
PY=${PYTHON:-python3}
WORK='$WORK'  # a dry run makes nothing
if (( ! DRY )); then
  WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)  # fresh: a machine kept between commands keeps /tmp
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" ATROPOS_CACHE_DIR="$WORK/cache"
QUICKSTART="$PY -m atroposlib.cli.launch configs/quickstart_cpu.yaml \
--set trainer.args.training_steps=20 --set trainer.args.device=cuda \
--set trainer.args.engine_device=cuda"

# name | what it needs | seconds allowed | command
CHECKS=(
  "nccl group (DP-1)|1 GPU|60|$PY -c 'import torch, torch.distributed as dist
from example_trainer.distributed import DataParallel, process_group_backend
from example_trainer.sharding import padded_micro_batch_count
cuda = torch.device(\"cuda\", 0)
dist.init_process_group(process_group_backend(cuda), store=dist.HashStore(), rank=0, world_size=1)
for device in (torch.device(\"cpu\"), cuda):
    t = torch.ones(2, dtype=torch.float64, device=device); dist.all_reduce(t)
print(\"cpu and cuda all_reduce ok; micro-batches\", padded_micro_batch_count(3, True, cuda))
dist.destroy_process_group()'"
  "quickstart fp32|1 GPU, the web-stack wheels|150|$QUICKSTART --run-dir $WORK/fp32"
  "quickstart bf16|1 GPU, the web-stack wheels|150|$QUICKSTART --set trainer.args.dtype=bfloat16 --run-dir $WORK/bf16"
  "trainer step 1.5B, DDP and FSDP (a group of one), chunked-logprob peak|1 GPU, ~60 GiB|240|$PY benchmarks/trainer_step.py --shape 1.5b --device cuda --ranks 1 --peak-tflops 989 --rows ddp:off:whole,ddp:off:chunked,fsdp:on:chunked"
  "7B step, FSDP + activation checkpointing + chunked logprobs|1 GPU, ~120 GiB|200|$PY benchmarks/trainer_step.py --shape 7b --device cuda --ranks 1 --peak-tflops 989 --sequences 16 --rows fsdp:on:chunked --logprob-rows 1024"
  "configs/grpo_qwen05b_vllm.yaml, 20 steps (docs/gpu.md)|1 GPU, vLLM, Qwen2.5-0.5B-Instruct and openai/gsm8k reachable or cached|600|$PY -m atroposlib.cli.launch configs/grpo_qwen05b_vllm.yaml --set trainer.args.training_steps=20 --run-dir $WORK/qwen05b"
  "padding-free packing (flash-attention varlen)|1 GPU, flash-attn|120|$PY -c 'import flash_attn' && $PY -c 'import torch, transformers
from atroposlib.utils.tiny_model import ensure_tiny_model
from example_trainer.logprobs import keeps_packed_sequences_apart
model = transformers.AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), dtype=torch.bfloat16, attn_implementation=\"flash_attention_2\").cuda()
apart = keeps_packed_sequences_apart(model)
print(\"flash_attention_2 keeps packed sequences apart:\", apart); raise SystemExit(0 if apart else 1)'"
)

if (( DRY )); then
  printf '%-62s | %-28s | %5s | %s\n' "check" "needs" "limit" "command"
  for check in "${CHECKS[@]}"; do
    IFS='|' read -r name needs limit command <<< "$check"
    printf '%-62s | %-28s | %4ss | %s\n' "$name" "$needs" "$limit" "${command%%$'\n'*}..."
  done
  echo "(nothing run: --dry-run)"
  exit 0
fi

if ! $PY -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  echo "gpu_check: torch sees no GPU here; bash scripts/gpu_check.sh --dry-run lists the checks" >&2
  exit 2
fi
if compgen -G ".device-wheels/*.whl" > /dev/null; then
  $PY -m pip install -q --no-deps .device-wheels/*.whl || echo "gpu_check: some wheels did not install" >&2
fi
$PY -m atroposlib.cli.make_tiny_model > "$WORK/tiny.log" 2>&1 || echo "gpu_check: tiny model: see $WORK/tiny.log" >&2

RESULTS=()
for check in "${CHECKS[@]}"; do
  IFS='|' read -r name needs limit command <<< "$check"
  echo "[gpu_check] $name (at most ${limit}s)"
  started=$(date +%s)
  log="$WORK/$(echo "$name" | tr -c 'a-zA-Z0-9' '_').log"
  timeout "$limit" bash -c "$command" > "$log" 2>&1
  code=$?
  seconds=$(( $(date +%s) - started ))
  last=$(grep -v '^\s*$' "$log" | tail -1 | cut -c1-110)
  case $code in
    0) result=ok ;;
    124) result="timed out" ;;
    *) result="failed ($code)" ;;
  esac
  RESULTS+=("| $name | $result | $seconds | ${last//|//} |")
done

echo
echo "GPU checks, $(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $($PY -c 'import torch; print(torch.cuda.get_device_name(0), "torch", torch.__version__)')"
echo "| check | result | seconds | last line |"
echo "|---|---|---|---|"
printf '%s\n' "${RESULTS[@]}"
echo "(logs: $WORK)"
