#!/usr/bin/env bash
# The package as a user installs it: build the wheel, install it into a fresh venv on top of the pinned torch
# (pip install <wheel>, which resolves pyproject.toml's dependencies from the registry), then from a folder
# outside the checkout import it and run one GRPO step of recipes/grpo_gsm8k.py on the built-in toy model.
#   scripts/wheel_check.sh            (~3-7 min, needs the package registry; the committed HEAD)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# built from the committed tree (git archive), never in the checkout: setuptools' build/ folder would ship
# stale files (a module deleted from minirl/ would still be in the wheel)
mkdir "$work/src" && git -C "$root" archive HEAD | tar -x -C "$work/src"
python3 -m pip wheel -q --no-deps -w "$work/dist" "$work/src"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --upgrade pip
# the pinned CPU wheel first (see pyproject.toml): this project's machines have it on disk, which pip finds;
# elsewhere pass TORCH_INDEX=https://download.pytorch.org/whl/cpu, or pip takes the multi-GB CUDA build
"$work/venv/bin/pip" install -q torch==2.13.0 ${TORCH_INDEX:+--index-url "$TORCH_INDEX"}
"$work/venv/bin/pip" install -q "$work"/dist/minirl-*.whl
mkdir "$work/elsewhere" && cp "$root"/recipes/{grpo_gsm8k,common}.py "$root"/data/arith_{train,test}.jsonl "$work/elsewhere"
cd "$work/elsewhere"
export MINIRL_CACHE="$work/cache" HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
"$work/venv/bin/python" -c 'import minirl, sys; assert "site-packages" in minirl.__file__, minirl.__file__; print("import minirl:", minirl.__file__)'
# one GRPO step of the shortest loop, on the built-in toy model, with nothing of the checkout on the path
"$work/venv/bin/python" grpo_gsm8k.py --steps 1 --prompts_per_step 4 --group_size 4 \
    --train_files arith_train.jsonl --val_files arith_test.jsonl
echo "wheel check: ok ($(cd "$work/dist" && ls))"
