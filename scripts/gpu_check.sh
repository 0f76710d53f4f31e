#!/usr/bin/env bash
# A few GRPO steps on one GPU in bf16 with gradient checkpointing and LoRA; prints tokens/s for generation and
# for training (from the run's metrics.jsonl).
#   bash scripts/gpu_check.sh                         # a randomly initialised Qwen2-0.5B-shaped model (no download)
#   MODEL=/path/to/Qwen2.5-0.5B-Instruct bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
OUT=${OUT:-runs/gpu_check}
python -c "import torch; assert torch.cuda.is_available(), 'gpu_check.sh needs a CUDA GPU'" 
if [ -z "${MODEL:-}" ]; then
  MODEL=runs/gpu_check_model
  $PY scripts/make_random_model.py --out "$MODEL" --size 0.5b
fi
rm -rf "$OUT"
$PY train.py --model_name_or_path "$MODEL" --train_files data/arith_train.jsonl --val_files "" \
  --dtype bfloat16 --gradient_checkpointing true --lora_rank 16 --lora_alpha 32 --lr 2e-5 \
  --prompts_per_step 32 --group_size 8 --max_new_tokens 256 --micro_batch_size 32 --max_steps 5 \
  --output_dir "$OUT"
$PY - "$OUT" <<'PYEOF'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1] + "/metrics.jsonl")) if "critic/reward/mean" in r][1:]  # skip warm-up step
n = 32 * 8
gen = sum(r["response_length/mean"] * n for r in rows) / sum(r["timing_s/gen"] for r in rows)
upd = sum(r["response_length/mean"] * n for r in rows) / sum(r["timing_s/update"] for r in rows)
print(f"generation: {gen:,.0f} response tokens/s   training: {upd:,.0f} response tokens/s  ({len(rows)} steps)")
PYEOF
