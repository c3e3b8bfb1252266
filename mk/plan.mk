# make plan                   the capacity planner on MODEL_DIR (a checkpoint directory or its config.json;
#                             default: SmolLM2-135M-Instruct): the step-time model's validation (P10), then every
#                             instance x tp_degree x replicas x n_slots that fits, simulated on Poisson loads,
#                             ranked by cost per million output tokens within the SLO (docs/planning.md)
# make plan MODEL_DIR=/models/Llama-3.1-8B-Instruct INSTANCE=inf2.48xlarge SLO_ITL_MS=50 SLO_TTFT_MS=1000 \
#           PROMPT_TOKENS=1500 OUTPUT_TOKENS=250
# INSTANCE: one name or several (space-separated); empty: all of profiles/inf2-instances.yaml.
# PLAN_ARGS: more scripts/plan/planner.py options, e.g. "--weight-dtype int8 --slots 8,16,32 --top 20".
#   "--speculation-k 3 --acceptance-rate 0.6": the top 5 layouts again with speculative decoding modelled
#   (a verify step of 4 x slots tokens, (1 - a^4) / (1 - a) tokens a row): a model, not a measurement.
# Writes build/plan/plan-<model>.png and .json; offline, a few seconds.
# make profiles               the sim profiles the step-time model writes (scripts/plan/profiles.py: the TP8 seed
#                             layout's, from the planner's step_profile), with their sources and the ratios to the
#                             published points in each header; the TP24 ones stay published figures (it says why)
INSTANCE ?=
SLO_ITL_MS ?= 50
SLO_TTFT_MS ?= 1000
PROMPT_TOKENS ?= 1500
OUTPUT_TOKENS ?= 250
PLAN_ARGS ?=

.PHONY: plan profiles

plan: venv $(if $(filter $(DEFAULT_MODEL_DIR),$(MODEL_DIR)),model)
	$(PY) -m scripts.plan.planner --model $(MODEL_DIR) $(foreach i,$(INSTANCE),--instance $(i)) \
		--slo-itl-ms $(SLO_ITL_MS) --slo-ttft-ms $(SLO_TTFT_MS) \
		--prompt-tokens $(PROMPT_TOKENS) --output-tokens $(OUTPUT_TOKENS) --out $(BUILD)/plan $(PLAN_ARGS)

profiles: venv
	$(PY) -m scripts.plan.profiles
