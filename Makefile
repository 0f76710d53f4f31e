# minirl: `make demo` sets up and runs the built-in toy run; `make test` sets up and runs the tests.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test smollm2 clean

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

test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q tests

clean:
	rm -rf runs .pytest_cache
