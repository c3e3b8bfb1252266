# make bench                 sim backend, Llama-2-7B inf2.48xlarge profile: torchserve in each scheduler
#                            mode (continuous, then static), the same loads and a Poisson sweep from 10 % to
#                            95 % of capacity; tables with the discrete-event limit, P1-P4, P8; then the
#                            replicas stage (1 vs 3 replicas of Llama-3.1-8B TP8, the seed workload): P7 (about 12 min)
# make bench BACKEND=hf      the real default model (SmolLM2-135M-Instruct, f32) on CPU, continuous mode, 4 slots,
#                            64 output tokens: served vs in-process at 1 and 4 streams (P5-single, P5), the idle
#                            TTFT and the worker's RSS (about 2.5 min on 2 cores; figures in docs/performance.md)
# make bench BENCH_LONG=1    a longer sweep: 11 loads, 4x the requests (about 40 min)
# make bench BENCH_ARGS="--modes continuous --sweep none --no-replicas"   only the ratios' loads, one mode (P1-P3)
# make bench BENCH_ARGS="--modes none"                      only P8 and the replicas stage (P7, the seed table)
# make bench BENCH_ARGS="--time-scale 0.5"                   every simulated time halved (ratios unchanged)
# The bench starts its own torchserve per mode (own ports, config.properties and TMPDIR under
# build/bench/<backend>/<mode>/) and stops it; results go to bench_results/bench-<backend>.{json,png}.
# The policy reference alone: $(PY) -m scripts.bench.des --profile $(BENCH_PROFILE)
# make bench-isolation       hf backend, tiny model, 4 slots: a 300-token bystander stream's ITL p99 while one class
#                            of hostile requests arrives (lone surrogates, JSON 2,000 deep, huge stop strings, a
#                            12,000-property schema) / alone (goal <= 2), their statuses and whether the worker died;
#                            its own torchserve under build/bench-isolation/; bench_results/bench-isolation.json (1-3 min)
# make bench-isolation ISOLATION_ARGS="--classes a,d"        some classes only
# make bench-memory          hf backend, tiny model: the worker's RSS after 300 distinct ~1 MB schemas and 100 1 MB
#                            prompts against handler.grammar.cache_mb, and the wait behind an n-at-the-limit request;
#                            bench_results/memory.json (about 2 min)
# make bench-embed           (also the last stage of make bench; BENCH_EMBED=0 leaves it out there)
#                            the embedding archive (all-MiniLM-L6-v2, hf, cpu_threads 1) served vs HFEncoder.encode
#                            in-process, 128-token inputs, 32 concurrent clients: P13 at batch 8 (goal >= 0.8; float
#                            and base64 replies), batchSize 1 vs 8 (the batching gain), the idle p50;
#                            bench_results/bench-embed.json (about 75 s on 2 cores, 2 min when other jobs share them)
# make bench-embed EMBED_BENCH_ARGS="--requests-per-client 16"   longer loads (steadier figures)
# make bench-frontends       sim backend: the same engine, profile and loads on TorchServe and on the ASGI frontend
#                            (python -m handler.frontend), one after the other, continuous mode: idle TTFT, P1-P4 per
#                            frontend (P4: static TorchServe / that frontend), P12 per frontend (seed workload, 32
#                            streams, 1 replica; goal <= 1.1) and P14 = ASGI tok/s / TorchServe tok/s at 8 streams
#                            (goal >= 1.0); bench_results/bench-frontends.json (8-9 min on 2 shared cores; not in make bench)
# make bench-frontends FRONTEND_BENCH_ARGS="--frontends asgi --no-static"   one frontend only
# make bench-frontends FRONTEND_BENCH_ARGS="--asgi-env OMP_NUM_THREADS=1"   the ASGI frontend with one torch thread
# make bench-hostile         the default model on CPU (MODEL_DIR, MODEL_CONFIG) on TorchServe, then the ASGI frontend
#                            (issue 42): the TTFT of a normal request after 200 abandoned ones / alone, and a 64-token
#                            chat stream's time and largest gap beside 4 clients sending distinct 0.9 MB schemas / alone;
#                            bench_results/bench-hostile.json (a few minutes; not in make bench)
# make bench-hostile HOSTILE_ARGS="--frontend asgi --only schema --schema-bytes 2000000"   one frontend, one measurement
# make bench-lora            (also the last stage of make bench; BENCH_LORA=0 leaves it out there)
#                            the default model on CPU (REAL_MODEL_DIR, MODEL_CONFIG copied: 8 slots, cpu_threads 1) with
#                            4 seeded LoRA adapters (rank 8, q_proj,v_proj) in one torchserve (issue 43): P15 = tok/s of
#                            8 streams on 4 adapters mixed / the same load on the base (base, adapters, base; goal >= 0.8),
#                            and the hf decode step in-process, 8 base rows vs 4 adapters x 2 rows (and the bare model);
#                            its files under build/bench-lora/; bench_results/bench-lora.json (about 3 min on 2 cores)
# make bench-lora LORA_BENCH_ARGS="--requests-per-client 8 --repeats 2 --rank 16 --targets q_proj,k_proj,v_proj,o_proj"
# make bench-speculation     (also a stage of make bench; BENCH_SPECULATION=0 leaves it out there) P16: prompt-lookup
#                            speculation on the default model (hf, in-process, greedy, 1 and 8 streams): tok/s with k = 3
#                            ÷ without, back-off off and on, acceptance and tokens per row per step, for a JSON extraction
#                            (P16a), a rewrite and a story (P16b); 3 rounds each, medians; texts must be equal;
#                            bench_results/bench-speculation.json (about 12 min on 2 cores)
# make bench-speculation SPECULATION_BENCH_ARGS="--k 5 --loads json --streams 1"
BACKEND ?= sim
BENCH_PROFILE ?= profiles/llama-2-7b-inf2-48xl-tp24.yaml
BENCH_LONG ?=
BENCH_ARGS ?=
ISOLATION_ARGS ?=
MEMORY_ARGS ?=
EMBED_BENCH_ARGS ?=
FRONTEND_BENCH_ARGS ?=
HOSTILE_ARGS ?=
SPECULATION_BENCH_ARGS ?=
LORA_BENCH_ARGS ?=
# make bench ends with bench-embed (P13), bench-lora (P15) and bench-speculation (P16); 0 leaves each out.
BENCH_EMBED ?= 1
BENCH_LORA ?= 1
BENCH_SPECULATION ?= 1

