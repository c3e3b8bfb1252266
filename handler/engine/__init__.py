"""Token ids in, text out: the step engines (step_engine.py continuous, micro_batch.py static),
the slot scheduler, and each request's `Sequence` with its detokenizer and stop strings. No
TorchServe, no wire format, no config."""
