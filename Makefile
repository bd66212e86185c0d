# `make test` and `make demo` set themselves up: a .venv with the package installed in editable mode, its
# dependencies at the versions of constraints.txt (the ones the suite passes with; `make constraints` refreshes them).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
CONSTRAINTS ?= constraints.txt
# One pytest worker per core (at most 4). Tests are handed out one at a time to whichever worker is free, except
# the files marked with an xdist_group (those with expensive module fixtures), each run whole on one worker so
# that its fixtures are built once.
PARALLEL ?= -n auto --maxprocesses 4 --dist loadgroup

.PHONY: install lint test test-fast demo bench clean constraints

$(STAMP): setup.cfg pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]" $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
	touch $(STAMP)

install: $(STAMP)

# ruff (lint and import order, pyproject.toml) over the tree, then mypy over the whole package ([tool.mypy]).
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy

test: $(STAMP)
	$(PY) -m pytest -q $(PARALLEL)

test-fast: $(STAMP)
	$(PY) -m pytest -q $(PARALLEL) -m "not slow"

demo: $(STAMP)
	$(PY) examples/demo.py

# A fresh .venv from setup.cfg's ranges alone (the newest releases within them), the whole suite on it, and, if it
# passes, its versions as the new constraints.txt (the file's leading comment kept).
constraints:
	rm -rf $(VENV)
	$(MAKE) test CONSTRAINTS=
	{ sed '/^[^#]/,$$d' constraints.txt; $(PY) -m pip freeze --exclude-editable; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
