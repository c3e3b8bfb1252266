# SageMaker real-time endpoint on ml.inf2 (PyTorch Neuron DLC, TorchServe inside).
# make archive                       model_store/$(MODEL_NAME)/ (no-archive), with requirements-archive.txt
# make sagemaker-local               torchserve as in the container: /ping, /invocations, no token
# make sagemaker-upload   SAGEMAKER_S3_URI=s3://bucket/prefix/
# make sagemaker-deploy   SAGEMAKER_S3_URI=... SAGEMAKER_ROLE_ARN=arn:aws:iam::...:role/... [SAGEMAKER_ENDPOINT=...]
# make sagemaker-stream   [PROMPT="..."]
# make sagemaker-delete
SAGEMAKER_S3_URI ?=
SAGEMAKER_ROLE_ARN ?=
SAGEMAKER_ENDPOINT ?= inf2-llm-$(MODEL_NAME)
SAGEMAKER_INSTANCE_TYPE ?= ml.inf2.xlarge
SAGEMAKER_INSTANCE_COUNT ?= 1
SAGEMAKER_VOLUME_SIZE ?= 64
SAGEMAKER_DOWNLOAD_TIMEOUT ?= 3600
SAGEMAKER_STARTUP_TIMEOUT ?= 600
SAGEMAKER_DEPLOY_ARGS ?=
SAGEMAKER_MAX_NEW_TOKENS ?= 128
AWS_REGION ?=
SAGEMAKER_LOCAL_CONFIG := $(BUILD)/sagemaker-local.properties

# Every archive carries the runtime requirements the DLC lacks (torch-model-archiver -r);
# TorchServe installs them only where install_py_dep_per_model=true (the SageMaker config).
ARCHIVER_ARGS ?= -r requirements-archive.txt

_sagemaker_probe = curl -sf http://$(HOST):$(INFERENCE_PORT)/invocations -H 'Content-Type: application/json' \
	-d '{"prompt": "ping", "max_new_tokens": 1, "stream": false}'
_aws_region = $(if $(AWS_REGION),--region $(AWS_REGION))
_require = $(if $($(1)),,$(error set $(1), e.g. make $@ $(1)=$(2)))

.PHONY: sagemaker-local sagemaker-upload sagemaker-deploy sagemaker-stream sagemaker-delete

# serving/sagemaker.properties as the container runs it, bound to $(HOST):$(INFERENCE_PORT)
# (0.0.0.0:8080 inside the container) and with the model registered as "model", as there.
sagemaker-local: archive
	mkdir -p $(BUILD) logs
	sed -e 's|^inference_address=.*|inference_address=http://$(HOST):$(INFERENCE_PORT)|' \
		-e 's|^management_address=.*|management_address=http://$(HOST):$(MANAGEMENT_PORT)|' \
		-e 's|^metrics_address=.*|metrics_address=http://$(HOST):$(METRICS_PORT)|' \
		-e 's|^model_store=.*|model_store=$(MODEL_STORE)|' \
		-e 's|^install_py_dep_per_model=.*|install_py_dep_per_model=false|' \
		serving/sagemaker.properties > $(SAGEMAKER_LOCAL_CONFIG)
	PATH=$(abspath $(BIN)):$$PATH HF_HUB_OFFLINE=1 $(TS_ENV) $(BIN)/torchserve --start --ncs \
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
	@echo "  $(PY) scripts/sagemaker_stream.py --url http://$(HOST):$(INFERENCE_PORT) \"Today the weather is\""
	@echo "  make stop"

sagemaker-upload: archive
	$(call _require,SAGEMAKER_S3_URI,s3://my-bucket/$(MODEL_NAME)-inf2/)
	$(PY) scripts/sagemaker_upload.py --model-dir $(MODEL_STORE)/$(MODEL_NAME) --s3-uri $(SAGEMAKER_S3_URI) $(_aws_region)

sagemaker-deploy: venv
	$(call _require,SAGEMAKER_S3_URI,s3://my-bucket/$(MODEL_NAME)-inf2/)
	$(call _require,SAGEMAKER_ROLE_ARN,arn:aws:iam::111122223333:role/SageMakerExecutionRole)
	$(PY) scripts/sagemaker_deploy.py --model-data $(SAGEMAKER_S3_URI) --role-arn $(SAGEMAKER_ROLE_ARN) \
		--endpoint-name $(SAGEMAKER_ENDPOINT) --instance-type $(SAGEMAKER_INSTANCE_TYPE) \
		--instance-count $(SAGEMAKER_INSTANCE_COUNT) --volume-size $(SAGEMAKER_VOLUME_SIZE) \
		--model-data-download-timeout $(SAGEMAKER_DOWNLOAD_TIMEOUT) \
		--container-startup-health-check-timeout $(SAGEMAKER_STARTUP_TIMEOUT) \
		--wait $(_aws_region) $(SAGEMAKER_DEPLOY_ARGS)

sagemaker-stream: venv
	$(PY) scripts/sagemaker_stream.py --endpoint-name $(SAGEMAKER_ENDPOINT) \
		--max-new-tokens $(SAGEMAKER_MAX_NEW_TOKENS) $(_aws_region) "$(PROMPT)"

sagemaker-delete: venv
	$(PY) scripts/sagemaker_delete.py --endpoint-name $(SAGEMAKER_ENDPOINT) $(_aws_region)
