# `make test` and `make demo` set themselves up: a .venv with the package installed in editable mode.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# One pytest worker per core (at most 4). Tests are handed out one at a time to whichever worker is free, except
# the files marked with an xdist_group (those with expensive module fixtures), each run whole on one worker so
# that its fixtures are built once.
PARALLEL ?= -n auto --maxprocesses 4 --dist loadgroup

.PHONY: install test test-fast demo bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q $(PARALLEL)

test-fast: $(STAMP)
	$(PY) -m pytest -q $(PARALLEL) -m "not slow"

demo: $(STAMP)
	$(PY) examples/demo.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
