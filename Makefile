# The two commands of the README: `make demo` and `make test`. Both set up .venv first.
# The venv sees system site-packages so a machine that already has torch (a GPU box) keeps its CUDA build;
# where torch is not importable we install torch==2.13.0 (a CPU build from local disk on our CI machines).
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.gobrrr-installed

.PHONY: setup demo test lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv --system-site-packages $(VENV)
	$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install "torch==2.13.0"
	$(VPY) -m pip install -e ".[dev]"
	# Holistic Trace Analysis: the doctor's tests check our idle/overlap figures against it. It pins
	# jupyterlab, which it does not need to import; its import deps are in the dev extra.
	$(VPY) -m pip install --no-deps "HolisticTraceAnalysis==0.5.0"
	touch $(STAMP)

demo: setup
	$(VPY) -m gobrrr demo --out demo-out

test: setup
	$(VPY) -m pytest

# the code's own hygiene: ruff (style, errors, imports sorted), import-linter (the layers of DESIGN.md),
# and gobrrr's own lint on gobrrr (no accidental host-device sync in library code)
lint: setup
	$(VENV)/bin/ruff check gobrrr tests examples scripts
	$(VENV)/bin/lint-imports
	$(VENV)/bin/gobrrr lint gobrrr

clean:
	rm -rf $(VENV) gobrrr-doctor demo-out
