#!/usr/bin/env bash
# GRPO steps on one GPU, bf16 compute over fp32 weights: LoRA with gradient checkpointing, then full fine-tuning.
# Prints tokens/s for generation and for training and the peak GPU memory (from the runs' metrics.jsonl).
#   bash scripts/gpu_check.sh                         # a randomly initialised Qwen2-0.5B-shaped model (no download)
#   MODEL=/path/to/Qwen2.5-0.5B-Instruct bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
RUN_DIR=${RUN_DIR:-runs/gpu_check}
STEPS=${STEPS:-5}
$PY -c "import torch; assert torch.cuda.is_available(), 'gpu_check.sh needs a CUDA GPU'"
if [ -z "${MODEL:-}" ]; then
  MODEL=runs/gpu_check_model
  $PY scripts/make_random_model.py --out "$MODEL" --size 0.5b
fi
COMMON=(--model_name_or_path "$MODEL" --train_files data/arith_train.jsonl --val_files "" --dtype bfloat16
        --prompts_per_step 32 --group_size 8 --max_new_tokens 256 --micro_batch_size 32 --max_steps "$STEPS"
        --kl_coef 0.001)
rm -rf "$RUN_DIR"
$PY train.py "${COMMON[@]}" --gradient_checkpointing true --lora_rank 16 --lora_alpha 32 --lr 2e-5 --output_dir "$RUN_DIR/lora"
$PY train.py "${COMMON[@]}" --lr 1e-6 --output_dir "$RUN_DIR/full"
$PY - "$RUN_DIR" <<'PYEOF'
import json, sys
for run in ("lora", "full"):
    rows = [r for r in map(json.loads, open(f"{sys.argv[1]}/{run}/metrics.jsonl")) if "critic/reward/mean" in r][1:]
    n = 32 * 8  # skip the warm-up step above
    tokens = sum(r["response_length/mean"] * n for r in rows)
    train_s = sum(r[f"timing_s/{k}"] for r in rows for k in ("old_log_prob", "ref", "adv", "update"))
    gen, upd = tokens / sum(r["timing_s/gen"] for r in rows), tokens / train_s
    mem = max(r["perf/max_memory_allocated_gb"] for r in rows)
    print(f"{run}: generation {gen:,.0f} response tokens/s, training {upd:,.0f} response tokens/s, "
          f"peak {mem:.1f} GiB ({len(rows)} steps)")
PYEOF
