#!/usr/bin/env bash
# The one-shot GPU acceptance check (scripts/gpu_check.py says what each check asserts): a PASS or FAIL line per
# check and a non-zero exit on any FAIL. No download: a random Qwen2.5-0.5B-shaped model.
#   bash scripts/gpu_check.sh                # on a CUDA machine (~6 min on one H200)
#   bash scripts/gpu_check.sh --cpu          # the dry run on CPU at toy sizes (what the test suite runs)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
exec "$PY" scripts/gpu_check.py "$@"
