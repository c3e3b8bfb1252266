# The ASGI frontend (handler/frontend/, docs/frontends.md): the same model-config.yaml and checkpoint
# served in this venv by uvicorn, without TorchServe or Java. `make serve FRONTEND=asgi` (or
# `make serve-asgi`) behaves as `make serve` does: it starts the frontend in the background
# (scripts/serve/asgi_server.py: detached, its output in ASGI_LOG, its pid in ASGI_PID_FILE), returns
# once /ping answers 200 (on failure it prints the log's tail and stops it), and prints the hints.
# `make stop` stops it: SIGTERM, then new requests get 503 and the streams in flight get
# DRAIN_GRACE_S seconds to finish, then it exits. Its bearer key is in FRONTEND_KEY_FILE (written
# when absent; rewrite the file to rotate the key: it is read again on change).
FRONTEND ?= torchserve
FRONTEND_KEY_FILE ?= $(BUILD)/frontend-key.txt
FRONTEND_ARGS ?=
ASGI_PID_FILE ?= $(BUILD)/asgi.pid
ASGI_LOG ?= logs/asgi.log

.PHONY: serve-asgi
serve-asgi: venv $(if $(filter $(DEFAULT_MODEL_DIR),$(MODEL_DIR)),model)
	HF_HUB_OFFLINE=1 $(PY) -m scripts.serve.asgi_server start --pid-file $(ASGI_PID_FILE) --log $(ASGI_LOG) \
		--url http://$(HOST):$(INFERENCE_PORT) --key-file $(FRONTEND_KEY_FILE) --timeout 600 -- \
		$(PY) -m handler.frontend --config $(MODEL_CONFIG) --model-dir $(MODEL_DIR) --model-name $(MODEL_NAME) \
		--host $(HOST) --port $(INFERENCE_PORT) --key-file $(FRONTEND_KEY_FILE) --drain-s $(DRAIN_GRACE_S) $(FRONTEND_ARGS)
	@echo
	@$(PY) -m scripts.serve.client $(CLIENT_ARGS) hints --config $(MODEL_CONFIG) --key-file-hint $(FRONTEND_KEY_FILE)
