# torchrec_ascend: two commands set everything up on a fresh machine.
#   make demo   venv + pinned CPU stack + csrc build, then the main job
#   make test   the same set-up, then the whole pytest suite
# A second run skips what is already installed (stamp files in .venv/).

PYTHON_SYS ?= python3.11
VENV       ?= .venv
PY         := $(VENV)/bin/python
PIP        := $(PY) -m pip
PIP_FLAGS  := --disable-pip-version-check --progress-bar off
TORCH_PIN  := torch==2.13.0
STAMP_DEPS := $(VENV)/.deps-stamp
STAMP_EDIT := $(VENV)/.editable-stamp
STAMP_BUILD:= $(VENV)/.build-stamp
CSRC       := $(wildcard csrc/*.cpp csrc/*.h csrc/simnpu/*.cpp csrc/simnpu/*.h)
PYTEST_ARGS ?=

.PHONY: all setup build demo test test-fast bench clean distclean

all: setup

$(PY):
	$(PYTHON_SYS) -m venv $(VENV)

# The pinned CPU stack.  torchrec's metadata requires the CUDA `fbgemm-gpu` (which drags another
# torch): install it --no-deps next to fbgemm-gpu-cpu and torchrec's real dependencies.
$(STAMP_DEPS): $(PY) requirements.txt Makefile
	$(PIP) install $(PIP_FLAGS) -q --upgrade pip
	$(PIP) install $(PIP_FLAGS) -q $(TORCH_PIN)
	$(PIP) install $(PIP_FLAGS) -q $(TORCH_PIN) -r requirements.txt
	$(PIP) install $(PIP_FLAGS) -q --no-deps torchrec==1.8.0
	$(PY) -c "import torch, fbgemm_gpu, torchrec; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $@

# The editable install links the package into the venv (no compilation: TORCHREC_ASCEND_NO_EXT).
$(STAMP_EDIT): $(STAMP_DEPS) setup.py
	TORCHREC_ASCEND_NO_EXT=1 $(PIP) install $(PIP_FLAGS) -q --no-build-isolation --no-deps -e .
	touch $@

# csrc/ -> torchrec_ascend/_C*.so, _simnpu*.so in place.  build_ext keeps its ninja objects in
# build/, so a change to one .cpp recompiles that file only.  flock: one build at a time.
$(STAMP_BUILD): $(STAMP_EDIT) $(CSRC) setup.py
	flock .build.lock $(PY) setup.py -q build_ext --inplace
	$(PY) -c "import torchrec_ascend.ops.extension as c; assert c.available(), 'csrc extension did not load'"
	touch $@

setup: $(STAMP_BUILD)

build: setup

demo: setup
	$(PY) examples/kuairand/train.py --config demo

test: setup
	$(PY) -m pytest tests $(PYTEST_ARGS)

bench: setup
	$(PY) benchmarks/run_all.py --quick

clean:
	rm -rf build torchrec_ascend/_C*.so $(STAMP_BUILD) .pytest_cache

distclean: clean
	rm -rf $(VENV)
