# SageMaker real-time endpoint on ml.inf2 (PyTorch Neuron DLC, SDK 2.25, TorchServe 0.11.0 inside).
# make sagemaker-archive  MODEL_DIR=/path/to/checkpoint   build/sagemaker/model_store/$(MODEL_NAME)/: your checkpoint
#                                                          + SAGEMAKER_MODEL_CONFIG + bundled deps + sagemaker.properties
# make sagemaker-upload   MODEL_DIR=... SAGEMAKER_S3_URI=s3://bucket/prefix/   builds it, checks it, uploads it
# make sagemaker-deploy   SAGEMAKER_S3_URI=... SAGEMAKER_ROLE_ARN=arn:aws:iam::...:role/... [SAGEMAKER_ENDPOINT=...]
# make sagemaker-stream   [PROMPT="..."]
# make sagemaker-delete
# make sagemaker-local    torchserve with serving/sagemaker.properties on the local archive: /ping, /invocations
SAGEMAKER_S3_URI ?=
SAGEMAKER_ROLE_ARN ?=
SAGEMAKER_ENDPOINT ?= inf2-llm-$(MODEL_NAME)
SAGEMAKER_INSTANCE_TYPE ?= ml.inf2.xlarge
SAGEMAKER_INSTANCE_COUNT ?= 1
SAGEMAKER_VOLUME_SIZE ?= 64
SAGEMAKER_DOWNLOAD_TIMEOUT ?= 3600
SAGEMAKER_STARTUP_TIMEOUT ?= 600
SAGEMAKER_READY_TIMEOUT ?= 1800
SAGEMAKER_DEPLOY_ARGS ?=
SAGEMAKER_MAX_NEW_TOKENS ?= 128
AWS_REGION ?=
SAGEMAKER_LOCAL_CONFIG := $(BUILD)/sagemaker-local.properties
# The SageMaker archive: its own config, build folder and model store, never the local ones.
SAGEMAKER_MODEL_CONFIG ?= configs/model-config-sagemaker-inf2.yaml
SAGEMAKER_BUILD ?= $(BUILD)/sagemaker
SAGEMAKER_MODEL_FOLDER = $(SAGEMAKER_BUILD)/model_store/$(MODEL_NAME)
# 1: package the tiny test model anyway (it cannot serve on Inferentia: for trying the pipeline only).
SAGEMAKER_ALLOW_TINY_MODEL ?= 0

# One token (one embedded word for an embedding archive: its handler.task picks the body).
_sagemaker_probe_body = $(shell $(PY) -m scripts.serve.client readiness-body --config $(MODEL_CONFIG))
_sagemaker_probe = curl -sf http://$(HOST):$(INFERENCE_PORT)/invocations -H 'Content-Type: application/json' \
	-d '$(_sagemaker_probe_body)'
_aws_region = $(if $(AWS_REGION),--region $(AWS_REGION))
_require = $(if $($(1)),,$(error set $(1), e.g. make $@ $(1)=$(2)))
_sagemaker_tiny = $(filter $(abspath $(TINY_MODEL_DIR)),$(abspath $(MODEL_DIR)))
_sagemaker_tiny_refused = $(and $(_sagemaker_tiny),$(filter-out 1,$(SAGEMAKER_ALLOW_TINY_MODEL)))
_sagemaker_tiny_message = MODEL_DIR is the tiny test model ($(TINY_MODEL_DIR)), which cannot serve on Inferentia. \
	Pass your checkpoint: make sagemaker-archive MODEL_DIR=/path/to/checkpoint (compiled first with \
	make compile MODEL_CONFIG=$(SAGEMAKER_MODEL_CONFIG)), or SAGEMAKER_ALLOW_TINY_MODEL=1 to package the tiny model anyway