.PHONY: bench-speculation bench bench-isolation bench-memory bench-embed bench-frontends bench-hostile bench-lora

bench: venv model
	$(PY) -m scripts.bench.suite --backend $(BACKEND) --profile $(BENCH_PROFILE) \
		--model-dir $(if $(filter hf,$(BACKEND)),$(REAL_MODEL_DIR),$(TINY_MODEL_DIR)) --workdir $(BUILD)/bench $(if $(BENCH_LONG),--long) $(BENCH_ARGS)
	$(if $(filter 1,$(BENCH_EMBED)),$(MAKE) --no-print-directory bench-embed)
	$(if $(filter 1,$(BENCH_LORA)),$(MAKE) --no-print-directory bench-lora)
	$(if $(filter 1,$(BENCH_SPECULATION)),$(MAKE) --no-print-directory bench-speculation)

bench-isolation: venv model
	$(PY) -m scripts.bench.isolation --model-dir $(TINY_MODEL_DIR) --workdir $(BUILD)/bench-isolation $(ISOLATION_ARGS)

bench-memory: venv model
	$(PY) -m scripts.bench.memory --model-dir $(TINY_MODEL_DIR) $(MEMORY_ARGS)

bench-embed: venv model
	$(PY) -m scripts.bench.embeddings --model-dir $(ENCODER_MODEL_DIR) --workdir $(BUILD)/bench-embed $(EMBED_BENCH_ARGS)

bench-frontends: venv model
	$(PY) -m scripts.bench.frontends --model-dir $(TINY_MODEL_DIR) --workdir $(BUILD)/bench-frontends $(FRONTEND_BENCH_ARGS)

bench-hostile: venv model
	$(PY) -m scripts.bench.hostile --model-dir $(MODEL_DIR) --model-config $(MODEL_CONFIG) \
		--workdir $(BUILD)/bench-hostile --out bench_results/bench-hostile.json $(HOSTILE_ARGS)

bench-lora: venv model
	$(PY) -m scripts.bench.lora --model-dir $(REAL_MODEL_DIR) --model-config $(MODEL_CONFIG) \
		--workdir $(BUILD)/bench-lora --out bench_results/bench-lora.json $(LORA_BENCH_ARGS)

bench-speculation: venv model
	$(PY) -m scripts.bench.speculation --model-dir $(REAL_MODEL_DIR) $(SPECULATION_BENCH_ARGS)

