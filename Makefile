# The two set-up commands (see README):  make bench   |   make test
# Each creates or reuses a local virtualenv, installs what fastbert needs, builds the
# C++ extension and runs. Torch is installed first, explicitly: a CPU build where there
# is no GPU (override with TORCH_SPEC / TORCH_PIP_ARGS).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1 || echo 0)
ifeq ($(HAS_GPU),1)
TORCH_SPEC ?= torch
else
TORCH_SPEC ?= torch==2.13.0
endif
TORCH_PIP_ARGS ?=
STAMP := $(VENV)/.fastbert-installed
SOURCES := setup.py pyproject.toml $(wildcard csrc/*.cpp csrc/*.h)

.PHONY: test test-slow lint bench bench-full bench-pytest bench-kernels install fuzz clean

install: $(STAMP)

$(STAMP): $(SOURCES)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip "setuptools>=77" wheel "pybind11>=2.12"
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(PY) -m pip install -q --no-build-isolation -e ".[test,bench]"
	@touch $(STAMP)

# The fast tests (the README's test command); what is slow by nature is marked `slow` and runs in
# `make test-slow`, CI's next stage.
test: $(STAMP)
	$(PY) -m pytest tests -q -m "not slow"

test-slow: $(STAMP)
	$(PY) -m pytest tests -q -m slow

lint: $(STAMP)
	$(PY) -m ruff check .

# The benchmark suite also installs the peers' runtimes (ONNX Runtime, OpenVINO, CTranslate2), which
# only the benchmarks need; without them their rows are skipped with the reason.
PEERS_STAMP := $(VENV)/.fastbert-peers

# (the `peers` extra's requirements, read from the installed metadata: no rebuild of fastbert)
$(PEERS_STAMP): $(STAMP)
	$(PY) -m pip install -q $$($(PY) -c "from importlib.metadata import requires; \
	    print(' '.join(r.split(';')[0].replace(' ', '') for r in requires('fastbert') if 'extra == \"peers\"' in r))")
	@touch $(PEERS_STAMP)

bench: $(PEERS_STAMP)
	$(PY) -m fastbert bench --quick

bench-full: $(PEERS_STAMP)
	$(PY) -m fastbert bench

# The pytest-benchmark suites in bench/ (GPU-only pieces skip with a reason on CPU).
bench-pytest: $(STAMP)
	$(PY) -m pytest bench/ --benchmark-only -q

# Triton kernels vs torch on a CUDA GPU; appends the run to bench/results/kernels.jsonl.
bench-kernels: $(STAMP)
	$(PY) bench/bench_kernels.py

clean:
	rm -rf build *.egg-info fastbert/_C*.so
