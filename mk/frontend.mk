# The ASGI frontend (handler/frontend/, docs/frontends.md): the same model-config.yaml and checkpoint
# served in this venv by uvicorn, without TorchServe or Java. `make serve FRONTEND=asgi` (or
# `make serve-asgi`) runs it in the foreground: Ctrl-C or SIGTERM drains the streams in flight
# (up to 25 s), then it exits. Its bearer key is in FRONTEND_KEY_FILE (written when absent;
# rewrite the file to rotate the key: it is read again on change).
FRONTEND ?= torchserve
FRONTEND_KEY_FILE ?= $(BUILD)/frontend-key.txt
FRONTEND_ARGS ?=

.PHONY: serve-asgi
serve-asgi: venv $(if $(filter $(DEFAULT_MODEL_DIR),$(MODEL_DIR)),model)
	@$(PY) -m scripts.serve.client $(CLIENT_ARGS) hints --config $(MODEL_CONFIG) --key-file-hint $(FRONTEND_KEY_FILE)
	HF_HUB_OFFLINE=1 exec $(PY) -m handler.frontend --config $(MODEL_CONFIG) --model-dir $(MODEL_DIR) \
		--model-name $(MODEL_NAME) --host $(HOST) --port $(INFERENCE_PORT) --key-file $(FRONTEND_KEY_FILE) $(FRONTEND_ARGS)
