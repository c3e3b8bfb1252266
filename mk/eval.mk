# make eval               lm-eval (local-completions, its own venv) against `make serve`'s model on the tasks
#                         the project ships (eval/tasks: loglikelihood and generate_until, local JSONL), then
#                         the scores (docs/evaluation.md)
# make eval EVAL_LIMIT=5  the first 5 samples of each task
# make eval EVAL_URL=http://127.0.0.1:9080 EVAL_TOKENIZER=/models/llama-2-7b EVAL_OUT=build/eval/neuronx
#                         another server (e.g. neuronx on an inf2 host), the same checkpoint's tokenizer
# make eval-compare EVAL_A=build/eval/hf EVAL_B=build/eval/neuronx   did the two builds answer alike?
LMEVAL_VENV := $(VENV)/lm-eval
EVAL_URL ?= http://$(HOST):$(INFERENCE_PORT)
EVAL_TOKENIZER ?= $(MODEL_DIR)
EVAL_LIMIT ?=
EVAL_OUT ?= $(BUILD)/eval
EVAL_ARGS ?=
EVAL_A ?=
EVAL_B ?=

.PHONY: lm-eval eval eval-compare

lm-eval: $(LMEVAL_VENV)/.installed

$(LMEVAL_VENV)/.installed: requirements-eval.txt
	$(PYTHON) -m venv $(LMEVAL_VENV)
	$(LMEVAL_VENV)/bin/pip install --quiet -r requirements-eval.txt
	touch $@

eval: lm-eval venv
	$(PY) -m scripts.eval.evaluate --url $(EVAL_URL) --model $(MODEL_NAME) --tokenizer $(EVAL_TOKENIZER) \
		--out $(EVAL_OUT) --lm-eval $(LMEVAL_VENV)/bin/lm_eval $(if $(EVAL_LIMIT),--limit $(EVAL_LIMIT)) $(EVAL_ARGS)

eval-compare: venv
	$(call _require,EVAL_A,build/eval/hf)
	$(call _require,EVAL_B,build/eval/neuronx)
	$(PY) -m scripts.eval.compare $(EVAL_A) $(EVAL_B)

# tests/e2e/test_lm_eval.py and tests/perf/test_real_model_eval.py run lm-eval against a real
# torchserve: install it before pytest.
test: lm-eval
test-compat: lm-eval
test-perf: lm-eval
