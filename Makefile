# Build, serve and test the Inf2 LLM TorchServe archive.
# Every variable can be overridden: make serve MODEL_DIR=/models/llama-2-7b INFERENCE_PORT=9080

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin

MODEL_NAME ?= llama
DEFAULT_MODEL_DIR := models/tiny-llama
MODEL_DIR ?= $(DEFAULT_MODEL_DIR)
# Copy the checkpoint into the archive (default for the tiny model); else reference it by path.
EMBED_MODEL ?= $(if $(filter $(DEFAULT_MODEL_DIR),$(MODEL_DIR)),1,0)
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
# Prometheus metrics on METRICS_PORT, the handler's token metrics included (auto-detected).
TS_METRICS_PROPERTIES := "metrics_mode=prometheus" "model_metrics_auto_detect=true"
PROMPT ?= Today the weather is really nice and I am planning on
PYTEST_ARGS ?=

.PHONY: venv model archive serve stop demo test lint clean

# Feature areas keep their targets in mk/*.mk (neuron, sagemaker, bench).
-include mk/*.mk

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -r requirements.txt -r requirements-dev.txt
	touch $@

model: $(DEFAULT_MODEL_DIR)/config.json

$(DEFAULT_MODEL_DIR)/config.json: scripts/make_tiny_model.py scripts/corpus.txt | venv
	$(PY) scripts/make_tiny_model.py $(DEFAULT_MODEL_DIR)

archive: venv $(if $(filter $(DEFAULT_MODEL_DIR),$(MODEL_DIR)),model)
	$(PY) scripts/stage_archive.py --model-dir $(MODEL_DIR) --config $(MODEL_CONFIG) --stage $(BUILD)/stage \
		$(if $(filter 1,$(EMBED_MODEL)),--embed-model) --export-path $(MODEL_STORE) --model-name $(MODEL_NAME)

$(TS_CONFIG): Makefile
	mkdir -p $(BUILD)
	printf '%s\n' \
		"inference_address=http://$(HOST):$(INFERENCE_PORT)" \
		"management_address=http://$(HOST):$(MANAGEMENT_PORT)" \
		"metrics_address=http://$(HOST):$(METRICS_PORT)" \
		"grpc_inference_port=$(GRPC_INFERENCE_PORT)" \
		"grpc_management_port=$(GRPC_MANAGEMENT_PORT)" \
		"model_store=$(MODEL_STORE)" \
		"load_models=$(MODEL_NAME)" \
		"allowed_urls=file://$(abspath $(MODEL_STORE))/.*" \
		"default_response_timeout=300" \
		$(TS_METRICS_PROPERTIES) > $@

serve: archive
	@$(PY) scripts/torchserve_compat.py require-secure-defaults  # token auth + model API off need TorchServe 0.12
	$(MAKE) --no-print-directory $(TS_CONFIG) -B
	mkdir -p logs
	PATH=$(abspath $(BIN)):$$PATH HF_HUB_OFFLINE=1 $(TS_ENV) $(BIN)/torchserve --start --ncs \
		--ts-config $(TS_CONFIG) --log-config serving/log4j2.xml --model-store $(MODEL_STORE) --models $(MODEL_NAME)=$(MODEL_NAME) \
		> logs/torchserve.out 2>&1
	@$(PY) scripts/client.py --url http://$(HOST):$(INFERENCE_PORT) --model $(MODEL_NAME) wait --timeout 600 \
		--log logs/ts_log.log --pid-file $(BUILD)/.model_server.pid \
		|| (tail -n 40 logs/ts_log.log; $(MAKE) --no-print-directory stop; exit 1)
	@echo
	@echo "Serving $(MODEL_NAME) on http://$(HOST):$(INFERENCE_PORT) (token auth on; key in key_file.json). Try:"
	@echo "  make demo"
	@echo "  curl -N -H \"Authorization: Bearer \$$($(PY) scripts/client.py token)\" -H 'Content-Type: application/json' \\"
	@echo "       -d '{\"prompt\": \"Today the weather is\", \"max_new_tokens\": 64}' http://$(HOST):$(INFERENCE_PORT)/predictions/$(MODEL_NAME)"
	@echo "  make stop"

stop:  # returns once the frontend process is gone (torchserve --stop returns at once)
	-@pid=$$(cat $(BUILD)/.model_server.pid 2>/dev/null); $(TS_ENV) $(BIN)/torchserve --stop; \
		[ -z "$$pid" ] || for i in $$(seq 1 40); do kill -0 $$pid 2>/dev/null || exit 0; sleep 0.5; done

demo: venv
	$(PY) scripts/client.py --url http://$(HOST):$(INFERENCE_PORT) --model $(MODEL_NAME) \
		generate "$(PROMPT)" --max-new-tokens 64

test: venv
	$(PY) -m pytest $(PYTEST_ARGS)

# vermin: nothing newer than Python 3.10 (the Neuron DLAMI venvs and DLCs run 3.10)
lint: venv
	$(BIN)/ruff check handler scripts tests
	$(BIN)/ruff format --check handler scripts tests
	$(BIN)/vermin --target=3.10- --violations --eval-annotations --no-tips --exclude long handler scripts tests

clean:
	rm -rf $(BUILD) $(MODEL_STORE) logs key_file.json .pytest_cache $(DEFAULT_MODEL_DIR) bench_results
