"""LoRA adapters on one base model: reading and checking PEFT adapters (`adapters`), and naming them
per request (`registry`). The backends apply them (hf through `peft`, nxdi through NxD Inference)."""
