# Inferentia2 targets (included by the Makefile). On an inf2 host, inside the Neuron venv:
#   make neuron-venv VENV=$VIRTUAL_ENV
#   make checkpoint HF_MODEL=/models/Llama-2-7b-hf MODEL_DIR=models/llama-2-7b VENV=$VIRTUAL_ENV
#   make compile archive serve MODEL_DIR=models/llama-2-7b MODEL_CONFIG=model-config-inf2.yaml VENV=$VIRTUAL_ENV
# docs/inferentia2.md walks through it.

HF_MODEL ?=
CHECKPOINT_FORMAT ?= safetensors
NEURON_PYTEST_ARGS ?=
COMPAT_VENV ?= .venv-compat
COMPAT_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.10*/bin/python3.10) $(shell command -v python3.10))
COMPAT_PYTEST_ARGS ?=

.PHONY: neuron-venv nxdi-venv checkpoint compile test-neuron test-neuron-fake compat-venv test-compat

# Adds the serving dependencies to an existing Neuron venv (VENV=...) and marks it installed, so
# `make venv` never replaces its torch-neuronx / transformers with the CPU pins of requirements.txt.
neuron-venv:
	test -x $(PY) || { echo "VENV=$(VENV) is not a venv; activate the Neuron DLAMI venv and pass VENV=\$$VIRTUAL_ENV"; exit 1; }
	$(BIN)/pip install -r requirements-neuron.txt $$(grep -E "^pytest" requirements-dev.txt)
	touch $(VENV)/.installed

# The same for the NxD Inference backend: requirements-nxdi.txt (Neuron SDK 2.28) into the SDK 2.28
# DLAMI's NxDI venv (Python 3.12): source /opt/aws_neuronx_venv_pytorch_2_9_nxd_inference/bin/activate
nxdi-venv:
	test -x $(PY) || { echo "VENV=$(VENV) is not a venv; activate the NxD Inference DLAMI venv and pass VENV=\$$VIRTUAL_ENV"; exit 1; }
	$(BIN)/pip install -r requirements-nxdi.txt $$(grep -E "^pytest" requirements-dev.txt)
	touch $(VENV)/.installed

# HF_MODEL: a local Hugging Face model folder; MODEL_DIR: the checkpoint the archive will use.
# CHECKPOINT_FORMAT=split writes the pytorch_model.bin/ folder older transformers-neuronx releases need.
checkpoint: venv
	@test -n "$(HF_MODEL)" || { echo "usage: make checkpoint HF_MODEL=/path/to/hf-model MODEL_DIR=models/<name>"; exit 1; }
	$(PY) -m scripts.model.prepare_checkpoint $(HF_MODEL) $(MODEL_DIR) --format $(CHECKPOINT_FORMAT)

# Compiles for the settings in MODEL_CONFIG and saves NEFFs + manifest in $(MODEL_DIR)/neuron_cache
# (or handler.neuronx.cache_dir); a later run with unchanged settings only loads them.
compile: venv $(if $(filter $(DEFAULT_MODEL_DIR),$(MODEL_DIR)),model)
	$(PY) -m scripts.model.compile --model-dir $(MODEL_DIR) --config $(MODEL_CONFIG)

# On an inf2 host: the tests that need the device and the real transformers-neuronx.
test-neuron: venv
	$(PY) -m pytest -m neuron tests/integration/neuron -rs $(NEURON_PYTEST_ARGS)

# Anywhere: the neuronx backend against the fake SDK (part of `make test` too).
test-neuron-fake: venv
	$(PY) -m pytest tests/integration/neuron tests/e2e/neuron -m "not neuron" $(NEURON_PYTEST_ARGS)

# The test suite on the stack Inferentia users run (requirements-compat.txt): Python 3.10,
# TorchServe 0.11.0 (the SageMaker Neuron DLC's), transformers 4.48.3 (the Neuron SDK 2.25's),
# torch 2.7.0, in its own venv. CI runs it after `make test`. What runs:
# - tests/unit, tests/integration, tests/real_model: every in-process test on Python 3.10 and
#   transformers 4.48, and the real model served by TorchServe 0.11.0;
# - tests/e2e on TorchServe 0.11.0 only (`--frontends torchserve`): the route tests' ASGI runs
#   exercise our own frontend, not TorchServe's, and run in `make test`; test_asgi_frontend.py
#   still runs, for uvicorn and Starlette on Python 3.10;
# - in continuous mode only (`--modes continuous`), the mode every shipped config serves: static
#   mode's e2e runs (TorchServe's classic batching, unchanged from 0.11 to 0.12) stay in
#   `make test`, and the in-process tests run both modes here too;
# - left out: tests/e2e/neuron/test_nxdi_torchserve.py (NxD Inference is the Python 3.12 stack:
#   test-py312 runs it on TorchServe 0.11.0), test_lm_eval.py and test_make_serve_embedder.py
#   (a client venv and the Makefile, the same on either TorchServe).
# COMPAT_TESTS=tests runs everything.
COMPAT_TESTS ?= tests/unit tests/integration tests/real_model tests/e2e --frontends torchserve --modes continuous \
	--ignore=tests/e2e/neuron/test_nxdi_torchserve.py --ignore=tests/e2e/test_lm_eval.py \
	--ignore=tests/e2e/test_make_serve_embedder.py
$(COMPAT_VENV)/.installed: requirements-compat.txt requirements-dev.txt
	@test -n "$(COMPAT_PYTHON)" || { echo "no Python 3.10 found: set COMPAT_PYTHON=/path/to/python3.10 (pyenv install 3.10)"; exit 1; }
	test -x $(COMPAT_VENV)/bin/python || $(COMPAT_PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/pip install --quiet --upgrade pip
	$(COMPAT_VENV)/bin/pip install --quiet -r requirements-compat.txt
	$(COMPAT_VENV)/bin/pip install --quiet -r requirements-compat.txt -r requirements-dev.txt
	touch $@

compat-venv: $(COMPAT_VENV)/.installed

test-compat: $(COMPAT_VENV)/.installed guidellm
	$(COMPAT_VENV)/bin/python -m pytest $(XDIST) $(COMPAT_TESTS) $(COMPAT_PYTEST_ARGS)
