# The two commands of the README: `make train` (demo run) and `make test`. Each sets itself up.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=

.PHONY: install train test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -e '.[dev,export,cluster]'
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

train: $(STAMP)   ## the demo: ResNet18 on embedded handwritten digits, CPU, a few minutes
	$(PY) train.py experiment=demo $(ARGS)

test: $(STAMP)    ## the test suite (CPU only; GPU tests skip without CUDA)
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests train.py evaluate.py

clean:
	rm -rf outputs .pytest_cache
