"""Structured output: a request's `Constraint` as llguidance grammars, and the per-slot token
masks the samplers apply (docs/grammar-engines.md says why llguidance). Knows token ids and
tokenizers; no wire format, no backend."""
