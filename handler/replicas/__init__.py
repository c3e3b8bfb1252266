"""Data-parallel model replicas behind one continuous-batching worker (`scheduler.replicas`).

The worker keeps TorchServe, parsing, tokenizing and the wire formats; each replica is a child
process (a fresh interpreter, so its NEURON_RT_VISIBLE_CORES is set before any SDK import)
holding one model copy, its own slots, its own `StepEngine` and KV state. Each replica runs
every sequence's `Sequence` (detokenizing, stop strings, the end decision) next to its step
loop and reports what each one did (`Progress`) after every step; the worker's copy of the
Sequence adopts it. docs/design.md ("Replicas") says why that split.

- protocol.py: the messages between worker and replica;
- child.py: a replica process's main;
- process.py: the worker's handle on one replica process;
- dispatch.py: which replica takes a new request;
- replica_set.py: the R replicas as one engine, with restarts;
- model.py: placement and start-up, and the model facts the worker serves from.
"""