# An upload without a destination fails before the archive is built, not after.
ifneq ($(filter sagemaker-upload,$(MAKECMDGOALS)),)
ifeq ($(SAGEMAKER_S3_URI),)
$(error set SAGEMAKER_S3_URI, e.g. make sagemaker-upload MODEL_DIR=/path/to/checkpoint SAGEMAKER_S3_URI=s3://my-bucket/$(MODEL_NAME)-inf2/)
endif
endif

.PHONY: sagemaker-local sagemaker-archive sagemaker-upload sagemaker-deploy sagemaker-stream sagemaker-delete

# serving/sagemaker.properties as the container runs it, bound to $(HOST):$(INFERENCE_PORT)
# (0.0.0.0:8080 inside the container) and with the model registered as "model", as there.
sagemaker-local: archive plugins
	mkdir -p $(BUILD) logs
	rm -rf $(STATE_DIR) && mkdir -p $(STATE_DIR)
	sed -e 's|^inference_address=.*|inference_address=http://$(HOST):$(INFERENCE_PORT)|' \
		-e 's|^management_address=.*|management_address=http://$(HOST):$(MANAGEMENT_PORT)|' \
		-e 's|^metrics_address=.*|metrics_address=http://$(HOST):$(METRICS_PORT)|' \
		-e 's|^model_store=.*|model_store=$(MODEL_STORE)|' \
		-e 's|^plugins_path=.*|plugins_path=$(abspath $(PLUGINS_DIR))|' \
		serving/sagemaker.properties > $(SAGEMAKER_LOCAL_CONFIG)
	PATH=$(abspath $(BIN)):$$PATH HF_HUB_OFFLINE=1 INF2_STATE_DIR=$(STATE_DIR) $(TS_ENV) $(BIN)/torchserve --start --ncs \
		--ts-config $(SAGEMAKER_LOCAL_CONFIG) --log-config serving/log4j2.xml \
		--model-store $(MODEL_STORE) --models model=$(MODEL_NAME) > logs/torchserve.out 2>&1
	@# /ping can say Healthy before the worker has loaded the model: wait for a real answer
	@for i in $$(seq 1 600); do $(_sagemaker_probe) >/dev/null 2>&1 && break; \
		kill -0 $$(cat $(BUILD)/.model_server.pid) 2>/dev/null || break; sleep 1; done
	@$(_sagemaker_probe) >/dev/null || (tail -n 40 logs/ts_log.log; $(TS_ENV) $(BIN)/torchserve --stop; exit 1)
	@curl -s http://$(HOST):$(INFERENCE_PORT)/ping
	@echo
	@echo "Container view on http://$(HOST):$(INFERENCE_PORT) (no token). Try:"
	@echo "  curl -N http://$(HOST):$(INFERENCE_PORT)/invocations -H 'Content-Type: application/json' -d '{\"prompt\": \"Today the weather is\", \"max_new_tokens\": 32}'"
	@echo "  $(PY) -m scripts.sagemaker.stream --url http://$(HOST):$(INFERENCE_PORT) \"Today the weather is\""
	@echo "  make stop"

# Your checkpoint (MODEL_DIR, compiled with `make compile MODEL_CONFIG=$(SAGEMAKER_MODEL_CONFIG)`),
# embedded, with SAGEMAKER_MODEL_CONFIG, the handler's dependencies for the DLC's Python (3.10 for neuronx, 3.12 for nxdi)
# (pip, from PyPI or pip's configured index), serving/sagemaker.properties and the /ping plugin
# (built into $(PLUGINS_DIR) by the script, after it has checked the checkpoint).
sagemaker-archive: venv $(if $(and $(_sagemaker_tiny),$(filter 1,$(SAGEMAKER_ALLOW_TINY_MODEL))),model)
	$(if $(_sagemaker_tiny_refused),$(error $(_sagemaker_tiny_message)))
	$(PY) -m scripts.sagemaker.archive --model-dir $(MODEL_DIR) --config $(SAGEMAKER_MODEL_CONFIG) \
		--model-name $(MODEL_NAME) --build-dir $(SAGEMAKER_BUILD) --plugins-dir $(PLUGINS_DIR)

sagemaker-upload: sagemaker-archive
	$(PY) -m scripts.sagemaker.upload --model-dir $(SAGEMAKER_MODEL_FOLDER) --s3-uri $(SAGEMAKER_S3_URI) $(_aws_region)

sagemaker-deploy: venv
	$(call _require,SAGEMAKER_S3_URI,s3://my-bucket/$(MODEL_NAME)-inf2/)
	$(call _require,SAGEMAKER_ROLE_ARN,arn:aws:iam::111122223333:role/SageMakerExecutionRole)
	$(PY) -m scripts.sagemaker.deploy --model-data $(SAGEMAKER_S3_URI) --role-arn $(SAGEMAKER_ROLE_ARN) \
		--endpoint-name $(SAGEMAKER_ENDPOINT) --instance-type $(SAGEMAKER_INSTANCE_TYPE) \
		--instance-count $(SAGEMAKER_INSTANCE_COUNT) --volume-size $(SAGEMAKER_VOLUME_SIZE) \
		--model-data-download-timeout $(SAGEMAKER_DOWNLOAD_TIMEOUT) \
		--container-startup-health-check-timeout $(SAGEMAKER_STARTUP_TIMEOUT) \
		--wait --ready-timeout $(SAGEMAKER_READY_TIMEOUT) $(_aws_region) $(SAGEMAKER_DEPLOY_ARGS)

sagemaker-stream: venv
	$(PY) -m scripts.sagemaker.stream --endpoint-name $(SAGEMAKER_ENDPOINT) \
		--max-new-tokens $(SAGEMAKER_MAX_NEW_TOKENS) $(_aws_region) "$(PROMPT)"

sagemaker-delete: venv
	$(PY) -m scripts.sagemaker.delete --endpoint-name $(SAGEMAKER_ENDPOINT) $(_aws_region)
