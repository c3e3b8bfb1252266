# make bench                 sim backend, Llama-2-7B inf2.48xlarge profile: table + P1, P2, P3
# make bench BACKEND=hf      small random Llama on CPU: served vs in-process generate, P5
# make bench BENCH_ARGS="--poisson-requests 100 --output-tokens 64"
# The bench starts its own torchserve (own ports, config.properties and TMPDIR under
# build/bench/) and stops it; results go to bench_results/bench-<backend>.{json,png}.
BACKEND ?= sim
BENCH_PROFILE ?= profiles/llama-2-7b-inf2-48xl-tp24.yaml
BENCH_ARGS ?=

.PHONY: bench

bench: venv model
	$(PY) scripts/bench_suite.py --backend $(BACKEND) --profile $(BENCH_PROFILE) \
		--model-dir $(DEFAULT_MODEL_DIR) --workdir $(BUILD)/bench $(BENCH_ARGS)
