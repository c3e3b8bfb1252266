# The NxD Inference stack's Python (included by the Makefile). The SDK 2.27-2.31 containers
# (pytorch-inference-neuronx:2.9.0-neuronx-py312-sdk2.28.0-ubuntu24.04 for the SDK 2.28 that
# requirements-nxdi.txt pins) run Python 3.12, TorchServe 0.11.0 and transformers 4.57, as the
# SDK 2.28 DLAMI's NxDI venv does (Python 3.12, transformers 4.57); requirements-py312.txt is that
# stack minus the Neuron packages, in its own venv (.venv-py312). CI runs it after test-compat.
#   make test-py312                                  build .venv-py312 (once), run the selection below
#   make test-py312 PY312_PYTEST_ARGS="-k nxdi -x"   extra pytest arguments
#   make test-py312 PY312_TESTS=tests                the whole suite (about as long as make test)
PY312_VENV ?= .venv-py312
PY312_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) $(shell command -v python3.12))
PY312_PYTEST_ARGS ?=
# What runs, by directory (new test files there are picked up as they appear):
# - tests/unit, tests/integration: every handler module imported and driven in-process on
#   Python 3.12 and transformers 4.57 (tokenizer, streamer, cache and generate APIs), the Neuron
#   backends (neuronx, NxD Inference) on the fake SDKs in tests/fakes (the device tests, marker
#   `neuron`, skip); a minute or two.
# - tests/e2e/neuron: the Neuron backends inside a real TorchServe 0.11.0.
# - tests/e2e/test_streaming_server.py: the handler inside a real TorchServe 0.11.0 on Python 3.12
#   (worker process, streaming, both scheduling modes).
# - tests/e2e/sagemaker/test_container_contract.py: /ping and /invocations as the DLC serves them.
# Left out: the rest of tests/e2e (real-TorchServe runs of the routes, clients and failure
# handling), which `make test` (TorchServe 0.12) and `make test-compat` (TorchServe 0.11.0)
# already run; what they add is the HTTP protocol, not the Python or transformers version, which
# the in-process tests above cover. tests/perf runs once, in `make test-perf`.
PY312_TESTS ?= tests/unit tests/integration tests/e2e/neuron tests/e2e/test_streaming_server.py \
	tests/e2e/sagemaker/test_container_contract.py

.PHONY: py312-venv test-py312

$(PY312_VENV)/.installed: requirements-py312.txt requirements-dev.txt
	@test -n "$(PY312_PYTHON)" || { echo "no Python 3.12 found: set PY312_PYTHON=/path/to/python3.12 (pyenv install 3.12)"; exit 1; }
	test -x $(PY312_VENV)/bin/python || $(PY312_PYTHON) -m venv $(PY312_VENV)
	$(PY312_VENV)/bin/pip install --quiet --upgrade pip
	$(PY312_VENV)/bin/pip install --quiet -r requirements-py312.txt
	$(PY312_VENV)/bin/pip install --quiet -r requirements-py312.txt -r requirements-dev.txt
	touch $@

py312-venv: $(PY312_VENV)/.installed

test-py312: $(PY312_VENV)/.installed
	$(PY312_VENV)/bin/python -m pytest $(XDIST) $(PY312_TESTS) $(PY312_PYTEST_ARGS)
