# minirl: `make demo` sets up and runs the built-in toy run; `make test` sets up and runs the tests.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements.txt
	touch $@

demo: setup
	$(PY) train.py

test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q tests

clean:
	rm -rf runs .pytest_cache
