# make soak                  the sim backend (configs/model-config-sim.yaml) served for SOAK_MINUTES at 70 % of
#                            capacity: native and OpenAI routes, streamed and not, 10 % of clients leaving
#                            mid-stream, 1 % invalid requests. Reports every valid request as completed,
#                            cancelled or lost, the worker's RSS and the slots left after the drain; fails on
#                            any lost request or leaked slot (docs/performance.md#soak)
# make soak SOAK_MINUTES=2   a short run; SOAK_ARGS="--load-fraction 0.5 --seed 3" for other loads
# It starts its own torchserve under build/soak/ and stops it; the report goes to bench_results/soak.json.
SOAK_MINUTES ?= 30
SOAK_ARGS ?=

.PHONY: soak

soak: venv model
	$(PY) -m scripts.bench.soak --minutes $(SOAK_MINUTES) --model-dir $(TINY_MODEL_DIR) --workdir $(BUILD)/soak $(SOAK_ARGS)
