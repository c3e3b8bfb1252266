# OpenAI-compatible clients against `make serve` (routes: /predictions/<model>/1.0/v1/...).
# make guidellm          guidellm 0.8.1 in its own venv ($(VENV)/guidellm); the e2e tests use it
# make guidellm-run      a short guidellm benchmark against the running server
GUIDELLM_VENV := $(VENV)/guidellm
GUIDELLM_REQUESTS ?= 40
GUIDELLM_STREAMS ?= 4
GUIDELLM_TOKENS ?= prompt_tokens=32,output_tokens=32
GUIDELLM_TOKENIZER ?= $(MODEL_DIR)

.PHONY: guidellm guidellm-run

guidellm: $(GUIDELLM_VENV)/.installed

# torch pinned in the same pip command, else guidellm pulls a multi-GB CUDA torch.
$(GUIDELLM_VENV)/.installed: requirements-guidellm.txt
	$(PYTHON) -m venv $(GUIDELLM_VENV)
	$(GUIDELLM_VENV)/bin/pip install --quiet -r requirements-guidellm.txt
	touch $@

guidellm-run: guidellm venv
	mkdir -p $(BUILD)
	HF_HUB_OFFLINE=1 $(GUIDELLM_VENV)/bin/guidellm run \
		--backend '{"kind":"openai_http","target":"http://$(HOST):$(INFERENCE_PORT)","model":"$(MODEL_NAME)","api_key":"'"$$($(PY) -m scripts.serve.client token)"'","request_format":"/v1/completions","api_routes":{"/health":"ping","/v1/models":"predictions/$(MODEL_NAME)/1.0/v1/models","/v1/completions":"predictions/$(MODEL_NAME)/1.0/v1/completions"},"http2":false}' \
		--tokenizer kind=hf_auto,model=$(GUIDELLM_TOKENIZER) \
		--data kind=synthetic_text,$(GUIDELLM_TOKENS) \
		--profile kind=concurrent,streams=$(GUIDELLM_STREAMS) \
		--constraint kind=max_requests,count=$(GUIDELLM_REQUESTS) \
		--output kind=json,path=$(BUILD)/guidellm.json --disable-console-interactive

# The e2e tests run guidellm; install it before pytest (the test installs it itself if missing).
test: guidellm
